"""The reference batching (minigpt.batching) against its oracles, chapter 10.

``left_pad``, ``position_ids`` and ``padded_causal_mask`` against small tables written out by hand and against their
definitions, entry by entry. ``forward_padded`` against Hugging Face's GPT2LMHeadModel run on the same left-padded
batch with its ``attention_mask`` and ``position_ids``, and against each row run alone, for a prefill and for decode
steps through chapter 7's KVCache (whose keys and values equal Hugging Face's cache at the tokens). ``generate_batch``
against Hugging Face's ``generate`` on the same left-padded batch, greedy, with end-of-text ids that end the rows at
different steps, on random GPT-2s and on the course's trained model; and against chapter 6's ``generate`` of each
prompt alone: stop strings, and seeded sampling with a Sampler of its own per row. Then its argument errors.
"""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

import coursekit
from coursekit.testing import quiet_transformers
from minigpt.batching import Row, forward_padded, generate_batch, left_pad, padded_causal_mask, position_ids
from minigpt.kv_cache import KVCache
from minigpt.samplers import Sampler, generate
from minigpt.transformer import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# Logits, keys and values of small float32 GPTs, of magnitude about 5 (up to 15): a row in a padded batch, the row
# alone, the cached steps and Hugging Face's multiply matrices of other shapes, whose sums of up to 48 products of
# that size round in other orders: by about sqrt(48) * 5 * 6e-8 = 2e-6 (1.4e-5 at worst), also where the result
# itself is near 0; 4.9e-6 is the most measured, under two CPU capabilities. 5e-5 (and 1e-5 of larger values) leaves
# a margin of 10 over that, and is 20 times below the mistakes' 1e-3.
ATOL, RTOL = 5e-5, 1e-5
# The course's model: logits up to 14, where float32 rounds at ~1e-6; Hugging Face's own logits of a row in a batch
# and alone differ by 1.5e-5 there (the products' shapes differ, so do their sums' orders).
SHIPPED_ATOL = 5e-5
MARGIN = 1e-3  # the smallest gap between the two best logits at a greedy step the comparisons rely on
END, NEWLINE = 50256, 198  # GPT-2's "<|endoftext|>" and "\n"

SHAPES = {  # vocabularies, windows, depths and head counts unlike each other and unlike GPT-2's
    "one-head": dict(vocab_size=101, n_positions=10, n_layer=1, n_head=1, n_embd=8),
    "wide": dict(vocab_size=257, n_positions=16, n_layer=3, n_head=6, n_embd=48),
    "deep": dict(vocab_size=83, n_positions=12, n_layer=5, n_head=4, n_embd=32),
}
LENGTHS = [[3, 1, 4], [1], [2, 2], [4, 1, 1, 3, 2]]  # prompt lengths of a batch: ragged, alone, not padded at all


