"""The reference constrained decoding (minigpt.constrained) against oracles it does not share code with.

- The compiler: the `regex` package's `fullmatch` (whole texts) and `fullmatch(..., partial=True)` (prefixes), with
  `regex.ASCII`, on random texts, for every pattern below.
- The masks: a brute-force check of every one of GPT-2's 50,257 tokens, `written + token` against the pattern with
  `regex`'s partial matching, on random prefixes (`autograder.checks.constrained.brute_force`, the hidden checks'
  oracle); the fast mask (DFA over the trie), the plain mask and the choice
  mask must each equal it where they apply. all_masks (every state's mask at once, one depth of the trie at a time,
  what a Constraint holds) must equal dfa_mask on every state.
- Generation: every output matches its pattern (`regex.fullmatch`) or parses (`json.loads`), over seeds, patterns
  and sampler settings; and equals Hugging Face's `generate(..., prefix_allowed_tokens_fn=...)` with the same mask,
  token for token, greedy and seeded sampling, with and without the KV cache, on random-weight GPT-2s that hold
  GPT-2's whole vocabulary (built locally, nothing downloaded).
- Beam search (`constrained_beam_search`, chapter 6's `beam_search` on a masking wrapper): equals Hugging Face's
  `generate(num_beams=k)` with a logits processor that applies the same mask to HF's log-probabilities and
  renormalises them over the allowed tokens (this course's semantics), token for token; differs, where the model
  puts probability outside the mask, from HF's `prefix_allowed_tokens_fn`, which masks after the log-softmax; sees
  every generated id when prompt and output outgrow the model's block_size; no NaN when fewer tokens are allowed
  than beams take candidates.
- `generate(..., constraint=...)`: the same ids as constrained_generate (sampling) or constrained_beam_search
  (num_beams > 1), and as chapter 6's generate without a constraint.
- The errors: patterns outside the subset, a vocabulary that cannot spell a constraint, a constraint that can no
  longer be met.
"""
from __future__ import annotations

import functools
import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import coursekit
from autograder.checks.constrained import brute_force, full, partial  # the oracle the hidden checks use too
from autograder.sandboxed.helpers.samplers import random_gpt, random_gpt2
from coursekit.testing import quiet_transformers
from minigpt.constrained import (DFA, SUBSET, Constraint, MaskedModel, UnsupportedPattern, all_masks, build_trie,
                                 choice_mask, compile_regex, constrained_beam_search, constrained_generate, dfa_mask,
                                 escape, generate, regex_mask_plain, schema_regex, token_texts, trie_levels,
                                 vocabulary)
from minigpt.transformer import GPT

pytestmark = pytest.mark.usefixtures("torch_one_thread")

END = 50256
SCHEMA = {"type": "object", "properties": {"speaker": {"enum": ["ROMEO", "JULIET", "NURSE"]},
                                           "line": {"type": "string", "maxLength": 12},
                                           "act": {"enum": ["1", "2"]}, "aside": {"type": "boolean"}}}
# Patterns of the subset: multi-token literals, classes, repeats with bounds, alternation with shared starts,
# characters of several bytes, the dot and negated classes (which take every non-ASCII character).
PATTERNS = [
    r"-?\d{1,4}(\.\d\d)?",
    r"[a-z]{1,6}( [a-z]{1,6}){0,2}\.",
    r"yes|no|not sure|nope",
    r" Paris| London| Rome",
    r"猫{1,3}|犬",
    r".{0,5}",
    r'"[^"\\]{0,6}"',
    r"(ab|a)(bc)?c*d?",
    r"\w+@\w+\.(com|org)",
    r"[A-Z][a-z]*(, [A-Z][a-z]*)?!?",
]
BOUNDED = [p for p in PATTERNS if "*" not in p and "+" not in p] + [schema_regex(SCHEMA)]
EXAMPLES = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@pytest.fixture(scope="module")
def enc():
    return coursekit.gpt2_encoding()


@pytest.fixture(scope="module")
def vocab(enc):
    return vocabulary(enc, 50257)


@pytest.fixture(scope="module")
def trie(vocab):
    return build_trie(vocab)


def ids_of(mask: torch.Tensor) -> set[int]:
    assert mask.dtype == torch.bool and mask.dim() == 1
    return set(mask.nonzero().flatten().tolist())


