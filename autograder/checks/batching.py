"""Chapter 10 (batching): hidden checks for left_pad, position_ids, padded_causal_mask, forward_padded and
generate_batch.

The oracles. For the padding, positions and mask: what the notebook states, written here plainly (a loop over
each row's tokens). For the model on a batch: each row run ALONE through the course's reference GPT (chapter 4,
tested against Hugging Face's ``GPT2LMHeadModel`` in the course's tests) with the same seeded random weights: a
padded row's logits must be the row's own, to float rounding. For generation: Hugging Face's ``generate`` on the
same left-padded batch (``attention_mask``, greedy), token for token, and chapter 6's reference ``generate`` of each
prompt alone, with the same sampler settings and seeds (ids, text and finish reason); the course's shipped model on
both sides where its weights are the point (Hugging Face's batch, a prompt holding <|endoftext|>, stop strings in its
text), a seeded random GPT with GPT-2's vocabulary where they are not (rows that end apart, a sampler per row, the
count of forward passes): a decode step of the shipped model costs tens of milliseconds, one of the random GPT's a
fraction of one. The samplers' settings include penalties that read the prompt (a repetition penalty, an n-gram
ban), so that a sampler given only the new ids is seen.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, and so do
the models, caches, samplers and tokenizer they are given, built there from plain recipes
(``sandboxed.helpers.batching``); what comes back (tensors, plain lists) is compared here. The forward passes of a
generation are counted here: the random GPT's block 0 ``attn.c_attn`` is in this process only (``judge.serve``), so
that the learner's side computes no position of any pass without this process seeing its input, (rows, columns,
width). So the count of passes and of the positions each computes is the judge's, in every setting: rows that run to
their length, rows that meet an end id or a stop string and finish apart, rows that sample.

Nothing here assumes how the code is written: pads by a loop or by ``torch.nn.utils.rnn.pad_sequence`` on flipped
rows, with any id the model has (0, the end-of-text id), any valid position at padding (0, 1 as Hugging Face puts,
the clamped count), a padding query that reads itself, every key, or its row's first token,
``F.scaled_dot_product_attention`` with the boolean mask or an additive mask of a large negative number, a
generation loop that drops finished rows from the batch or keeps them running: all pass. What must hold: the
tokens' numbers, and what the notebook asks of the loop: one forward pass of the whole batch per new token through
chapter 7's cache (the prefill computes the padded prompts once, each later pass only the new column), none after the
last token or once every row has finished. A loop that runs each prompt alone is not a batch, and one that runs the
whole window again at every step does not use the cache. Whether the learner's side runs under ``torch.no_grad()``
is not checked: no value depends on it, and only that side could say.

Nothing here imports the chapter's reference, ``minigpt.batching``: a module imported by a check would stay
importable for the learner's later cells.
"""
from __future__ import annotations

import functools

import torch
from transformers import GPT2LMHeadModel  # here: transformers' lazy imports race in a judge's threads

import coursekit
from autograder.checks import Shape, gap, once
from autograder.sandboxed.helpers import kv_cache as kv_recipes
from autograder.judge import Remote, ask, because_of, cell, make, part, seeded, serve, type_of
from coursekit.testing import call, expect_raises, fail, quiet_transformers, show
from minigpt.generation import TextStream
from minigpt.samplers import Sampler, generate as generate_alone
from minigpt.transformer import GPT

CHAPTER = "chapter 10 (batching)"
ATOL, RTOL = 1e-5, 1e-5  # float32 logits: plus RTOL times the largest expected value


def _tensor(label: str, got, shape, dtype) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got) if isinstance(got, Remote) else type(got).__name__}, expected a "
             f"tensor of shape {tuple(shape)}")
    if tuple(got.shape) != tuple(shape):
        fail(f"{label} returned a tensor of shape {tuple(got.shape)}, expected {tuple(shape)}")
    if got.dtype != dtype:
        kind = str(dtype).removeprefix("torch.")
        fail(f"{label} returned a {str(got.dtype).removeprefix('torch.')} tensor, expected {kind}",
             {"int64": "int64, as token ids and Hugging Face's attention_mask are: dtype=torch.long or .long()",
              "bool": "a bool mask: True where a query may read a key"}.get(kind, ""))
    return got


