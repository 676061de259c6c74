"""The reference samplers (minigpt.samplers) against Hugging Face, the external oracle for chapter 6.

Filters against HF's logits processors on random logits; seeded sampling through chapter 5's loop against
`torch.manual_seed(s); generate(do_sample=True)`; beam search against `generate(num_beams=k)`, with
end-of-text ids that make beams finish early; on random GPT-2s and on the course's trained model. Then
the frequencies of the draws (chi-square), and every bad setting.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (GPT2LMHeadModel, LogitsProcessorList, MinPLogitsWarper, NoRepeatNGramLogitsProcessor,
                          RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

import coursekit
from autograder.checks import samplers as checks
from minigpt.generation import token_stream
from minigpt.samplers import (Sampler, apply_presence_frequency_penalty, apply_repetition_penalty,
                              apply_temperature, ban_repeated_ngrams, beam_search, generate, min_p_filter,
                              sample_from_logits, top_k_filter, top_p_filter)
from minigpt.transformer import GPT

pytestmark = pytest.mark.usefixtures("torch_one_thread")

NEWLINE = 198  # GPT-2's "\n": as a second end-of-text id it makes beams end at the end of a line
END = 50256
NEG = float("-inf")
EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True, database=None)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    finite = ~torch.isinf(want)
    return (torch.equal(torch.isneginf(got), torch.isneginf(want))
            and torch.allclose(got[finite], want[finite], atol=1e-6, rtol=1e-6))


def random_logits(seed: int, rows: int = 3, vocab: int = 50, removed: float = 0.0, step: float = 0.0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, vocab, generator=gen) * 3
    if step:
        z = (z / step).round() * step
    if removed:
        mask = torch.rand(rows, vocab, generator=gen) < removed
        mask[:, 0] = False
        z = z.masked_fill(mask, float("-inf"))
    return z


logits_args = dict(seed=st.integers(0, 10**6), removed=st.sampled_from([0.0, 0.3]), step=st.sampled_from([0.0, 1.0]))


# ---------------------------------------------------------------- the filters, against HF's processors

@EXAMPLES
@given(temperature=st.floats(0.05, 20.0), **logits_args)
def test_temperature_equals_hf(temperature, seed, removed, step):
    z = random_logits(seed, removed=removed, step=step)
    assert same(apply_temperature(z, temperature), TemperatureLogitsWarper(temperature)(None, z.clone()))


@EXAMPLES
@given(k=st.integers(1, 60), **logits_args)
def test_top_k_equals_hf_ties_included(k, seed, removed, step):
    z = random_logits(seed, removed=removed, step=step)
    assert same(top_k_filter(z, k), TopKLogitsWarper(k)(None, z.clone()))


def test_top_k_zero_keeps_everything():
    z = random_logits(1)
    assert torch.equal(top_k_filter(z, 0), z)


@EXAMPLES
@given(p=st.floats(0.01, 1.0), **logits_args)
def test_top_p_equals_hf(p, seed, removed, step):
    z = random_logits(seed, removed=removed, step=step)
    assert same(top_p_filter(z, p), TopPLogitsWarper(p)(None, z.clone()))


@EXAMPLES
@given(p=st.floats(0.0, 1.0), **logits_args)
def test_min_p_equals_hf(p, seed, removed, step):
    z = random_logits(seed, removed=removed, step=step)
    assert same(min_p_filter(z, p), MinPLogitsWarper(p)(None, z.clone()))


def test_filters_take_one_row_as_well_as_a_batch():
    z = random_logits(2, rows=1)[0]
    assert same(top_k_filter(z, 5), TopKLogitsWarper(5)(None, z[None].clone())[0])
    assert same(top_p_filter(z, 0.7), TopPLogitsWarper(0.7)(None, z[None].clone())[0])
    assert same(min_p_filter(z, 0.1), MinPLogitsWarper(0.1)(None, z[None].clone())[0])


# Hugging Face's two extra arguments of the cuts (issue 17): min_tokens_to_keep and filter_value.
CUTS = {"top_k_filter": (top_k_filter, TopKLogitsWarper), "top_p_filter": (top_p_filter, TopPLogitsWarper),
        "min_p_filter": (min_p_filter, MinPLogitsWarper)}
SETTING = {"top_k_filter": st.integers(1, 60), "top_p_filter": st.floats(0.01, 0.99), "min_p_filter": st.floats(0.0, 1.0)}


def equal_but_ties_with_the_last_kept(got, want, z, min_tokens_to_keep) -> bool:
    """got equals want, except where a token ties with the ``min_tokens_to_keep``-th highest logit of its row: the
    reference keeps every such token (at its logit), where Hugging Face keeps the ones its sort happens to put first.
    Where no token ties with it, got must equal want exactly."""
    last_kept = torch.topk(z, min(min_tokens_to_keep, z.shape[-1]), dim=-1).values[..., -1:]
    tied = z == last_kept
    if not (tied.sum(-1) > 1).any():
        return torch.equal(got, want)
    return bool(((got == want) | (tied & (got == z))).all())


@EXAMPLES
@pytest.mark.parametrize("name", sorted(CUTS))
@given(data=st.data(), min_tokens_to_keep=st.integers(1, 60),
       filter_value=st.sampled_from([float("-inf"), -1e4, -5.0, 0.0]), seed=st.integers(0, 10**6),
       removed=st.sampled_from([0.0, 0.3, 0.9]), step=st.sampled_from([0.0, 1.0]))
def test_cut_options_equal_hf(name, data, min_tokens_to_keep, filter_value, seed, removed, step):
    """top_k_filter, top_p_filter and min_p_filter with min_tokens_to_keep and filter_value against the warper of the
    same name, on logits with ties and with tokens already at -inf (which a cut may remove: they get filter_value)."""
    cut, warper = CUTS[name]
    setting = data.draw(SETTING[name])
    z = random_logits(seed, removed=removed, step=step)
    got = cut(z, setting, min_tokens_to_keep=min_tokens_to_keep, filter_value=filter_value)
    want = warper(setting, filter_value=filter_value, min_tokens_to_keep=min_tokens_to_keep)(None, z.clone())
    assert equal_but_ties_with_the_last_kept(got, want, z, min_tokens_to_keep)


def test_cut_options_keep_at_least_that_many_tokens_and_write_the_filter_value():
    z = torch.tensor([[3.0, 1.0, 0.5, 0.0, -1.0]])  # probabilities 0.78, 0.11, 0.06, 0.04, 0.01
    assert torch.equal(top_p_filter(z, 0.5, min_tokens_to_keep=3, filter_value=-1e4),
                       torch.tensor([[3.0, 1.0, 0.5, -1e4, -1e4]]))
    assert torch.equal(min_p_filter(z, 0.5, min_tokens_to_keep=2), torch.tensor([[3.0, 1.0, NEG, NEG, NEG]]))
    assert torch.equal(top_k_filter(z, 1, min_tokens_to_keep=4, filter_value=0.5), torch.tensor([[3, 1, 0.5, 0, 0.5]]))
    assert torch.equal(top_k_filter(z, 2, min_tokens_to_keep=9), z)  # more than the vocabulary: all of it


def test_cut_options_take_one_row_keep_float64_and_leave_the_logits_alone():
    z = random_logits(11, rows=2, vocab=30, removed=0.2).double()
    before = z.clone()
    for name, (cut, warper) in CUTS.items():
        setting = {"top_k_filter": 4, "top_p_filter": 0.6, "min_p_filter": 0.3}[name]
        want = warper(setting, filter_value=-50.0, min_tokens_to_keep=6)(None, z.clone())
        got = cut(z, setting, min_tokens_to_keep=6, filter_value=-50.0)
        assert got.dtype == torch.float64 and torch.equal(got, want), name
        assert torch.equal(cut(z[0], setting, min_tokens_to_keep=6, filter_value=-50.0), want[0]), name
        assert torch.equal(z, before), name


@pytest.mark.parametrize("name", sorted(CUTS))
@pytest.mark.parametrize("options, message", [
    (dict(min_tokens_to_keep=0), "min_tokens_to_keep must be a positive integer, got 0"),
    (dict(min_tokens_to_keep=-2), "min_tokens_to_keep must be a positive integer, got -2"),
    (dict(min_tokens_to_keep=2.5), "min_tokens_to_keep must be a positive integer, got 2.5"),
    (dict(filter_value=float("nan")), "filter_value must be a number"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_cut_options_out_of_range_raise_naming_them(name, options, message):
    cut, _ = CUTS[name]
    with pytest.raises(ValueError, match=re.escape(message)):
        cut(random_logits(1), 0.5 if name != "top_k_filter" else 3, **options)


@EXAMPLES
@given(seed=st.integers(0, 10**6), min_tokens_to_keep=st.integers(1, 12), filter_value=st.sampled_from([-1e4, -5.0]),
       removed=st.sampled_from([0.0, 0.3]))
def test_sampler_with_cut_options_equals_hf_processors(seed, min_tokens_to_keep, filter_value, removed):
    """Sampler.process: temperature, top-k, top-p and min-p with both extras, as Hugging Face's warpers in that order."""
    z = random_logits(seed, removed=removed)
    options = dict(filter_value=filter_value, min_tokens_to_keep=min_tokens_to_keep)
    sampler = Sampler(do_sample=True, temperature=0.8, top_k=6, top_p=0.7, min_p=0.05, **options)
    hf = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(6, **options),
                              TopPLogitsWarper(0.7, **options), MinPLogitsWarper(0.05, **options)])
    want = hf(None, z.clone())
    assert equal_but_ties_with_the_last_kept(sampler.process(z, torch.zeros(3, 0, dtype=torch.long)), want,
                                             apply_temperature(z, 0.8), min_tokens_to_keep)