# ---------------------------------------------------------------- the compiler

@functools.lru_cache(maxsize=None)
def compiled(pattern: str) -> DFA:
    """compile_regex(pattern), once per pattern: hypothesis walks each pattern's DFA with 60 texts (the JSON schema's
    takes 0.4 s to compile)."""
    return compile_regex(pattern)


TEXT_ALPHABET = "ab cd.-019\"\\,!RAxyz@猫犬é😀\n\t"


@pytest.mark.parametrize("pattern", PATTERNS + [schema_regex(SCHEMA), r"\d+\D?\s*\S", r"[^a-c]{2}|x{2,}",
                                                r"(a|)b{0}c{2,3}", r"\(\[\{\.\*\}\]\)", r"[\-a\]]+\x41"])
@EXAMPLES
@given(text=st.text(alphabet=TEXT_ALPHABET, max_size=8))
def test_compiled_dfa_matches_and_lives_exactly_where_regex_says(pattern, text):
    dfa = compiled(pattern)
    state = dfa.walk(dfa.start, text.encode())
    assert (state >= 0 and dfa.accepting[state]) == full(pattern, text), (pattern, text)
    assert (state >= 0) == partial(pattern, text), (pattern, text)


def test_every_state_kept_can_still_reach_a_match():
    dfa = compile_regex(schema_regex(SCHEMA))
    live = {s for s, ok in enumerate(dfa.accepting) if ok}
    for _ in dfa.table:
        live |= {s for s, row in enumerate(dfa.table) if any(t in live for t in row)}
    assert live == set(range(len(dfa.table)))
    assert isinstance(dfa, DFA) and dfa.start == 0


@pytest.mark.parametrize("pattern", ["a*?", "^a", "a$", r"\b", "(?=a)", r"(a)\1", "[é-ü]", "a{3,1}", "(a", "a)",
                                     "*a", "a{2", r"\x4", "a{1001}", "[^é]", r"[\D]", "(?i)a"])
def test_patterns_outside_the_subset_raise_a_value_error_naming_it(pattern):
    with pytest.raises(UnsupportedPattern, match="this compiler knows") as info:
        compile_regex(pattern)
    assert isinstance(info.value, ValueError) and SUBSET in str(info.value)


def test_escape_makes_any_text_a_literal():
    text = 'a.b\\c(d)[e]{f}*+?|^$ "猫"'
    dfa = compile_regex(escape(text))
    assert dfa.accepting[dfa.walk(0, text.encode())] and full(escape(text), text)
    assert dfa.walk(0, b"a-b") == -1


# ---------------------------------------------------------------- the masks against the brute force

def random_prefixes(pattern: str, vocab, trie, rng: random.Random, n: int) -> list[bytes]:
    """``b""``, and texts written by walking allowed tokens at random (each step picked from the fast mask: the
    oracle then checks the mask at the prefix it led to), one byte string that no match starts with."""
    dfa = compile_regex(pattern)
    prefixes = [b""]
    while len(prefixes) < n:
        written = b""
        for _ in range(rng.randint(1, 6)):
            state = dfa.walk(dfa.start, written)
            choices = sorted(ids_of(dfa_mask(dfa, state, trie, len(vocab), set())))
            if not choices:
                break
            written += vocab[rng.choice(choices)]
        prefixes.append(written)
    dead = next(b for b in (b"\x00", b"~~", b"\xff") if dfa.walk(dfa.start, b) == -1)
    return prefixes + [dead]


@pytest.mark.parametrize("pattern", PATTERNS[:8] + [schema_regex(SCHEMA)])
def test_fast_mask_equals_the_brute_force_check_of_every_token(pattern, vocab, trie):
    dfa = compile_regex(pattern)
    for written in random_prefixes(pattern, vocab, trie, random.Random(pattern), 5):
        state = dfa.walk(dfa.start, written)
        want = brute_force(pattern, written, vocab)
        if state < 0:
            assert want == set(), (pattern, written)
            continue
        got = ids_of(dfa_mask(dfa, state, trie, len(vocab), {END}))
        assert got == want, (pattern, written, sorted(got ^ want)[:10])


