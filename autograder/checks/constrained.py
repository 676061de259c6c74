"""Chapter 9 (constrained decoding): hidden checks for the choice mask, the plain regex mask, the trie and the fast
mask, the schema's pattern, and the constrained generation loop.

The oracles are external and brute force. A mask is checked token by token: for a choice list, whether some
choice starts with ``written + token``; for a pattern, the `regex` package's ``fullmatch(..., partial=True)`` on
``written + token`` (with ``regex.ASCII``), where a token that ends inside a character is tried with the
characters that can finish it (``could_match``). A schema's pattern is run by `regex` on texts that ``json.dumps``
writes (they must match) and on near misses that ``json.loads`` refuses or that break the schema (they must not);
it must also be in the subset of the notebook's given compiler. Generation is compared with Hugging Face's
``generate(..., prefix_allowed_tokens_fn=...)``, token for token, greedy and seeded sampling, with a constraint
that follows a script (``helpers.constrained.Scripted``: the tokens allowed at each step), so that the loop is
graded on its own and not through the learner's masks.

The learner's functions are stand-ins (``autograder.judge.Remote``) and so are the objects they are given or
build: GPT-2's vocabulary (``helpers.constrained.gpt2_vocab``), the learner's trie and DFAs (built by the
learner's ``build_trie`` and the notebook's given ``compile_regex``), the random GPT-2 (``helpers.samplers``) and
the scripted constraint. Nothing here imports ``minigpt.constrained``.

No test cell's check calls a function of another test cell: the choice and plain masks are their own; the fast
mask uses the learner's trie of the same cell; the loop gets a scripted constraint. So a mistake costs points in
one cell. When a mask is wrong, the check names the known mistake whose answer it is, from the tokens it allows
and misses.
"""
from __future__ import annotations

import functools
import itertools
import json

import regex
import torch
# Here, not in the checks: transformers' lazy imports race in a judge's threads.
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401  (what the models' recipe builds here)

from autograder.checks import once
from autograder.sandboxed.helpers import constrained as recipes
from autograder.sandboxed.helpers import samplers as gpt_recipes
from autograder.judge import Remote, ask, cell, learner_side, make, part, seeded
from coursekit.testing import call, describe_error, fail, not_written, quiet_transformers, show

END = 50256

# ---------------------------------------------------------------- the oracle: regex on every token


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str):
    """``pattern`` compiled once (ASCII classes): the oracles try it on every token of GPT-2's vocabulary, and
    ``regex.fullmatch(pattern, ...)`` pays the module's cache lookup at each call (half their time)."""
    return regex.compile(pattern, flags=regex.ASCII)


def full(pattern: str, text: str) -> bool:
    return _compiled(pattern).fullmatch(text) is not None


def partial(pattern: str, text: str) -> bool:
    return _compiled(pattern).fullmatch(text, partial=True) is not None


@functools.lru_cache(maxsize=4096)
def completions(pattern: str, tail: bytes) -> tuple[str, ...]:
    """Characters whose UTF-8 starts with ``tail`` (the start of one character): the pattern's own characters
    that do, and the first three others. In the course's subset, classes hold ASCII ranges and single characters,
    so the non-ASCII characters a pattern does not name are all treated alike: one stands for them all (three, to
    be sure)."""
    named = [c for c in sorted(set(pattern)) if ord(c) > 127 and c.encode() != tail and c.encode().startswith(tail)]
    length = 2 if tail[0] < 0xE0 else 3 if tail[0] < 0xF0 else 4
    others = []
    for rest in itertools.product(range(0x80, 0xC0), repeat=length - len(tail)):
        try:
            c = (tail + bytes(rest)).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if c not in named:
            others.append(c)
            if len(others) == 3:
                break
    return tuple(named + others)


def could_match(pattern: str, data: bytes) -> bool:
    """Whether some text that starts with the bytes ``data`` fully matches ``pattern``."""
    try:
        return partial(pattern, data.decode("utf-8"))
    except UnicodeDecodeError as err:
        if err.end != len(data) or "unexpected end" not in err.reason:
            return False  # bytes that no text holds
        text, tail = data[:err.start].decode("utf-8"), data[err.start:]
    return partial(pattern, text) and any(partial(pattern, text + c) for c in completions(pattern, tail))


def brute_force(pattern: str, written: bytes, vocab: list[bytes | None], eos_ids=(END,)) -> set[int]:
    """The tokens allowed after ``written``, each checked on its own; the end-of-text ids when ``written`` is a
    full match."""
    allowed = {i for i, piece in enumerate(vocab) if piece and could_match(pattern, written + piece)}
    try:
        if full(pattern, written.decode("utf-8")):
            allowed |= set(eos_ids)
    except UnicodeDecodeError:
        pass
    return allowed


@once
def _answer(oracle, pattern: str, written, vocab: tuple, eos: frozenset) -> frozenset[int]:
    """``oracle(pattern, written, vocab, eos)`` (``brute_force`` or ``_plain_oracle``), computed once: over GPT-2's
    vocabulary it takes 0.3 s a case, and every notebook's check asks the same cases (``warm_up``)."""
    return frozenset(oracle(pattern, written, vocab, eos))


def warm_up() -> None:
    """The answers over GPT-2's vocabulary, computed in the grader's fork server before any notebook's judge
    process is forked from it (``autograder.warm``)."""
    for pattern, written in GPT2_PLAIN:
        _answer(_plain_oracle, pattern, written, _gpt2_texts(), frozenset({END}))
    for pattern, written in GPT2_FAST:
        _answer(brute_force, pattern, written, _gpt2_vocab(), frozenset({END}))
    for choices, written in GPT2_CHOICES:
        _choice_answer(written, choices, _gpt2_vocab(), frozenset({END}))