def _padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The expected left-padded ids and mask, written out row by row."""
    T = max(len(r) for r in rows)
    ids = [[pad_id] * (T - len(r)) + list(r) for r in rows]
    mask = [[0] * (T - len(r)) + [1] * len(r) for r in rows]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


# ---------------------------------------------------------------- left_pad

ROWS, PADS, PAD_ERRORS = "rows of different lengths", "pad ids, one row, rows of one length", "errors for no rows"
PAD_CASES = [  # (rows, pad_id, part)
    ([[3, 1, 4, 1, 5], [9], [2, 6]], 50256, ROWS),
    ([[7], [8, 9, 10, 11, 12, 13, 14], [15, 16], [17, 18, 19]], 0, ROWS),
    ([[1, 2, 3]], 0, PADS),
    ([[4, 4], [5, 5]], 1, PADS),
    ([[0], [0, 0]], 0, PADS),  # tokens with the pad's id: the mask comes from the lengths, not from the ids
    ([[50256], [11, 50256, 12]], 50256, PADS),
]


def _pad_mistake(rows, pad_id, ids, mask) -> str:
    T = max(len(r) for r in rows)
    right = torch.tensor([list(r) + [pad_id] * (T - len(r)) for r in rows])
    want_ids, want_mask = _padded(rows, pad_id)
    if ids.shape == right.shape and torch.equal(ids, right) and not torch.equal(right, want_ids):
        return "the rows are padded on the RIGHT: pad on the left, so that every row ends in the last column"
    if torch.equal(ids, want_ids) and torch.equal(mask, 1 - want_mask):
        return "the mask is inverted: 1 at the tokens, 0 at the padding"
    if torch.equal(ids, want_ids) and torch.equal(mask, (want_ids != pad_id).long()):
        return "the mask was computed from the ids (ids != pad_id), but a token may have the pad's id: make it " \
               "from each row's length"
    return "each row right-aligned: pad_id in the first T - len(row) columns, then the row; the mask 0 there, 1 after"


@cell("test_left_pad", parts={ROWS: 3, PADS: 1, PAD_ERRORS: 1})
def check_left_pad(left_pad):
    for name in (ROWS, PADS):
        with part(name):
            for rows, pad_id, case_part in PAD_CASES:
                if case_part == name:
                    _check_pad(left_pad, rows, pad_id)
    with part(PAD_ERRORS):
        expect_raises(ValueError, left_pad, [], 0, name="left_pad", hint="no rows: raise ValueError")
        expect_raises(ValueError, left_pad, [[1, 2], []], 0, name="left_pad",
                      hint="an empty row has no token to continue from: raise ValueError")


def _check_pad(left_pad, rows, pad_id):
    label = f"left_pad({show(rows)}, pad_id={pad_id})"
    got, changed = call(ask, "batching.run", left_pad, rows, pad_id, label=label)
    if changed:
        fail(f"{label} changed the rows it was given", "read the rows; build new tensors")
    if not isinstance(got, tuple) or len(got) != 2:
        fail(f"{label} returned {show(got)}, expected a pair (ids, mask)", "return ids, mask")
    want_ids, want_mask = _padded(rows, pad_id)
    ids = _tensor(f"{label}[0] (the ids)", got[0], want_ids.shape, torch.long)
    mask = _tensor(f"{label}[1] (the mask)", got[1], want_mask.shape, torch.long)
    if not (torch.equal(ids, want_ids) and torch.equal(mask, want_mask)):
        fail(f"{label} returned ids {show(ids.tolist())} and mask {show(mask.tolist())}, expected "
             f"{show(want_ids.tolist())} and {show(want_mask.tolist())}", _pad_mistake(rows, pad_id, ids, mask))


# ---------------------------------------------------------------- position_ids

MASKS = [  # left-padded masks, some with decode columns appended
    [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]],
    [[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]],
    [[1, 1, 1, 1, 1, 1, 1]],
    [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]],
]


def _positions(mask: torch.Tensor) -> list[list[int | None]]:
    """Each token's position in its row; None at padding."""
    out = []
    for row in mask.tolist():
        count, positions = 0, []
        for m in row:
            positions.append(count if m else None)
            count += m
        out.append(positions)
    return out


@cell("test_position_ids")
def check_position_ids(position_ids):
    for rows in MASKS:
        mask = torch.tensor(rows, dtype=torch.long)
        label = f"position_ids({show(rows)})"
        got, changed = call(ask, "batching.run", position_ids, mask, label=label)
        if changed:
            fail(f"{label} changed the mask it was given", "read the mask, never write into it (cumsum_ works in place)")
        pos = _tensor(label, got, mask.shape, torch.long)
        want = _positions(mask)
        at_tokens = [[p if w is not None else None for p, w in zip(r, wr)] for r, wr in zip(pos.tolist(), want)]
        if at_tokens != want:
            cols = [list(range(mask.shape[1]))] * mask.shape[0]
            hint = ("these are the columns, not the positions: a token's position is the number of TOKENS before it "
                    "in its row (a running count of the mask, minus 1)" if pos.tolist() == cols else
                    "the count starts at 1: a row's first token is at position 0 (the running count, minus 1)"
                    if [[p - 1 if w is not None else None for p, w in zip(r, wr)]
                        for r, wr in zip(pos.tolist(), want)] == want else
                    "count the tokens before each one in its own row: padding does not count")
            fail(f"{label} gave {show(pos.tolist())} at the tokens, expected (padding as .) "
                 f"{show([['.' if p is None else p for p in r] for r in want])}", hint)
        T = mask.shape[1]
        if not all(0 <= p < T for r in pos.tolist() for p in r):
            fail(f"{label} gave {show(pos.tolist())}: a padding entry outside 0 .. {T - 1}",
                 "padding may get any VALID position (the embedding table has rows 0 .. block_size - 1): 0, say")


