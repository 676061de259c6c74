"""Chapter 1 (tokens): hidden checks for pre_split, bpe_merge and the Tokenizer, against tiktoken.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, and the merge
tables they are given are built there too (``make("common.gpt2_ranks")``, ``make("tokens.small_ranks")``);
tiktoken here gives the answers, with the same tables built from the same recipes.

Besides the texts of every kind, the checks use the sizes the contract allows (the empty string, one character, a
piece longer than any token), ids as a tuple, tokenizers with other special tokens or none, and two tokenizers with
different tables side by side (a cache that outlives one tokenizer's table gives the other's ids). The Tokenizer's
cells run the learner's pre_split and bpe_merge: a failure there says so when those fail their own tests.
"""
from __future__ import annotations

import functools
import random

import regex
import tiktoken

import coursekit
from autograder.sandboxed.helpers import tokens as recipes
from autograder.judge import LearnerError, ask, because_of, cell, make, part
from coursekit.testing import call, describe_error, fail, not_written, show

END = "<|endoftext|>"
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")

# Strings the learner never sees: Unicode, emoji, whitespace runs, contractions, digits, code.
HIDDEN_TEXTS = [
    "naïve façade — Ærøskøbing, Zürich", "Привет, мир!", "日本語のテキストです。", "مرحبا بالعالم",
    "e\u0301 vs é", "ﬁne ligatures", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters", "Ω≈ç√∫˜µ≤≥÷",
    "family: 👨‍👩‍👧 flag: 🇫🇷 hands: 👋🏽 robot🤖!", "🎉🎉🎉",
    "a  b", "a   b", "a\t\tb", "line\n\n\nnext", "  leading", "trailing   ", "end \n", "x\r\ny",
    "\u00a0no-break\u00a0space", " \n \n", "   ", "\n", "tab\tand  two", "mixed \t\n whitespace",
    "I'm sure you're right, we've seen they'll go; he'd said it's done, don't!",
    "'s 't 're 've 'm 'll 'd", "I'M SHOUTING, DON'T", "O'Neil's rock 'n' roll", "''quoted'' `ticks`",
    "1234567890", "3.14159", "1,000,000 people", "2026-11-22T12:00", "v2.0.1", "abc123def456", "١٢٣ and ½",
    "def f(x):\n    return x ** 2\n", "if (a != b) { return -1; }", "for i in range(10):\n\tprint(i)",
    "x = {'k': [1, 2]}  # comment", '<div class="x">&amp;</div>', "SELECT * FROM t WHERE id=42;",
    "https://example.com/path?q=1&r=2", "user@example.org", "C:\\Users\\me", "$$\\sum_i x_i^2$$",
    "!!!???...", "--- *** ___", "Hello,world", "  Mixed CASE and camelCase and snake_case",
]
# The smallest texts: nothing, one character of one to four bytes, one space.
SHORT_TEXTS = ["", "x", "é", "語", "🤖", " ", "7"]
# Pieces longer than any token: a letter run that takes 1,500 merges, digits, a whitespace run, symbols.
LONG_PIECE = "a" * 2000
LONG_TEXTS = [LONG_PIECE, "1234567890" * 60, " " * 300 + "x", "ab" * 300 + "!" * 300]
# What the tokenizer's cells ran through the learner's pre_split and bpe_merge.
USES_MERGING = {"pre_split": "test_pre_split", "bpe_merge": "test_bpe_merge"}


# The parts of the cells that run texts of these kinds, with their weights.
EVERY_KIND, SHORTEST, LONGEST = "texts of every kind", "the empty text and one character", "very long texts"
TEXT_PARTS = {EVERY_KIND: 4, SHORTEST: 1, LONGEST: 1}


def _texts() -> list[str]:
    return SHORT_TEXTS + HIDDEN_TEXTS + LONG_TEXTS


def _because(hint: str = "", **uses: str) -> str:
    """``hint``, preceded by which of the learner's functions of earlier cells that this call ran fail their own
    tests (``judge.because_of``): a mistake there is named where it costs points again."""
    return "; ".join(part for part in (because_of(**uses), hint) if part)


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return coursekit.gpt2_encoding()


def _ranks() -> dict[bytes, int]:
    return _encoding()._mergeable_ranks


@functools.cache
def _corpus_sample() -> str:
    """A fixed slice of three works: real text with the usual mix of names, verse and stage directions."""
    texts = coursekit.corpus_texts()
    return "\n".join(texts[w][5_000:9_000] for w in ("hamlet", "sonnets", "tempest"))


