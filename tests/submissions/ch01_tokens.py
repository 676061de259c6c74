"""Chapter 1 (tokens): realistic learner mistakes, each of which must lose points with a message that names
it, and different-but-correct answers, each of which must get full marks.

Solution cells: `pre_split`, `bpe_merge`, `bpe_merge_fast` (optional, not graded), `tokenizer` (the whole `Tokenizer`
class), `train_bpe` (optional, not graded).
Test cells: test_pre_split, test_bpe_merge, test_encode_ordinary, test_special_tokens, test_decode,
test_matches_tiktoken. The tokenizer's tests use `pre_split` and `bpe_merge`, so a mistake there also costs
their points, with a message that says which of them fails its own test (`judge.because_of`: "it uses your
bpe_merge, ..."); a mistake in the `Tokenizer` must cost nothing in the cells before it. The reference `Tokenizer`
merges with `bpe_merge_fast` (issue 16), the notebook's optional, ungraded challenge: the reference is a learner who
wrote it. A learner who skips it leaves that cell as released (`raise NotImplementedError()`) and their `Tokenizer`
calls their own `bpe_merge` (`CALLS_BPE_MERGE`): full marks (variant required-only), and the mistakes in
`bpe_merge` below are made by such a learner, but for one (bpe-leftmost-fast-tokenizer), who wrote the fast merge
right and `bpe_merge` wrong, and whose `Tokenizer` calls the fast one: only `bpe_merge`'s own test may lose.

Issue 12's classes, each with mutants below: sizes (no ids: decode-empty; a piece longer than any token:
bpe-recursive; nothing allowed: encode-empty-allowed), input types (ids as a tuple: decode-list-only; a tokenizer
made without special tokens, or with others: encode-fixed-special-list), interactions (several allowed special
tokens in one text: encode-one-special), state shared between tokenizers (cache-in-module, cache-on-class,
special-tokens-on-class), behaviour the notebook states (the ranks given are left as they are: specials-into-ranks;
equal ranks merge leftmost first: bpe-ties-rightmost). Numeric range, dtypes of tensors and gradients do not arise
in this chapter: its ids are Python ints, and decode promises nothing for numpy or torch integers.
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
# What the tokenizer's cells say when they lose points through an earlier function (judge.because_of).
USES_BPE = "uses your bpe_merge"
USES_SPLIT = "uses your pre_split"
USES_DECODE = "uses your decode"


def _pattern(new: str) -> Edit:
    return Edit("pre_split", REFERENCE_PATTERN, new)


# Tokenizer method bodies, as they stand in the reference (with the solution markers removed).
ENCODE_CHECKS_DISALLOWED = """\
        disallowed = [token for token in self.special_tokens if token not in allowed and token in text]
        if disallowed:
            token = min(disallowed, key=text.find)  # the first in the text, as tiktoken names it
            raise ValueError(
                f"text contains the special token {token!r}, which is not allowed: pass allowed_special="
                f"{{{token!r}}} to encode it as one token, or disallowed_special=() (or encode_ordinary) to encode "
                "it as plain text")