# ---------------------------------------------------------------- padded_causal_mask

TOKEN_ROWS, LAST, PAD_QUERIES = "the tokens' rows", "the last t_new positions", "padding queries read something"
MASK_CASES = [  # (mask, t_new, part)
    ([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], None, TOKEN_ROWS),
    ([[0, 1, 1, 1, 1, 1]], None, TOKEN_ROWS),
    ([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], 1, LAST),
    ([[0, 1, 1, 1, 1], [0, 0, 0, 1, 1]], 2, LAST),
    ([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], 3, LAST),
]


def _allowed(mask: torch.Tensor, t_new: int) -> list[list[list[bool | None]]]:
    """[b][query][key]: whether a token's query may read the key; None for the rows of padding queries."""
    B, T = mask.shape
    out = []
    for b in range(B):
        rows = []
        for i in range(T - t_new, T):
            rows.append(None if not mask[b, i] else [bool(j <= i and mask[b, j]) for j in range(T)])
        out.append(rows)
    return out


def _mask_mistake(mask, t_new, got) -> str:
    B, T = mask.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()[T - t_new:]
    tokens = [(b, r) for b in range(B) for r in range(t_new) if mask[b, T - t_new + r]]
    rows = lambda m: [m[b, 0, r].tolist() for b, r in tokens]  # noqa: E731
    if rows(got) == rows(causal.expand(B, 1, t_new, T)):
        return "this is chapter 3's causal mask alone: a token also must not read the padding of its row " \
               "(& mask[b, j] == 1)"
    if rows(got) == rows(mask.bool()[:, None, None, :].expand(B, 1, t_new, T)):
        return "the mask hides the padding but not the future: a query also must not read LATER positions (j <= i)"
    first = torch.ones(t_new, T, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    if t_new < T and rows(got) in (rows(first), rows(first | torch.eye(T, dtype=torch.bool)[T - t_new:])):
        return "the queries are the LAST t_new of the T positions: query r is position T - t_new + r " \
               "(tril(diagonal=T - t_new), as chapter 3's causal_mask(t_new, T))"
    return "query i may read key j when j <= i and key j is a token"


@cell("test_padded_causal_mask", parts={TOKEN_ROWS: 3, LAST: 2, PAD_QUERIES: 1})
def check_padded_causal_mask(padded_causal_mask):
    answers = {}  # case -> the mask it returned, when it was a tensor of the right shape and dtype
    for name in (TOKEN_ROWS, LAST):
        with part(name):
            for case, (rows, t_new, case_part) in enumerate(MASK_CASES):
                if case_part == name:
                    answers[case] = _check_mask(padded_causal_mask, rows, t_new)
    with part(PAD_QUERIES):
        for case, (rows, t_new, _) in enumerate(MASK_CASES):
            mask = torch.tensor(rows, dtype=torch.long)
            T = mask.shape[1]
            n = T if t_new is None else t_new
            label = f"padded_causal_mask({show(rows)}{'' if t_new is None else f', {t_new}'})"
            got = answers.get(case)
            if got is None:  # its tokens' rows failed first: asked again here
                got = _tensor(label, call(padded_causal_mask, mask, *(() if t_new is None else (t_new,)),
                                          label=label), (mask.shape[0], 1, n, T), torch.bool)
            for b in range(mask.shape[0]):
                for r in range(n):
                    if not mask[b, T - n + r] and not got[b, 0, r].any():
                        fail(f"{label}: the padding query of row {b}, column {T - n + r}, may read nothing (a row of "
                             "False)", "softmax over a row of -inf is 0 / 0 = NaN, and the NaN reaches the tokens "
                                       "in the next layer (0 * NaN = NaN): let a padding query read itself")


def _check_mask(padded_causal_mask, rows, t_new) -> torch.Tensor:
    mask = torch.tensor(rows, dtype=torch.long)
    B, T = mask.shape
    n = T if t_new is None else t_new
    label = f"padded_causal_mask({show(rows)}{'' if t_new is None else f', {t_new}'})"
    got, changed = call(ask, "batching.run", padded_causal_mask, mask, *(() if t_new is None else (t_new,)),
                        label=label)
    if changed:
        fail(f"{label} changed the mask it was given", "read the mask, never write into it")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, n, T):
        fail(f"{label} returned a tensor of shape {(B, n, T)}, expected {(B, 1, n, T)}",
             "keep a dimension of 1 for the heads: the mask then broadcasts over (B, n_head, t_new, T)")
    got = _tensor(label, got, (B, 1, n, T), torch.bool)
    want = _allowed(mask, n)
    for b in range(B):
        for r in range(n):
            if want[b][r] is not None and got[b, 0, r].tolist() != want[b][r]:
                fail(f"{label}: row {b}'s query at column {T - n + r} may read {show(got[b, 0, r].tolist())}, "
                     f"expected {show(want[b][r])}", _mask_mistake(mask, n, got))
    return got