def _oracle_pieces(text: str) -> list[str]:
    return regex.findall(_encoding()._pat_str, text)


# ---------------------------------------------------------------- pre_split

@cell("test_pre_split", parts=TEXT_PARTS)
def check_pre_split(pre_split):
    every_kind = HIDDEN_TEXTS + _corpus_sample().splitlines(keepends=True)[:80]
    for name, texts in ((SHORTEST, SHORT_TEXTS), (EVERY_KIND, every_kind), (LONGEST, LONG_TEXTS)):
        with part(name):
            for text in texts:
                got = call(pre_split, text, name="pre_split")
                want = _oracle_pieces(text)
                if got != want:
                    fail(f"pre_split({show(text)}) returned {show(got)}, expected {show(want)}",
                         _pre_split_hint(text, got, want))


def _pre_split_hint(text, got, want) -> str:
    if not isinstance(got, list) or not all(isinstance(p, str) for p in got):
        return "return a list of str pieces"
    if "".join(got) != text:
        return f"joined, your pieces give {show(''.join(got))}: the pieces must cover the whole text, whitespace included"
    i = next(i for i in range(min(len(got), len(want)) + 1) if i == len(got) or i == len(want) or got[i] != want[i])
    g = got[i] if i < len(got) else ""
    w = want[i] if i < len(want) else ""
    if w in CONTRACTIONS or any(g.startswith(c) and len(g) > len(c) for c in CONTRACTIONS):
        return f"the first wrong piece is {g!r} (expected {w!r}): contractions 's 't 're 've 'm 'll 'd are pieces of their own"
    if g[:2].lower() in {"'s", "'t", "'m", "'d"} or g[:3].lower() in {"'re", "'ve", "'ll"}:
        return f"the first wrong piece is {g!r} (expected {w!r}): contractions are matched in lower case only"
    if w.isspace() or g.isspace() or w[:1].isspace() != g[:1].isspace():
        return (f"the first wrong piece is {g!r} (expected {w!r}): in a run of whitespace before a word the last space "
                "joins the word (\\s+(?!\\S)); other whitespace, newlines and tabs included, forms pieces of its own")
    if any(c.isdigit() for c in g + w):
        return f"the first wrong piece is {g!r} (expected {w!r}): runs of digits (\\p{{N}}) are pieces separate from letters"
    if any(ord(c) > 127 for c in g + w):
        return (f"the first wrong piece is {g!r} (expected {w!r}): letters and numbers mean any Unicode letter \\p{{L}} "
                "or number \\p{N}, which the regex module knows and re does not")
    return f"the first wrong piece is {g!r}, expected {w!r}"


# ---------------------------------------------------------------- bpe_merge

# Small tables where the common mistakes give other answers than the right merge order.
ORDER_CASES = [
    ({b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4}, b"abc", [b"a", b"bc"]),
    ({b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"cd": 4, b"ab": 5, b"abcd": 6}, b"abcd", [b"abcd"]),
    ({b"a": 0, b"aa": 1, b"aaaa": 2}, b"aaaaa", [b"aaaa", b"a"]),
    ({b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4}, b"abc", [b"ab", b"c"]),
    ({b"a": 0, b"b": 1}, b"abba", [b"a", b"b", b"b", b"a"]),
]
# The sizes: no byte, one byte, two bytes that merge.
SIZE_CASES = [
    ({b"a": 0, b"b": 1, b"ab": 2}, b"", []),
    ({b"a": 0, b"b": 1, b"ab": 2}, b"b", [b"b"]),
    ({b"a": 0, b"b": 1, b"ab": 2}, b"ab", [b"ab"]),
]
TOY_CASES = ORDER_CASES + SIZE_CASES
MERGE_PARTS = {"GPT-2's ranks on the pieces of real text": 3, "the order of merges on small tables": 2,
               "no byte, one byte, two bytes": 1, "pieces longer than any token": 1}