@pytest.mark.parametrize("pattern", [PATTERNS[0], PATTERNS[2], PATTERNS[6], schema_regex(SCHEMA)])
def test_plain_mask_equals_the_brute_force_on_tokens_that_are_text(pattern, vocab, trie):
    texts = token_texts(vocab)
    dfa = compile_regex(pattern)
    for written in random_prefixes(pattern, vocab, trie, random.Random(pattern), 3)[:-1]:
        if dfa.walk(dfa.start, written) < 0 or "\ufffd" in written.decode("utf-8", errors="replace"):
            continue
        got = ids_of(regex_mask_plain(pattern, written.decode(), texts, {END}))
        want = {i for i in brute_force(pattern, written, vocab) if i == END or texts[i] is not None}
        assert got == want, (pattern, written)


@pytest.mark.parametrize("choices", [["yes", "no", "not sure", "nope"], [" Paris", " London", " Rome"],
                                     ["猫", "猫犬", "a"], ["x"]])
def test_choice_mask_equals_the_brute_force_and_the_fast_mask(choices, vocab, trie):
    pattern = "|".join(map(escape, choices))
    as_bytes = [c.encode() for c in choices]
    dfa = compile_regex(pattern)
    starts = sorted({c[:k] for c in as_bytes for k in range(len(c) + 1)})
    for written in random.Random(0).sample(starts, min(5, len(starts))) + [as_bytes[0]]:
        want = brute_force(pattern, written, vocab)
        assert ids_of(choice_mask(written, as_bytes, vocab, {END})) == want, (choices, written)
        assert ids_of(dfa_mask(dfa, dfa.walk(0, written), trie, len(vocab), {END})) == want
        assert (END in want) == (written in as_bytes), "end-of-text exactly when a whole choice is written"


def test_the_trie_holds_every_token_once_at_the_end_of_its_bytes():
    vocab = [b"a", b"ab", b"ab", None, b"", b"b", b"\xe7\x8c"]
    trie = build_trie(vocab)
    assert sorted(trie.children) == [ord("a"), ord("b"), 0xE7] and trie.ids == []
    assert trie.children[ord("a")].ids == [0] and trie.children[ord("a")].children[ord("b")].ids == [1, 2]
    assert trie.children[0xE7].children[0x8C].ids == [6]


def test_the_mask_after_a_piece_of_a_character_allows_only_what_finishes_it(vocab, trie):
    """The token-boundary trap: GPT-2 writes 猫 as three one-byte tokens, none of them text. Checked as text, no token
    can start 猫+ (the plain mask is empty); checked on bytes, the first byte is allowed, then the second, then the
    third, then end-of-text or another 猫."""
    texts = token_texts(vocab)
    assert not regex_mask_plain("猫+", "", texts, {END}).any()
    dfa = compile_regex("猫+")
    cat = "猫".encode()
    for k in range(1, 4):
        allowed = ids_of(dfa_mask(dfa, dfa.walk(0, cat[:k - 1]), trie, len(vocab), {END}))
        assert all(cat[:k - 1] + vocab[i] in (cat[:j] for j in range(k, 4)) for i in allowed) and allowed
    assert END in ids_of(dfa_mask(dfa, dfa.walk(0, cat), trie, len(vocab), {END}))


# ---------------------------------------------------------------- the schema