@once
def _gpt2_vocab() -> tuple[bytes | None, ...]:
    return tuple(recipes.gpt2_vocab())


@once
def _gpt2_texts() -> tuple[str | None, ...]:
    return tuple(recipes.gpt2_texts())


# ---------------------------------------------------------------- masks as sets of ids

MASK = ("return a bool tensor of shape (V,), one entry per token id: torch.zeros(len(vocab), dtype=torch.bool), then "
        "True where a token is allowed")


def _ids(got, size: int, label: str) -> set[int]:
    """The ids a mask allows; fail if it is not a bool tensor of shape (size,)."""
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {show(got)}; expected a bool tensor of shape ({size},)", MASK)
    if tuple(got.shape) != (size,):
        fail(f"{label} returned a tensor of shape {tuple(got.shape)}; expected ({size},), one entry per token id", MASK)
    if got.dtype != torch.bool:
        fail(f"{label} returned a {str(got.dtype).removeprefix('torch.')} tensor; expected a bool mask", MASK)
    return set(got.nonzero().flatten().tolist())


def _token(i: int, vocab) -> str:
    piece = vocab[i] if i < len(vocab) else None
    return f"{i} ({piece!r})" if piece is not None else f"{i} (end-of-text)" if i == END else str(i)


def _difference(got: set[int], want: set[int], vocab, eos) -> str:
    extra, missing = sorted(got - want), sorted(want - got)
    parts = []
    if extra:
        parts.append(f"allows {len(extra)} token(s) it should not, e.g. "
                     f"{', '.join(_token(i, vocab) for i in extra[:3])}")
    if missing:
        parts.append(f"misses {len(missing)} allowed token(s), e.g. "
                     f"{', '.join(_token(i, vocab) for i in missing[:3])}")
    return "; ".join(parts)


def _eos_hint(got: set[int], want: set[int], eos: set[int], when: str) -> str:
    if eos and (got ^ want) <= eos:
        return (f"only the end-of-text ids are wrong: allow them exactly when {when}" if eos & want or eos & got
                else "")
    return ""


def _check_mask(label: str, ids: set[int], want: set[int], vocab, eos: set[int], explain, *, ends: bool = False):
    """Fail unless the ids a mask allows agree with ``want``: on the end-of-text ids if ``ends``, else on every other
    id (the two parts of a mask's test cell). ``explain()``: the hint, computed only for a failure (it may run the
    known mistakes over a whole vocabulary)."""
    keep = (lambda x: x & eos) if ends else (lambda x: x - eos)
    if keep(ids) != keep(want):
        fail(f"{label} {_difference(keep(ids), keep(want), vocab, eos)}", explain())


def _mask_hint(ids: set[int], want: set[int], eos: set[int], mistakes, when_eos: str, note: str = "") -> str:
    """The first known mistake that gives the same set (``mistakes``: (why, compute the set)), or the end-of-text
    rule, or ``note``."""
    return next((why for why, compute in mistakes if _gives(compute, ids)), "") or \
        _eos_hint(ids, want, eos, when_eos) or note


def _check_ends(name: str, answers: list) -> None:
    """The part ``name`` of a mask's test cell: the end-of-text ids of the masks in ``answers`` ((label, ids, want,
    vocab, eos, explain) of each mask that came back). Not entered when none came back: a part never reached fails."""
    if answers:
        with part(name):
            for label, ids, want, vocab, eos, explain in answers:
                _check_mask(label, ids, want, vocab, eos, explain, ends=True)


def _gives(compute, got: set[int]) -> bool:
    try:
        return compute() == got
    except Exception:  # noqa: BLE001 (a mistake that cannot even run on this input explains nothing)
        return False


def _label(fn: str, *shown) -> str:
    return f"{fn}({', '.join(shown)})"


def _vocab_label(vocab) -> str:
    return "<GPT-2's vocabulary>" if len(vocab) == 50257 else show(list(vocab))


# ---------------------------------------------------------------- choices

SMALL_VOCAB = (b"y", b"yes", b"no", b"not", b" sure", b"n", None, b"", b"es", b"nope", b"o", b"no", b"t sure",
               b"\xe7\x8c", b"\xab", "猫".encode(), "犬".encode(), b"a", b"x", None, None)
SMALL_EOS = {19, 20}  # the two None at the end: ids that write no text
CHOICES = [
    ((b"yes", b"no", b"not sure", b"nope"), b"", SMALL_EOS),
    ((b"yes", b"no", b"not sure", b"nope"), b"no", SMALL_EOS),
    ((b"yes", b"no", b"not sure", b"nope"), b"not", SMALL_EOS),
    ((b"yes", b"no", b"not sure", b"nope"), b"y", SMALL_EOS),
    ((b"yes", b"no", b"not sure", b"nope"), b"yes", {19}),
    ((b"yes", b"no", b"not sure", b"nope"), b"x", SMALL_EOS),
    (("猫犬".encode(), b"a"), b"", SMALL_EOS),
    (("猫犬".encode(), b"a"), b"\xe7\x8c", SMALL_EOS),
    (("猫犬".encode(), b"a"), "猫".encode(), set()),
    # an empty choice: before anything is written, it is whole already
    ((b"", b"yes", b"no"), b"", SMALL_EOS),
]
# One case over GPT-2's whole vocabulary, the real thing: each costs the learner's mask a pass over 50,257 tokens (0.2 s
# or more), and the small cases above already catch every known mistake (three of the four change this mask too).
GPT2_CHOICES = [
    ((b" Paris", b" London", b" Rome"), b" Lon"),
]