@cell("test_bpe_merge", parts=MERGE_PARTS)
def check_bpe_merge(bpe_merge):
    with part("the order of merges on small tables"):
        for ranks, piece, want in ORDER_CASES:
            _check_one_merge(bpe_merge, piece, ranks, want, "a small table")
    with part("no byte, one byte, two bytes"):
        for ranks, piece, want in SIZE_CASES:
            _check_one_merge(bpe_merge, piece, ranks, want, "a small table")
    enc = _encoding()
    theirs = make("common.gpt2_ranks")  # the same table, on the learner's side
    pieces = sorted({p for text in _texts() + [_corpus_sample()] for p in _oracle_pieces(text)})
    for name, long in (("GPT-2's ranks on the pieces of real text", False), ("pieces longer than any token", True)):
        with part(name):
            chosen = [piece for piece in pieces if (len(piece) > 100) == long]  # LONG_TEXTS' pieces, and no others
            given = _answers(bpe_merge, [piece.encode("utf-8") for piece in chosen], theirs)
            for i, piece in enumerate(chosen):
                want = [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(piece)]
                _check_one_merge(bpe_merge, piece.encode("utf-8"), _ranks(), want, "GPT-2's ranks", theirs,
                                 *given[i:i + 1])


def _answers(fn, inputs: list, *args) -> list:
    """What ``fn(x, *args)`` returned for each x of ``inputs``, asked in one request where a call a piece is a round
    trip (a thousand a notebook): those up to the first call that raised, which the caller makes again on its own."""
    try:
        got = ask("tokens.answers", fn, inputs, *args)
    except LearnerError:  # what came back could not cross: each call on its own says what
        return []
    return got if isinstance(got, list) and len(got) <= len(inputs) else []


def _check_one_merge(bpe_merge, piece, ranks, want, table_name, theirs=None, *answer):
    """``ranks`` is the table here; ``theirs`` the same table on the learner's side (default: ``ranks`` sent);
    ``answer``: what bpe_merge returned for the piece, if it was asked already (``_answers``)."""
    label = f"bpe_merge({show(piece)}, <{table_name}>)"
    try:
        got = answer[0] if answer else call(bpe_merge, piece, ranks if theirs is None else theirs, label=label)
    except AssertionError as err:
        if isinstance(err.__cause__, RecursionError):
            fail(str(err), f"this piece of {len(piece):,} bytes is longer than any token and takes "
                 f"{len(piece) - len(want):,} merges: a function that calls itself once per merge runs past Python's "
                 "recursion limit (1,000 calls); merge in a loop")
        raise
    if got == want:
        return
    if isinstance(got, list) and got and all(isinstance(t, int) for t in got):
        fail(f"{label} returned ids {show(got)}; return the token parts as bytes, e.g. {show(want)}")
    hint = _merge_mistake(bpe_merge, piece, ranks, got)
    if not hint and isinstance(got, list) and b"".join(p for p in got if isinstance(p, bytes)) != piece:
        hint = "the parts, joined, must give back the piece"
    if not hint and not isinstance(got, list):
        hint = "return the parts as a list of bytes"
    fail(f"{label} returned {show(got)}, expected {show(want)}", hint)


def _merge_mistake(bpe_merge, piece, ranks, got) -> str:
    """The explanation of the mistake that gives ``got``. Several can give the same answer on one piece
    (on b"abc", merging the leftmost pair and merging the highest rank both give ab + c): then the one
    that gives the learner's answers on the most small tables wins."""
    explaining = [(mistake, why) for mistake, why in _MERGE_MISTAKES if mistake(piece, ranks) == got]
    if not explaining:
        return ""
    answers = [(p, r, _answer(bpe_merge, p, r)) for r, p, _ in TOY_CASES]
    _, why = max(explaining, key=lambda m: sum(m[0](p, r) == answer for p, r, answer in answers))
    return why


def _answer(bpe_merge, piece, ranks):
    try:
        return bpe_merge(piece, ranks)
    except Exception as err:  # noqa: BLE001 (a crash is an answer no mistake above gives)
        return err