def hf_model(seed: int, **shape) -> GPT2LMHeadModel:
    """A Hugging Face GPT-2 with random weights, spread wide enough that greedy steps are not near ties."""
    torch.manual_seed(seed)
    config = GPT2Config(**shape, initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module", params=list(SHAPES))
def pair(request, tmp_path_factory):
    """(Hugging Face model, the same weights in minigpt's GPT) for each shape."""
    hf = hf_model(len(request.param), **SHAPES[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    with quiet_transformers():
        hf.save_pretrained(folder)
    return hf, GPT.from_pretrained(folder)


@pytest.fixture(scope="module")
def shipped():
    folder = coursekit.shipped_model_dir()
    with quiet_transformers():  # the checkpoint is float16: without dtype, HF would compute in float16
        hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    model = GPT.from_pretrained(folder)
    assert {p.dtype for p in [*hf.parameters(), *model.parameters()]} == {torch.float32}
    return model, hf, coursekit.gpt2_encoding()


@pytest.fixture(scope="module")
def enc():
    return coursekit.gpt2_encoding()


def random_rows(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face's position ids of a left-padded batch: a running count of the mask, padding at 1."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def alone(model, row: list[int]) -> torch.Tensor:
    """Chapter 4's logits (T, V) of one row, no batch around it."""
    with torch.no_grad():
        return model(torch.tensor([row]))[0]


# ---------------------------------------------------------------- left_pad, position_ids, padded_causal_mask

@pytest.mark.parametrize("rows, pad_id, ids, mask", [
    ([[5, 6, 7], [8], [9, 10, 11, 12, 13]], 0,
     [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8], [9, 10, 11, 12, 13]],
     [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]]),
    ([[1, 2]], 50256, [[1, 2]], [[1, 1]]),
    ([[4], [5, 6]], 50256, [[50256, 4], [5, 6]], [[0, 1], [1, 1]]),
    ([[3, 3], [3, 3]], 3, [[3, 3], [3, 3]], [[1, 1], [1, 1]]),
    ([[0], [0, 0, 0]], 0, [[0, 0, 0], [0, 0, 0]], [[0, 0, 1], [1, 1, 1]]),  # the pad id is a token too: the mask tells
])
def test_left_pad_right_aligns_the_rows_and_masks_the_padding(rows, pad_id, ids, mask):
    before = [list(row) for row in rows]
    got_ids, got_mask = left_pad(rows, pad_id)
    assert got_ids.tolist() == ids and got_mask.tolist() == mask
    assert got_ids.dtype == got_mask.dtype == torch.int64
    assert rows == before


@pytest.mark.parametrize("rows, message", [([], "no rows"), ([[1], []], "row 1 is empty"), ([[]], "row 0 is empty")])
def test_left_pad_refuses_no_rows_and_an_empty_row(rows, message):
    with pytest.raises(ValueError, match=message):
        left_pad(rows, 0)


@pytest.mark.parametrize("mask, at_tokens", [
    ([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]], [[0, 1, 2], [0], [0, 1, 2, 3, 4]]),
    ([[1]], [[0]]),
    ([[0, 1], [1, 1]], [[0], [0, 1]]),
])
def test_position_ids_count_each_rows_own_tokens(mask, at_tokens):
    for dtype in (torch.int64, torch.int32, torch.bool):
        m = torch.tensor(mask).to(dtype)
        pos = position_ids(m)
        assert pos.dtype == torch.int64 and pos.shape == m.shape
        assert [[p for p, keep in zip(row, keep_row) if keep] for row, keep_row in zip(pos.tolist(), mask)] == at_tokens
        assert (pos >= 0).all() and (pos < m.shape[1]).all()  # padding at a valid position too
        want = hf_positions(torch.tensor(mask))  # Hugging Face's convention, at the tokens
        assert torch.equal(pos[m.bool()], want[m.bool()])


def expected_allowed(mask: list[list[int]], t_new: int) -> list:
    """padded_causal_mask by its definition, entry by entry: query i (position T - t_new + i) reads key j when j comes
    no later and is a token, and a query always reads itself."""
    T = len(mask[0])
    return [[[[(j <= T - t_new + i and bool(row[j])) or j == T - t_new + i for j in range(T)]
               for i in range(t_new)]] for row in mask]


def test_padded_causal_mask_on_a_table():
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]])
    got = padded_causal_mask(mask)
    assert got.dtype == torch.bool and got.shape == (3, 1, 5, 5)
    T, F = True, False
    assert got[1, 0].tolist() == [[T, F, F, F, F], [F, T, F, F, F], [F, F, T, F, F], [F, F, F, T, F],
                                  [F, F, F, F, T]]  # padding queries read themselves only; the token reads itself
    assert got[0, 0, 4].tolist() == [F, F, T, T, T] and got[2, 0].tolist() == torch.ones(5, 5).tril().bool().tolist()
    assert padded_causal_mask(torch.tensor([[0, 1, 1, 1]]), 1)[0, 0].tolist() == [[F, T, T, T]]
    assert padded_causal_mask(torch.tensor([[0, 1, 1, 1]]), 2)[0, 0].tolist() == [[F, T, T, F], [F, T, T, T]]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(pads=st.lists(st.integers(0, 7), min_size=1, max_size=5), extra=st.integers(0, 4), data=st.data())