@EXAMPLES
@given(seed=st.integers(0, 10**6), penalty=st.floats(0.2, 5.0), length=st.integers(1, 12))
def test_repetition_penalty_equals_hf(seed, penalty, length):
    z = random_logits(seed, vocab=20)
    ids = torch.randint(0, 20, (3, length), generator=torch.Generator().manual_seed(seed))
    assert same(apply_repetition_penalty(z, ids, penalty), RepetitionPenaltyLogitsProcessor(penalty)(ids, z.clone()))


@EXAMPLES
@given(seed=st.integers(0, 10**6), n=st.integers(1, 5), length=st.integers(1, 14))
def test_no_repeat_ngram_equals_hf(seed, n, length):
    z = random_logits(seed, vocab=6)
    ids = torch.randint(0, 6, (3, length), generator=torch.Generator().manual_seed(seed))  # few tokens: repeats
    assert same(ban_repeated_ngrams(z, ids, n), NoRepeatNGramLogitsProcessor(n)(ids, z.clone()))


@pytest.mark.parametrize("f, bad", [(top_k_filter, -1), (top_p_filter, 0.0), (top_p_filter, 1.5),
                                    (top_p_filter, float("nan")), (min_p_filter, -0.1), (min_p_filter, 1.5),
                                    (min_p_filter, float("nan"))], ids=lambda v: getattr(v, "__name__", repr(v)))