def _merge_loop(piece, ranks, choose, once=False):
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        candidates = [(ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                      if parts[i] + parts[i + 1] in ranks]
        if not candidates:
            break
        _, i = choose(candidates)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if once:
            break
    return parts


def _left_to_right_pass(piece, ranks):
    parts = [bytes([b]) for b in piece]
    out = []
    for p in parts:
        if out and out[-1] + p in ranks:
            out[-1] += p
        else:
            out.append(p)
    return out


_MERGE_MISTAKES = [
    (lambda p, r: _merge_loop(p, r, lambda c: min(c, key=lambda x: x[1])),
     "you merged the leftmost pair that can merge; BPE merges the pair with the LOWEST rank first, wherever it is"),
    (lambda p, r: _merge_loop(p, r, lambda c: max(c, key=lambda x: (x[0], -x[1]))),  # ties: the leftmost
     "you merged the highest rank first; a lower rank was learned earlier and must be merged first"),
    (lambda p, r: _merge_loop(p, r, min, once=True),
     "you stopped after one merge; keep merging until no neighbouring pair is in ranks"),
    (_left_to_right_pass,
     "you merged greedily in one pass from the left; repeat: find the lowest-rank pair, merge it, look again"),
    (lambda p, r: _merge_loop(p, r, lambda c: min(c, key=lambda x: (x[0], -x[1]))),
     "where the same pair occurs several times (equal ranks), you merged the last one; merge the first (leftmost) "
     "one, as tiktoken does: compare ranks with <, not <="),
]


# ---------------------------------------------------------------- the Tokenizer

def _tokenizer(Tokenizer, special_tokens=None, ranks=None):
    """The learner's Tokenizer of GPT-2's ranks (``ranks``: that table on the learner's side, default a new one) and
    ``special_tokens`` (default GPT-2's; ``{}``: none given at all, ``Tokenizer(ranks)``)."""
    ranks = make("common.gpt2_ranks") if ranks is None else ranks
    special = {END: 50256} if special_tokens is None else dict(special_tokens)
    if not special:
        return call(Tokenizer, ranks, label="Tokenizer(<GPT-2's ranks>)")
    return call(Tokenizer, ranks, special, label=f"Tokenizer(<GPT-2's ranks>, {show(special)})")


SMALL_END = len(recipes.small_ranks())  # <|endoftext|> in the small table: the id after its last token
# A text whose pieces occur in no other test of the chapter (a shared cache leaks only here).
PROBE = "Zyzzyva quokka"


@functools.cache
def _small_encoding() -> tiktoken.Encoding:
    """tiktoken with the small table of ``autograder.sandboxed.helpers.tokens`` (the learner's side builds the same)."""
    return tiktoken.Encoding(name="course-small", pat_str=_encoding()._pat_str, mergeable_ranks=recipes.small_ranks(),
                             special_tokens={END: SMALL_END})


def _small_tokenizer(Tokenizer):
    return call(Tokenizer, make("tokens.small_ranks"), {END: SMALL_END},
                label=f"Tokenizer(<a small table of {SMALL_END} tokens>, {show({END: SMALL_END})})")


def _first_wrong_piece(text, got) -> str:
    """Name the first pre-split piece whose ids the learner got wrong."""
    enc, done = _encoding(), 0
    for piece in _oracle_pieces(text):
        ids = enc.encode_ordinary(piece)
        if got[done:done + len(ids)] != ids:
            return (f"the first wrong piece is {show(piece)}: expected ids {show(ids)}, "
                    f"got {show(got[done:done + len(ids)])}")
        done += len(ids)
    return ""


END_AS_TEXT, TABLES_APART = f"{END} as plain text", "two tokenizers with different tables"


@cell("test_encode_ordinary", parts={**TEXT_PARTS, END_AS_TEXT: 1, TABLES_APART: 1})
def check_encode_ordinary(Tokenizer):
    tok = _tokenizer(Tokenizer)
    enc = _encoding()
    for name, texts in ((SHORTEST, SHORT_TEXTS), (EVERY_KIND, HIDDEN_TEXTS + [_corpus_sample()]),
                        (LONGEST, LONG_TEXTS), (END_AS_TEXT, [END, f"a{END}b"])):
        with part(name):
            for text in texts:
                got = call(tok.encode_ordinary, text, name="Tokenizer.encode_ordinary",
                           hint=_because(**USES_MERGING))
                want = enc.encode_ordinary(text)
                if got != want:
                    hint = _first_wrong_piece(text, got) if isinstance(got, list) else "return a list of int ids"
                    if END in text and isinstance(got, list) and 50256 in got:
                        hint = (f"encode_ordinary treats {END!r} as plain text; only encode(..., allowed_special=...) "
                                "makes it id 50256")
                    fail(f"Tokenizer.encode_ordinary({show(text)}) returned {show(got)}, expected {show(want)}",
                         _because(hint, **USES_MERGING))
    with part(TABLES_APART):
        _check_tables_apart(tok, _small_tokenizer(Tokenizer))


def _check_tables_apart(tok, small):
    """Two tokenizers with different tables, used in turn on the same text: each must give its own table's ids.
    A cache of pieces kept at class or module level, keyed by the piece alone, hands one the other's ids."""
    wants = {"small": _small_encoding().encode_ordinary(PROBE), "GPT-2": _encoding().encode_ordinary(PROBE)}
    tables = {"small": "a small table", "GPT-2": "GPT-2's ranks"}
    for name, t in (("small", small), ("GPT-2", tok), ("small", small)):
        label = f"Tokenizer(<{tables[name]}>, ...).encode_ordinary"
        got = call(t.encode_ordinary, PROBE, name=label, hint=_because(**USES_MERGING))
        if got == wants[name]:
            continue
        other = "GPT-2" if name == "small" else "small"
        hint = _first_wrong_piece(PROBE, got) if name == "GPT-2" and isinstance(got, list) else ""
        if got == wants[other]:
            hint = (f"that is what the other tokenizer (of {tables[other]}) gives: "
                    "your tokenizers share answers. A cache of pieces belongs to one tokenizer (self._piece_ids, made "
                    "in the given __init__), not to the class or the module: another table gives other ids")
        fail(f"{label}({show(PROBE)}) returned {show(got)}, expected {show(wants[name])} (two tokenizers with "
             "different tables, used in turn)", _because(hint, **USES_MERGING))


USES_ENCODE_ORDINARY = {**USES_MERGING, "encode_ordinary": "test_encode_ordinary"}
FIM = "<|fim|>"
SPECIAL_PARTS = {"allowed special tokens become their ids": 3, "nothing allowed: encode_ordinary's ids": 1,
                 "errors for special tokens not allowed": 2, "a tokenizer with two special tokens": 1,
                 "special tokens are each tokenizer's own": 1, "the ranks given are left as they are": 1}


@cell("test_special_tokens", parts=SPECIAL_PARTS)
def check_special_tokens(Tokenizer):
    enc = _encoding()
    ranks = make("common.gpt2_ranks")
    tok = _tokenizer(Tokenizer, ranks=ranks)
    extra = {END: 50256, FIM: 50257}
    tok2 = _tokenizer(Tokenizer, extra, ranks=ranks)  # the same table, another special token
    bare = _tokenizer(Tokenizer, {}, ranks=ranks)  # no special tokens at all
    texts = [END, f"{END}{END}", f"a {END} b", f"Chapter one.{END}Chapter two.", f"{END}\n\nNew text",
             "no special here", "<|endoftext", "<|endoftext|", f"x<{END}>y", "", f"!{END}", f"{END}!",
             f"a  {END}  b", f"{END}\n{END}"]
    with part("allowed special tokens become their ids"):
        for text in texts:
            for allowed in ("all", {END}, frozenset({END})):
                _expect_encoding(tok, text, allowed, enc.encode(text, allowed_special=allowed),
                                 f"with allowed_special={allowed!r}, the text {END!r} must become the single id 50256")
    # Nothing allowed (the default, or an empty set): the same ids as encode_ordinary, on text with no special token.
    with part("nothing allowed: encode_ordinary's ids"):
        for text in ["", "x", "Hello world", "no special here", "a  b\n", "<|endoftext", LONG_TEXTS[1]]:
            for allowed in (None, set(), frozenset()):
                got = call(tok.encode, text, name="Tokenizer.encode", hint=_because(
                    "with no special token allowed (the default, or an empty set), encode gives encode_ordinary's ids",
                    **USES_ENCODE_ORDINARY), **({} if allowed is None else {"allowed_special": allowed}))
                want = enc.encode_ordinary(text)
                if got != want:
                    args = show(text) + ("" if allowed is None else f", allowed_special={allowed!r}")
                    fail(f"Tokenizer.encode({args}) returned {show(got)}, expected {show(want)}", _because(
                        "with no special token allowed (the default, or an empty set), encode gives "
                        "encode_ordinary's ids", **USES_ENCODE_ORDINARY))
    with part("errors for special tokens not allowed"):
        for text in [END, f"hello {END} world", f"trailing{END}"]:
            _expect_value_error(tok.encode, text, END, "Tokenizer.encode",
                                "a special token in the text that is not in allowed_special must raise ValueError "
                                "naming it (tiktoken does the same), never be encoded silently")
    # A tokenizer with a second special token: allowing one must not allow the other, and "all" allows both.
    enc2 = tiktoken.Encoding(name="gpt2-fim", pat_str=enc._pat_str, mergeable_ranks=_ranks(), special_tokens=extra)
    with part("a tokenizer with two special tokens"):
        got = call(tok2.encode, f"a{FIM}b", allowed_special={FIM}, name="Tokenizer.encode")
        want = enc2.encode(f"a{FIM}b", allowed_special={FIM})
        if got != want:
            fail(f"with special tokens {extra}, encode('a{FIM}b', allowed_special={{'{FIM}'}}) returned "
                 f"{show(got)}, expected {want}", _because("use the tokenizer's own special_tokens, not a fixed list",
                                                           **USES_ENCODE_ORDINARY))
        _expect_value_error(lambda t: tok2.encode(t, allowed_special={FIM}), f"a{FIM}b{END}", END,
                            "Tokenizer.encode", f"only the allowed special tokens may appear; {END!r} was not allowed")
        _expect_value_error(lambda t: tok2.encode(t, allowed_special={END}), f"a{FIM}b", FIM, "Tokenizer.encode",
                            f"this tokenizer's special tokens are {list(extra)}: {FIM!r} was not allowed; check every "
                            "one of the tokenizer's own special tokens, not a fixed list")
        for text in [f"x{END}y{FIM}z", f"{FIM}{END}{FIM}", f"{FIM} a {END}"]:
            _expect_encoding(tok2, text, "all", enc2.encode(text, allowed_special="all"),
                             "several special tokens are allowed here: the text must be split at every allowed "
                             "special token, each one becoming its own id", special_tokens=extra)
    # No special tokens: <|endoftext|> is plain text, allowed or not; and tok2's <|fim|> is not tok's.
    with part("special tokens are each tokenizer's own"):
        for text, allowed in [(f"a{END}b", None), (f"a{END}b", "all"), (FIM, "all")]:
            kwargs = {} if allowed is None else {"allowed_special": allowed}
            label = "Tokenizer(<GPT-2's ranks>).encode"
            want = enc.encode_ordinary(text)
            why = (f"a tokenizer made without special tokens has none: {text!r} is plain text to it. Use the "
                   "tokenizer's own special_tokens (a dict of its own, made in __init__), never a fixed list or one "
                   "shared with other tokenizers")
            got = call(bare.encode, text, name=label, hint=why, **kwargs)
            if got != want:
                fail(f"{label}({show(text)}{'' if allowed is None else ', allowed_special=' + repr(allowed)}) "
                     f"returned {show(got)}, expected {show(want)}", _because(why, **USES_ENCODE_ORDINARY))
        _expect_encoding(tok, FIM, "all", enc.encode(FIM, allowed_special="all"),
                         f"{FIM!r} is a special token of another tokenizer (made with {extra}), not of this one: keep "
                         "special tokens on self, in a dict of its own, not in a class attribute or a default "
                         "argument", always=True)
    # The table given is the caller's: other tokenizers may share it. Checked after each tokenizer that shares it
    # encoded a text (whatever ids it gave), so that a tokenizer that cannot encode yet earns nothing here.
    with part("the ranks given are left as they are"):
        for t, special in ((tok, {END: 50256}), (tok2, extra)):
            call(t.encode, f"{''.join(special)} after", allowed_special="all", name="Tokenizer.encode",
                 hint=_because(**USES_ENCODE_ORDINARY))
        got = ask("tokens.fingerprint", ranks)
        if got != _ranks_fingerprint():
            fail(f"Tokenizer(ranks, special_tokens) changed the ranks it was given (now {got[0]:,} entries, expected "
                 f"{len(_ranks()):,})", "other tokenizers may share the same ranks: leave the table as it is, and put "
                                        "the special tokens in a dict of your own (self.vocab maps every id to its "
                                        "bytes)")


@functools.cache
def _ranks_fingerprint() -> list:
    return recipes.fingerprint(_ranks())


def _expect_encoding(tok, text, allowed, want, hint, special_tokens=None, always=False):
    """tok.encode(text, allowed_special=allowed) == want; ``hint`` when an allowed special token of the text was
    encoded as text (or ``always``)."""
    got = call(tok.encode, text, allowed_special=allowed, name="Tokenizer.encode",
               hint=_because(**USES_ENCODE_ORDINARY))
    if got == want:
        return
    specials = special_tokens or {END: 50256}
    as_text = isinstance(got, list) and any(token in text and i not in got for token, i in specials.items())
    why = hint if always or as_text or got == _encoding().encode_ordinary(text) else ""
    where = f" (special tokens {special_tokens})" if special_tokens else ""
    fail(f"Tokenizer.encode({show(text)}, allowed_special={allowed!r}){where} returned {show(got)}, expected "
         f"{show(want)}", _because(why, **USES_ENCODE_ORDINARY))


def _expect_value_error(fn, text, token, name, hint):
    try:
        got = fn(text)
    except NotImplementedError as err:
        raise not_written(f"{name}({show(text)})", err) from None
    except ValueError as err:
        if token not in str(err):
            fail(f"{name}({show(text)}) raised ValueError({str(err)!r}); its message should name {token!r}")
        return
    except Exception as err:
        if getattr(err, "grader_side", False):
            raise
        fail(f"{name}({show(text)}) raised {describe_error(err)}; expected ValueError", hint)
    else:
        fail(f"{name}({show(text)}) returned {show(got)}; expected ValueError", hint)


DECODE_PARTS = {"ids of every kind": 3, "no ids": 1, "ids as a tuple": 1, "errors for ids outside the vocabulary": 1,
                "a tokenizer of another table": 1}


@cell("test_decode", parts=DECODE_PARTS)
def check_decode(Tokenizer):
    enc = _encoding()
    tok = _tokenizer(Tokenizer)
    with part("no ids"):
        for method, fn, want in (("decode_bytes", tok.decode_bytes, b""), ("decode", tok.decode, "")):
            hint = f"no ids, no text: {method}([]) is {want!r}"
            got = call(fn, [], name=f"Tokenizer.{method}", hint=hint)
            if got != want:
                fail(f"Tokenizer.{method}([]) returned {show(got)}, expected {want!r}", hint)
    cases = [enc.encode(t) for t in SHORT_TEXTS + HIDDEN_TEXTS] + [enc.encode(END, allowed_special="all")]
    emoji = enc.encode("🎉👨‍👩‍👧語")
    cases += [emoji[:k] for k in range(1, len(emoji))] + [emoji[1:], emoji[2:3], [31204, 31204, 226]]
    with part("ids of every kind"):
        for ids in cases:
            got_bytes = call(tok.decode_bytes, ids, name="Tokenizer.decode_bytes")
            if got_bytes != enc.decode_bytes(ids):
                fail(f"Tokenizer.decode_bytes({show(ids)}) returned {show(got_bytes)}, expected "
                     f"{show(enc.decode_bytes(ids))}", "join the bytes of every token, special tokens included")
            got = call(tok.decode, ids, name="Tokenizer.decode")
            want = enc.decode(ids)
            if got != want:
                raw = enc.decode_bytes(ids)
                hint = ""
                if got == raw.decode("utf-8", errors="ignore"):
                    hint = 'you dropped the invalid bytes; like tiktoken, show each as "\\ufffd" (errors="replace")'
                elif got == "".join(enc.decode_bytes([i]).decode("utf-8", errors="replace") for i in ids):
                    hint = ("you decoded token by token; a character can span several tokens: join all the bytes, "
                            "then decode once")
                fail(f"Tokenizer.decode({show(ids)}) returned {show(got)}, expected {show(want)}", hint)
    # ids as a tuple: any sequence of ints
    with part("ids as a tuple"):
        for ids in ([15496, 995], emoji, enc.encode("naïve café 🤖", allowed_special="all") + [50256]):
            for name, fn, want in (("Tokenizer.decode_bytes", tok.decode_bytes, enc.decode_bytes(ids)),
                                   ("Tokenizer.decode", tok.decode, enc.decode(ids))):
                hint = "ids may come as a tuple as well as a list (any sequence of ints): iterate over them"
                got = call(fn, tuple(ids), name=name, hint=hint)
                if got != want:
                    fail(f"{name}({show(tuple(ids))}) returned {show(got)}, expected {show(want)}", hint)
    with part("errors for ids outside the vocabulary"):
        for bad in ([50257], [0, 99999], [-1]):
            _expect_bad_ids(tok, bad, "Tokenizer")
    # Another table, another vocabulary: its ids and special token are its own.
    with part("a tokenizer of another table"):
        small, small_enc = _small_tokenizer(Tokenizer), _small_encoding()
        label = "Tokenizer(<a small table>, ...).decode"
        for ids in (small_enc.encode(f"Zyzzyva and the quokka{END}", allowed_special="all"), [SMALL_END]):
            got = call(small.decode, ids, name=label)
            if got != small_enc.decode(ids):
                fail(f"{label}({show(ids)}) returned {show(got)}, expected {show(small_enc.decode(ids))}",
                     "decode with this tokenizer's own vocabulary (made in __init__ from its ranks and special tokens)")
        _expect_bad_ids(small, [50256], "Tokenizer(<a small table>, ...)")


def _expect_bad_ids(tok, bad, who):
    """decode(bad) must raise ValueError: an id outside this tokenizer's vocabulary."""
    try:
        got = tok.decode(bad)
    except NotImplementedError as err:
        raise not_written(f"{who}.decode({bad})", err) from None
    except ValueError:
        return
    except Exception as err:
        if getattr(err, "grader_side", False):
            raise
        fail(f"{who}.decode({bad}) raised {describe_error(err)}; expected ValueError",
             "an id outside the vocabulary must raise ValueError")
    hint = ""
    if isinstance(got, str) and got.startswith("<|") and got.endswith("|>"):
        hint = (f"{got!r} is not a special token of this tokenizer: did it come from another tokenizer made before? "
                "Keep special tokens on self, in a dict of its own made in __init__, not in a class attribute")
    fail(f"{who}.decode({bad}) returned {show(got)}; an id outside the vocabulary must raise ValueError", hint)


# Pieces of text that exercise the pre-split rules when strung together at random.
FRAGMENTS = ["the", " the", "'s", "'ll", " ", "  ", "\n", "\t", "7", "42", "é", "語", "🤖", "!", "?!", ".", "don", "t",
             "Hello", "WORLD", "_", "-", "\u00a0", "x2"]


def random_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts drawn with a fixed seed: half any Unicode (no lone surrogates), half strings of FRAGMENTS."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        size = rng.randrange(0, 41)
        if i % 2:
            texts.append("".join(rng.choice(FRAGMENTS) for _ in range(size % 13)))
            continue
        chars = []
        while len(chars) < size:
            c = chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x3000),
                                rng.randrange(0x1F300, 0x1FAFF), rng.randrange(0, 32))))
            if not 0xD800 <= ord(c) <= 0xDFFF:
                chars.append(c)
        texts.append("".join(chars))
    return texts