def _choice_oracle(written: bytes, choices, vocab, eos) -> set[int]:
    allowed = {i for i, p in enumerate(vocab) if p and any(c.startswith(written + p) for c in choices)}
    return allowed | (set(eos) if written in choices else set())


@once
def _choice_answer(written: bytes, choices: tuple, vocab: tuple, eos: frozenset) -> frozenset[int]:
    """``_choice_oracle``, computed once: over GPT-2's vocabulary it takes 0.4 s a case (``warm_up``)."""
    return frozenset(_choice_oracle(written, choices, vocab, eos))


def _choice_mistakes(written, choices, vocab, eos):
    """Each mistake's hint, with what a mask that makes it returns (each set computed only when a wrong answer asks
    for it: every one goes over the whole vocabulary)."""
    return [
        ("you checked the token alone; it is allowed when some choice starts with written + token (what was "
         "written so far, then the token)",
         lambda: {i for i, p in enumerate(vocab) if p and any(c.startswith(p) for c in choices)}
         | (set(eos) if written in choices else set())),
        ("a token that writes nothing (None or b\"\") never moves towards a choice: leave it out",
         lambda: _choice_oracle(written, choices, vocab, eos)
         | {i for i, p in enumerate(vocab) if p == b"" and any(c.startswith(written) for c in choices)}),
        ("end-of-text is allowed only when written is a whole choice, not whenever it starts one",
         lambda: _choice_oracle(written, choices, vocab, ())
         | (set(eos) if any(c.startswith(written) for c in choices) else set())),
        ("an empty choice b\"\" is whole before anything is written: end-of-text is allowed whenever written is "
         "one of the choices (test `written in choices`, not whether written is empty)",
         lambda: _choice_oracle(written, choices, vocab, ()) if not written and written in choices else None),
        ("you allowed tokens that go past the end of a choice: a choice must START with written + token",
         lambda: {i for i, p in enumerate(vocab) if p and any(c.startswith(written + p) or (written + p).startswith(c)
                                                              for c in choices)}
         | (set(eos) if written in choices else set())),
    ]


CONTINUES, CHOICE_ENDS = "tokens that continue a choice", "end-of-text after a whole choice"


@cell("test_choices", parts={CONTINUES: 3, CHOICE_ENDS: 1})
def check_choices(choice_mask):
    cases = [(choices, written, eos, SMALL_VOCAB) for choices, written, eos in CHOICES]
    big = None
    for choices, written in GPT2_CHOICES:
        cases.append((choices, written, {END}, None))
    answers = []
    with part(CONTINUES):
        for choices, written, eos, vocab in cases:
            if vocab is None:
                big = big or make("constrained.gpt2_vocab")
                vocab, arg = _gpt2_vocab(), big
            else:
                arg = list(vocab)
            label = _label("choice_mask", repr(written), show(list(choices)), _vocab_label(vocab), show(set(eos)))
            ids = _ids(call(choice_mask, written, list(choices), arg, set(eos), label=label), len(vocab), label)
            want = set(_choice_answer(written, tuple(choices), tuple(vocab), frozenset(eos)))
            explain = functools.partial(_mask_hint, ids, want, set(eos), _choice_mistakes(written, choices, vocab, eos),
                                        "written is one of the choices, whole")
            answers.append((label, ids, want, vocab, set(eos), explain))
            _check_mask(label, ids, want, vocab, set(eos), explain)
    _check_ends(CHOICE_ENDS, answers)


# ---------------------------------------------------------------- regex, the plain way

SMALL_TEXTS = ("1", "12", "123", "a", "1a", "٣", None, "", "-", ".5", "ab", " b", "!", "yes", "no!", "\"", "x\"", "é",
               None, None)
SMALL_TEXT_EOS = {18, 19}
PLAIN = [
    (r"-?\d{1,3}", "", SMALL_TEXT_EOS),
    (r"-?\d{1,3}", "12", SMALL_TEXT_EOS),
    (r"-?\d{1,3}", "-", SMALL_TEXT_EOS),
    (r"\d+\.\d", "1", SMALL_TEXT_EOS),
    (r"(yes|no)!?", "no", {18}),
    (r"[a-z]+( [a-z]+)?", "ab", SMALL_TEXT_EOS),
    (r'"[^"]{0,3}"', "\"é", SMALL_TEXT_EOS),
    (r"\w+", "", SMALL_TEXT_EOS),
    (r"(no|not sure)", "not", SMALL_TEXT_EOS),  # a match starts "not" ("no"), but "not" is none: no end-of-text
]
# One case over GPT-2's whole vocabulary, the real thing: regex on every token is slow by design (0.5 s a call), and the
# small cases above already catch every known mistake. Inside a string every kind of GPT-2 token counts (several
# characters, non-ASCII ones, pieces of characters: None), and four of the six known mistakes change this mask.
GPT2_PLAIN = [(r'"[^"]{0,5}"', "\"ab")]


def _plain_oracle(pattern, written, texts, eos) -> set[int]:
    allowed = {i for i, t in enumerate(texts) if t and partial(pattern, written + t)}
    return allowed | (set(eos) if full(pattern, written) else set())