def test_schema_texts_match_and_others_do_not():
    pattern = schema_regex(SCHEMA)
    good = {"speaker": "NURSE", "line": "Ay, ay! 猫", "act": "2", "aside": True}
    assert full(pattern, json.dumps(good, ensure_ascii=False))
    bad = [json.dumps({**good, "speaker": "TYBALT"}), json.dumps({**good, "line": "a" * 13}),
           json.dumps({**good, "line": 'say "ay"'}), json.dumps({**good, "line": "a\nb"}),
           json.dumps({**good, "aside": 1}), json.dumps(good, indent=1), json.dumps(good, separators=(",", ":")),
           json.dumps(dict(reversed(list(good.items())))), json.dumps(good)[:-1]]
    assert not any(full(pattern, text) for text in bad)
    numbers = schema_regex({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert [full(numbers, f'{{"n": {n}}}') for n in ["0", "-12", "07", "1.5", "+1", "1e3", ""]] == \
        [True, True, False, False, False, False, False]


@pytest.mark.parametrize("schema", [{"type": "array"}, {"properties": {}},
                                    {"type": "object", "properties": {"a": {"type": "number"}}},
                                    {"type": "object", "properties": {"a": {"enum": []}}},
                                    {"type": "object", "properties": {"a": {"enum": [1]}}}])
def test_schemas_outside_the_subset_raise_value_error(schema):
    with pytest.raises(ValueError):
        schema_regex(schema)


# ---------------------------------------------------------------- generation

SHAPE = dict(vocab_size=50257, block_size=128, n_layer=1, n_head=2, n_embd=16, weight_std=0.4)


@pytest.fixture(scope="module")
def models():
    """{seed: (our GPT, Hugging Face's GPT2LMHeadModel)} holding the same random weights, GPT-2's vocabulary."""
    return {seed: (random_gpt(seed=seed, **SHAPE), random_gpt2(seed=seed, **SHAPE)) for seed in (1, 2)}


@pytest.fixture(scope="module")
def constraints(enc):
    return {p: Constraint.regex(p, enc) for p in BOUNDED}


SETTINGS = [{}, {"do_sample": True}, {"do_sample": True, "temperature": 0.7, "top_k": 20},
            {"do_sample": True, "temperature": 1.5, "top_p": 0.9}, {"repetition_penalty": 1.3},
            {"do_sample": True, "min_p": 0.05, "repetition_penalty": 1.2}]


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(pattern=st.sampled_from(BOUNDED), sampling=st.sampled_from(SETTINGS), seed=st.integers(0, 10**6),
       model_seed=st.sampled_from([1, 2]), use_cache=st.booleans())
def test_every_constrained_output_fully_matches_its_pattern(models, constraints, enc, pattern, sampling, seed,
                                                            model_seed, use_cache):
    model, _ = models[model_seed]
    torch.manual_seed(seed)
    out = constrained_generate(model, enc, "Answer: ", constraints[pattern], 120, use_cache=use_cache, **sampling)
    assert out.finish_reason == "eos" and out.ids[-1] == END and END not in out.ids[:-1]
    assert full(pattern, out.text), (pattern, out.text)
    assert out.text == enc.decode(out.ids[:-1])
    if pattern == schema_regex(SCHEMA):
        assert set(json.loads(out.text)) == set(SCHEMA["properties"])


def hf_constrained(hf, prompt_ids, constraint, max_new_tokens, **sampling):
    """Hugging Face's generate with the constraint's mask as its prefix_allowed_tokens_fn."""
    sampling = dict(sampling)
    if sampling.get("do_sample"):
        sampling.setdefault("top_k", 0)  # no top-k unless asked (generate's default may be 50)
    def allowed(batch_id, ids):
        return constraint.allowed(ids[len(prompt_ids):].tolist()).nonzero().flatten().tolist()

    with torch.no_grad(), quiet_transformers():
        out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, prefix_allowed_tokens_fn=allowed,
                          eos_token_id=END, pad_token_id=END, do_sample=sampling.pop("do_sample", False), **sampling)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("sampling", SETTINGS)
@pytest.mark.parametrize("pattern", [BOUNDED[0], PATTERNS[1], BOUNDED[-1]])
def test_constrained_generation_equals_hugging_face_with_the_same_mask(models, enc, sampling, pattern):
    constraint = Constraint.regex(pattern, enc)
    prompt = enc.encode("The answer, as asked: ")
    for model_seed, seed in [(1, 11), (2, 12)]:
        model, hf = models[model_seed]
        torch.manual_seed(seed)
        want = hf_constrained(hf, prompt, constraint, 40, **sampling)
        for use_cache in (True, False):
            torch.manual_seed(seed)
            got = constrained_generate(model, enc, prompt, constraint, 40, use_cache=use_cache, **sampling)
            assert got.ids == want, (pattern, sampling, model_seed, use_cache)


def test_generate_with_a_constraint_is_the_constrained_loop_or_beam_search(models, constraints, enc):
    """Chapter 6's generate with constraint=: sampling goes to constrained_generate, beams to
    constrained_beam_search, and without a constraint it is chapter 6's generate, the same ids each time."""
    from minigpt import samplers

    model, _ = models[2]
    constraint = constraints[BOUNDED[0]]
    for sampling in SETTINGS[:4]:
        torch.manual_seed(5)
        want = constrained_generate(model, enc, "Answer: ", constraint, 30, **sampling)
        torch.manual_seed(5)
        got = generate(model, enc, "Answer: ", 30, constraint=constraint, **sampling)
        assert got == want and full(BOUNDED[0], got.text), sampling
    want = constrained_beam_search(model, enc, "Answer: ", constraint, 12, num_beams=3, length_penalty=2.0)
    assert generate(model, enc, "Answer: ", 12, constraint=constraint, num_beams=3, length_penalty=2.0) == want
    for options in ({}, {"num_beams": 2}, {"do_sample": True, "top_k": 5, "seed": 3}):
        got = generate(model, enc, "Answer: ", 8, **options)
        assert got == samplers.generate(model, enc, "Answer: ", 8, **options), options
    for options, message in [({"stop": "\n"}, "stop cannot be used"), ({"eos_ids": [1]}, "eos_ids cannot be used"),
                             ({"num_beams": 2, "do_sample": True}, "no sampling settings")]:
        with pytest.raises(ValueError, match=message):
            generate(model, enc, "Answer: ", 8, constraint=constraint, **options)


def test_a_short_budget_ends_with_reason_length_and_a_prefix_of_a_match(models, enc):
    model, _ = models[1]
    constraint = Constraint.json(SCHEMA, enc)
    out = constrained_generate(model, enc, "{", constraint, 5)
    assert out.finish_reason == "length" and len(out.ids) == 5 and partial(schema_regex(SCHEMA), out.text)


def test_the_course_model_writes_json_that_parses_only_when_constrained(enc):
    model = GPT.from_pretrained(coursekit.shipped_model_dir())
    schema = {"type": "object", "properties": {"speaker": {"enum": ["ROMEO", "JULIET"]},
                                               "line": {"type": "string", "maxLength": 20},
                                               "mood": {"enum": ["happy", "sad"]}}}
    constraint = Constraint.json(schema, enc)
    prompt = '{"speaker": "ROMEO", "line": "But soft!", "mood": "happy"}\n'
    for seed in range(3):
        out = constrained_generate(model, enc, prompt, constraint, 110, do_sample=True, seed=seed)
        assert out.finish_reason == "eos" and list(json.loads(out.text)) == ["speaker", "line", "mood"]


# ---------------------------------------------------------------- errors

def test_a_vocabulary_that_cannot_spell_the_pattern_is_named(enc):
    model = GPT(coursekit_config(60)).eval()
    with pytest.raises(ValueError, match="the vocabulary cannot spell any text that the pattern"):
        constrained_generate(model, enc, [0], Constraint.regex("[a-z]+", enc, 60), 4)


def test_a_constraint_that_can_no_longer_be_met_is_named():
    vocab = [b"a", b"ab", b"x", None]
    constraint = Constraint(compile_regex("abc"), vocab, [3], "the pattern 'abc'")
    model = GPT(coursekit_config(4)).eval()
    with pytest.raises(ValueError, match=r"after '(a|ab)', no token continues .* can no longer be met"):
        constrained_generate(model, None, [2], constraint, 4)
    with pytest.raises(ValueError, match="built for 4 token ids, the model has 60"):
        constrained_generate(GPT(coursekit_config(60)), None, [2], constraint, 4)


def coursekit_config(vocab_size: int):
    from minigpt.transformer import GPTConfig

    return GPTConfig(vocab_size=vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=8)


@pytest.mark.parametrize("pattern", [PATTERNS[0], PATTERNS[4], PATTERNS[5], PATTERNS[6], schema_regex(SCHEMA)])
def test_all_masks_has_every_state_s_dfa_mask(pattern, vocab, trie):
    """all_masks (every state at once, one depth of the trie at a time) against dfa_mask (one state, node by node),
    on every state: the multi-byte characters and the JSON string's counted characters give many states."""
    dfa = compile_regex(pattern)
    masks = all_masks(dfa, trie_levels(trie, len(vocab)), {END}, chunk=7)  # chunks that do not divide the states
    assert masks.shape == (len(dfa.table), len(vocab)) and masks.dtype == torch.bool
    for state in range(len(dfa.table)):
        assert torch.equal(masks[state], dfa_mask(dfa, state, trie, len(vocab), {END})), (pattern, state)


def test_all_masks_on_a_small_vocabulary_with_gaps_twins_and_pieces():
    vocab = [b"a", b"ab", b"ab", None, b"", b"b", b"\xe7\x8c", b"\xa0", b"abc"]
    trie = build_trie(vocab)
    for pattern in ["ab?c?", "(ab)*", "b|c", "猫"]:
        dfa = compile_regex(pattern)
        for eos in (set(), {3}):
            masks = all_masks(dfa, trie_levels(trie, len(vocab)), eos, chunk=2)
            for state in range(len(dfa.table)):
                assert torch.equal(masks[state], dfa_mask(dfa, state, trie, len(vocab), eos)), (pattern, eos, state)
    none = all_masks(compile_regex("z"), trie_levels(trie, len(vocab)), {3})
    assert not none[0].any() and none[1].tolist() == [i == 3 for i in range(len(vocab))], "no token spells z"
    dfa = compile_regex("(ab)*")
    every = all_masks(dfa, trie_levels(trie, len(vocab)), {3})
    assert torch.equal(all_masks(dfa, trie_levels(trie, len(vocab)), {3}, states=[1, 0]), every[[1, 0]])


def test_a_constraint_holds_every_state_s_mask_and_a_step_looks_it_up(enc):
    constraint = Constraint.regex(r"\d{1,3}", enc)
    assert sorted(constraint.masks) == list(range(len(constraint.dfa.table)))
    assert torch.equal(constraint.allowed([]), constraint.masks[0]) and END not in ids_of(constraint.allowed([]))
    one = enc.encode("7")
    assert END in ids_of(constraint.allowed(one)) and ids_of(constraint.allowed(one)) >= {enc.encode("12")[0]}
    assert not constraint.allowed(enc.encode("x")).any()
    assert not constraint.allowed(enc.encode("1234")).any()


def test_an_automaton_over_the_budget_gets_its_masks_as_its_states_are_met(enc, trie, monkeypatch):
    import minigpt.constrained

    big = {"type": "object", "properties": {"line": {"type": "string", "maxLength": 40}}}
    monkeypatch.setattr(minigpt.constrained, "MASK_BUDGET", 100 * 50257)  # fewer states than the schema's
    constraint = Constraint.json(big, enc)
    dfa = constraint.dfa
    assert len(dfa.table) > 100 and constraint.masks == {}
    written = enc.encode('{"line": "Good morrow')
    state = constraint.state_after(written)
    mask = constraint.allowed(written)
    assert torch.equal(mask, dfa_mask(dfa, state, trie, 50257, set())) and 0 < len(constraint.masks) <= 64
    assert state - state % 64 in constraint.masks and constraint.allowed(written) is mask


def test_the_vocabulary_of_chapter_1s_tokenizer_is_tiktoken_s(vocab):
    from minigpt.tokens import gpt2_tokenizer

    assert vocabulary(gpt2_tokenizer(), 50257) == vocab
    assert vocab[END] is None and vocab[:3] == [b"!", b'"', b"#"]
    assert vocabulary(coursekit.gpt2_encoding(), 50300)[50257:] == [None] * 43  # ids the tokenizer does not have
    assert Constraint.regex("a", gpt2_tokenizer()).vocab == vocab


# ---------------------------------------------------------------- beam search

class RenormalisedMask:
    """A Hugging Face logits processor: HF's beam search hands it log-probabilities; it sets -inf where the constraint
    does not allow the token and renormalises the row over the allowed tokens (log_softmax again), which is what
    masking the logits before the log-softmax gives. A beam that left the pattern (picked at -inf) is left as it is."""

    def __init__(self, constraint: Constraint, prompt_len: int):
        self.constraint, self.prompt_len = constraint, prompt_len

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for row, ids in zip(scores, input_ids.tolist()):
            new = ids[self.prompt_len:]
            if self.constraint.state_after(new) >= 0:
                row.copy_(torch.log_softmax(row.masked_fill(~self.constraint.allowed(new), float("-inf")), dim=-1))
        return scores


def hf_beams(hf, prompt_ids, constraint, max_new_tokens, num_beams, length_penalty, renormalised=True):
    """The generated ids of Hugging Face's best beam (with chapter 6's settings), cut after its end-of-text id:
    masked by RenormalisedMask, or by ``prefix_allowed_tokens_fn`` (HF's own way: the mask after the log-softmax)."""
    from transformers import LogitsProcessorList

    if renormalised:
        how = dict(logits_processor=LogitsProcessorList([RenormalisedMask(constraint, len(prompt_ids))]))
    else:
        how = dict(prefix_allowed_tokens_fn=lambda _, ids: constraint.allowed(
            ids[len(prompt_ids):].tolist()).nonzero().flatten().tolist())
    with torch.no_grad(), quiet_transformers():
        out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                          num_beams=num_beams, length_penalty=length_penalty, eos_token_id=END, pad_token_id=END,
                          **how)
    row = out[0, len(prompt_ids):].tolist()
    return row[:row.index(END) + 1] if END in row else row