def test_padded_causal_mask_follows_its_definition_and_no_row_is_all_false(pads, extra, data):
    """Left-padded masks (``pads[b]`` padding columns, then tokens), and masks after decode steps: columns of 1."""
    T = max(pads) + 1 + extra
    mask = [[0] * p + [1] * (T - p) for p in pads]
    t_new = data.draw(st.integers(1, T))
    got = padded_causal_mask(torch.tensor(mask), t_new)
    assert got.shape == (len(pads), 1, t_new, T) and got.dtype == torch.bool
    assert got.tolist() == expected_allowed(mask, t_new)
    assert got.any(-1).all()  # a row of False would make the softmax 0 / 0 = NaN
    assert torch.equal(padded_causal_mask(torch.tensor(mask).bool(), t_new), got)


# ---------------------------------------------------------------- forward_padded: Hugging Face's and each row alone

@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_forward_padded_equals_hugging_face_with_its_mask_and_positions_and_each_row_alone(pair, lengths):
    hf, model = pair
    V = model.config.vocab_size
    rows = random_rows(lengths, V, seed=len(lengths))
    ids, mask = left_pad(rows, pad_id=0)
    got = forward_padded(model, ids, mask)
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, position_ids=hf_positions(mask)).logits
    assert got.shape == (len(rows), max(lengths), V) and not got.requires_grad
    assert torch.isfinite(got).all()  # padding queries too
    tokens = mask.bool()
    torch.testing.assert_close(got[tokens], want[tokens], atol=ATOL, rtol=RTOL)
    for b, row in enumerate(rows):
        torch.testing.assert_close(got[b, -len(row):], alone(model, row), atol=ATOL, rtol=RTOL)
    other = ids.masked_fill(mask == 0, V - 1)  # another pad id: the mask hides it
    torch.testing.assert_close(forward_padded(model, other, mask)[tokens], got[tokens], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("lengths, chunks", [([3, 1, 4], [1, 1, 2, 1]), ([1, 2], [2, 1, 1]), ([2], [1, 1, 1])],
                         ids=str)
def test_prefill_and_decode_steps_through_the_cache_equal_the_whole_batch_and_hugging_face(pair, lengths, chunks):
    """The prompts through forward_padded with a KVCache, then new columns (one token a row, or two) with the mask a
    column longer each time: each step's logits are those of the whole left-padded sequence run at once (ours and
    Hugging Face's); the cached keys and values are Hugging Face's at the tokens."""
    hf, model = pair
    V = model.config.vocab_size
    rows = random_rows(lengths, V, seed=7)
    tails = random_rows([sum(chunks)] * len(rows), V, seed=8)
    ids, mask = left_pad([row + tail for row, tail in zip(rows, tails)], pad_id=0)
    T0 = max(lengths)
    with torch.no_grad():
        out = hf(ids[:, :T0], attention_mask=mask[:, :T0], position_ids=hf_positions(mask[:, :T0]), use_cache=True)
        hf_whole = hf(ids, attention_mask=mask, position_ids=hf_positions(mask)).logits
    whole = forward_padded(model, ids, mask)
    tokens = mask.bool()
    torch.testing.assert_close(whole[tokens], hf_whole[tokens], atol=ATOL, rtol=RTOL)
    cache = KVCache(model.config.n_layer)
    prefill = forward_padded(model, ids[:, :T0], mask[:, :T0], cache)
    torch.testing.assert_close(prefill[tokens[:, :T0]], hf_whole[:, :T0][tokens[:, :T0]], atol=ATOL, rtol=RTOL)
    for layer in range(model.config.n_layer):  # (B, H, T, D): compared at the token columns of each row
        for b in range(len(rows)):
            keep, theirs = tokens[b, :T0], out.past_key_values.layers[layer]
            torch.testing.assert_close(cache.keys[layer][b][:, keep], theirs.keys[b][:, keep], atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(cache.values[layer][b][:, keep], theirs.values[b][:, keep], atol=ATOL, rtol=RTOL)
    done = T0
    for size in chunks:
        step = forward_padded(model, ids[:, done:done + size], mask[:, :done + size], cache)
        assert step.shape == (len(rows), size, V) and torch.isfinite(step).all()
        torch.testing.assert_close(step, hf_whole[:, done:done + size], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(step, whole[:, done:done + size], atol=ATOL, rtol=RTOL)
        done += size
        assert cache.length == done
    for b, (row, tail) in enumerate(zip(rows, tails)):  # the last step, as the row alone
        torch.testing.assert_close(step[b, -1], alone(model, row + tail)[-1], atol=ATOL, rtol=RTOL)


def test_forward_padded_on_the_shipped_model_equals_hugging_face(shipped):
    model, hf, enc = shipped
    rows = [enc.encode(text) for text in ("ROMEO:", "O", "To be, or not to be, that is the question:",
                                          "KING HENRY:\nOnce more unto the breach")]
    ids, mask = left_pad(rows, pad_id=END)
    got = forward_padded(model, ids, mask)
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, position_ids=hf_positions(mask)).logits
    assert torch.isfinite(got).all()
    tokens = mask.bool()
    torch.testing.assert_close(got[tokens], want[tokens], atol=SHIPPED_ATOL, rtol=0)
    for b, row in enumerate(rows):
        torch.testing.assert_close(got[b, -len(row):], alone(model, row), atol=SHIPPED_ATOL, rtol=0)


# ---------------------------------------------------------------- generate_batch against Hugging Face's generate

def hf_greedy_batch(hf, rows: list[list[int]], n: int, eos: list[int], pad_id: int) -> tuple[list[list[int]], float]:
    """Hugging Face's generate, greedy, on the left-padded batch: each row's new ids cut after its first end id, and
    the smallest gap between the two best logits over the steps at which a row was still running."""
    ids, mask = left_pad(rows, pad_id)
    with torch.no_grad(), quiet_transformers():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=0 if eos else n,
                          do_sample=False, num_beams=1, use_cache=True, pad_token_id=pad_id,
                          eos_token_id=eos or None, output_scores=True, return_dict_in_generate=True)
    cut, margin = [], float("inf")
    for b, new in enumerate(out.sequences[:, ids.shape[1]:].tolist()):
        end = next((i + 1 for i, token in enumerate(new) if token in eos), len(new))
        cut.append(new[:end])
        for step in range(end):
            top2 = out.scores[step][b].topk(2).values
            margin = min(margin, (top2[0] - top2[1]).item())
    return cut, margin


def ending_id(generated: list[list[int]]) -> int:
    """An id that, as the end-of-text id, ends the rows at the most different steps (one never ending, best)."""
    def spread(token):
        return len({row.index(token) if token in row else None for row in generated})
    return min(sorted({t for row in generated for t in row}), key=lambda token: -spread(token))


@pytest.mark.parametrize("lengths", [[3, 1, 4], [2, 4, 1, 1, 3]], ids=str)
def test_greedy_batch_equals_hugging_face_generate_with_rows_ending_at_different_steps(pair, enc, lengths):
    """Up to the last position of the window (the longest prompt's last new token is read at block_size - 1)."""
    hf, model = pair
    rows = random_rows(lengths, model.config.vocab_size, seed=11)
    n = model.config.block_size - max(lengths) + 1
    free, margin = hf_greedy_batch(hf, rows, n, [], pad_id=0)
    assert margin >= MARGIN, f"a near tie at a greedy step ({margin:.1e}): pick other weights or prompts"
    assert [g.ids for g in generate_batch(model, enc, rows, n, eos_ids=[])] == free
    eos = ending_id(free)
    want, _ = hf_greedy_batch(hf, rows, n, [eos], pad_id=0)
    got = generate_batch(model, enc, rows, n, eos_ids=[eos])
    assert [g.ids for g in got] == want
    assert [g.prompt_ids for g in got] == rows
    assert [g.finish_reason for g in got] == ["eos" if row[-1:] == [eos] else "length" for row in want]
    ends = {len(row) for row, g in zip(want, got) if g.finish_reason == "eos"}
    assert len(ends) >= 2 or (ends and len({g.finish_reason for g in got}) == 2), want  # rows end apart


@pytest.mark.parametrize("eos, n", [([END, NEWLINE], 7), ([], 60)], ids=["end-of-line", "no-end"])
def test_greedy_batch_on_the_shipped_model_equals_hugging_face_generate(shipped, eos, n):
    model, hf, enc = shipped
    prompts = ["ROMEO:\nBut soft, what light", "O", "To be, or not to be, that is the question:\nWhether",
               "KING HENRY:\nOnce more unto the breach, dear friends,", "<|endoftext|>"]
    rows = [enc.encode(p, allowed_special="all") for p in prompts]
    want, margin = hf_greedy_batch(hf, rows, n, eos, pad_id=END)
    assert margin >= MARGIN, f"a near tie at a greedy step ({margin:.1e})"
    got = generate_batch(model, enc, prompts, n, eos_ids=eos)
    assert [g.ids for g in got] == want
    for g in got:
        assert g.text == enc.decode(g.ids[:-1] if g.finish_reason == "eos" else g.ids)
    if eos:  # lines of different lengths, and a row that runs on to the last token
        assert {g.finish_reason for g in got} == {"eos", "length"} and len({len(g.ids) for g in got}) >= 3, want


# ---------------------------------------------------------------- generate_batch against each prompt alone

PROMPTS = ["ROMEO:\nBut soft, what light", "O", "To be, or not to be", "<|endoftext|>First Citizen:\nBefore we"]


def as_tuples(generations) -> list[tuple]:
    return [(g.prompt_ids, g.ids, g.text, g.finish_reason) for g in generations]


def test_greedy_batch_with_stop_strings_equals_each_prompt_alone(shipped):
    model, _, enc = shipped
    stop = [",", "\n\n"]
    got = as_tuples(generate_batch(model, enc, PROMPTS, 30, stop=stop))
    assert got == as_tuples(generate(model, enc, p, 30, stop=stop) for p in PROMPTS)
    assert {reason for *_, reason in got} >= {"stop"} and len({len(ids) for _, ids, *_ in got}) >= 2, got
    one = as_tuples(generate_batch(model, enc, PROMPTS, 40, stop="\n"))  # one string, not a list
    assert one == as_tuples(generate(model, enc, p, 40, stop="\n") for p in PROMPTS)


SAMPLINGS = [dict(do_sample=True, temperature=0.8, top_k=40, seed=1), dict(do_sample=True, top_p=0.9, seed=2),
             dict(), dict(do_sample=True, min_p=0.05, repetition_penalty=1.3, seed=3),
             dict(do_sample=True, temperature=1.3, no_repeat_ngram_size=2, seed=4)]


@pytest.mark.parametrize("eos", [None, [END, NEWLINE]], ids=["default-end", "end-of-line"])
def test_sampling_with_a_sampler_per_row_equals_each_prompt_alone(shipped, eos):
    """Row b draws with samplers[b] (its own settings and seed; one greedy); each row as its prompt alone."""
    model, _, enc = shipped
    prompts = PROMPTS + ["JULIET:\n"]
    samplers = [Sampler(**settings) for settings in SAMPLINGS]
    got = as_tuples(generate_batch(model, enc, prompts, 24, eos_ids=eos, samplers=samplers))
    want = as_tuples(generate(model, enc, p, 24, eos_ids=eos, **settings) for p, settings in zip(prompts, SAMPLINGS))
    assert got == want
    if eos:
        assert "eos" in {reason for *_, reason in got} and len({len(ids) for _, ids, *_ in got}) >= 3, got


def test_one_and_no_new_tokens_equal_each_prompt_alone(shipped):
    model, _, enc = shipped
    for n in (0, 1):
        got = as_tuples(generate_batch(model, enc, PROMPTS, n))
        assert got == as_tuples(generate(model, enc, p, n) for p in PROMPTS)
        assert all(len(ids) == n for _, ids, *_ in got)


def test_a_finished_row_takes_no_more_tokens(enc):
    row = Row(enc, [1, 2], [], {END})
    row.add(END)
    assert row.finish_reason == "eos"
    with pytest.raises(ValueError, match="finished"):
        row.add(5)
    assert row.end().ids == [END]


# ---------------------------------------------------------------- argument errors

@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()


@pytest.mark.parametrize("prompts, n, options, message", [
    ([[1, 2], [3]], 4, dict(samplers=[Sampler()]), "one sampler per prompt: got 1 samplers for 2 prompts"),
    ([[1, 2]], 4, dict(samplers=[Sampler(), Sampler()]), "one sampler per prompt: got 2 samplers for 1 prompts"),
    ([], 4, {}, "no prompts"),
    ([[1], []], 4, {}, "prompt 1 is empty"),
    ([[1, 2], [3, 40]], 4, {}, "prompt 1: token id 40 is not in the vocabulary (0 to 39)"),
    ([[-1]], 4, {}, "prompt 0: token id -1 is not in the vocabulary"),
    ([[1, True]], 4, {}, "prompt 0: token id True is not in the vocabulary"),
    ([[1, 2.0]], 4, {}, "prompt 0: token id 2.0 is not in the vocabulary"),
    ([[1], [1] * 6], 4, {}, "prompt 1: 6 tokens and 4 new ones need 9 positions, the model has 8"),
    ([[1] * 9], 1, {}, "prompt 0: 9 tokens and 1 new ones need 9 positions, the model has 8"),
    ([[1]], -1, {}, "max_new_tokens must be a non-negative integer, got -1"),
    ([[1]], True, {}, "max_new_tokens must be a non-negative integer, got True"),
    ([[1]], 2.0, {}, "max_new_tokens must be a non-negative integer, got 2.0"),
    ([[1]], 2, dict(stop=["\n", ""]), "stop strings must be non-empty strings"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_raise_value_error_naming_them(small, enc, prompts, n, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        generate_batch(small, enc, prompts, n, **options)


def test_the_last_position_of_the_window_is_allowed(small, enc):
    """A prompt of 5 and 4 new tokens: the last new token is written from position 7, the window's last."""
    got = generate_batch(small, enc, [[1] * 5, [2]], 4, eos_ids=[])
    assert [len(g.ids) for g in got] == [4, 4]
    assert [g.ids for g in got] == [generate(small, enc, p, 4, eos_ids=[]).ids for p in ([1] * 5, [2])]


def test_the_random_gpt_of_the_generation_checks_fits_its_tokenizer_and_its_cases_say_what_they_claim(enc):
    """test_generate_batch's random GPT and its cases: GPT-2's vocabulary, as the tokenizer it comes with (a learner
    may pad with any of its ids); no near tie at any greedy step (penalties applied), so that the batch and each row
    alone agree on every kernel path; rows of the end case that all finish apart, before the tokens allowed run out
    (a pass after that is then seen); a sampling case in which a sampler given only the new ids draws other tokens;
    and room in every case's window for a pass after the last token."""
    from autograder.checks import batching as checks

    model = checks._model(checks.GEN)
    assert model.config.vocab_size == enc.n_vocab
    cases = [(checks.END_ROWS, checks.END_NEW, [{}] * len(checks.END_ROWS), checks.END_IDS),
             (checks.ONE_PASS_ROWS, checks.ONE_PASS_NEW, [{}] * len(checks.ONE_PASS_ROWS), []),
             (checks.SAMPLE_ROWS, checks.SAMPLE_NEW, checks.SAMPLE_SETTINGS, [])]
    margin = float("inf")
    for rows, n, settings, eos in cases:
        assert max(len(r) for r in rows) + n <= model.config.block_size
        for row, setting in zip(rows, settings):
            if setting.get("do_sample"):
                continue
            sampler, ids = Sampler(**setting, prompt_len=len(row)), list(row)
            for _ in range(n):
                with torch.no_grad():
                    logits = sampler.process(model(torch.tensor([ids]))[0, -1:], torch.tensor([ids]))[0]
                top2 = logits.topk(2)
                margin = min(margin, (top2.values[0] - top2.values[1]).item())
                ids.append(int(top2.indices[0]))
                if ids[-1] in eos:
                    break
    assert margin >= 10 * MARGIN, f"a near tie at a greedy step ({margin:.1e}): pick another seed"
    ends = checks._expected("ends")
    assert {reason for _, _, reason in ends} == {"eos", "stop"}, ends
    assert len({len(ids) for ids, _, _ in ends}) == len(ends) and max(len(ids) for ids, _, _ in ends) < checks.END_NEW
    alone = [ids for ids, _, _ in checks._expected("sampling")]
    without_prompts = [ids for ids, _, _ in checks._sampled_without_prompts()]
    assert [a[0] != w[0] for a, w in zip(alone, without_prompts)] == [not s.get("do_sample")
                                                                     for s in checks.SAMPLE_SETTINGS]