def _plain_mistakes(pattern, written, texts, eos):
    eos_full = set(eos) if full(pattern, written) else set()
    return [
        ("you allowed only tokens after which the text is a FULL match; pass partial=True, so that a text that can "
         "still become a match counts",
         lambda: {i for i, t in enumerate(texts) if t and full(pattern, written + t)} | eos_full),
        ("pass flags=regex.ASCII: without it \\d and \\w match other scripts' digits and letters (here '٣'), which "
         "json.loads and the DFA do not take",
         lambda: {i for i, t in enumerate(texts) if t and regex.fullmatch(pattern, written + t, partial=True)}
         | (set(eos) if regex.fullmatch(pattern, written) else set())),
        ("use regex.fullmatch: regex.match only asks that the text START with a match, so tokens that go past the "
         "end of a match slip through",
         lambda: {i for i, t in enumerate(texts) if t and regex.match(pattern, written + t, flags=regex.ASCII,
                                                                      partial=True)} | eos_full),
        ("you checked the token's text alone; check written + text, the whole text so far",
         lambda: {i for i, t in enumerate(texts) if t and partial(pattern, t)} | eos_full),
        ("end-of-text is allowed only when written is a whole match: regex.fullmatch, not regex.match (which is "
         "content with a match at the start of written, such as 'no' in 'not')",
         lambda: {i for i, t in enumerate(texts) if t and partial(pattern, written + t)}
         | (set(eos) if regex.match(pattern, written, flags=regex.ASCII) else set())),
        ("end-of-text is allowed only when written is a FULL match (regex.fullmatch without partial)",
         lambda: {i for i, t in enumerate(texts) if t and partial(pattern, written + t)}
         | (set(eos) if partial(pattern, written) else set())),
    ]


MATCHABLE, MATCH_ENDS = "tokens after which a match is still possible", "end-of-text after a full match"


@cell("test_plain_regex", parts={MATCHABLE: 3, MATCH_ENDS: 1})
def check_plain_regex(regex_mask_plain):
    cases = [(p, w, eos, SMALL_TEXTS) for p, w, eos in PLAIN] + [(p, w, {END}, None) for p, w in GPT2_PLAIN]
    big = None
    answers = []
    with part(MATCHABLE):
        for pattern, written, eos, texts in cases:
            if texts is None:
                big = big or make("constrained.gpt2_texts")
                texts, arg = _gpt2_texts(), big
            else:
                arg = list(texts)
            shown = "<GPT-2's tokens as text>" if len(texts) == 50257 else show(list(texts))
            label = _label("regex_mask_plain", repr(pattern), repr(written), shown, show(set(eos)))
            got = call(regex_mask_plain, pattern, written, arg, set(eos), label=label,
                       hint="a token whose text is None or \"\" is never allowed")
            ids, want = _ids(got, len(texts), label), set(_answer(_plain_oracle, pattern, written, tuple(texts),
                                                                      frozenset(eos)))
            explain = functools.partial(_mask_hint, ids, want, set(eos), _plain_mistakes(pattern, written, texts, eos),
                                        "written is a full match")
            answers.append((label, ids, want, texts, set(eos), explain))
            _check_mask(label, ids, want, texts, set(eos), explain)
    _check_ends(MATCH_ENDS, answers)


# ---------------------------------------------------------------- the trie and the fast mask

TRIE_VOCAB = (b"a", b"ab", b"abc", b"b", b"ab", None, b"", b"\xe7\x8c", b"\xab", "猫".encode(), b"c", b"bc",
              b"\xe7", b"\x8c\xab", b"d", b"abcd", None)
TRIE_EOS = {16}
FAST = [
    ("ab+c?", b""),
    ("ab+c?", b"ab"),
    ("ab+c?", b"abb"),
    ("(ab|a)(bc)?c*d?", b"a"),
    ("猫+|犬", b""),
    ("猫+|犬", b"\xe7"),
    ("猫+|犬", "猫".encode() + b"\xe7\x8c"),
    ("[a-c]{2}d", b"c"),
    ("a|bc", b"a"),
]
# A tokenizer without an end-of-text token: Constraint gives eos_ids=set(), and no id is allowed for the end, in an
# accepting state (after "ab") or not
FAST_NO_EOS = [("ab+c?", b"ab"), ("a|bc", b"")]
NO_EOS_HINT = ("eos_ids may be empty (a tokenizer without an end-of-text token): allow each id it holds, none when it "
               "holds none (torch.tensor([]) is a float tensor, which cannot index)")
GPT2_FAST = [
    (r'\{"speaker": ("ROMEO"|"JULIET"), "line": "[^"\\\x00-\x1f]{0,8}"\}', b'{"speaker": "JU'),
    (r'\{"speaker": ("ROMEO"|"JULIET"), "line": "[^"\\\x00-\x1f]{0,8}"\}', b'{"speaker": "ROMEO", "line": "O'),
    (r"[a-z]+( [a-z]+)*\.", b"wherefore art"),
    (r"猫{1,3}|犬", "猫".encode()[:1]),
    (r"-?\d{1,4}(\.\d\d)?", b"-12"),
]


@once
def _vocab_index(vocab: tuple) -> tuple[dict[bytes, list[int]], set[bytes]]:
    """({bytes: the ids that write them}, the proper starts of some token's bytes) of a vocabulary."""
    by_bytes: dict[bytes, list[int]] = {}
    starts: set[bytes] = set()
    for i, piece in enumerate(vocab):
        if piece:
            by_bytes.setdefault(piece, []).append(i)
            starts.update(piece[:k] for k in range(1, len(piece)))
    return by_bytes, starts