def beam_constraint(enc, kind: str) -> tuple[Constraint, str]:
    """A constraint, and the pattern its texts fully match."""
    if kind.startswith("choices:"):
        options = kind.removeprefix("choices:").split("|")
        return Constraint.choices(options, enc), "|".join(map(escape, options))
    if kind == "schema":
        return Constraint.json(SCHEMA, enc), schema_regex(SCHEMA)
    return Constraint.regex(kind, enc), kind


# (constraint, model seed, max_new_tokens, num_beams, length_penalty): most end with end-of-text, the schema at 8
# tokens runs out of steps; one or two choices leave fewer allowed tokens than beam search takes candidates, so
# beams are picked at -inf.
BEAM_CASES = [
    (BOUNDED[0], 1, 10, 2, 1.0), (BOUNDED[0], 2, 6, 4, 2.0), (PATTERNS[1], 1, 20, 3, 0.5),
    (PATTERNS[1], 2, 12, 4, 1.0), (PATTERNS[2], 1, 8, 3, 2.0), ("choices:yes", 1, 6, 4, 1.0),
    ("choices: Paris| London", 2, 6, 4, 1.0), ("schema", 1, 8, 2, 1.0), ("schema", 2, 60, 3, 1.0),
]


@pytest.mark.parametrize("kind, model_seed, max_new_tokens, num_beams, length_penalty", BEAM_CASES)
def test_constrained_beam_search_equals_hugging_face_with_the_renormalised_mask(models, enc, kind, model_seed,
                                                                                max_new_tokens, num_beams,
                                                                                length_penalty):
    constraint, pattern = beam_constraint(enc, kind)
    model, hf = models[model_seed]
    prompt = enc.encode("The answer, as asked: ")
    got = constrained_beam_search(model, enc, prompt, constraint, max_new_tokens, num_beams, length_penalty)
    assert got.ids == hf_beams(hf, prompt, constraint, max_new_tokens, num_beams, length_penalty)
    assert got.prompt_ids == prompt and got.text == enc.decode([i for i in got.ids if i != END])
    if got.finish_reason == "eos":
        assert got.ids[-1] == END and END not in got.ids[:-1] and full(pattern, got.text), got.text
    else:
        assert got.finish_reason == "length" and len(got.ids) == max_new_tokens and partial(pattern, got.text)