def test_filters_reject_settings_out_of_range_nan_included(f, bad):
    with pytest.raises(ValueError):
        f(random_logits(1), bad)


@pytest.mark.parametrize("shift", [1e4, -1e4])
def test_filters_equal_hf_far_from_zero(shift):
    """exp overflows above 88 and underflows below -103 in float32: the reference's softmax does neither."""
    z = random_logits(5, rows=4, removed=0.3) + shift
    assert same(top_p_filter(z, 0.8), TopPLogitsWarper(0.8)(None, z.clone()))
    assert same(min_p_filter(z, 0.1), MinPLogitsWarper(0.1)(None, z.clone()))


def test_functions_leave_their_inputs_alone_and_keep_float64():
    z = random_logits(6, rows=2, vocab=20, removed=0.2).double()
    ids = torch.tensor([[1, 2, 3, 1, 2], [4, 4, 5, 6, 4]])
    calls = [(apply_temperature, (0.7,)), (top_k_filter, (5,)), (top_p_filter, (0.8,)), (min_p_filter, (0.2,)),
             (apply_repetition_penalty, (ids, 1.3)), (apply_presence_frequency_penalty, (ids, 1, 0.5, 0.25)),
             (ban_repeated_ngrams, (ids, 2))]
    for f, args in calls:
        before = z.clone(), ids.clone()
        out = f(z, *args)
        assert out.dtype == torch.float64, f
        assert torch.equal(z, before[0]) and torch.equal(ids, before[1]), f
    assert torch.equal(ids, before[1])
    before = z.clone()
    sample_from_logits(z, torch.Generator().manual_seed(0))
    assert torch.equal(z, before)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_penalties_take_int32_ids_and_no_ids_yet(dtype):
    z = random_logits(7, rows=2, vocab=10)
    ids = torch.tensor([[1, 2, 2, 3, 3, 3], [4, 4, 4, 4, 5, 6]], dtype=dtype)
    assert same(apply_repetition_penalty(z, ids, 1.3), RepetitionPenaltyLogitsProcessor(1.3)(ids.long(), z.clone()))
    assert same(ban_repeated_ngrams(z, ids, 2), NoRepeatNGramLogitsProcessor(2)(ids.long(), z.clone()))
    got = apply_presence_frequency_penalty(z, ids, 2, 0.5, 0.25)
    assert same(got, checks._openai(z, ids.long(), 2, 0.5, 0.25))
    none = ids[:, :0]
    for n in (1, 2):
        assert same(ban_repeated_ngrams(z, none, n), z)
    assert same(apply_repetition_penalty(z, none, 1.3), z)
    assert same(apply_presence_frequency_penalty(z, none, 0, 0.5, 0.25), z)