def _utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fast_hints(pattern, written, got, want, vocab, eos) -> str:
    """Name the mistake the learner's fast mask made, from the tokens it allows and misses."""
    by_bytes, starts = _vocab_index(tuple(vocab))
    extra, missing = got - want - eos, sorted((want - got) - eos)
    if written and got - eos == brute_force(pattern, b"", vocab, ()):
        return ("you walked from the DFA's start; walk from the given state (the state after what was written "
                "so far)")
    if missing and all(set(by_bytes[vocab[i]]) & got for i in missing):
        return ("two ids with the same bytes end at the same node of the trie: keep them both (ids is a list: "
                "append, do not replace)")
    if missing and all(not _utf8(vocab[i]) for i in missing):
        return ("every token's bytes go into the trie, as bytes: a token need not be valid UTF-8 on its own (GPT-2 "
                "writes a character like 猫 in pieces, b'\\xe7\\x8c' then b'\\xab', and each piece is a token "
                "the DFA may allow). Keep them as bytes; do not skip the ones that fail to decode")
    if missing and all(vocab[i] in starts for i in missing):
        return ("a token whose node has children is allowed too: the ids at a node are allowed as soon as the DFA "
                "is alive there, whether or not the walk goes deeper")
    if extra and all(could_match(pattern, written + vocab[i][:1]) for i in extra):
        return ("check every byte of a token, not only the first: go down the trie one byte at a time, and skip a "
                "child (and everything below it) as soon as the DFA dies (step gives -1)")
    if extra:
        return ("a DFA step that gives -1 means dead: skip that child and its subtree. Used as a state, -1 is "
                "Python's last row of the table, a real state")
    return _eos_hint(got, want, eos, "the state is accepting (dfa.accepting[state])")


WALKED, ACCEPTING = "tokens the DFA allows, through your trie", "end-of-text in an accepting state"


@cell("test_fast_mask", parts={WALKED: 3, ACCEPTING: 1})
def check_fast_mask(build_trie, dfa_mask, compile_regex):
    answers = []
    with part(WALKED):
        small = call(build_trie, list(TRIE_VOCAB), label=_label("build_trie", show(list(TRIE_VOCAB))))
        cases = [(p, w, TRIE_VOCAB, TRIE_EOS) for p, w in FAST] + [(p, w, TRIE_VOCAB, set()) for p, w in FAST_NO_EOS] \
            + [(p, w, None, {END}) for p, w in GPT2_FAST]
        big = None  # the learner's trie of GPT-2's vocabulary, built when its first case comes (after the small ones)
        dfas: dict[str, Remote] = {}
        for pattern, written, vocab, eos in cases:
            if vocab is None:
                if big is None:
                    big = call(build_trie, make("constrained.gpt2_vocab"), label="build_trie(<GPT-2's vocabulary>)")
                trie, vocab = big, _gpt2_vocab()
            else:
                trie = small
            if pattern not in dfas:
                dfas[pattern] = call(compile_regex, pattern, label=f"compile_regex({pattern!r}) (the given compiler)")
            dfa = dfas[pattern]
            state = call(dfa.walk, call(getattr, dfa, "start", label="dfa.start"), written,
                         label=f"dfa.walk(dfa.start, {written!r}) (the given DFA)")
            label = _label("dfa_mask", f"<the DFA of {pattern!r}>", f"<the state after {written!r}>",
                           f"<your trie of {_vocab_label(vocab)}>", str(len(vocab)), show(set(eos)))
            got = call(dfa_mask, dfa, state, trie, len(vocab), set(eos), label=label, hint="" if eos else NO_EOS_HINT)
            ids, want = _ids(got, len(vocab), label), set(_answer(brute_force, pattern, written, tuple(vocab),
                                                                     frozenset(eos)))
            explain = functools.partial(_fast_hints, pattern, written, ids, want, vocab, eos)
            answers.append((label, ids, want, vocab, eos, explain))
            _check_mask(label, ids, want, vocab, eos, explain)
    _check_ends(ACCEPTING, answers)


# ---------------------------------------------------------------- the schema

SCHEMAS = [
    {"type": "object", "properties": {"speaker": {"enum": ["ROMEO", "JULIET"]}, "line": {"type": "string"},
                                      "mood": {"enum": ["happy", "sad"]}}},
    {"type": "object", "properties": {"act": {"type": "integer"}, "aside": {"type": "boolean"},
                                      "said": {"type": "string", "maxLength": 4},
                                      "who?": {"enum": ["a.b", "(c)", 'say "no"', "back\\slash"]}}},
    {"type": "object", "properties": {"n": {"type": "integer"}}},
    {"type": "object", "properties": {"said": {"type": "string", "maxLength": 0}, "act": {"type": "integer"}}},
]
VALUES = {
    "string": ["", "O Romeo, Romeo!", "猫 and é", "a" * 40, "'tis"],
    "integer": [0, 7, -12, 1605],
    "boolean": [True, False],
}


def _good(schema) -> list[str]:
    """Texts json.dumps writes for objects of ``schema`` (non-ASCII written as itself, as a model writes it)."""
    props = schema["properties"]
    columns = []
    for field in props.values():
        if "enum" in field:
            columns.append(field["enum"])
        else:
            values = VALUES[field["type"]]
            most = field.get("maxLength")
            columns.append([v for v in values if most is None or len(v) <= most])
    texts = []
    for k in range(max(len(c) for c in columns)):
        obj = {name: col[k % len(col)] for name, col in zip(props, columns)}
        texts.append(json.dumps(obj, ensure_ascii=False))
    return texts