def test_the_beam_cases_end_both_ways(models, enc):
    reasons = {constrained_beam_search(models[seed][0], enc, "The answer, as asked: ", beam_constraint(enc, kind)[0],
                                       n, beams, lp).finish_reason for kind, seed, n, beams, lp in BEAM_CASES}
    assert reasons == {"eos", "length"}


@pytest.mark.parametrize("pattern, num_beams", [(BOUNDED[0], 2), (PATTERNS[1], 4)])
def test_the_mask_before_the_log_softmax_keeps_other_beams_than_hugging_face_s_prefix_fn(models, enc, pattern,
                                                                                      num_beams):
    """What the chapter says: HF's prefix_allowed_tokens_fn masks log-probabilities that stay the model's own, this
    beam search renormalises them over the allowed tokens, and the best beam differs."""
    constraint = Constraint.regex(pattern, enc)
    model, hf = models[1]
    prompt = enc.encode("The answer, as asked: ")
    got = constrained_beam_search(model, enc, prompt, constraint, 20, num_beams).ids
    assert got == hf_beams(hf, prompt, constraint, 20, num_beams, 1.0)
    assert got != hf_beams(hf, prompt, constraint, 20, num_beams, 1.0, renormalised=False)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(pattern=st.sampled_from(BOUNDED), num_beams=st.integers(2, 4), length_penalty=st.sampled_from([0.0, 1.0, 2.0]),
       model_seed=st.sampled_from([1, 2]))
