"""Chapter 1 (tokens): hidden checks for pre_split, bpe_merge and the Tokenizer, against tiktoken.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, and GPT-2's
merge table they are given is built there too (``make("common.gpt2_ranks")``); tiktoken here gives the answers.
"""
from __future__ import annotations

import functools
import random

import regex
import tiktoken

import coursekit
from autograder.judge import cell, make
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

@cell("test_pre_split")
def check_pre_split(pre_split):
    texts = HIDDEN_TEXTS + _corpus_sample().splitlines(keepends=True)[:80]
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
TOY_CASES = [
    ({b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4}, b"abc", [b"a", b"bc"]),
    ({b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"cd": 4, b"ab": 5, b"abcd": 6}, b"abcd", [b"abcd"]),
    ({b"a": 0, b"aa": 1, b"aaaa": 2}, b"aaaaa", [b"aaaa", b"a"]),
    ({b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4}, b"abc", [b"ab", b"c"]),
    ({b"a": 0, b"b": 1}, b"abba", [b"a", b"b", b"b", b"a"]),
]


@cell("test_bpe_merge")
def check_bpe_merge(bpe_merge):
    for ranks, piece, want in TOY_CASES:
        _check_one_merge(bpe_merge, piece, ranks, want, "a small table")
    enc = _encoding()
    theirs = make("common.gpt2_ranks")  # the same table, on the learner's side
    pieces = {p for text in HIDDEN_TEXTS + [_corpus_sample()] for p in _oracle_pieces(text)}
    for piece in sorted(pieces):
        want = [enc.decode_single_token_bytes(t) for t in enc.encode_ordinary(piece)]
        _check_one_merge(bpe_merge, piece.encode("utf-8"), _ranks(), want, "GPT-2's ranks", theirs)


def _check_one_merge(bpe_merge, piece, ranks, want, table_name, theirs=None):
    """``ranks`` is the table here; ``theirs`` the same table on the learner's side (default: ``ranks`` sent)."""
    got = call(bpe_merge, piece, ranks if theirs is None else theirs, name="bpe_merge")
    if got == want:
        return
    label = f"bpe_merge({show(piece)}, <{table_name}>)"
    if isinstance(got, list) and got and all(isinstance(t, int) for t in got):
        fail(f"{label} returned ids {show(got)}; return the token parts as bytes, e.g. {show(want)}")
    hint = _merge_mistake(bpe_merge, piece, ranks, got)
    if not hint and isinstance(got, list) and b"".join(p for p in got if isinstance(p, bytes)) != piece:
        hint = "the parts, joined, must give back the piece"
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
]


# ---------------------------------------------------------------- the Tokenizer

def _tokenizer(Tokenizer, special_tokens=None):
    return call(Tokenizer, make("common.gpt2_ranks"), dict(special_tokens or {END: 50256}),
                label=f"Tokenizer(<GPT-2's ranks>, {show(dict(special_tokens or {END: 50256}))})")


def _first_wrong_piece(text, got) -> str:
    """Name the first pre-split piece whose ids the learner got wrong."""
    enc, done = _encoding(), 0
    for piece in _oracle_pieces(text):
        ids = enc.encode_ordinary(piece)
        if got[done:done + len(ids)] != ids:
            return f"the first wrong piece is {piece!r}: expected ids {ids}, got {show(got[done:done + len(ids)])}"
        done += len(ids)
    return ""


@cell("test_encode_ordinary")
def check_encode_ordinary(Tokenizer):
    tok = _tokenizer(Tokenizer)
    enc = _encoding()
    for text in HIDDEN_TEXTS + [_corpus_sample(), END, f"a{END}b"]:
        got = call(tok.encode_ordinary, text, name="Tokenizer.encode_ordinary")
        want = enc.encode_ordinary(text)
        if got != want:
            hint = _first_wrong_piece(text, got) if isinstance(got, list) else "return a list of int ids"
            if END in text and isinstance(got, list) and 50256 in got:
                hint = f"encode_ordinary treats {END!r} as plain text; only encode(..., allowed_special=...) makes it id 50256"
            fail(f"Tokenizer.encode_ordinary({show(text)}) returned {show(got)}, expected {show(want)}", hint)


