"""Chapter 1 (tokens): realistic learner mistakes, each of which must lose points with a message that names
it, and different-but-correct answers, each of which must get full marks.

Solution cells: `pre_split`, `bpe_merge`, `tokenizer` (the whole `Tokenizer` class), `train_bpe` (not graded).
Test cells: test_pre_split, test_bpe_merge, test_encode_ordinary, test_special_tokens, test_decode,
test_matches_tiktoken. The tokenizer's tests use `pre_split` and `bpe_merge`, so a mistake there also costs
their points; a mistake in the `Tokenizer` must cost nothing in the cells before it.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "01-tokens"

REFERENCE_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The test cells that run text through the learner's pre_split and bpe_merge: a mistake there costs their
# points too. The special-token tests use only plain words and spaces, so a mistake that shows only on
# contractions or Unicode spares them.
TOKENIZER_TESTS = ("test_encode_ordinary", "test_special_tokens", "test_matches_tiktoken")
TEXT_TESTS = ("test_encode_ordinary", "test_matches_tiktoken")


def _pattern(new: str) -> Edit:
    return Edit("pre_split", REFERENCE_PATTERN, new)


# Tokenizer method bodies, as they stand in the reference (with the solution markers removed).
ENCODE_CHECKS_DISALLOWED = """\
        for token in self.special_tokens:
            if token not in allowed and token in text:
                raise ValueError(
                    f"text contains the special token {token!r}, which is not allowed: pass "
                    f"allowed_special={{{token!r}}} to encode it as one token, or use encode_ordinary "
                    "to encode it as plain text")
"""
DECODE_BYTES_BODY = """\
        try:
            return b"".join(self.vocab[i] for i in ids)
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or i not in self.vocab)
            raise ValueError(f"token id {bad!r} is not in the vocabulary (ids 0 to {max(self.vocab)})") from None