"""
# The Tokenizer's given lines since issue 17 (tiktoken's disallowed_special and surrogates), and its encode as the
# notebook had it before: a learner's answer written to that contract must keep full marks (variant "before-17").
GIVEN_SURROGATES = """\
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # given: surrogates as tiktoken's
"""
ENCODE_HEAD = '''\
    def encode(self, text: str, allowed_special: set[str] | str = frozenset(),
               disallowed_special: Collection[str] | str = "all") -> list[int]:
        """Token ids of ``text``; the special tokens in ``allowed_special`` (or ``"all"``) become their ids.

        Raises ValueError if ``text`` contains a special token that is not allowed. ``disallowed_special``, as in
        tiktoken, names the special tokens that raise (``"all"``: every one not allowed); the others are plain text.
        """
        if disallowed_special != "all":  # given: tiktoken's finer rule (Step 6)
            return encode_disallowing(self, text, allowed_special, disallowed_special)
'''
BEFORE_17_ENCODE_HEAD = '''\
    def encode(self, text: str, allowed_special: set[str] | str = frozenset()) -> list[int]:
        """Token ids of ``text``; the special tokens in ``allowed_special`` (or ``"all"``) become their ids.

        Raises ValueError if ``text`` contains a special token that is not allowed.
        """
'''
BEFORE_17_CHECKS_DISALLOWED = """\
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
CLASS_DOC = '''    """Byte-level BPE: ``encode`` turns text into token ids and ``decode`` turns ids back into text."""
'''
ENCODE_ORDINARY_BODY = """\
        ids = []
        for piece in pre_split(text):
            piece_ids = self._piece_ids.get(piece)
            if piece_ids is None:
                piece_ids = [self.ranks[part] for part in bpe_merge_fast(piece.encode("utf-8"), self.ranks)]
                if len(self._piece_ids) < 200_000:  # bounded: a long-lived tokenizer must not grow forever
                    self._piece_ids[piece] = piece_ids
            ids.extend(piece_ids)
        return ids
"""
ENCODE_SPLIT = """\
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
# The reference Tokenizer merges with bpe_merge_fast (the optional part); with this edit it calls bpe_merge.
CALLS_BPE_MERGE = Edit("tokenizer", "bpe_merge_fast(piece", "bpe_merge(piece")
BPE_MERGE_BODY = """\
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best = None  # (rank, index) of the mergeable pair learned first
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts
"""

MUTANTS = [
    # ---- bpe_merge: the order of merges
    Mutant(
        "bpe-leftmost",
        "merges the leftmost mergeable pair, not the lowest rank",
        (Edit("bpe_merge", "                best = (rank, i)\n",
              "                best = (rank, i)\n                break  # the first pair that can merge\n"),
         CALLS_BPE_MERGE),
        {"test_bpe_merge": "LOWEST rank", **{t: USES_BPE for t in TOKENIZER_TESTS}},
    ),
    Mutant(
        "bpe-leftmost-fast-tokenizer",
        "merges the leftmost mergeable pair in bpe_merge, but wrote the optional bpe_merge_fast right and its "
        "Tokenizer calls that one: bpe_merge's own test grades bpe_merge, not the fast one",
        (Edit("bpe_merge", "                best = (rank, i)\n",
              "                best = (rank, i)\n                break  # the first pair that can merge\n"),),
        {"test_bpe_merge": "LOWEST rank"},
    ),
    Mutant(
        "bpe-highest-rank",
        "merges the highest rank first",
        (Edit("bpe_merge", "rank < best[0]", "rank > best[0]"), CALLS_BPE_MERGE),
        {"test_bpe_merge": "highest rank first", **{t: USES_BPE for t in TOKENIZER_TESTS}},
    ),
    Mutant(
        "bpe-one-merge",
        "stops after the first merge",
        (Edit("bpe_merge", "        parts[i:i + 2] = [parts[i] + parts[i + 1]]\n",
              "        parts[i:i + 2] = [parts[i] + parts[i + 1]]\n        break\n"), CALLS_BPE_MERGE),
        {"test_bpe_merge": "stopped after one merge", **{t: USES_BPE for t in TOKENIZER_TESTS}},
    ),
    Mutant(
        "bpe-ties-rightmost",
        "among pairs of equal rank (the same pair twice), merges the rightmost: `<=` where `<` belongs",
        (Edit("bpe_merge", "rank < best[0]", "rank <= best[0]"), CALLS_BPE_MERGE),
        # Ties come from runs of one character: the long runs of the encode_ordinary test show them.
        {"test_bpe_merge": "merge the first (leftmost) one", "test_encode_ordinary": USES_BPE},
    ),
    # ---- pre_split: the regular expression
    Mutant(
        "split-no-contractions",
        "pre-split without the contraction alternative",
        (_pattern(r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""),),
        {"test_pre_split": "contractions 's 't 're 've 'm 'll 'd are pieces of their own",
         **{t: USES_SPLIT for t in TEXT_TESTS}},
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
        {"test_pre_split": "Unicode letter", **{t: USES_SPLIT for t in TEXT_TESTS}},
    ),
    Mutant(
        "split-no-space-rule",
        "pre-split without the \\s+(?!\\S) whitespace rule",
        (_pattern(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"""),),
        {"test_pre_split": "the last space joins the word (\\s+(?!\\S))", **{t: USES_SPLIT for t in TOKENIZER_TESTS}},
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
        {"test_decode": "decoded token by token", "test_matches_tiktoken": USES_DECODE},
    ),
    Mutant(
        "decode-keyerror",
        "decode_bytes raises KeyError on an unknown id",
        (Edit("tokenizer", DECODE_BYTES_BODY, '        return b"".join(self.vocab[i] for i in ids)\n'),),
        {"test_decode": "raised KeyError: 50257"},
    ),
    # ---- issue 12: sizes
    Mutant(
        "decode-empty",
        "decode_bytes starts from the first id's bytes, so that no ids at all is an IndexError",
        (Edit("tokenizer", '            return b"".join(self.vocab[i] for i in ids)\n', """\
            out = self.vocab[ids[0]]
            for i in ids[1:]:
                out += self.vocab[i]
            return out
"""),),
        # decode(encode("")) round-trips through it too.
        {"test_decode": "no ids, no text", "test_matches_tiktoken": USES_DECODE},
    ),
    Mutant(
        "bpe-recursive",
        "bpe_merge calls itself once per merge: a piece longer than any token runs past the recursion limit",
        (Edit("bpe_merge", BPE_MERGE_BODY, """\
    return _merge_parts([bytes([b]) for b in piece], ranks)


def _merge_parts(parts: list[bytes], ranks: dict[bytes, int]) -> list[bytes]:
    \"\"\"Merge the lowest-rank pair of neighbours, then merge the rest the same way.\"\"\"
    pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
    if not pairs:
        return parts
    _, i = min(pairs)
    return _merge_parts(parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:], ranks)
"""), CALLS_BPE_MERGE),
        {"test_bpe_merge": "recursion limit", "test_encode_ordinary": USES_BPE},
    ),
    Mutant(
        "encode-empty-allowed",
        "encode builds its special-token pattern even when nothing is allowed ('()', which splits everywhere)",
        (Edit("tokenizer", "        if not allowed:\n            return self.encode_ordinary(text)\n", ""),),
        {"test_special_tokens": "with no special token allowed"},
    ),
    # ---- issue 12: input types
    Mutant(
        "decode-list-only",
        "decode_bytes refuses ids that are not a list (a tuple of ids is a TypeError)",
        (Edit("tokenizer", DECODE_BYTES_BODY, """\
        if not isinstance(ids, list):
            raise TypeError(f"ids must be a list of ints, not {type(ids).__name__}")
""" + DECODE_BYTES_BODY),),
        {"test_decode": "a tuple as well as a list"},
    ),
    Mutant(
        "encode-fixed-special-list",
        "encode checks a fixed list of special tokens (GPT-2's) instead of the tokenizer's own",
        (Edit("tokenizer", "disallowed = [token for token in self.special_tokens if",
              'disallowed = [token for token in ["<|endoftext|>"] if'),),
        # tok2's <|fim|> must raise when it is not allowed: the fixed list lets it through.
        {"test_special_tokens": "not a fixed list"},
    ),
    # ---- issue 12: interactions
    Mutant(
        "encode-one-special",
        "encode splits the text at one allowed special token only",
        (Edit("tokenizer", ENCODE_SPLIT, """\
        token = next(iter(allowed))  # the special token to cut the text at
        ids = []
        for i, part in enumerate(text.split(token)):
            if i:
                ids.append(self.special_tokens[token])
            ids.extend(self.encode_ordinary(part))
        return ids
"""),),
        {"test_special_tokens": "split at every allowed special token"},
    ),
    # ---- issue 12: state shared between tokenizers
    Mutant(
        "cache-on-class",
        "the cache of pieces made a class attribute (the given __init__'s line moved up): every tokenizer shares it",
        (Edit("tokenizer", "        self._piece_ids: dict[str, list[int]] = {}\n", ""),
         Edit("tokenizer", CLASS_DOC, CLASS_DOC + "\n    _piece_ids: dict[str, list[int]] = {}  # ids of pieces merged\n")),
        {"test_encode_ordinary": "your tokenizers share answers"},
    ),
    Mutant(
        "cache-in-module",
        "the cache of pieces is a dict of the module, keyed by the piece alone: every tokenizer shares it",
        (Edit("tokenizer", "#| export\nclass Tokenizer:",
              "#| export\n_PIECE_IDS: dict[str, list[int]] = {}  # the ids of every piece merged so far\n\n\n"
              "class Tokenizer:"),
         Edit("tokenizer", ENCODE_ORDINARY_BODY, ENCODE_ORDINARY_BODY.replace("self._piece_ids", "_PIECE_IDS"))),
        {"test_encode_ordinary": "your tokenizers share answers"},
    ),
    Mutant(
        "special-tokens-on-class",
        "special tokens gathered into a dict of the class: a tokenizer gets those of the ones made before it",
        (Edit("tokenizer", "        self.special_tokens = dict(special_tokens or {})\n",
              "        self.special_tokens.update(special_tokens or {})\n"),
         Edit("tokenizer", CLASS_DOC, CLASS_DOC + "\n    special_tokens: dict[str, int] = {}\n")),
        # The tokenizers of the decode test then know the <|fim|> of the special-token test's.
        {"test_special_tokens": "made without special tokens", "test_decode": "another tokenizer"},
    ),
    # ---- issue 12: behaviour the notebook states (the ranks given are left as they are)
    Mutant(
        "specials-into-ranks",
        "__init__ adds the special tokens to the caller's ranks, to build the vocabulary from one dict",
        (Edit("tokenizer", """\
        self.vocab = {rank: token for token, rank in ranks.items()}  # id -> bytes
        self.vocab.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
""", """\
        for s, i in self.special_tokens.items():  # special tokens are tokens too
            ranks[s.encode("utf-8")] = i
        self.vocab = {rank: token for token, rank in ranks.items()}  # id -> bytes
"""),),
        {"test_special_tokens": "changed the ranks it was given"},
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

# A vocabulary list indexed by id (None where no token has that id); a cache of pieces by functools.lru_cache on a
# method, keyed by (self, piece); special tokens found with finditer; ids checked one by one as they are joined.
LIST_VOCAB_INIT = """\
        size = max([*ranks.values(), *self.special_tokens.values()], default=-1) + 1
        self.vocab: list[bytes | None] = [None] * size  # id -> bytes, None where no token has that id
        for token, rank in ranks.items():
            self.vocab[rank] = token
        for s, i in self.special_tokens.items():
            self.vocab[i] = s.encode("utf-8")
"""
REFERENCE_INIT_TAIL = """\
        self.vocab = {rank: token for token, rank in ranks.items()}  # id -> bytes
        self.vocab.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
        self._piece_ids: dict[str, list[int]] = {}
"""
LRU_ENCODE_ORDINARY = """\
        return [i for piece in pre_split(text) for i in self._piece_ids(piece)]

    @functools.lru_cache(maxsize=2**16)  # keyed by (self, piece): each tokenizer has entries of its own
    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        return tuple(self.ranks[part] for part in bpe_merge(piece.encode("utf-8"), self.ranks))
"""
FINDITER_SPLIT = """\
        pattern = regex.compile("|".join(regex.escape(t) for t in sorted(allowed, key=len, reverse=True)))
        ids, start = [], 0
        for m in pattern.finditer(text):
            ids += self.encode_ordinary(text[start:m.start()])
            ids.append(self.special_tokens[m.group()])
            start = m.end()
        return ids + self.encode_ordinary(text[start:])
"""
LIST_DECODE_BYTES = """\
        out = []
        for i in ids:
            token = self.vocab[i] if isinstance(i, int) and 0 <= i < len(self.vocab) else None
            if token is None:
                raise ValueError(f"token id {i!r} is not in the vocabulary")
            out.append(token)
        return b"".join(out)
"""

# pre_split by regex.split on the pattern in a capture group; bpe_merge from a dict {position: rank} of the pairs
# that can merge; ids checked all at once before joining; decode through str(bytes, encoding, errors).
SPLIT_PRE_SPLIT = '''\
#| export
PIECE = r"""'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""


def pre_split(text: str) -> list[str]:
    """Cut ``text`` into the pieces GPT-2 encodes separately: split at every piece, keep the pieces."""
    return [p for p in regex.split(f"({PIECE})", text) if p]
'''
PAIRS_DICT_MERGE = '''\
#| export
def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Split ``piece`` into tokens by merging neighbouring parts, lowest rank first, until none can merge."""
    parts = [bytes([b]) for b in piece]
    while True:
        pairs = {i: ranks[parts[i] + parts[i + 1]] for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in ranks}
        if not pairs:
            return parts
        i = min(pairs, key=pairs.get)  # the lowest rank; among equal ranks, the first position
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
'''
CHECKED_DECODE_BYTES = """\
        unknown = [i for i in ids if i not in self.vocab]
        if unknown:
            raise ValueError(f"token ids not in the vocabulary: {unknown[:5]}")
        return b"".join(self.vocab[i] for i in ids)
"""

# The optional fast merge as released: a learner who skips it leaves the cell as it is.
UNWRITTEN_FAST_MERGE = '''\
#| export
def bpe_merge_fast(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """The parts ``bpe_merge`` gives, in about n log n steps for a piece of n bytes instead of n * n.

    The parts are a linked list over the piece's bytes and the pairs that can merge wait in a priority queue, so a
    merge changes two links and queues at most two new pairs, instead of looking at every pair again.
    """
    # YOUR CODE HERE
    raise NotImplementedError()
'''

VARIANTS = [
    Variant(
        "required-only",
        "the required exercises only: the optional bpe_merge_fast left as released (raise NotImplementedError()), "
        "the Tokenizer calling the learner's bpe_merge",
        cells={"bpe_merge_fast": UNWRITTEN_FAST_MERGE},
        edits=(CALLS_BPE_MERGE,),
    ),
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
    Variant(
        "list-vocab-lru-cache",
        "a vocabulary list indexed by id; functools.lru_cache on a method; special tokens found with finditer",
        edits=(Edit("tokenizer", "#| export\nclass Tokenizer:", "#| export\nimport functools\n\n\nclass Tokenizer:"),
               Edit("tokenizer", REFERENCE_INIT_TAIL, LIST_VOCAB_INIT),
               Edit("tokenizer", ENCODE_ORDINARY_BODY, LRU_ENCODE_ORDINARY),
               Edit("tokenizer", ENCODE_SPLIT, FINDITER_SPLIT),
               Edit("tokenizer", DECODE_BYTES_BODY, LIST_DECODE_BYTES)),
    ),
    Variant(
        "before-17",
        "the Tokenizer written to the notebook of before issue 17: encode(text, allowed_special) with no given lines "
        "(no disallowed_special, no handling of surrogates), raising for the first special token of its own list",
        edits=(Edit("tokenizer", GIVEN_SURROGATES, ""),
               Edit("tokenizer", ENCODE_HEAD, BEFORE_17_ENCODE_HEAD),
               Edit("tokenizer", ENCODE_CHECKS_DISALLOWED, BEFORE_17_CHECKS_DISALLOWED)),
    ),
    Variant(
        "regex-split-pairs-dict",
        "pre_split with regex.split on a captured pattern; bpe_merge from a dict of mergeable pairs; ids checked "
        "before joining; str(bytes, 'utf-8', 'replace')",
        cells={"pre_split": SPLIT_PRE_SPLIT, "bpe_merge": PAIRS_DICT_MERGE},
        edits=(Edit("tokenizer", DECODE_BYTES_BODY, CHECKED_DECODE_BYTES),
               Edit("tokenizer", DECODE_BODY, '        return str(self.decode_bytes(ids), "utf-8", "replace")\n')),
    ),
]