@cell("test_special_tokens")
def check_special_tokens(Tokenizer):
    enc = _encoding()
    tok = _tokenizer(Tokenizer)
    for text in [END, f"{END}{END}", f"a {END} b", f"Chapter one.{END}Chapter two.", f"{END}\n\nNew text",
                 "no special here", "<|endoftext", "<|endoftext|", f"x<{END}>y"]:
        for allowed in ("all", {END}):
            got = call(tok.encode, text, allowed_special=allowed, name="Tokenizer.encode")
            want = enc.encode(text, allowed_special=allowed)
            if got != want:
                hint = ""
                if isinstance(got, list) and got == enc.encode_ordinary(text):
                    hint = f"with allowed_special={allowed!r}, the text {END!r} must become the single id 50256"
                fail(f"Tokenizer.encode({show(text)}, allowed_special={allowed!r}) returned {show(got)}, "
                     f"expected {show(want)}", hint)
    for text in [END, f"hello {END} world", f"trailing{END}"]:
        _expect_value_error(tok.encode, text, END, "Tokenizer.encode",
                            "a special token in the text that is not in allowed_special must raise ValueError "
                            "naming it (tiktoken does the same), never be encoded silently")
    # A tokenizer with a second special token: allowing one must not allow the other.
    extra = {END: 50256, "<|fim|>": 50257}
    tok2 = _tokenizer(Tokenizer, extra)
    enc2 = tiktoken.Encoding(name="gpt2-fim", pat_str=enc._pat_str, mergeable_ranks=_ranks(), special_tokens=extra)
    got = call(tok2.encode, "a<|fim|>b", allowed_special={"<|fim|>"}, name="Tokenizer.encode")
    want = enc2.encode("a<|fim|>b", allowed_special={"<|fim|>"})
    if got != want:
        fail(f"with special tokens {extra}, encode('a<|fim|>b', allowed_special={{'<|fim|>'}}) returned "
             f"{show(got)}, expected {want}", "use the tokenizer's own special_tokens, not a fixed list")
    _expect_value_error(lambda t: tok2.encode(t, allowed_special={"<|fim|>"}), f"a<|fim|>b{END}", END,
                        "Tokenizer.encode", f"only the allowed special tokens may appear; {END!r} was not allowed")


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
        fail(f"{name}({show(text)}) raised {describe_error(err)}; expected ValueError", hint)
    else:
        fail(f"{name}({show(text)}) returned {show(got)}; expected ValueError", hint)


@cell("test_decode")
def check_decode(Tokenizer):
    enc = _encoding()
    tok = _tokenizer(Tokenizer)
    cases = [enc.encode(t) for t in HIDDEN_TEXTS] + [enc.encode(END, allowed_special="all")]
    emoji = enc.encode("🎉👨‍👩‍👧語")
    cases += [emoji[:k] for k in range(1, len(emoji))] + [emoji[1:], emoji[2:3], [31204, 31204, 226]]
    for ids in cases:
        got_bytes = call(tok.decode_bytes, ids, name="Tokenizer.decode_bytes")
        if got_bytes != enc.decode_bytes(ids):
            fail(f"Tokenizer.decode_bytes({show(ids)}) returned {show(got_bytes)}, expected {show(enc.decode_bytes(ids))}",
                 "join the bytes of every token, special tokens included")
        got = call(tok.decode, ids, name="Tokenizer.decode")
        want = enc.decode(ids)
        if got != want:
            raw = enc.decode_bytes(ids)
            hint = ""
            if got == raw.decode("utf-8", errors="ignore"):
                hint = 'you dropped the invalid bytes; like tiktoken, show each as "\\ufffd" (errors="replace")'
            elif got == "".join(enc.decode_bytes([i]).decode("utf-8", errors="replace") for i in ids):
                hint = "you decoded token by token; a character can span several tokens: join all the bytes, then decode once"
            fail(f"Tokenizer.decode({show(ids)}) returned {show(got)}, expected {show(want)}", hint)
    for bad in ([50257], [0, 99999], [-1]):
        try:
            got = tok.decode(bad)
        except ValueError:
            continue
        except Exception as err:
            fail(f"Tokenizer.decode({bad}) raised {describe_error(err)}; expected ValueError naming the id")
        fail(f"Tokenizer.decode({bad}) returned {show(got)}; an id outside the vocabulary must raise ValueError")


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


@cell("test_matches_tiktoken")
def check_matches_tiktoken(Tokenizer, examples: int = 300):
    """On random text, encode equals tiktoken's and decode(encode(text)) == text; the shortest failing text is
    the one reported."""
    enc = _encoding()
    tok = _tokenizer(Tokenizer)
    failures = []
    for text in random_texts(examples):
        got = call(tok.encode_ordinary, text, name="Tokenizer.encode_ordinary")
        want = enc.encode_ordinary(text)
        if got != want:
            failures.append((len(text), text, f"Tokenizer.encode_ordinary({show(text)}) returned {show(got)}; "
                             f"tiktoken gives {show(want)}", _first_wrong_piece(text, got) if isinstance(got, list)
                             else ""))
            continue
        back = call(tok.decode, got, name="Tokenizer.decode")
        if back != text:
            failures.append((len(text), text, f"Tokenizer.decode(encode({show(text)})) gave {show(back)}: decoding "
                             "must give the text back", ""))
    if failures:
        _, _, message, hint = min(failures, key=lambda f: (f[0], f[1]))
        fail(message, hint)