def test_the_in_place_helper_tells_a_changed_argument():
    """``helpers.samplers.run``, through which the checks call every learner function: it reports in-place changes
    of tensors and lists, and nothing for a function that only reads them."""
    from autograder.sandboxed.helpers import samplers as helpers

    z, ids = torch.zeros(2, 3), [1, 2]
    assert helpers.run(lambda x, i: x + 1, z, ids)[1] == [False, False]
    assert helpers.run(lambda x, i: x.add_(1), z.clone(), ids)[1] == [True, False]
    assert helpers.run(lambda x, i: i.append(3), z, list(ids))[1] == [False, True]
    assert list(helpers.one_pass([4, 5])) == [4, 5]


def test_presence_and_frequency_penalties_count_only_generated_tokens():
    z = random_logits(3, rows=2, vocab=10)
    ids = torch.tensor([[1, 2, 2, 3, 3, 3], [4, 4, 4, 4, 5, 6]])
    got = apply_presence_frequency_penalty(z, ids, prompt_len=2, presence=0.5, frequency=0.25)
    want = z.clone()
    for row, counts in enumerate([{2: 1, 3: 3}, {4: 2, 5: 1, 6: 1}]):  # ids[:, 2:], by hand
        for token, count in counts.items():
            want[row, token] -= 0.5 + 0.25 * count
    assert same(got, want)


@pytest.mark.parametrize("grade_id, names", [
    ("test_temperature", ["apply_temperature"]),
    ("test_filters", ["top_k_filter", "top_p_filter", "min_p_filter"]),
    ("test_penalties", ["apply_repetition_penalty", "apply_presence_frequency_penalty", "ban_repeated_ngrams"]),
    ("test_sample", ["sample_from_logits"]),
    ("test_beam_search", ["beam_search"]),
], ids=lambda value: value if isinstance(value, str) else "")
def test_hidden_checks_pass_the_reference(grade_id, names):
    """The checks judge stand-ins of the learner's objects: they run as a hidden test cell runs them (the judge in
    this process, through the same plain data)."""
    import minigpt.samplers as reference
    from autograder.sandboxed.hidden import check
    from autograder.trusted import forget_here

    forget_here()
    check(grade_id, *[getattr(reference, name) for name in names])


