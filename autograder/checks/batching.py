"""Chapter 10 (batching): hidden checks for left_pad, position_ids, padded_causal_mask, forward_padded and
generate_batch.

The oracles. For the padding, positions and mask: what the notebook states, written here plainly (a loop over
each row's tokens). For the model on a batch: each row run ALONE through the course's reference GPT (chapter 4,
tested against Hugging Face's ``GPT2LMHeadModel`` in the course's tests) with the same seeded random weights: a
padded row's logits must be the row's own, to float rounding. For generation: Hugging Face's ``generate`` on the
same left-padded batch (``attention_mask``, greedy), token for token, and chapter 6's reference ``generate`` of each
prompt alone, with the same sampler settings and seeds (ids, text and finish reason); the course's shipped model on
both sides where its weights are the point (Hugging Face's batch, stop strings in its text), a seeded random GPT
where they are not (rows that meet an end id, a sampler per row, the count of forward passes): a decode step of the
shipped model costs tens of milliseconds, one of the random GPT's a fraction of one.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, and so do
the models, caches, samplers and tokenizer they are given, built there from plain recipes
(``sandboxed.helpers.batching``); what comes back (tensors, plain lists) is compared here. The forward passes of a
generation are counted here: the model of that part has its language-model head (untied from the embedding) in
this process only (``judge.serve``), so that the learner's side gets no logits without this process computing them.

Nothing here assumes how the code is written: pads by a loop or by ``torch.nn.utils.rnn.pad_sequence`` on flipped
rows, any valid position at padding (0, 1 as Hugging Face puts, the clamped count), a padding query that reads
itself, every key, or its row's first token, ``F.scaled_dot_product_attention`` with the boolean mask or an additive
mask of a large negative number, a generation loop with or without the cache, one that drops finished rows from the
batch or keeps them running: all pass. What must hold: the tokens' numbers, and one forward pass of the whole
batch per new token (a loop that runs each prompt alone is not a batch).

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
from minigpt.samplers import generate as generate_alone
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

SHAPES = {
    "a": Shape(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=24, seed=1000),
    "b": Shape(vocab_size=61, block_size=12, n_layer=3, n_head=3, n_embd=12, seed=1001),
}
INIT_RANGE = 0.2  # spread logits: no greedy step of the checks' cases is a near tie


OWN_HEAD = "b, its own head"  # "b" with a head untied from its embedding: the judge serves it (test_generate_batch)


def _recipe(name: str) -> dict:
    s = SHAPES[name.split(",")[0]]
    head = {"head_seed": 1015} if name == OWN_HEAD else {}  # a seed whose greedy steps have no near tie
    return dict(vocab_size=s.vocab_size, block_size=s.block_size, n_layer=s.n_layer, n_head=s.n_head,
                n_embd=s.n_embd, seed=s.seed, init_range=INIT_RANGE, **head)


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


def _forward_mistake(model, rows, got) -> str:
    for mistake, hint in (("columns", "each token was embedded at its COLUMN: add the position embedding of its "
                                      "position in its own row, position_ids(mask)"),
                          ("reads_padding", "the tokens read the padding of their row: attend with "
                                            "padded_causal_mask(mask, t_new), not a plain causal mask")):
        other = _replay(model, rows, mistake)
        if other is not None and all(_close(got[b, -len(r):], other[b, -len(r):]) for b, r in enumerate(rows)):
            return hint
    if torch.isnan(got).any():
        return "NaN in the logits: a padding query whose mask row is all False gives 0 / 0 in softmax, and the " \
               "next layer spreads it (0 * NaN = NaN)"
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
                     "the new tokens are the LAST t_new columns of the mask: their positions are the last t_new "
                     "of position_ids(mask), and they read every cached token of their row (padded_causal_mask("
                     "mask, t_new))" + (f"; {because}" if because else ""))


# ---------------------------------------------------------------- generate_batch

HF_GREEDY, ENDS, SAMPLING, ONE_PASS = ("greedy, as Hugging Face's generate on the batch", "rows that finish apart",
                                       "a sampler per row", "one forward pass of the batch per token")
GREEDY_PROMPTS = ["ROMEO:", "Now is the winter of our discontent", "O", "What light through yonder window breaks?"]
GREEDY_NEW = 8  # new tokens a row: the mistakes of padding, positions and masks show within the first 4
STOP_PROMPTS = ["KING HENRY:\nOnce more unto the breach,", "To be, or not to be", "JULIET:"]
STOP_NEW = 8  # alone, the rows meet a stop string after 1, 4 and 1 tokens
# The end id of the random GPT "a" in ENDS: alone, its rows meet it after 4, never, 9 and 5 tokens.
EOS_A = 65
SAMPLE_SETTINGS = [dict(do_sample=True, temperature=0.9, top_k=50, seed=11),
                   dict(do_sample=True, temperature=1.2, top_p=0.9, seed=12),
                   dict(do_sample=True, temperature=0.7, seed=13)]


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


STOPS = [",", "\n"]
EOS_ROWS = [[5, 6, 7], [40], [60, 61, 62, 63, 64], [80, 81]]  # prompts of the random GPT "a"
# Sampled by the random GPT "a": 5 tokens and 10 new ones leave a position of its 16 for a pass after the last
# token, so that a loop that makes one is told so by the one-pass part, not by an IndexError here.
SAMPLE_ROWS, SAMPLE_NEW = EOS_ROWS[:3], 10
ONE_PASS_ROWS, ONE_PASS_NEW = [[1, 2, 3], [4], [5, 6]], 6  # prompts of the random GPT OWN_HEAD, greedy, no end id
GENERATION_CASES = ("hf", "greedy", "stops", "eos", "sampling", "one pass")


@once
def _expected(case: str) -> list:
    """The oracle's answers for one generation case of test_generate_batch, computed once (in the grader's fork
    server, before any judge process is forked from it: ``warm_up``): "hf", Hugging Face's generate on the batch;
    the others, chapter 6's generate of each prompt alone, as [ids, text, finish reason]."""
    enc = _encoding()
    greedy = [enc.encode(p) for p in GREEDY_PROMPTS]
    if case == "hf":
        return _hf_batch(greedy, GREEDY_NEW, enc.eot_token)
    if case == "greedy":
        return _alone_all(_shipped(), greedy, GREEDY_NEW)
    if case == "stops":
        return _alone_all(_shipped(), [enc.encode(p) for p in STOP_PROMPTS], STOP_NEW, stop=STOPS)
    if case == "eos":
        return _alone_all(_model("a"), EOS_ROWS, 12, eos_ids=[EOS_A])
    if case == "sampling":
        return _alone_all(_model("a"), SAMPLE_ROWS, SAMPLE_NEW, SAMPLE_SETTINGS)
    if case == "one pass":
        return _alone_all(_model(OWN_HEAD), ONE_PASS_ROWS, ONE_PASS_NEW, eos_ids=[])
    raise KeyError(case)


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