"""
DECODE_BODY = """\
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
"""

MUTANTS = [
    # ---- bpe_merge: the order of merges
    Mutant(
        "bpe-leftmost",
        "merges the leftmost mergeable pair, not the lowest rank",
        (Edit("bpe_merge", "                best = (rank, i)\n",
              "                best = (rank, i)\n                break  # the first pair that can merge\n"),),
        {"test_bpe_merge": "LOWEST rank", **{t: "" for t in TOKENIZER_TESTS}},
    ),
    Mutant(
        "bpe-highest-rank",
        "merges the highest rank first",
        (Edit("bpe_merge", "rank < best[0]", "rank > best[0]"),),
        {"test_bpe_merge": "highest rank first", **{t: "" for t in TOKENIZER_TESTS}},
    ),
    Mutant(
        "bpe-one-merge",
        "stops after the first merge",
        (Edit("bpe_merge", "        parts[i:i + 2] = [parts[i] + parts[i + 1]]\n",
              "        parts[i:i + 2] = [parts[i] + parts[i + 1]]\n        break\n"),),
        {"test_bpe_merge": "stopped after one merge", **{t: "" for t in TOKENIZER_TESTS}},
    ),
    # ---- pre_split: the regular expression
    Mutant(
        "split-no-contractions",
        "pre-split without the contraction alternative",
        (_pattern(r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""),),
        {"test_pre_split": "contractions 's 't 're 've 'm 'll 'd are pieces of their own",
         **{t: "" for t in TEXT_TESTS}},
    ),
    Mutant(
        "split-contractions-any-case",
        "contractions matched in any case",
        (_pattern(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""),),
        # GPT-2 has no tokens "'M" or "'T": the ids come out right, only the pieces are wrong.
        {"test_pre_split": "lower case only"},
    ),
    Mutant(
        "split-ascii",
        "ASCII letters and digits instead of \\p{L} and \\p{N}",
        (_pattern(r"""'(?:[sdmt]|ll|ve|re)| ?[a-zA-Z]+| ?[0-9]+| ?[^\sa-zA-Z0-9]+|\s+(?!\S)|\s+"""),),
        {"test_pre_split": "Unicode letter", **{t: "" for t in TEXT_TESTS}},
    ),
    Mutant(
        "split-no-space-rule",
        "pre-split without the \\s+(?!\\S) whitespace rule",
        (_pattern(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"""),),
        {"test_pre_split": "the last space joins the word (\\s+(?!\\S))", **{t: "" for t in TOKENIZER_TESTS}},
    ),
    # ---- encode: special tokens
    Mutant(
        "encode-ignores-allowed",
        "encode ignores allowed_special",
        (Edit("tokenizer", "        if not allowed:\n            return self.encode_ordinary(text)\n",
              "        return self.encode_ordinary(text)\n"),),
        {"test_special_tokens": "must become the single id 50256"},
    ),
    Mutant(
        "encode-disallowed-silently",
        "a special token that is not allowed is encoded silently",
        (Edit("tokenizer", ENCODE_CHECKS_DISALLOWED, ""),),
        {"test_special_tokens": "must raise ValueError"},
    ),
    # ---- decode
    Mutant(
        "decode-drops-bytes",
        "decode drops the invalid bytes",
        (Edit("tokenizer", 'errors="replace"', 'errors="ignore"'),),
        # Valid text still round-trips, so agreeing with tiktoken costs nothing.
        {"test_decode": "dropped the invalid bytes"},
    ),
    Mutant(
        "decode-per-token",
        "decode token by token",
        (Edit("tokenizer", DECODE_BODY,
              '        return "".join(self.decode_bytes([i]).decode("utf-8", errors="replace") for i in ids)\n'),),
        {"test_decode": "decoded token by token", "test_matches_tiktoken": ""},
    ),
    Mutant(
        "decode-keyerror",
        "decode_bytes raises KeyError on an unknown id",
        (Edit("tokenizer", DECODE_BYTES_BODY, '        return b"".join(self.vocab[i] for i in ids)\n'),),
        {"test_decode": "raised KeyError: 50257"},
    ),
    # ---- not writing it at all: the grading kernel holds back the reference of the chapter being graded
    Mutant(
        "imports-reference",
        "imports the course's reference pre_split instead of writing one",
        (Edit("pre_split", "def pre_split(", "from minigpt.tokens import pre_split\n\n\ndef _unused("),),
        {"test_pre_split": "", **{t: "" for t in TOKENIZER_TESTS}},
    ),
]


# ---------------------------------------------------------------- different but correct

# minbpe's way: find the lowest-rank pair, merge all its occurrences in one pass, repeat. And no cache.
MINBPE_MERGE = '''\
#| export
def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Split ``piece`` into tokens by merging neighbouring parts, lowest rank first, until none can merge."""
    parts = [bytes([b]) for b in piece]
    while len(parts) >= 2:
        pairs = [a + b for a, b in zip(parts, parts[1:])]
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and parts[i] + parts[i + 1] == best:
                merged.append(best)
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts
'''
ENCODE_ORDINARY_BODY = """\
        ids = []
        for piece in pre_split(text):
            piece_ids = self._piece_ids.get(piece)
            if piece_ids is None:
                piece_ids = [self.ranks[part] for part in bpe_merge(piece.encode("utf-8"), self.ranks)]
                if len(self._piece_ids) < 200_000:  # bounded: a long-lived tokenizer must not grow forever
                    self._piece_ids[piece] = piece_ids
            ids.extend(piece_ids)
        return ids
"""
NO_CACHE_ENCODE_ORDINARY = """\
        return [self.ranks[part] for piece in pre_split(text) for part in bpe_merge(piece.encode("utf-8"), self.ranks)]
"""

# tiktoken's own pattern, possessive quantifiers and all, compiled on each call.
TIKTOKEN_PRE_SPLIT = '''\
#| export
def pre_split(text: str) -> list[str]:
    """Cut ``text`` into the pieces GPT-2 encodes separately."""
    pat = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s""")
    return pat.findall(text)
'''
ENCODE_BODY = """\
        allowed = set(self.special_tokens) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(f"allowed_special names unknown special tokens: {sorted(unknown)}")
""" + ENCODE_CHECKS_DISALLOWED + """\
        if not allowed:
            return self.encode_ordinary(text)
        # Longest first, so that a special token that contains another one wins.
        splitter = "(" + "|".join(regex.escape(t) for t in sorted(allowed, key=len, reverse=True)) + ")"
        ids = []
        for i, part in enumerate(regex.split(splitter, text)):
            if i % 2:  # the odd parts of a split with one capture group are the separators
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(self.encode_ordinary(part))
        return ids
"""
FIND_LOOP_ENCODE = """\
        if allowed_special == "all":
            allowed_special = self.special_tokens.keys()
        for token in self.special_tokens:
            if token in text and token not in allowed_special:
                raise ValueError(f"disallowed special token {token!r} in the text")
        ids, start = [], 0
        while True:
            # the next allowed special token: the first in the text, the longest if two start there
            hits = [(text.find(t, start), -len(t), t) for t in allowed_special]
            hits = [h for h in hits if h[0] >= 0]
            if not hits:
                break
            pos, _, token = min(hits)
            ids += self.encode_ordinary(text[start:pos])
            ids.append(self.special_tokens[token])
            start = pos + len(token)
        return ids + self.encode_ordinary(text[start:])
"""
BYTEARRAY_DECODE_BYTES = """\
        out = bytearray()
        for i in ids:
            if i not in self.vocab:
                raise ValueError(f"unknown token id {i}")
            out += self.vocab[i]
        return bytes(out)
"""

# min over the positions, keyed by rank (min keeps the leftmost of equal ranks).
MIN_RANGE_MERGE = '''\
#| export
def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Split ``piece`` into tokens by merging neighbouring parts, lowest rank first, until none can merge."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        i = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], float("inf")))
        if parts[i] + parts[i + 1] not in ranks:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts
'''

# A heap of candidate merges over a linked list of parts, with stale entries skipped: O(n log n).
HEAP_MERGE = '''\
#| export
import heapq


def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Split ``piece`` into tokens by merging neighbouring parts, lowest rank first, until none can merge."""
    parts: list[bytes | None] = [bytes([b]) for b in piece]
    nxt = list(range(1, len(parts))) + [-1]
    prv = list(range(-1, len(parts) - 1))
    heap = []

    def push(i):
        j = nxt[i] if i >= 0 else -1
        if j >= 0 and parts[i] + parts[j] in ranks:
            heapq.heappush(heap, (ranks[parts[i] + parts[j]], i, parts[i], parts[j]))

    for i in range(len(parts) - 1):
        push(i)
    while heap:
        _, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        if parts[i] != left or j < 0 or parts[j] != right:
            continue  # stale: one of the two parts has changed since this entry was pushed
        parts[i], parts[j] = left + right, None
        nxt[i] = nxt[j]
        if nxt[j] >= 0:
            prv[nxt[j]] = i
        push(prv[i])
        push(i)
    return [p for p in parts if p is not None]
'''
MODULE_LEVEL_PRE_SPLIT = '''\
#| export
GPT2_SPLIT = regex.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d"   # contractions
    r"| ?\\p{L}+"                 # letters
    r"| ?\\p{N}+"                 # numbers
    r"| ?[^\\s\\p{L}\\p{N}]+"      # anything else that is not a space
    r"|\\s+(?!\\S)"                # whitespace, leaving one space for the next word
    r"|\\s"                       # any whitespace left
)


def pre_split(text: str) -> list[str]:
    """Cut ``text`` into the pieces GPT-2 encodes separately."""
    return [m.group() for m in GPT2_SPLIT.finditer(text)]
'''

VARIANTS = [
    Variant(
        "minbpe-no-cache",
        "minbpe: merge every occurrence of the best pair per pass; encode_ordinary without a cache",
        cells={"bpe_merge": MINBPE_MERGE},
        edits=(Edit("tokenizer", ENCODE_ORDINARY_BODY, NO_CACHE_ENCODE_ORDINARY),),
    ),
    Variant(
        "possessive-find-bytearray",
        "tiktoken's possessive pattern; special tokens found with str.find; decode_bytes into a bytearray",
        cells={"pre_split": TIKTOKEN_PRE_SPLIT},
        edits=(Edit("tokenizer", ENCODE_BODY, FIND_LOOP_ENCODE),
               Edit("tokenizer", DECODE_BYTES_BODY, BYTEARRAY_DECODE_BYTES)),
    ),
    Variant(
        "min-range",
        "min(range(...), key=rank); decode with bytes.decode(..., 'replace')",
        cells={"bpe_merge": MIN_RANGE_MERGE},
        edits=(Edit("tokenizer", DECODE_BODY,
                    '        return bytes.decode(self.decode_bytes(ids), "utf-8", "replace")\n'),),
    ),
    Variant(
        "heap",
        "a heap of candidate merges; a module-level compiled pattern with finditer; decode_bytes catching KeyError",
        cells={"bpe_merge": HEAP_MERGE, "pre_split": MODULE_LEVEL_PRE_SPLIT},
        edits=(Edit("tokenizer", DECODE_BYTES_BODY, """\
        try:
            return b"".join([self.vocab[i] for i in ids])
        except KeyError as err:
            raise ValueError(f"no token with id {err.args[0]}") from None
"""),),
    ),
]