def _bad(schema) -> list[tuple[str, str]]:
    """(text, why it must not match): near misses of the schema's texts."""
    props = schema["properties"]
    good = json.loads(_good(schema)[0])
    out = [(json.dumps(good, separators=(",", ":")), "json.dumps writes ', ' and ': ' between fields"),
           (json.dumps(good)[:-1], "the closing brace is part of the object"),
           (json.dumps(good) + " ", "nothing after the object"),
           (json.dumps(dict(reversed(list(good.items())))) if len(good) > 1 else "{}",
            "every property, in the order given")]
    for name, field in props.items():
        if "enum" in field:
            out.append((json.dumps({**good, name: field["enum"][0] + "x"}), "an enum allows only its values"))
            out += [(json.dumps({**good, name: v.replace(".", "x")}), "escape enum values: in a pattern, . matches "
                     "any character") for v in field["enum"] if "." in v]
            out.append((json.dumps(good).replace(json.dumps(good[name]), good[name], 1),
                        "enum values are JSON strings, in quotes"))
        elif field["type"] == "string":
            out += [(json.dumps({**good, name: 'say "ay"'}), "no quote inside a string (no escapes)"),
                    (json.dumps({**good, name: "a\\b"}), "no backslash inside a string (no escapes)"),
                    (json.dumps({**good, name: "a\nb"}, ensure_ascii=False).replace("\\n", "\n"),
                     "no control character inside a string (json.loads refuses them)")]
            if "maxLength" in field:
                out.append((json.dumps({**good, name: "a" * (field["maxLength"] + 1)}),
                            "maxLength: at most that many characters" + (
                                "; maxLength 0 allows only \"\": test `is None`, not truthiness (0 is falsy)"
                                if field["maxLength"] == 0 else "")))
        elif field["type"] == "integer":
            text = json.dumps({**good, name: 7})
            out += [(text.replace("7", "07"), "JSON has no leading zeros"),
                    (text.replace("7", "7.5"), "an integer has no fraction"),
                    (text.replace("7", "+7"), "JSON has no plus sign"),
                    (text.replace("7", "\"7\""), "an integer is written without quotes"),
                    (text.replace("7", ""), "an integer has at least one digit")]
        elif field["type"] == "boolean":
            out.append((json.dumps(good).replace(json.dumps(good[name]), "True", 1),
                        "JSON writes true and false in lower case"))
    return out


SCHEMA_ERRORS = [{"type": "array"}, {"properties": {"a": {"type": "string"}}},
                 {"type": "object", "properties": {"a": {"type": "number"}}},
                 {"type": "object", "properties": {"a": {"enum": []}}}]


MATCHES, REFUSES, SUBSET, OTHER_SCHEMAS = ("matches what json.dumps writes", "refuses the near misses",
                                         "in the given compiler's subset", "errors for other schemas")


@cell("test_schema", parts={MATCHES: 2, REFUSES: 2, SUBSET: 1, OTHER_SCHEMAS: 1})
def check_schema(schema_regex, compile_regex):
    patterns = []  # (schema, label, the pattern) of each schema_regex call that gave a regular expression
    with part(MATCHES):
        for schema in SCHEMAS:
            label = f"schema_regex({show(schema)})"
            pattern = call(schema_regex, schema, label=label)
            if not isinstance(pattern, str):
                fail(f"{label} returned {show(pattern)}; expected a pattern, a str")
            try:
                regex.compile(pattern, flags=regex.ASCII)
            except regex.error as err:
                fail(f"{label} returned {pattern!r}, which is no regular expression ({err})",
                     "put every key and enum value through escape(...), and the object's braces too")
            patterns.append((schema, label, pattern))
            for text in _good(schema):
                if not full(pattern, text):
                    fail(f"{label} returned {pattern!r}, which does not match {text!r}, a text json.dumps writes "
                         f"for this schema", _schema_hint(text, pattern))
    if patterns:  # (none came back: the parts that read them are not reached, and fail)
        with part(REFUSES):
            for schema, label, pattern in patterns:
                for text, why in _bad(schema):
                    if full(pattern, text):
                        fail(f"{label} returned {pattern!r}, which matches {text!r}", why)
        with part(SUBSET):
            for _, label, pattern in patterns:
                _check_compiles(compile_regex, label, pattern)
    with part(OTHER_SCHEMAS):
        for bad in SCHEMA_ERRORS:
            label = f"schema_regex({show(bad)})"
            try:
                got = schema_regex(bad)
            except NotImplementedError as err:
                raise not_written(label, err) from None
            except ValueError:
                continue
            except Exception as err:  # noqa: BLE001
                if getattr(err, "grader_side", False):
                    raise
                fail(f"{label} raised {describe_error(err)}; expected ValueError",
                     "a schema outside the subset raises ValueError, saying what is not supported")
            fail(f"{label} returned {show(got)}; expected ValueError",
                 "only objects, with fields that are strings, integers, booleans or enums of strings")


def _check_compiles(compile_regex, label: str, pattern: str) -> None:
    try:
        compile_regex(pattern)
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        if isinstance(err, NotImplementedError):
            raise not_written(label, err) from None
        fail(f"the given compile_regex cannot compile {label}'s pattern {pattern!r}: {describe_error(err)}",
             "write the pattern in the compiler's subset (SUBSET): escape the braces, keys and enum values with "
             "escape(...), use groups (...) and the classes and repeats it knows")


def _schema_hint(text: str, pattern: str) -> str:
    if "\\" in text:  # a value json.dumps escapes: a quote or a backslash inside (strings here hold neither)
        return ("an enum value is written as json.dumps writes it, a backslash before each quote and backslash "
                "inside: escape(json.dumps(value)), not the value between quotes")
    if '":"' in pattern.replace("\\", "") or '","' in pattern.replace("\\", ""):
        return "json.dumps writes ': ' after a key and ', ' between fields (with a space)"
    return "build the pattern piece by piece: escape('{'), then for each property its quoted key, ': ', its value"


# ---------------------------------------------------------------- generation

GEN_SHAPE = dict(vocab_size=64, block_size=48, n_layer=2, n_head=2, n_embd=16, seed=91, weight_std=0.4)
GEN_VOCAB = [bytes([33 + i]) for i in range(63)] + [None]  # id 63 writes no text: the end-of-text id
GEN_EOS = [63]
PROMPT = [5, 17, 42, 8]