# ---------------------------------------------------------------- forward_padded

# The random GPTs: "a" and "b" for forward_padded; GEN for generate_batch where the course's model is not the point.
# GEN has GPT-2's vocabulary, as the tokenizer it is given with: every id the tokenizer has is one the model can
# embed, whatever a learner pads with (0, end_of_text_id(tokenizer), ...).
GEN = "g"
SHAPES = {
    "a": Shape(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=24, seed=1000),
    "b": Shape(vocab_size=61, block_size=12, n_layer=3, n_head=3, n_embd=12, seed=1001),
    GEN: Shape(vocab_size=50257, block_size=20, n_layer=2, n_head=2, n_embd=16, seed=2002),
}
# GEN's weights spread wide enough that no greedy step of its cases is a near tie (the two best of its 50,257 logits
# at least 1e-2 apart: tests/test_batching.py); "a" and "b" make no greedy step.
INIT_RANGE = {"a": 0.2, "b": 0.2, GEN: 0.5}


def _recipe(name: str) -> dict:
    s = SHAPES[name]
    return dict(vocab_size=s.vocab_size, block_size=s.block_size, n_layer=s.n_layer, n_head=s.n_head,
                n_embd=s.n_embd, seed=s.seed, init_range=INIT_RANGE[name])


@once
def _model(name: str) -> GPT:
    """The reference GPT of shape ``name`` with the recipe's random weights: the model the learner's side builds."""
    with seeded(0):  # the recipe seeds torch's generator: one such block at a time in this process
        return kv_recipes.seeded_gpt(**_recipe(name))


def _alone(model, row: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([row]))[0]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    scale = want.abs().max().item() if want.numel() else 0.0
    return got.shape == want.shape and bool(((got - want).abs() <= ATOL + RTOL * scale).all())


def _replay(model, rows: list[list[int]], mistake: str) -> torch.Tensor | None:
    """Logits (B, T, V) of the left-padded rows with a known mistake: "columns" (each token at its column, not its
    position in the row), "reads_padding" (chapter 3's causal mask alone). None when it cannot run."""
    ids, mask = _padded(rows, 0)
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T) if mistake == "columns" else (mask.cumsum(-1) - 1).clamp(min=0)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    if mistake != "reads_padding":
        allowed = (allowed & mask.bool()[:, None, None, :]) | torch.eye(T, dtype=torch.bool)
    try:
        with torch.no_grad():
            x = model.emb.wte(ids) + model.emb.wpe(pos)
            for block in model.h:
                a = block.attn
                q, k, v = (a.split_heads(t) for t in a.c_attn(block.ln_1(x)).split(a.n_embd, dim=2))
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
                x = x + a.c_proj(a.merge_heads(y))
                x = x + block.mlp(block.ln_2(x))
            return model.lm_head(model.ln_f(x))
    except (IndexError, RuntimeError):
        return None


NAN = "NaN in the logits: a padding query whose mask row is all False gives 0 / 0 in softmax, and the next layer " \
      "spreads it (0 * NaN = NaN)"


def _forward_mistake(model, rows, got) -> str:
    if torch.isnan(got).any():  # named first: NaN logits match no replay, and the positions are not the mistake
        return NAN
    for mistake, hint in (("columns", "each token was embedded at its COLUMN: add the position embedding of its "
                                      "position in its own row, position_ids(mask)"),
                          ("reads_padding", "the tokens read the padding of their row: attend with "
                                            "padded_causal_mask(mask, t_new), not a plain causal mask")):
        other = _replay(model, rows, mistake)
        if other is not None and all(_close(got[b, -len(r):], other[b, -len(r):]) for b, r in enumerate(rows)):
            return hint
    return "embed each token at its own position (position_ids), attend with padded_causal_mask, then as chapter 4"


PREFILL, DECODE = "a padded batch at once", "decode steps through chapter 7's cache"
FORWARD_CASES = [  # (shape, rows)
    ("a", [[5, 6, 7, 8], [9], [10, 11]]),
    ("b", [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14, 15], [16]]),
    ("a", [[20, 21, 22, 23, 24, 25]]),
]