def test_every_constrained_beam_output_fully_matches_its_pattern(models, constraints, enc, pattern, num_beams,
                                                                 length_penalty, model_seed):
    out = constrained_beam_search(models[model_seed][0], enc, "Answer: ", constraints[pattern], 100, num_beams,
                                  length_penalty)
    assert out.finish_reason == "eos" and out.ids[-1] == END and END not in out.ids[:-1]
    assert full(pattern, out.text), (pattern, out.text)


def test_beam_search_sees_every_generated_id_past_the_block_size(enc):
    """last_logits keeps the last block_size ids; the mask needs all the generated ones. With one beam, beam search
    is greedy: it must equal constrained_generate, which keeps its own ids; with three, the output still matches."""
    model = random_gpt(seed=3, **{**SHAPE, "block_size": 12})
    pattern = r"[a-z]{1,6}( [a-z]{1,6}){0,2}\."
    constraint = Constraint.regex(pattern, enc)
    prompt = enc.encode("Three words at most, then a full stop:")
    assert len(prompt) == 10  # the first generated ids fall out of the window after two steps
    greedy = constrained_beam_search(model, enc, prompt, constraint, 30, num_beams=1)
    assert greedy.ids == constrained_generate(model, enc, prompt, constraint, 30, use_cache=False).ids
    assert len(prompt) + len(greedy.ids) > 12 and greedy.finish_reason == "eos" and full(pattern, greedy.text)
    beams = constrained_beam_search(model, enc, prompt, constraint, 30, num_beams=3)
    assert len(prompt) + len(beams.ids) > 12 and beams.finish_reason == "eos" and full(pattern, beams.text)