def _script(seed: int, steps: int, width: int, eos_at: tuple[int, ...] = (), also=()) -> list[list[int]]:
    """The tokens allowed at each step: ``width`` random ids and the ids ``also`` (and the end-of-text id at the
    steps ``eos_at``)."""
    gen = torch.Generator().manual_seed(seed)
    script = []
    for k in range(steps):
        ids = set(torch.randperm(63, generator=gen)[:width].tolist()) | set(also)
        script.append(sorted(ids) + (GEN_EOS if k in eos_at else []))
    return script


MASKED, SAMPLED, STOPPED, DEAD = ("greedy, masked", "sampling with the Sampler's settings",
                                  "end-of-text and max_new_tokens", "dead ends")
CACHED = "chapter 7's cache when use_cache, the model itself otherwise"
# (script, max_new_tokens, sampling, seed of the learner's global generator, use_cache, the part of test_generate)
GENERATIONS = [
    (_script(1, 12, 6), 12, {}, None, True, MASKED),
    (_script(2, 12, 8, eos_at=(4,)), 12, {}, None, True, STOPPED),
    (_script(3, 10, 10, eos_at=(3, 6)), 10, {"do_sample": True}, 9001, True, SAMPLED),
    (_script(4, 10, 12), 10, {"do_sample": True, "temperature": 0.7, "top_k": 5}, 9002, True, SAMPLED),
    (_script(5, 9, 20, eos_at=(2, 5, 8)), 9, {"do_sample": True, "top_p": 0.8, "repetition_penalty": 1.3}, 9003,
     False, SAMPLED),
    (_script(6, 8, 1), 8, {}, None, False, MASKED),
    (_script(7, 12, 5, eos_at=(11,)), 6, {}, None, True, STOPPED),
    (_script(8, 3, 4), 0, {}, None, True, STOPPED),
    # end-of-text (the only token allowed) as the last of max_new_tokens: the reason is "eos", not "length"
    (_script(11, 4, 6) + [list(GEN_EOS)], 5, {}, None, True, STOPPED),
    # the prompt's ids allowed at every step: penalties that see the whole history (prompt included) choose otherwise
    (_script(10, 10, 4, also=PROMPT), 10, {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2}, None, True,
     SAMPLED),
]
DEAD_ENDS = [(_script(9, 3, 4), 6), ([], None)]  # (script, max_new_tokens; None: left out, its default)
TEXT_PROMPT = 0  # the case of GENERATIONS whose prompt is given as text (PROMPT's bytes), with a tokenizer of bytes


@once
def _hf_model():
    with seeded(GEN_SHAPE["seed"]):
        return gpt_recipes.random_gpt2(**GEN_SHAPE)


@once
def _hf_weights() -> dict:
    """_hf_model's tensors, sent to the learner's side (``constrained.recording_gpt``), which has no transformers."""
    return gpt_recipes.hf_weights(_hf_model())


@once
def _hf_generation(case: int) -> list[int]:
    """Hugging Face's generate with the script as its prefix_allowed_tokens_fn (seeded as the learner's side is)."""
    script, n, sampling, seed, *_ = GENERATIONS[case]
    if n == 0:
        return []
    sampling = dict(sampling)
    do_sample = sampling.pop("do_sample", False)
    if do_sample:
        sampling.setdefault("top_k", 0)  # generate's default may be 50

    def allowed(batch_id, ids):
        return script[len(ids) - len(PROMPT)]

    with seeded(seed or 0), torch.no_grad(), quiet_transformers():
        out = _hf_model().generate(torch.tensor([PROMPT]), max_new_tokens=n, prefix_allowed_tokens_fn=allowed,
                                   eos_token_id=GEN_EOS, pad_token_id=0, do_sample=do_sample, **sampling)
    new = out[0, len(PROMPT):].tolist()
    end = next((i for i, t in enumerate(new) if t in GEN_EOS), None)
    return new if end is None else new[:end + 1]


def _generation_label(n, sampling, use_cache, prompt=PROMPT) -> str:
    """The call as a label; ``n`` None: max_new_tokens left out, and use_cache too (as ``_check_dead_end`` calls)."""
    settings = "".join(f", {k}={v!r}" for k, v in sampling.items())
    tokenizer = "<a tokenizer of single bytes>" if isinstance(prompt, str) else "None"
    return (f"constrained_generate(<a random GPT-2 of 64 tokens>, {tokenizer}, {show(prompt)}, <a constraint that "
            f"allows given tokens at each step>" + ("" if n is None else f", {n}, use_cache={use_cache}")
            + f"{settings})")


@cell("test_generate", parts={MASKED: 3, SAMPLED: 2, STOPPED: 2, DEAD: 1, CACHED: 1})
def check_generate(constrained_generate):
    model = make("constrained.recording_gpt", *(GEN_SHAPE[k] for k in ("vocab_size", "block_size", "n_layer",
                                                                         "n_head", "n_embd")), _hf_weights())
    read: dict[int, list[int]] = {}  # case -> the positions each run of the model read
    for name in (MASKED, SAMPLED, STOPPED):
        with part(name):
            for case, generation in enumerate(GENERATIONS):
                if generation[-1] == name:
                    _check_generation(constrained_generate, model, case, read)
    with part(CACHED):
        _check_cache_use(read)
    with part(DEAD):
        for script, n in DEAD_ENDS:
            _check_dead_end(constrained_generate, model, script, n)