@cell("test_forward_padded", parts={PREFILL: 2, DECODE: 2})
def check_forward_padded(forward_padded):
    because = because_of(position_ids="test_position_ids", padded_causal_mask="test_padded_causal_mask")
    with part(PREFILL):
        for name, rows in FORWARD_CASES:
            _check_prefill(forward_padded, name, rows, because)
    with part(DECODE):
        for name, rows in FORWARD_CASES[:2]:
            _check_decode(forward_padded, name, rows, because)


def _check_prefill(forward_padded, name, rows, because):
    model, theirs = _model(name), make("kv_cache.seeded_gpt", **_recipe(name))
    ids, mask = _padded(rows, 0)
    label = f"forward_padded(<GPT>, <ids of {show(rows)} left-padded>, mask)"
    logits = _tensor(label, call(forward_padded, theirs, ids, mask, label=label),
                     (*ids.shape, model.config.vocab_size), torch.float32)
    for b, row in enumerate(rows):
        want = _alone(model, row)
        if not _close(logits[b, -len(row):], want):
            fail(f"{label}: row {b}'s tokens got logits that differ from the row run alone "
                 f"{gap(logits[b, -len(row):], want)}", _forward_mistake(model, rows, logits) + (
                     f"; {because}" if because else ""))


def _check_decode(forward_padded, name, rows, because):
    """A prefill into chapter 7's reference cache, then a chunk of two new tokens per row, then two decode steps."""
    model, theirs = _model(name), make("kv_cache.seeded_gpt", **_recipe(name))
    cache = make("batching.kv_cache", model.config.n_layer)
    ids, mask = _padded(rows, 0)
    call(forward_padded, theirs, ids, mask, cache, label=f"forward_padded(<GPT>, <{show(rows)} left-padded>, mask, "
                                                         "cache)")
    grown, fed = [list(r) for r in rows], 0  # each row's tokens so far; the tokens given after the prefill
    for step, t_new in enumerate((2, 1, 1)):
        new = torch.tensor([[(7 * b + 3 * step + j) % model.config.vocab_size for j in range(t_new)]
                            for b in range(len(rows))])
        mask = torch.cat([mask, torch.ones(len(rows), t_new, dtype=torch.long)], dim=1)
        for b in range(len(rows)):
            grown[b] += new[b].tolist()
        label = (f"forward_padded(<GPT>, <{t_new} new token{'s' if t_new > 1 else ''} per row>, <mask of "
                 f"{mask.shape[1]} columns>, cache) after a prefill of {show(rows)}"
                 f"{f' and {fed} more tokens a row' if fed else ''}")
        fed += t_new
        logits = _tensor(label, call(forward_padded, theirs, new, mask, cache, label=label),
                         (len(rows), t_new, model.config.vocab_size), torch.float32)
        for b in range(len(rows)):
            want = _alone(model, grown[b])[-t_new:]
            if not _close(logits[b], want):
                fail(f"{label}: row {b}'s new tokens got logits that differ from the row run alone "
                     f"{gap(logits[b], want)}",
                     (NAN if torch.isnan(logits).any() else
                      "the new tokens are the LAST t_new columns of the mask: their positions are the last t_new "
                      "of position_ids(mask), and they read every cached token of their row (padded_causal_mask("
                      "mask, t_new))") + (f"; {because}" if because else ""))


# ---------------------------------------------------------------- generate_batch

HF_GREEDY, ENDS, SAMPLING, ONE_PASS = ("greedy, as Hugging Face's generate on the batch", "rows that finish apart",
                                       "a sampler per row", "one forward pass of the batch per token, through the "
                                                            "cache")
# "<|endoftext|>O": a prompt holding the pad's id of a batch padded with end-of-text, as a token (GPT-2 starts a
# document with it): the mask comes from the rows' lengths, never from the ids.
GREEDY_PROMPTS = ["ROMEO:", "Now is the winter of our discontent", "<|endoftext|>O",
                  "What light through yonder window breaks?"]
GREEDY_NEW = 8  # new tokens a row: the mistakes of padding, positions and masks show within the first 4
STOP_PROMPTS = ["KING HENRY:\nOnce more unto the breach,", "To be, or not to be", "JULIET:"]
STOPS, STOP_NEW = [",", "\n"], 8  # alone, the rows meet a stop string after 1, 4 and 1 tokens
# The random GPT GEN's cases. Each leaves a position of its window for a pass after the last token, so that a loop
# that makes one is told so by the one-pass part, not by an IndexError in another.
# Rows that end apart: alone, they meet the end id after 4 and 6 tokens and a stop string after 5 and 2, so that
# every row has finished after 6 of the 12 tokens allowed.
END_ROWS, END_NEW, END_STOPS, END_IDS = [[5, 6, 7], [40], [60, 61, 62, 63, 64], [80, 81]], 12, ["PRO", " impact"], \
    [42425]