def test_a_beam_picked_at_minus_infinity_gets_the_plain_logits_and_no_nan(models, enc):
    model, _ = models[1]
    constraint = Constraint.choices(["yes"], enc)
    prompt = enc.encode("Yes or no? ")
    masked = MaskedModel(model, constraint, len(prompt))
    with torch.no_grad():
        live = masked(torch.tensor([prompt]))[0, -1]
        dead = masked(torch.tensor([prompt + enc.encode(" no")]))[0, -1]
        plain = model(torch.tensor([prompt + enc.encode(" no")]))[0, -1]
    assert set(live.isfinite().nonzero().flatten().tolist()) == ids_of(constraint.allowed([]))
    assert torch.equal(dead, plain)
    for options in (["yes"], ["yes", "no"], ["猫"]):
        out = constrained_beam_search(model, enc, prompt, Constraint.choices(options, enc), 6, num_beams=4)
        assert out.finish_reason == "eos" and out.text in options, (options, out)


def test_constrained_beam_search_errors_are_named(enc):
    vocab = [b"a", b"ab", b"x", None]
    constraint = Constraint(compile_regex("abc"), vocab, [3], "the pattern 'abc'")
    model = GPT(coursekit_config(4)).eval()
    with pytest.raises(ValueError, match=r"after '(a|ab)', no token continues .* can no longer be met"):
        constrained_beam_search(model, None, [2], constraint, 4, num_beams=2)
    with pytest.raises(ValueError, match="the vocabulary cannot spell any text that the pattern"):
        constrained_beam_search(GPT(coursekit_config(60)).eval(), enc, [0], Constraint.regex("[a-z]+", enc, 60), 4)
    with pytest.raises(ValueError, match="built for 4 token ids, the model has 60"):
        constrained_beam_search(GPT(coursekit_config(60)), None, [2], constraint, 4)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"max_new_tokens must be an integer >= 1 for beam search, got {bad!r}"):
            constrained_beam_search(model, None, [2], constraint, bad)
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1, got 0"):
        constrained_beam_search(model, None, [2], constraint, 4, num_beams=0)