MATCHES, ROUND_TRIP = "the same ids as tiktoken on random text", "decode(encode(text)) gives the text back"


@cell("test_matches_tiktoken", parts={MATCHES: 3, ROUND_TRIP: 1})
def check_matches_tiktoken(Tokenizer, examples: int = 300):
    """On random text, encode equals tiktoken's, and decode(encode(text)) == text with the learner's own ids; in
    each part the shortest failing text is the one reported."""
    enc = _encoding()
    tok = _tokenizer(Tokenizer)
    texts = random_texts(examples)
    encoded = {}  # text -> the learner's ids, for the round trip
    with part(MATCHES):
        failures = []
        for text in texts:
            got = encoded[text] = call(tok.encode_ordinary, text, name="Tokenizer.encode_ordinary",
                                       hint=_because(**USES_ENCODE_ORDINARY))
            want = enc.encode_ordinary(text)
            if got != want:
                hint = _first_wrong_piece(text, got) if isinstance(got, list) else ""
                failures.append((len(text), text, f"Tokenizer.encode_ordinary({show(text)}) returned {show(got)}; "
                                 f"tiktoken gives {show(want)}", _because(hint, **USES_ENCODE_ORDINARY)))
        _shortest(failures)
    with part(ROUND_TRIP):
        failures = []
        for text in texts:
            ids = encoded[text] if text in encoded else call(
                tok.encode_ordinary, text, name="Tokenizer.encode_ordinary", hint=_because(**USES_ENCODE_ORDINARY))
            back = call(tok.decode, ids, name="Tokenizer.decode", hint=_because(decode="test_decode"))
            if back != text:
                failures.append((len(text), text, f"Tokenizer.decode(encode({show(text)})) gave {show(back)}: "
                                 "decoding must give the text back", _because(decode="test_decode")))
        _shortest(failures)


def _shortest(failures: list[tuple]) -> None:
    """Fail with the failure (length, text, message, hint) of the shortest text, if any."""
    if failures:
        _, _, message, hint = min(failures, key=lambda f: (f[0], f[1]))
        fail(message, hint)