# A sampler per row: one samples, two are greedy with penalties that read the prompt (alone, each one's first token
# is another when the sampler is not given the prompt's ids): row 1's prompt holds the token greedy would pick
# after it, row 2's the pair (37192, 32240), which the n-gram ban forbids to repeat.
SAMPLE_ROWS, SAMPLE_NEW = [[60, 61, 62, 63, 64], [34008, 31544, 27385], [37192, 32240, 37192]], 6
SAMPLE_SETTINGS = [dict(do_sample=True, temperature=0.9, top_k=50, seed=11), dict(repetition_penalty=1.5),
                   dict(no_repeat_ngram_size=2, presence_penalty=0.5, frequency_penalty=0.5)]
ONE_PASS_ROWS, ONE_PASS_NEW = [[1, 2, 3], [4], [5, 6]], 6  # greedy, no end id: every row runs to its length
GENERATION_CASES = ("hf", "greedy", "stops", "ends", "sampling", "one pass")


@functools.cache
def _encoding():
    return coursekit.gpt2_encoding()


@once
def _shipped() -> GPT:
    return GPT.from_pretrained(coursekit.shipped_model_dir()).eval()


@once
def _shipped_hf():
    with quiet_transformers():
        return GPT2LMHeadModel.from_pretrained(coursekit.shipped_model_dir(), dtype=torch.float32).eval()


def _hf_batch(prompts: list[list[int]], n: int, eos: int) -> list[list[int]]:
    """Hugging Face's greedy generate on the left-padded batch, each row cut after its first end id."""
    ids, mask = _padded(prompts, eos)
    with torch.no_grad(), quiet_transformers():
        out = _shipped_hf().generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                                     pad_token_id=eos, eos_token_id=eos)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def _alone_all(model, prompts, n, settings=None, **options) -> list[list]:
    enc = _encoding()
    out = []
    for b, p in enumerate(prompts):
        g = generate_alone(model, enc, p, n, **options, **(settings[b] if settings else {}))
        out.append([g.ids, g.text, g.finish_reason])
    return out


def _greedy_prompts() -> list[list[int]]:
    return [_encoding().encode(p, allowed_special="all") for p in GREEDY_PROMPTS]


@once
def _expected(case: str) -> list:
    """The oracle's answers for one generation case of test_generate_batch, computed once (in the grader's fork
    server, before any judge process is forked from it: ``warm_up``): "hf", Hugging Face's generate on the batch;
    the others, chapter 6's generate of each prompt alone, as [ids, text, finish reason]."""
    enc = _encoding()
    if case == "hf":
        return _hf_batch(_greedy_prompts(), GREEDY_NEW, enc.eot_token)
    if case == "greedy":
        return _alone_all(_shipped(), _greedy_prompts(), GREEDY_NEW)
    if case == "stops":
        return _alone_all(_shipped(), [enc.encode(p) for p in STOP_PROMPTS], STOP_NEW, stop=STOPS)
    if case == "ends":
        return _alone_all(_model(GEN), END_ROWS, END_NEW, stop=END_STOPS, eos_ids=END_IDS)
    if case == "sampling":
        return _alone_all(_model(GEN), SAMPLE_ROWS, SAMPLE_NEW, SAMPLE_SETTINGS)
    if case == "one pass":
        return _alone_all(_model(GEN), ONE_PASS_ROWS, ONE_PASS_NEW, eos_ids=[])
    raise KeyError(case)


@once
def _sampled_without_prompts() -> list:
    """The sampling case with the mistake of giving each sampler only its row's new ids, not the prompt's: each
    prompt alone through chapter 5's TextStream, whose chooser hands the sampler the ids after the prompt."""
    out = []
    for prompt, settings in zip(SAMPLE_ROWS, SAMPLE_SETTINGS):
        sampler = Sampler(**settings, prompt_len=len(prompt))
        stream = TextStream(_model(GEN), _encoding(), prompt, SAMPLE_NEW,
                            choose=lambda logits, ids, n=len(prompt), s=sampler: s(logits, ids[n:]))
        for _ in stream:
            pass
        out.append([stream.ids, stream.text, stream.finish_reason])
    return out


def warm_up() -> None:
    """test_generate_batch's expected answers, computed in the grader's fork server (``autograder.warm``): each
    judge process forked from it starts with them (about 1 s of generation a notebook otherwise)."""
    for case in GENERATION_CASES:
        _expected(case)