def test_the_learner_side_builds_the_beam_models_without_this_chapter(tmp_path):
    """The helpers run in chapter 6's sandbox, where minigpt.samplers cannot be imported, and need no transformers
    (2.7 s of a notebook's CPU). The GPT they build from the weights the judge sends holds the judge's Hugging Face
    model, and a generator they make draws as one seeded here does."""
    from autograder.run import blocked_modules

    torch.save(checks._beam_weights("b"), tmp_path / "weights.pt")
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked_modules('06-samplers')!r}))\n"
            "sys.modules['transformers'] = None\n"
            "import torch\n"
            "from autograder.sandboxed.helpers import make\n"
            f"weights = torch.load({str(tmp_path / 'weights.pt')!r}, weights_only=True)\n"
            f"model = make('samplers.gpt', *{checks.BEAM_MODELS['b'][:5]!r}, weights)\n"
            "print(repr(model(torch.tensor([[1, 2, 3]]))[0, -1].tolist()))\n"
            "print(repr(torch.randint(0, 1000, (5,), generator=make('samplers.generator', 6007)).tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    logits, draws = out.stdout.splitlines()[-2:]
    _, hf = checks._beam_models("b")
    with torch.no_grad():
        want = hf(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert torch.allclose(torch.tensor(eval(logits)), want, atol=1e-5)
    assert eval(draws) == torch.randint(0, 1000, (5,), generator=torch.Generator().manual_seed(6007)).tolist()


# ---------------------------------------------------------------- drawing a token

def test_sample_frequencies_follow_softmax_chi_square():
    """20,000 seeded draws per row: Pearson's chi-square against softmax, at a p-value that never fails a right
    sampler by chance (1e-9) and always fails a wrong distribution (here p ~ 1e-300)."""
    z = torch.tensor([[2.0, 1.0, 0.5, float("-inf"), -1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 3.0, float("-inf")]])
    draws = sample_from_logits(z.repeat_interleave(20_000, dim=0), torch.Generator().manual_seed(0)).view(2, -1)
    for row, d in zip(z, draws):
        counts = torch.bincount(d, minlength=z.shape[1]).double()
        probs = row.double().softmax(-1)
        assert counts[probs == 0].sum() == 0, "a token at -inf was drawn"
        _, p_value = checks._chi2(counts, probs)
        assert p_value > checks.CHI2_P_VALUE, (counts / counts.sum(), probs)
        _, p_wrong = checks._chi2(counts, (row / 2).double().softmax(-1))  # the temperature-2 distribution
        assert p_wrong < 1e-100


def test_sample_gives_one_id_for_one_row_and_handles_logits_far_from_zero():
    z = random_logits(8, rows=1)
    assert sample_from_logits(z, torch.Generator().manual_seed(0)).shape == (1,)
    far = random_logits(9, rows=64, removed=0.3) + 1e4
    want = torch.multinomial(far.softmax(-1), 1, generator=torch.Generator().manual_seed(2)).squeeze(-1)
    assert torch.equal(sample_from_logits(far, torch.Generator().manual_seed(2)), want)


def test_sample_draws_are_torch_multinomials_with_the_generator():
    z = random_logits(4, rows=64)
    got = sample_from_logits(z, torch.Generator().manual_seed(9))
    want = torch.multinomial(z.softmax(-1), 1, generator=torch.Generator().manual_seed(9)).squeeze(-1)
    assert got.shape == (64,) and torch.equal(got, want)


# ---------------------------------------------------------------- seeded sampling == HF generate

SAMPLING_SETTINGS = [
    dict(temperature=0.7),
    dict(top_k=5),
    dict(top_p=0.8),
    dict(min_p=0.1),
    dict(repetition_penalty=1.3),
    dict(no_repeat_ngram_size=2),
    dict(temperature=1.3, top_k=20, top_p=0.9, repetition_penalty=1.2),
    dict(temperature=0.9, min_p=0.05, no_repeat_ngram_size=3),
]


def hf_sample(hf, prompt, n, seed, eos=None, **kw) -> list[int]:
    torch.manual_seed(seed)
    kw.setdefault("top_k", 0)  # no top-k unless asked (generate's default may be 50)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=True, max_new_tokens=n, eos_token_id=eos,
                          pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("model_name", sorted(checks.BEAM_MODELS))
@pytest.mark.parametrize("kw", SAMPLING_SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_seeded_sampling_equals_hf_generate_on_a_random_gpt(model_name, kw):
    model, hf = checks._beam_models(model_name)
    prompt = [3, 14, 15, 9]
    for seed in (0, 1):
        got = list(token_stream(model, prompt, 16, choose=Sampler(do_sample=True, seed=seed, **kw)))
        assert got == hf_sample(hf, prompt, 16, seed, **kw)


@pytest.mark.parametrize("model_name", sorted(checks.BEAM_MODELS))
def test_seeded_sampling_with_cut_options_equals_hf_generate(model_name):
    """min_tokens_to_keep and filter_value through chapter 5's loop: Hugging Face's generate takes them only as
    warpers of its own making, so the same warpers go in as its logits_processor."""
    model, hf = checks._beam_models(model_name)
    prompt = [3, 14, 15, 9]
    options = dict(filter_value=-1e4, min_tokens_to_keep=8)
    for seed in (0, 1):
        choose = Sampler(do_sample=True, seed=seed, top_k=5, top_p=0.3, **options)
        processors = LogitsProcessorList([TopKLogitsWarper(5, **options), TopPLogitsWarper(0.3, **options)])
        assert list(token_stream(model, prompt, 16, choose=choose)) == hf_sample(hf, prompt, 16, seed,
                                                                                   logits_processor=processors)


def test_temperature_zero_with_sampling_is_exactly_greedy():
    model, hf = checks._beam_models("a")
    prompt = [3, 14, 15, 9]
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, eos_token_id=None,
                             pad_token_id=0)[0, 4:].tolist()
    for seed in (0, 1, 2):
        assert list(token_stream(model, prompt, 16, choose=Sampler(do_sample=True, temperature=0, seed=seed))) == greedy


# ---------------------------------------------------------------- beam search == HF generate

def test_hidden_beam_cases_have_beams_that_finish_early():
    """The check's cases must exercise end-of-text handling: some best hypotheses end with an end-of-text id,
    and some do not although other beams ended."""
    best_ends, other_ends = 0, 0
    for case in checks.BEAM_CASES:
        model, prompt, n, beams, lp, eos, want = checks.beam_case(case)
        assert beam_search(model, prompt, n, beams, lp, eos) == want, case
        hyps = checks._hf_beams(checks._beam_models(case[0])[1], prompt, n, beams, lp, eos, hypotheses=beams) \
            if beams > 1 else [want]
        if want and want[-1] in eos:
            best_ends += 1
        elif any(h and h[-1] in eos for h in hyps):
            other_ends += 1
    assert best_ends >= 3 and other_ends >= 2, (best_ends, other_ends)


def test_beam_search_with_one_beam_is_greedy_and_takes_eos_ids_as_any_iterable():
    model, hf = checks._beam_models("a")
    prompt = [3, 14, 15, 9]
    liked = checks._liked_tokens("a", tuple(prompt), 10)
    for eos in ([], liked[:1]):
        greedy = checks._hf_beams(hf, prompt, 10, 1, 1.0, eos)
        for lp in (1.0, 2.0, -1.0):
            assert beam_search(model, prompt, 10, 1, lp, eos) == greedy[0], (eos, lp)
    want = checks._hf_beams(hf, prompt, 10, 3, 1.0, liked[:2])[0]
    for eos in (tuple(liked[:2]), set(liked[:2]), (t for t in liked[:2])):
        kept = list(prompt)
        assert beam_search(model, kept, 10, 3, 1.0, eos) == want
        assert kept == prompt


@pytest.mark.parametrize("model_name", sorted(checks.BEAM_MODELS))
@pytest.mark.parametrize("beams", [2, 3, 5])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0, -0.5])
def test_beam_search_equals_hf_with_end_of_text(model_name, beams, length_penalty):
    model, hf = checks._beam_models(model_name)
    for prompt in ([1, 2, 3], [17]):
        liked = checks._liked_tokens(model_name, tuple(prompt), 10)
        for eos in ([], liked[:1], liked[1:3]):
            want = checks._hf_beams(hf, prompt, 10, beams, length_penalty, eos)[0]
            assert beam_search(model, prompt, 10, beams, length_penalty, eos) == want, (prompt, eos)