def _compare(label, got, want, hint):
    for b, (g, w) in enumerate(zip(got, want)):
        if g != w:
            what = (f"the ids part: {_parting(g[0], w[0])}" if g[0] != w[0] else
                    "the same ids, another text" if g[1] != w[1] else "the same ids and text, another finish reason")
            fail(f"{label}: row {b} got ids {show(g[0])}, text {show(g[1])}, finish reason {show(g[2])}; alone, "
                 f"that prompt gives ids {show(w[0])}, text {show(w[1])}, finish reason {show(w[2])} ({what})", hint)


@cell("test_generate_batch", parts={HF_GREEDY: 2, ENDS: 1, SAMPLING: 1, ONE_PASS: 1})
def check_generate_batch(generate_batch):
    because = because_of(left_pad="test_left_pad", forward_padded="test_forward_padded")
    tail = f"; {because}" if because else ""
    enc, theirs_enc = _encoding(), make("common.gpt2_encoding")
    shipped = make("batching.shipped_gpt")
    with part(HF_GREEDY):
        prompts = [enc.encode(p) for p in GREEDY_PROMPTS]
        label = f"generate_batch(<the course's model>, <GPT-2's tokenizer>, <{len(prompts)} prompts of " \
                f"{', '.join(str(len(p)) for p in prompts)} tokens>, {GREEDY_NEW})"
        got = _generations(label, call(ask, "batching.generations", generate_batch, shipped, theirs_enc, prompts,
                                       GREEDY_NEW, label=label), len(prompts))
        for b, (g, want) in enumerate(zip(got, _expected("hf"))):
            if g[0] != want:
                fail(f"{label}: row {b} departs from Hugging Face's generate on the same left-padded batch: "
                     f"{_parting(g[0], want)}", "greedy: each row's next token is the argmax of ITS last logits; "
                                            "left-pad, each token at its own position, the mask hides padding" + tail)
        _compare(label, got, _expected("greedy"), "each row as its prompt generated alone" + tail)
    with part(ENDS):
        prompts = [enc.encode(p) for p in STOP_PROMPTS]
        label = f"generate_batch(<the course's model>, <GPT-2's tokenizer>, {show(STOP_PROMPTS)}, {STOP_NEW}, " \
                "stop=[',', '\\n'])"
        got = _generations(label, call(ask, "batching.generations", generate_batch, shipped, theirs_enc, prompts,
                                       STOP_NEW, stop=STOPS, label=label), len(prompts))
        _compare(label, got, _expected("stops"),
                 "a row that reached a stop string (or an end id) is finished: add no token to it, while the other "
                 "rows go on" + tail)
        # A random GPT whose rows meet the end id at different steps (tokens below 97 are single bytes of GPT-2's).
        theirs, rows = make("kv_cache.seeded_gpt", **_recipe("a")), EOS_ROWS
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(rows)}, 12, eos_ids=[{EOS_A}])"
        got = _generations(label, call(ask, "batching.generations", generate_batch, theirs, theirs_enc, rows, 12,
                                       eos_ids=[EOS_A], label=label), len(rows))
        _compare(label, got, _expected("eos"),
                 "a row ends at its end id (finish reason 'eos'), the others go on" + tail)
    with part(SAMPLING):
        theirs, rows = make("kv_cache.seeded_gpt", **_recipe("a")), SAMPLE_ROWS
        samplers = [make("batching.sampler", **s) for s in SAMPLE_SETTINGS]
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(rows)}, {SAMPLE_NEW}, samplers=[Sampler(" \
                f"{', '.join(f'{k}={v}' for k, v in SAMPLE_SETTINGS[0].items())}), ...])"
        got = _generations(label, call(ask, "batching.generations", generate_batch, theirs, theirs_enc, rows,
                                       SAMPLE_NEW, samplers=samplers, label=label), len(rows))
        _compare(label, got, _expected("sampling"),
                 "row b draws its tokens with samplers[b] (its own seed), called with that row's logits and ids, "
                 "once per new token of that row" + tail)
    with part(ONE_PASS):
        # The model's head is the judge's (untied, its weights only here): no logits without this process seeing
        # every forward pass, and the count below is what it saw.
        head = serve(_model(OWN_HEAD).lm_head)
        theirs = make("kv_cache.served_gpt", head.id, "lm_head", **_recipe(OWN_HEAD))
        rows = ONE_PASS_ROWS
        label = f"generate_batch(<a random GPT>, <GPT-2's tokenizer>, {show(rows)}, {ONE_PASS_NEW}, eos_ids=[])"
        got = _generations(label, call(ask, "batching.generations", generate_batch, theirs, theirs_enc, rows,
                                       ONE_PASS_NEW, eos_ids=[], label=label), len(rows))
        calls = [shape[0] if len(shape) > 1 else 1 for shape in head.take()]
        if len(calls) > ONE_PASS_NEW or max(calls, default=0) < len(rows):
            fail(f"{label} ran the model {len(calls)} times for {ONE_PASS_NEW} new tokens a row, on batches of "
                 f"{show(sorted(set(calls)))} rows",
                 "one forward pass of the whole batch per new token: the prefill of every prompt at once, then each "
                 "step one new column for all the rows, and none after the last token (past the window it would "
                 "not even fit); generating each prompt alone is not a batch")
        _compare(label, got, _expected("one pass"), "each row as its prompt generated alone" + tail)