def _generations(label, got, want_rows) -> list:
    if isinstance(got, list) and got[:1] in (["not a list"], ["not generations"]):
        fail(f"{label} returned {'a ' + got[1] if got[0] == 'not a list' else 'a list holding a ' + got[1]}, "
             "expected a list of Generation (one per prompt)", "return [row.end() for row in rows]")
    if len(got) != want_rows:
        fail(f"{label} returned {len(got)} generations for {want_rows} prompts", "one Generation per prompt")
    return got


def _parting(got: list[int], want: list[int]) -> str:
    """Where two lists of new ids part: "from new token 13 on, [...] against [...]" (or their lengths)."""
    i = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
    if i == min(len(got), len(want)):
        return f"{len(got)} new token{'s' if len(got) != 1 else ''} against {len(want)}, the first {i} the same"
    return f"from new token {i} on, {show(got[i:i + 8])} against {show(want[i:i + 8])}"


def _compare(label, got, want, hint, known: tuple = ()):
    """Each row as its prompt alone; ``known``: (a function giving what a known mistake returns, its hint), the hint
    named when the rows are the mistake's."""
    for b, (g, w) in enumerate(zip(got, want)):
        if g != w:
            what = (f"the ids part: {_parting(g[0], w[0])}" if g[0] != w[0] else
                    "the same ids, another text" if g[1] != w[1] else "the same ids and text, another finish reason")
            hint = next((h for mistake, h in known if got == mistake()), hint)
            fail(f"{label}: row {b} got ids {show(g[0])}, text {show(g[1])}, finish reason {show(g[2])}; alone, "
                 f"that prompt gives ids {show(w[0])}, text {show(w[1])}, finish reason {show(w[2])} ({what})", hint)


def _check_hf(label, got, prompts, tail):
    """Each row against Hugging Face's generate on the batch; rows whose prompts hold the pad's id of end-of-text
    departing alone name that."""
    eot = _encoding().eot_token
    apart = [b for b, (g, want) in enumerate(zip(got, _expected("hf"))) if g[0] != want]
    if apart:
        b = apart[0]
        hint = "greedy: each row's next token is the argmax of ITS last logits; left-pad, each token at its own " \
               "position, the mask hides padding" + tail
        holding = [i for i, p in enumerate(prompts) if eot in p]
        if apart == holding:
            hint = (f"only the row{'s' if len(holding) > 1 else ''} whose prompt holds <|endoftext|> ({eot}) as a "
                    f"token depart{'' if len(holding) > 1 else 's'}: a token with the pad's id is still a token; "
                    "the mask comes from the rows' lengths (left_pad's), never from the ids")
        fail(f"{label}: row {b} departs from Hugging Face's generate on the same left-padded batch: "
             f"{_parting(got[b][0], _expected('hf')[b])}", hint)


def _check_passes(label, shapes: list[tuple[int, ...]], prompts: list[list[int]], want: list, max_new: int):
    """The judge's record of one generation (the input shapes of block 0's c_attn, which only this process
    computes) against one forward pass of the whole batch per token through the cache: the prefill of the padded
    prompts (B rows, T columns), then each pass one new column, as many passes as the longest row has tokens (the
    row's tokens are right: ``want``), none after it."""
    B, T, k = len(prompts), max(len(p) for p in prompts), max(len(w[0]) for w in want)
    rows = [shape[0] if len(shape) > 1 else 1 for shape in shapes]
    ran = f"{label} ran the model {len(shapes)} time{'s' if len(shapes) != 1 else ''}, on batches of " \
          f"{show(sorted(set(rows)))} rows, where its longest row has {k} new token{'s' if k != 1 else ''}"
    if rows[:1] != [B]:
        fail(ran, "one forward pass of the whole batch per new token: the prefill of every prompt at once, then "
                  "each step one new column for all the rows; generating each prompt alone is not a batch")
    if len(shapes) > k:
        if k < max_new and len(shapes) >= max_new:
            fail(ran, f"every row had finished after {k} new tokens and the loop went on: stop as soon as every "
                      "row has finished, before another pass")
        fail(ran, "one forward pass per new token: the prefill gives every row its first token, each later pass "
                  "one more, and none after the last token (past the window it would not even fit)")
    computed = sum(torch.Size(shape[:-1]).numel() for shape in shapes)
    most = B * T + B * (k - 1)
    if computed > most:
        fail(f"{label} computed {computed} positions in its {len(shapes)} passes (columns per pass: "
             f"{show([shape[-2] if len(shape) > 2 else 1 for shape in shapes])}); through the cache, {most} at most",
             "keep the keys and values in chapter 7's KVCache and give forward_padded only the new column: the "
             f"prefill computes the {T} padded columns once, each later pass one column for the {B} rows; running "
             "the whole window again at every step is the work the cache saves")