# ---------------------------------------------------------------- the course's trained model

@pytest.fixture(scope="module")
def shipped():
    folder = coursekit.shipped_model_dir()
    # The checkpoint is float16: without dtype, transformers would compute in float16, 1e-3 away from minigpt.
    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    return GPT.from_pretrained(folder), hf, coursekit.gpt2_encoding()


PROMPT = "ROMEO:\nWhat light"


@pytest.mark.parametrize("kw", SAMPLING_SETTINGS[:1] + SAMPLING_SETTINGS[6:],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_seeded_generate_equals_hf_on_the_shipped_model(shipped, kw):
    model, hf, enc = shipped
    prompt = enc.encode(PROMPT)
    for seed in (0, 7):
        out = generate(model, enc, PROMPT, 24, do_sample=True, seed=seed, **kw)
        assert out.ids == hf_sample(hf, prompt, 24, seed, eos=END, **kw)


@pytest.mark.parametrize("beams,length_penalty", [(2, 1.0), (4, 2.0), (3, 0.0)])
def test_beam_search_equals_hf_on_the_shipped_model(shipped, beams, length_penalty):
    model, hf, enc = shipped
    prompt = enc.encode(PROMPT)
    for eos in ([END], [END, NEWLINE]):
        want = checks._hf_beams(hf, prompt, 20, beams, length_penalty, eos)[0]
        assert beam_search(model, prompt, 20, beams, length_penalty, eos) == want, eos


def test_newline_as_end_of_text_ends_beams_on_the_shipped_model(shipped):
    """With "\\n" as a second end-of-text id, the best hypothesis ends at the end of the line."""
    model, hf, enc = shipped
    ids = beam_search(model, enc.encode(PROMPT), 30, 4, 1.0, [END, NEWLINE])
    assert ids[-1] in (END, NEWLINE) and len(ids) < 30


def test_temperature_zero_is_greedy_on_the_shipped_model(shipped):
    model, _, enc = shipped
    greedy = generate(model, enc, PROMPT, 30)
    assert generate(model, enc, PROMPT, 30, do_sample=True, temperature=0, seed=3).ids == greedy.ids


# ---------------------------------------------------------------- bad settings

@pytest.mark.parametrize("name,value", [("temperature", -0.5), ("temperature", float("nan")), ("top_p", 0.0),
                                        ("top_p", 1.5), ("top_p", -0.1), ("top_k", -1), ("top_k", 2.5),
                                        ("min_p", 1.5), ("repetition_penalty", 0.0),
                                        ("repetition_penalty", -1.0), ("no_repeat_ngram_size", -2),
                                        ("min_tokens_to_keep", 0), ("min_tokens_to_keep", 1.5),
                                        ("filter_value", float("nan"))])
def test_bad_setting_raises_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=rf"{name}.*{re_value(value)}"):
        Sampler(do_sample=True, **{name: value})