def _check_generation(constrained_generate, model: Remote, case: int, read: dict) -> None:
    script, n, sampling, seed, use_cache, _ = GENERATIONS[case]
    constraint = make("constrained.Scripted", script, GEN_EOS, GEN_VOCAB)
    tokenizer, prompt = None, list(PROMPT)
    if case == TEXT_PROMPT:  # the prompt as text: the given first line encodes it, and the loop must use those ids
        tokenizer = make("constrained.byte_tokenizer", GEN_VOCAB)
        prompt = b"".join(GEN_VOCAB[i] for i in PROMPT).decode()
    label = _generation_label(n, sampling, use_cache, prompt)
    ask("constrained.fed", model)  # what earlier runs read
    try:
        with learner_side(seed=seed or 0, no_grad=True):
            out = constrained_generate(model, tokenizer, prompt, constraint, n, use_cache=use_cache, **sampling)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        fail(f"{label} raised {describe_error(err)}", _asked_hint(constraint.asked) or _nan_hint(err))
    read[case] = ask("constrained.fed", model)
    want = _hf_generation(case)
    ids, reason, text = (call(getattr, out, name, label=f"{label}.{name}") for name in ("ids", "finish_reason",
                                                                                        "text"))
    if not isinstance(ids, list) or ids != want:
        asked = constraint.asked
        fail(f"{label} generated {show(ids)}; Hugging Face's generate with the same mask gives {want}",
             _generate_hint(ids, want, asked, script))
    want_reason = "eos" if want and want[-1] in GEN_EOS else "length"
    if reason != want_reason:
        fail(f"{label} ended with finish_reason={reason!r}; expected {want_reason!r}",
             "the last of the max_new_tokens tokens is end-of-text: the reason is 'eos' (decide it from the token, "
             "not from how many came)" if want_reason == "eos" and len(want) == n else
             "an end-of-text id ends the loop with reason 'eos'; running out of steps leaves 'length'")
    want_text = b"".join(GEN_VOCAB[i] for i in want if i not in GEN_EOS).decode()
    if text != want_text:
        fail(f"{label} wrote the text {text!r}; expected {want_text!r}",
             "leave the given lines after the loop as they are: they decode new")


def _check_cache_use(read: dict[int, list[int]]) -> None:
    """With use_cache, the model reads the prompt once, then one new token a step (chapter 7's CachedModel, the
    given ``runner``); without, the whole sequence each step."""
    if not read:
        fail("no call of constrained_generate returned, so how it runs the model cannot be seen",
             "write the loop first: the parts above say what goes wrong")
    for case, got in read.items():
        _, n, sampling, _, use_cache, _ = GENERATIONS[case]
        label = _generation_label(n, sampling, use_cache)
        if use_cache:
            want = [len(PROMPT)] + [1] * (len(got) - 1) if got else []
            hint = ("run the given runner, not model: last_logits(runner, ids). With use_cache it is chapter 7's "
                    "CachedModel, which keeps the keys and values of the ids it has seen and reads only the new "
                    "token")
        else:
            want = list(range(len(PROMPT), len(PROMPT) + len(got)))
            hint = ("with use_cache=False the given runner is the model itself: run it (last_logits(runner, ids)) "
                    "on the whole sequence at each step")
        if got != want:
            fail(f"{label} ran the model on {show(got)} positions, one run after another; expected {show(want)}",
                 hint)


def _check_dead_end(constrained_generate, model: Remote, script, n: int) -> None:
    constraint = make("constrained.Scripted", script, GEN_EOS, GEN_VOCAB)
    label = _generation_label(n, {}, True).replace("given tokens at each step", f"tokens for {len(script)} steps "
                                                                                 "only")
    try:
        with learner_side(no_grad=True):
            got = constrained_generate(model, None, list(PROMPT), constraint, *(() if n is None else (n,)))
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError as err:
        if "no longer be met" not in str(err):
            fail(f"{label} raised ValueError({str(err)!r}), which does not say why",
                 _nan_hint(err) or "raise ValueError(constraint.dead_end(new)): its message names the problem")
        return
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        fail(f"{label} raised {describe_error(err)}; expected ValueError", DEAD_END)
    fail(f"{label} returned {show(got.ids)}; expected ValueError: after step {len(script)} no token is allowed",
         DEAD_END)


def _nan_hint(err: Exception) -> str:
    """For the Sampler's refusal of logits that hold NaN (chapter 6): where the NaN comes from in a masked step."""
    if "NaN" not in str(err):
        return ""
    return ("the masked logits hold NaN: 0 * -inf is nan, so adding (or multiplying by) the mask times "
            "float('-inf') puts NaN on every token it allows. Mask with logits.masked_fill(~allowed, "
            "float('-inf'))")


DEAD_END = ("when the mask allows no token, the constraint can no longer be met: raise "
            "ValueError(constraint.dead_end(new)) before choosing (a row of -inf gives token 0 or NaN)")


def _asked_hint(asked) -> str:
    if asked and asked[0] == PROMPT:
        return ("constraint.allowed takes the ids generated so far (new), not the prompt with them: the constraint "
                "knows nothing of the prompt")
    return ""


def _generate_hint(ids, want, asked, script) -> str:
    if not isinstance(ids, list):
        return "fill new with the generated ids (ints), the end-of-text id last when one was chosen"
    if _asked_hint(asked):
        return _asked_hint(asked)
    if any(t not in script[k] for k, t in enumerate(ids) if k < len(script)):
        return ("a token the constraint does not allow was chosen: set the logits of every token not allowed to "
                "-inf (masked_fill(~allowed, float('-inf'))) BEFORE choose, so that the sampler sees only allowed "
                "tokens")
    if want and want[-1] in GEN_EOS and ids[:len(want)] == want and len(ids) > len(want):
        return "an end-of-text id ends the loop: append it to new, then break"
    if ids == want[:-1] and want and want[-1] in GEN_EOS:
        return "append the end-of-text id to new before you break: the generated ids end with it"
    return ("mask, then choose(logits, ids) with every id so far (prompt included) as the sampler's history, one "
            "token per step, at most max_new_tokens steps")