@cell("test_generate_batch", parts={HF_GREEDY: 2, ENDS: 1, SAMPLING: 1, ONE_PASS: 1})
def check_generate_batch(generate_batch):
    because = because_of(left_pad="test_left_pad", forward_padded="test_forward_padded")
    tail = f"; {because}" if because else ""
    enc, theirs_enc = _encoding(), make("common.gpt2_encoding")
    shipped = make("batching.shipped_gpt")
    # The random GPT's block 0 c_attn is the judge's (its weights only here): no logits without this process
    # seeing every forward pass, and every position each pass computes. Each run's record is judged in the
    # one-pass part, where its rows came out right.
    qkv = serve(_model(GEN).h[0].attn.c_attn)
    theirs = make("kv_cache.served_gpt", qkv.id, "h.0.attn.c_attn", **_recipe(GEN))
    runs = []  # (label, the input shapes of its passes, prompts, max_new_tokens, the expected rows)

    def run_gen(label, rows, n, **options):
        qkv.take()
        got = _generations(label, call(ask, "batching.generations", generate_batch, theirs, theirs_enc, rows, n,
                                       label=label, **options), len(rows))
        return got, (label, qkv.take(), rows, n)

    with part(HF_GREEDY):
        prompts = _greedy_prompts()
        label = f"generate_batch(<the course's model>, <GPT-2's tokenizer>, <{len(prompts)} prompts of " \
                f"{', '.join(str(len(p)) for p in prompts)} tokens: {show(GREEDY_PROMPTS)}>, {GREEDY_NEW})"
        got = _generations(label, call(ask, "batching.generations", generate_batch, shipped, theirs_enc, prompts,
                                       GREEDY_NEW, label=label), len(prompts))
        _check_hf(label, got, prompts, tail)
        _compare(label, got, _expected("greedy"), "each row as its prompt generated alone" + tail)
    with part(ENDS):
        prompts = [enc.encode(p) for p in STOP_PROMPTS]
        label = f"generate_batch(<the course's model>, <GPT-2's tokenizer>, {show(STOP_PROMPTS)}, {STOP_NEW}, " \
                "stop=[',', '\\n'])"
        got = _generations(label, call(ask, "batching.generations", generate_batch, shipped, theirs_enc, prompts,
                                       STOP_NEW, stop=STOPS, label=label), len(prompts))
        ends = "a row that reached a stop string or an end id is finished (finish reason 'stop' or 'eos'): add no " \
               "token to it, while the other rows go on" + tail
        _compare(label, got, _expected("stops"), ends)
        # The random GPT: two rows meet the end id, two a stop string, all at different steps.
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(END_ROWS)}, {END_NEW}, " \
                f"stop={show(END_STOPS)}, eos_ids={show(END_IDS)})"
        got, record = run_gen(label, END_ROWS, END_NEW, stop=END_STOPS, eos_ids=END_IDS)
        _compare(label, got, _expected("ends"), ends)
        runs.append((*record, _expected("ends")))
    with part(SAMPLING):
        samplers = [make("batching.sampler", **s, prompt_len=len(p)) for s, p in zip(SAMPLE_SETTINGS, SAMPLE_ROWS)]
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(SAMPLE_ROWS)}, {SAMPLE_NEW}, " \
                f"samplers=[{', '.join(_sampler(s, len(p)) for s, p in zip(SAMPLE_SETTINGS, SAMPLE_ROWS))}])"
        got, record = run_gen(label, SAMPLE_ROWS, SAMPLE_NEW, samplers=samplers)
        _compare(label, got, _expected("sampling"),
                 "row b draws its tokens with samplers[b] (its own settings and seed), called with that row's logits "
                 "and all its ids so far, the prompt's and the new ones, once per new token of that row" + tail,
                 known=[(_sampled_without_prompts,
                         "each sampler was given only its row's new ids: give it the prompt's too (row.prompt_ids + "
                         "row.ids), as chapter 6's generate does: the repetition penalty and the n-gram ban read "
                         "the prompt")])
        runs.append((*record, _expected("sampling")))
    with part(ONE_PASS):
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(ONE_PASS_ROWS)}, {ONE_PASS_NEW}, " \
                "eos_ids=[])"
        got, record = run_gen(label, ONE_PASS_ROWS, ONE_PASS_NEW, eos_ids=[])
        _compare(label, got, _expected("one pass"), "each row as its prompt generated alone" + tail)
        for label, shapes, rows, n, want in [(*record, _expected("one pass")), *runs]:
            _check_passes(label, shapes, rows, want, n)


def _sampler(settings: dict, prompt_len: int) -> str:
    return f"Sampler({', '.join(f'{k}={v}' for k, v in (settings | {'prompt_len': prompt_len}).items())})"