def re_value(value) -> str:
    return re.escape(repr(value))


@pytest.mark.parametrize("num_beams", [0, -2, 1.5])
def test_bad_num_beams_raises_value_error_naming_it(num_beams):
    model, _ = checks._beam_models("a")
    with pytest.raises(ValueError, match=rf"num_beams.*{re_value(num_beams)}"):
        beam_search(model, [1, 2], 5, num_beams)


def test_nan_logits_raise_value_error():
    with pytest.raises(ValueError, match="NaN"):
        Sampler(do_sample=True)(torch.tensor([0.0, float("nan"), 1.0]), [0])


def test_apply_temperature_rejects_zero_negative_and_nan():
    for t in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            apply_temperature(torch.zeros(3), t)


def test_seed_and_generator_together_raise():
    with pytest.raises(ValueError, match="seed"):
        Sampler(do_sample=True, seed=1, generator=torch.Generator())


def test_beam_generate_rejects_sampling_settings():
    model, _ = checks._beam_models("a")
    with pytest.raises(ValueError, match="top_p"):
        generate(model, coursekit.gpt2_encoding(), [1, 2], 5, num_beams=2, top_p=0.9)


def test_chi_square_p_value_matches_the_closed_form():
    """Two degrees of freedom: the survival function of chi-square is exp(-x / 2)."""
    counts = torch.tensor([30.0, 50.0, 20.0], dtype=torch.float64)
    stat, p_value = checks._chi2(counts, torch.tensor([1 / 3] * 3, dtype=torch.float64))
    assert math.isclose(p_value, math.exp(-stat / 2), rel_tol=1e-9)
