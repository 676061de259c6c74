"""Chapter 7 (the KV cache): hidden checks for KVCache, attention_with_cache, forward_with_cache, CachedModel
and kv_cache_bytes.

The oracle is the same model without a cache. For one layer: torch's ``scaled_dot_product_attention`` over
the whole sequence at once. For the model: the course's reference GPT (chapter 4, ``minigpt.transformer``,
tested against Hugging Face's ``GPT2LMHeadModel`` in the course's tests, where the reference cache is also
compared with Hugging Face's own) with random weights, run on the whole sequence: this chapter grades the
cache, not the learner's transformer, and its grading kernel need not import transformers (seconds on every
notebook). For ``CachedModel``: the reference generation loops of chapters 5 and 6 (greedy ``token_stream``,
seeded ``Sampler``, ``beam_search``) with the plain model, token for token, also past the window. For the
memory: the tensors that a cache of keys and values really holds, in float32 and bfloat16.

The learner's classes and functions are stand-ins (``autograder.judge.Remote``): they run where the notebook
runs, and so do the models, attention layers and configs they are given, built there from plain recipes
(``autograder.sandboxed.helpers.kv_cache``: a shape and a seed), as do the measurements that need the learner's objects
(the tensors a ``CachedModel`` holds, the generation loops of chapters 5 and 6 run with it). The expected answers
are computed here, from the same recipes; what the learner's code returns (logits, keys and values) comes back as
plain tensors. The positions a ``CachedModel`` runs are counted here: the model it is given computes block 0's
queries, keys and values in this process (``judge.serve``; the weights of that layer are not on the learner's
side), so no position reaches the model's output unseen.

Inputs are ones the notebook's visible tests do not use: batches of 1 to 3 sequences, one head, a prefill of one
token, a prefill of several tokens after decode steps, a window exactly full and one that slides, float64 keys,
layers and models, ids of every integer dtype the model accepts, attention scores of about 300 (where a naive
``exp`` overflows), a prompt of one id.

When an answer is wrong, a check runs the known mistakes on the same weights (a KV-cached GPT-2 built here from
the model's own layers and torch's attention, with the mistake made on purpose) and names the one whose
numbers the learner's code gave. A mistake in ``KVCache`` is named in the later cells too ("fix KVCache
first"), since they store their keys and values in it: the learner's attention is tried with a cache that
answers with the right keys and values (``ScriptedCache``, scripted here), and the learner's KVCache is tried
on its own. A failure of a cell whose function uses the learner's functions of earlier cells that failed their
own tests says so (``judge.because_of``): attention_with_cache uses KVCache, forward_with_cache uses both, and
CachedModel all three.

``CachedModel`` is held to what the notebook states: its logits are ``(1, T_new, V)``, T_new being the positions
it ran (all of ids after a prefill); a call whose ids[:-1] has a kept cache runs one position (counted here), also
for the second of two beams of one parent, for a window exactly full, and after a prompt of one id; the least
recently used cache goes first (a parent just used outlives older prompts); two CachedModels of two models share
no cache; memory stays bounded.

The checks test what the code computes, never how: a cache that preallocates its tensors and writes into them
with an index, ``F.scaled_dot_product_attention`` with a mask, a softmax of its own that subtracts the maximum or
the logsumexp, a ``CachedModel`` that copies tensors, evicts by a use counter or continues the longest cached
prefix, all get full marks. Nothing here imports the chapter's reference, ``minigpt.kv_cache``: a module
imported by a check would stay importable for the learner's later cells.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from autograder.checks import Shape, gap, once
from autograder.sandboxed.helpers import kv_cache as recipes
from autograder.judge import (LearnerError, Remote, Served, ask, because_of, cell, learner_side, make, part, seeded,
                              serve, type_of)
from coursekit.testing import call, close, describe_error, fail, not_written, show
from minigpt.generation import token_stream
from minigpt.samplers import Sampler, beam_search
from minigpt.transformer import GPT, GPTConfig

ATOL = 1e-5  # float32 logits and outputs, plus RTOL times the largest expected value
RTOL = 1e-5
FIX_KV_CACHE = "fix KVCache first (test_kv_cache)"
FIX_ATTENTION = "fix attention_with_cache first (test_attention_with_cache)"
FIX_FORWARD = "fix forward_with_cache first (test_forward_with_cache)"
BUILT_ON = ("CachedModel runs on your forward_with_cache, attention_with_cache and KVCache: if one of their tests "
            "fails, fix that first")


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Of ``want``'s shape and dtype, and within ATOL + RTOL times ``want``'s largest value of it everywhere (the
    tolerance of a value near 0 is the one of the whole tensor's scale: the rounding of a sum of large terms)."""
    scale = want.detach().abs().max().item() if want.numel() else 0.0
    return got.shape == want.shape and got.dtype == want.dtype and close(got, want, atol=ATOL + RTOL * scale, rtol=0)


def _type_name(obj) -> str:
    """The short type name of what the learner's code returned (a stand-in: of the object on its side)."""
    return type_of(obj).rpartition(".")[2] if isinstance(obj, Remote) else type(obj).__name__


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else _type_name(x)


# ---------------------------------------------------------------- random GPT-2s and the oracle

# Small windows, so that a generation three times as long slides them many times. A larger initializer_range
# than GPT-2's 0.02 spreads the logits, so that no greedy step is a near tie that float rounding could flip
# (tests/test_kv_cache.py checks the margins of every step these checks rely on).
SHAPES = {
    "a": Shape(vocab_size=97, block_size=12, n_layer=2, n_head=2, n_embd=24, seed=70),
    "b": Shape(vocab_size=61, block_size=9, n_layer=3, n_head=3, n_embd=12, seed=72),
    "c": Shape(vocab_size=97, block_size=12, n_layer=2, n_head=2, n_embd=24, seed=71),  # "a", other weights
}
INIT_RANGE = 0.2


def _recipe(name: str) -> dict:
    """The plain recipe of the random GPT-2 of shape ``name``: ``recipes.seeded_gpt(**recipe)`` builds it (every
    parameter drawn from torch's generator seeded with the shape's seed: LayerNorm weights in [0.5, 1.5], biases
    N(0, 0.1), matrices N(0, INIT_RANGE))."""
    s = SHAPES[name]
    return dict(vocab_size=s.vocab_size, block_size=s.block_size, n_layer=s.n_layer, n_head=s.n_head,
                n_embd=s.n_embd, seed=s.seed, init_range=INIT_RANGE)


@functools.cache
def _models(name: str, dtype: torch.dtype = torch.float32) -> GPT:
    """The reference GPT (chapter 4, tested against Hugging Face's GPT-2) of the shape ``name``, random weights,
    in ``dtype``: the model the learner's side builds from the same recipe."""
    with seeded(SHAPES[name].seed):  # the recipe draws from torch's generator: one such block at a time
        return recipes.seeded_gpt(**_recipe(name), dtype=dtype)


def _model(name: str, dtype: torch.dtype = torch.float32) -> Remote:
    """The GPT of shape ``name`` in ``dtype`` on the learner's side."""
    return make("kv_cache.seeded_gpt", **_recipe(name), dtype=dtype)


def _ids(shape: tuple[int, ...], vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _plain_last(model, ids: list[int]) -> torch.Tensor:
    """The uncached model's next-token logits after ``ids`` (a window that fits): a copy of those computed once for
    each model and ids in this process (every notebook's check asks the same)."""
    return _plain_last_once(model, tuple(ids)).clone()


@once
def _plain_last_once(model, ids: tuple[int, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)]))[0, -1].clone()


# ---------------------------------------------------------------- the known mistakes, made on purpose

class _Cache:
    """The notebook's KVCache interface (per-layer ``keys`` and ``values`` lists, ``length``, ``append``), known to
    be right: the cache of the known mistakes replayed here (never given to the learner's code)."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer, k, v):
        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def _heads(attn, t: torch.Tensor) -> torch.Tensor:
    B, T, C = t.shape
    return t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2)


def _attend(attn, x: torch.Tensor, past: _Cache, layer: int, mistake: str = "") -> torch.Tensor:
    """Cached attention of the new positions x (B, T_new, C), with torch's attention and, if asked, a mistake:
    "mask_from_start" (the new queries masked as if they were the first positions), "no_mask", "no_cache" (the
    new queries read only the new keys)."""
    q, k, v = (_heads(attn, t) for t in attn.c_attn(x).split(attn.n_embd, dim=2))
    k, v = past.append(layer, k, v)
    t_new, t = q.shape[2], k.shape[2]
    mask = torch.ones(t_new, t, dtype=torch.bool).tril(diagonal=0 if mistake == "mask_from_start" else t - t_new)
    if mistake == "no_mask":
        mask = None
    if mistake == "no_cache":
        k, v, mask = k[:, :, -t_new:], v[:, :, -t_new:], mask[:, -t_new:]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.c_proj(y.transpose(1, 2).reshape(x.shape))


def _forward(model, idx: torch.Tensor, past: _Cache, mistake: str = "") -> torch.Tensor:
    """Logits of the new ids (B, T_new) through the model with a KV cache and, if asked, a mistake: "positions"
    (the new tokens at positions 0 .. T_new - 1), "offset+1", "offset-1", "one_layer" (every block caches in
    layer 0), or one of _attend's."""
    start = {"positions": 0, "offset+1": past.length + 1, "offset-1": past.length - 1}.get(mistake, past.length)
    x = model.emb.wte(idx.long()) + model.emb.wpe(torch.arange(start, start + idx.shape[1]))
    for i, block in enumerate(model.h):
        x = x + _attend(block.attn, block.ln_1(x), past, 0 if mistake == "one_layer" else i, mistake)
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))


def _replay(model, chunks: list[torch.Tensor], mistake: str) -> list[torch.Tensor] | None:
    """The logits of each chunk, fed one after the other into one cache, with the mistake; None if the mistake
    cannot even run on these chunks (a position outside the table)."""
    past = _Cache(model.config.n_layer)
    try:
        with torch.no_grad():
            return [_forward(model, chunk, past, mistake) for chunk in chunks]
    except (IndexError, RuntimeError):
        return None


# ---------------------------------------------------------------- KVCache

# The sequences of appends: (batch, heads, head_size, dtype, [(layer, new positions), ...]). Equal lengths first
# (a concatenation along the wrong dim then gives a wrong shape, not a crash), then a one-token decode step and a
# chunk of three after it; layer 1 in between, to see that layers are apart. Then one sequence, one head, float64,
# starting with a one-token prefill (a cache must keep the dtype it is given: a float32 buffer would round it).
KV_SEQUENCES = [
    (2, 3, 5, torch.float32, [(0, 2), (1, 2), (0, 2), (0, 1), (1, 1), (0, 3)]),
    (1, 1, 4, torch.float64, [(0, 1), (0, 1), (1, 3), (0, 2)]),
]


def _kv_cache_problem(KVCache) -> tuple[str, str] | None:
    """(what went wrong, why) for a wrong KVCache on fixed sequences of appends; None if it is right."""
    g = torch.Generator().manual_seed(700)
    for B, H, D, dtype, appends in KV_SEQUENCES:
        problem = _kv_sequence_problem(KVCache, g, B, H, D, dtype, appends)
        if problem:
            return problem
    return None


def _kv_sequence_problem(KVCache, g, B, H, D, dtype, appends) -> tuple[str, str] | None:
    def kv(t):
        return torch.randn(B, H, t, D, generator=g, dtype=dtype), torch.randn(B, H, t, D, generator=g, dtype=dtype)

    cache = call(KVCache, 3, label="KVCache(n_layer=3)")
    length = call(lambda: cache.length, label="KVCache(3).length")
    if length != 0:
        return f"an empty KVCache(3) has length {show(length)}, expected 0", "nothing is stored yet"
    stored = {0: [], 1: []}
    kind = str(dtype).removeprefix("torch.")
    for layer, t in appends:
        k_new, v_new = kv(t)
        label = (f"KVCache.append(layer={layer}, k, v) with {kind} k, v of shape {(B, H, t, D)}, after appending "
                 f"{[s[0].shape[2] for s in stored[layer]]} positions to layer {layer}")
        # On the learner's side: (what append returned, whether it wrote into the k or v it was given).
        got, changed = call(lambda: ask("kv_cache.watched", cache.append, layer, k_new, v_new), label=label,
                            hint="concatenate along dim 2, the time dimension of (B, n_head, T, head_size): other "
                                 "dims must match, and only T differs between the old and the new positions"
                            if stored[layer] else "")
        if changed:
            return f"{label} changed the k or v it was given", "store them (or copies); never write into them"
        old_k = [s[0] for s in stored[layer]]
        old_v = [s[1] for s in stored[layer]]
        stored[layer].append((k_new, v_new))
        want_k = torch.cat(old_k + [k_new], dim=2)
        want_v = torch.cat(old_v + [v_new], dim=2)
        if not isinstance(got, tuple) or len(got) != 2 or not all(isinstance(x, torch.Tensor) for x in got):
            return f"{label} returned {show(got)}", "return the tuple (all keys, all values) of this layer"
        k, v = got
        if k.dtype != dtype or v.dtype != dtype:
            return (f"{label} returned {str(k.dtype).removeprefix('torch.')} keys and "
                    f"{str(v.dtype).removeprefix('torch.')} values, expected {kind}",
                    "the cache keeps the dtype of the k and v it is given: a buffer made with torch.zeros(...) or "
                    "torch.empty(...) is float32 whatever k is; make it with k.new_zeros(...) / k.new_empty(...) "
                    "or dtype=k.dtype")
        if torch.equal(k, want_k) and torch.equal(v, want_v):
            n = sum(s[0].shape[2] for s in stored[0])
            length = call(lambda: cache.length, label="KVCache.length")
            if length != n:
                return (f"after appending {n} positions to layer 0, KVCache.length is {show(length)}",
                        "length counts the positions stored (in layer 0), not the appends or the layers")
            continue
        what = "other keys or values than" if k.shape == want_k.shape and v.shape == want_v.shape else \
            f"keys of shape {_shape(k)} and values of shape {_shape(v)}, not"
        return (f"{label} returned {what} the old and the new ones one after the other ({tuple(want_k.shape)})",
                _append_hint(k, v, k_new, v_new, old_k, old_v, want_k, want_v))
    return None


def _append_hint(k, v, k_new, v_new, old_k, old_v, want_k, want_v) -> str:
    if old_k and k.shape != want_k.shape:
        for dim, name in ((-1, "the last dim (head_size)"), (1, "dim 1 (the heads)"), (0, "dim 0 (the batch)")):
            if k.shape == torch.cat(old_k + [k_new], dim=dim).shape:
                return (f"the keys were concatenated along {name}; the time dimension of (B, n_head, T, "
                        "head_size) is dim 2: torch.cat([old, new], dim=2)")
    if torch.equal(k, want_k) and old_v and v.shape != want_v.shape and torch.equal(v, v_new):
        return "the values are not cached: only the new values came back; append them after the old ones, " \
               "exactly as the keys"
    if torch.equal(k, want_k) and old_v and any(torch.equal(v, torch.cat(old_v + keys, dim=2))
                                                for keys in ([k_new], [want_k], old_k + [k_new])):
        return "KEYS were appended to the values (a copy-paste slip?): the values get the new values, " \
               "torch.cat([old values, v], dim=2)"
    if torch.equal(k, want_k) and not torch.equal(v, want_v):
        return "the keys are right, the values are not: cache the values exactly as the keys"
    if old_k and torch.equal(k, torch.cat([k_new] + old_k, dim=2)):
        return "the new keys and values go AFTER the old ones: torch.cat([old, new], dim=2)"
    if old_k and torch.equal(k, k_new):
        return "only the new keys and values came back: store each layer's keys and values (self.keys[layer] = "\
               "...) and return all of them, old and new"
    if len(old_k) > 1 and torch.equal(k, torch.cat([old_k[-1], k_new], dim=2)):
        return "only the last append was kept: store the concatenation, so that the next append builds on it"
    if len(old_k) > 1 and torch.equal(k, torch.cat([old_k[0], k_new], dim=2)):
        return "the concatenation was returned but never stored: self.keys[layer] = the new full keys (and values)"
    return "append stores the layer's old and new positions, along dim 2, and returns them all"


APPENDS, FLOAT64_KV = "appends along time", "float64 keys and values"


@cell("test_kv_cache", parts={APPENDS: 3, FLOAT64_KV: 1})
def check_kv_cache(KVCache):
    g = torch.Generator().manual_seed(700)  # as _kv_cache_problem draws: the same keys and values
    for name, sequence in zip((APPENDS, FLOAT64_KV), KV_SEQUENCES):
        with part(name):
            problem = _kv_sequence_problem(KVCache, g, *sequence)
            if problem:
                fail(*problem)


def _kv_cache_blame(KVCache) -> str:
    """A hint that names a mistake in the learner's KVCache, or "" when it is right."""
    try:
        problem = _kv_cache_problem(KVCache)
    except AssertionError as err:
        problem = (str(err).split("\n")[0], "")
    if not problem:
        return ""
    return f"your KVCache is wrong: {problem[1] or problem[0]} ({FIX_KV_CACHE})"


# ---------------------------------------------------------------- attention_with_cache

class AttentionCase(NamedTuple):
    """A layer of this shape, a batch of inputs fed in chunks of new positions, the inputs scaled by ``scale`` and
    all in ``dtype``."""
    n_embd: int
    n_head: int
    batch: int
    chunks: list[int]
    scale: float = 1.0
    dtype: torch.dtype = torch.float32


# A prefill of several tokens or of one, decode steps, and a chunk of several new tokens after decode steps, whose
# mask must be causal_mask(T_new, T); then one sequence in float64, and inputs large enough that the scores reach
# about 300, where exp overflows (float32's largest is about exp(88)).
ATTENTION_CASES = [
    AttentionCase(16, 4, 1, [4, 1, 1, 3, 1]),
    AttentionCase(24, 3, 2, [1, 1, 2, 1, 4]),
    AttentionCase(12, 1, 3, [5, 2, 1, 1]),
    AttentionCase(8, 2, 1, [1, 3, 1], dtype=torch.float64),
    AttentionCase(16, 2, 2, [3, 1, 3, 1], scale=5.0),
]

ATTENTION_MISTAKES = [
    ("mask_from_start", "the mask hides the cached keys from the new queries: the new tokens are the LAST T_new "
                        "of the T positions, so query i may see keys 0 .. T - T_new + i. causal_mask(T_new, T) "
                        "builds that mask; tril() of a (T_new, T) matrix does not, nor does is_causal=True in "
                        "F.scaled_dot_product_attention"),
    ("no_cache", "the new queries attended only to the new keys: attend to ALL the keys and values that "
                 "cache.append returns, the cached ones and the new"),
    ("no_mask", "no causal mask: in a chunk of several new tokens, each may only see the keys up to its own "
                "position, causal_mask(T_new, T)"),
]
ATTENTION_MISTAKE_NAMES = {mistake for mistake, _ in ATTENTION_MISTAKES}
OVERFLOW = ("exp overflows: scores of about 300 are in this case, and exp(300) is inf in float32 (inf / inf is "
            "nan). Subtract each row's largest score before exp, or use torch.softmax (or chapter 3's attention), "
            "which do")
USES_KV_CACHE = {"KVCache": "test_kv_cache"}  # the learner's functions of earlier cells that each cell uses
USES_ATTENTION = {"attention_with_cache": "test_attention_with_cache", **USES_KV_CACHE}
USES_FORWARD = {"forward_with_cache": "test_forward_with_cache", **USES_ATTENTION}


def _also(hint: str, because: str) -> str:
    """A hint, and the note of ``judge.because_of`` (which earlier cell's function this one uses fails)."""
    return "; ".join(text for text in (hint, because) if text)


@dataclasses.dataclass
class _AttentionCase:
    attn: torch.nn.Module  # this side's layer, built from the recipe the learner's side builds its own from
    xs: list[torch.Tensor]  # the inputs, chunk by chunk
    want: list[torch.Tensor]  # the oracle's outputs, chunk by chunk
    cached: list[tuple[torch.Tensor, torch.Tensor]]  # all keys and values after each chunk (what append returns)
    new: list[tuple[torch.Tensor, torch.Tensor]]  # the new keys and values of each chunk (what append is given)


def _attention_chunks(case: AttentionCase, seed: int) -> _AttentionCase:
    n_embd, n_head, B, chunks, scale, dtype = case
    with seeded(seed):  # the recipe draws from torch's generator: one such block at a time
        attn, x = recipes.attention_case(n_embd, n_head, B, sum(chunks), seed, scale, dtype)
    with torch.no_grad():  # the oracle: every position at once, torch's causal attention, in float64
        q, k, v = (_heads(attn, t) for t in attn.c_attn(x).split(n_embd, dim=2))
        wide = copy.deepcopy(attn).double()
        q64, k64, v64 = (_heads(wide, t) for t in wide.c_attn(x.double()).split(n_embd, dim=2))
        y = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
        full = wide.c_proj(y.transpose(1, 2).reshape(x.shape)).to(dtype)
    bounds = [sum(chunks[:j]) for j in range(len(chunks) + 1)]
    spans = list(zip(bounds, bounds[1:]))
    return _AttentionCase(attn, [x[:, a:b] for a, b in spans], [full[:, a:b] for a, b in spans],
                          [(k[:, :, :b].contiguous(), v[:, :, :b].contiguous()) for _, b in spans],
                          [(k[:, :, a:b], v[:, :, a:b]) for a, b in spans])


def _attention_run(attention_with_cache, attn, xs, cache, label):
    """The learner's outputs chunk by chunk: (outputs, index of the chunk that crashed or None, its error)."""
    outs = []
    for j, x in enumerate(xs):
        t_cached = sum(c.shape[1] for c in xs[:j])
        try:
            with learner_side(no_grad=True):
                out = attention_with_cache(attn, x, cache, 0)
        except NotImplementedError as err:
            raise not_written(label, err) from None
        except LearnerError as err:  # reported below, with the chunk that caused it
            return outs, j, describe_error(err)
        outs.append(out)
        if not isinstance(out, torch.Tensor):
            fail(f"{label} returned {_type_name(out)} for {x.shape[1]} new positions, expected a tensor of "
                 f"shape {tuple(x.shape)}")
        if out.shape != x.shape:
            hint = "return the outputs of the new positions only, (B, T_new, C)" \
                if out.dim() == 3 and out.shape[1] == t_cached + x.shape[1] else \
                "merge the heads and apply attn.c_proj: the output has the input's shape (B, T_new, C)"
            fail(f"{label} returned shape {_shape(out)} for new positions of shape {tuple(x.shape)} "
                 f"({t_cached} cached)", hint)
    return outs, None, ""


CHUNKS, FLOAT64_X, LARGE_SCORES = "outputs chunk by chunk", "float64 inputs", "scores of about 300"


def _attention_part(case: AttentionCase) -> str:
    return FLOAT64_X if case.dtype == torch.float64 else LARGE_SCORES if case.scale > 1 else CHUNKS


@cell("test_attention_with_cache", parts={CHUNKS: 3, FLOAT64_X: 1, LARGE_SCORES: 1})
def check_attention_with_cache(attention_with_cache, KVCache):
    for name in (CHUNKS, FLOAT64_X, LARGE_SCORES):
        with part(name):
            for number, case in enumerate(ATTENTION_CASES):
                if _attention_part(case) == name:
                    _check_attention_case(attention_with_cache, KVCache, case, seed=710 + number)


def _check_attention_case(attention_with_cache, KVCache, case: AttentionCase, seed: int) -> None:
    because = because_of(**USES_KV_CACHE)
    n_embd, n_head, B, chunks, scale, dtype = case
    c = _attention_chunks(case, seed)
    xs, want = c.xs, c.want
    attn = ask("kv_cache.attention_case", *case[:3], sum(chunks), seed, scale, dtype)[0]  # the same layer, theirs
    kind = str(dtype).removeprefix("torch.")
    label = (f"attention_with_cache(<CausalSelfAttention(n_embd={n_embd}, n_head={n_head})"
             f"{'' if dtype == torch.float32 else f' in {kind}'}>, x, cache, 0)")
    cache = call(KVCache, 1, label="KVCache(n_layer=1)")
    outs, crashed, error = _attention_run(attention_with_cache, attn, xs, cache, label)
    wrong = _first_wrong(outs, want)
    if crashed is None and wrong is None:
        length = call(lambda: cache.length, label="KVCache.length")
        if length != sum(chunks):
            fail(f"after {label} on chunks of {chunks} new positions, cache.length is {show(length)}, expected "
                 f"{sum(chunks)}", _also("append every new position's key and value to the cache", because))
        return
    j = wrong if crashed is None or (wrong is not None and wrong < crashed) else crashed
    t_cached, t_new = sum(chunks[:j]), chunks[j]
    inputs = f"{kind} x" if dtype != torch.float32 else "x" if scale == 1 else f"x of about {scale:g} times N(0, 1)"
    where = (f"{label}, {inputs}, batch of {B}, chunks of {chunks} new positions: on chunk {j + 1} ({t_new} new "
             f"position{'s' * (t_new > 1)}, {t_cached} cached)")
    # The same calls with a cache known to be right (it answers with the right keys and values): if they are
    # right, the mistake is the learner's KVCache's.
    scripted = make("kv_cache.ScriptedCache", c.cached)
    trusted, trusted_crash, _ = _attention_run(attention_with_cache, attn, xs, scripted, label)
    right = trusted_crash is None and _first_wrong(trusted, want) is None and _appended_right(scripted.given, c)
    blame = _kv_cache_blame(KVCache) if right else ""
    if crashed == j:
        hint = blame or _also("the scores are (T_new, T): the mask must be causal_mask(T_new, T), not "
                              "causal_mask(T_new)" if t_new > 1 and t_cached else "", because)
        fail(f"{where} raised {error}", hint)
    got = outs[j]
    if got.dtype != dtype:
        fail(f"{where} returned {str(got.dtype).removeprefix('torch.')} outputs for {kind} inputs",
             blame or _also(f"keep x's dtype: a tensor made without dtype= (a mask of float values, a constant) "
                            f"is float32 and turns the {kind} scores into float32", because))
    if not bool(torch.isfinite(got).all()):
        fail(f"{where}: the outputs hold nan or inf, where attention over the whole sequence gives finite "
             f"values up to {want[j].abs().max().item():.3g}", blame or _also(OVERFLOW if scale > 1 else "",
                                                                             because))
    hint = blame or _also(_matching_mistake(c.attn, xs[:j + 1], outs[:j + 1]), because)
    fail(f"{where}: the outputs differ from attention over the whole sequence {gap(got, want[j])}", hint)


def _appended_right(given, c: _AttentionCase) -> bool:
    """Whether the learner's attention gave the scripted cache's append, chunk by chunk, layer 0 and the right new
    keys and values (as a right cache would have stored them)."""
    if not isinstance(given, list) or len(given) != len(c.new):
        return False
    for record, (k, v) in zip(given, c.new):
        if not isinstance(record, tuple) or len(record) != 3 or record[0] != 0:
            return False
        if not all(isinstance(t, torch.Tensor) and _close(t, want) for t, want in zip(record[1:], (k, v))):
            return False
    return True


def _first_wrong(outs, want) -> int | None:
    return next((j for j, (o, w) in enumerate(zip(outs, want)) if not _close(o, w)), None)


def _matching_mistake(attn, xs, outs) -> str:
    for mistake, why in ATTENTION_MISTAKES:
        past = _Cache(1)
        with torch.no_grad():
            replay = [_attend(attn, x, past, 0, mistake) for x in xs]
        if all(_close(o, r) for o, r in zip(outs, replay)):
            return why
    return ""


# ---------------------------------------------------------------- forward_with_cache

class ForwardCase(NamedTuple):
    """The GPT of shape ``shape`` in ``dtype``, a batch of ids of ``ids_dtype``, fed in chunks of new tokens."""
    shape: str
    batch: int
    chunks: list[int]
    dtype: torch.dtype = torch.float32
    ids_dtype: torch.dtype = torch.int64


# The window filled exactly (12 of block_size 12), a prefill of one token, a chunk after decode steps; then one
# sequence through a float64 model, and int32 ids (see _forward_cases for the other integer dtypes).
FORWARD_CASES = [
    ForwardCase("a", 1, [5, 1, 1, 1, 3, 1]),
    ForwardCase("b", 2, [1, 1, 1, 4, 1, 1]),
    ForwardCase("a", 3, [3, 1, 2, 1]),
    ForwardCase("b", 1, [2, 1, 3, 1], dtype=torch.float64),
    ForwardCase("a", 2, [4, 1, 2], ids_dtype=torch.int32),
]
SMALL_ID_DTYPES = (torch.int16, torch.int8, torch.uint8)  # tried too, where the model itself accepts them


@functools.cache
def _forward_cases() -> list[ForwardCase]:
    """FORWARD_CASES, and one case for each of SMALL_ID_DTYPES that the course's model (chapters 2 and 4) accepts as
    ids: what the model accepts, forward_with_cache accepts."""
    model, extra = _models("b"), []
    for dtype in SMALL_ID_DTYPES:
        try:
            with torch.no_grad():
                model(torch.tensor([[1, 2]], dtype=dtype))
        except (ValueError, RuntimeError, TypeError, IndexError):
            continue
        extra.append(ForwardCase("b", 1, [3, 1, 2], ids_dtype=dtype))
    return FORWARD_CASES + extra

FORWARD_MISTAKES = [
    ("positions", "no position offset: the new tokens got positions 0, 1, ... again. After the prefill they sit "
                  "at positions cache.length, cache.length + 1, ...: model.emb(idx, offset=cache.length), read "
                  "before the first layer extends the cache"),
    ("offset+1", "the positions are one too far: the first new token sits at position cache.length (read before "
                 "the first layer appends to the cache)"),
    ("offset-1", "the positions are one short: the first new token sits at position cache.length"),
    ("one_layer", "every block used layer 0 of the cache: block i must store and read its keys and values in "
                  "layer i"),
    ("mask_from_start", ATTENTION_MISTAKES[0][1]),
    ("no_cache", ATTENTION_MISTAKES[1][1]),
    ("no_mask", ATTENTION_MISTAKES[2][1]),
]


LOGITS, FLOAT64_MODEL, ID_DTYPES = "logits chunk by chunk", "float64 weights", "int32, int16, int8 and uint8 ids"


def _forward_part(case: ForwardCase) -> str:
    return FLOAT64_MODEL if case.dtype == torch.float64 else ID_DTYPES if case.ids_dtype != torch.int64 else LOGITS


@cell("test_forward_with_cache", parts={LOGITS: 3, FLOAT64_MODEL: 1, ID_DTYPES: 1})
def check_forward_with_cache(forward_with_cache, KVCache):
    theirs = {}  # the learner's side's model of each shape and dtype
    for name in (LOGITS, FLOAT64_MODEL, ID_DTYPES):
        with part(name):
            for case in _forward_cases():
                if _forward_part(case) == name:
                    _check_forward_case(forward_with_cache, KVCache, case, theirs)


def _check_forward_case(forward_with_cache, KVCache, case: ForwardCase, theirs: dict) -> None:
    because = because_of(**USES_ATTENTION)
    shape, B, chunks, dtype, ids_dtype = case
    model = _models(shape, dtype)
    theirs[shape, dtype] = theirs.get((shape, dtype)) or _model(shape, dtype)
    cfg = model.config
    idx = _ids((B, sum(chunks)), cfg.vocab_size, seed=720 + B)
    with torch.no_grad():
        want_all = model(idx)  # the same model without a cache, on the whole sequence
    idx = idx.to(ids_dtype)
    bounds = [sum(chunks[:j]) for j in range(len(chunks) + 1)]
    pieces = [idx[:, a:b] for a, b in zip(bounds, bounds[1:])]
    kinds = ", ".join(f"{str(t).removeprefix('torch.')} {what}" for t, what, usual in
                      ((dtype, "weights", torch.float32), (ids_dtype, "ids", torch.int64)) if t != usual)
    label = (f"forward_with_cache(<GPT n_layer={cfg.n_layer}, n_head={cfg.n_head}, block_size={cfg.block_size}>, "
             f"idx, cache) on a batch of {B}{f' ({kinds})' if kinds else ''}, fed chunks of {chunks} tokens")
    cache = call(KVCache, cfg.n_layer, label="KVCache(n_layer)")
    outs = []
    for j, piece in enumerate(pieces):
        where = f"{label}: chunk {j + 1} ({piece.shape[1]} new, {bounds[j]} cached)"
        try:
            got = forward_with_cache(theirs[shape, dtype], piece, cache)
        except NotImplementedError as err:
            raise not_written(where, err) from None
        except LearnerError as err:  # the learner's bug, reported with the call that caused it
            fail(f"{where} raised {describe_error(err)}",
                 _forward_crash_hint(str(err), KVCache, j, piece.shape[1], because))
        want = want_all[:, bounds[j]:bounds[j + 1]]
        if not isinstance(got, torch.Tensor):
            fail(f"{where} returned {_type_name(got)}, expected logits of shape {tuple(want.shape)}")
        if got.requires_grad:
            fail(f"{where} returned logits that are part of a gradient graph",
                 "run the model under torch.no_grad(): otherwise every cached key and value keeps the graph of "
                 "all the steps before it alive")
        if got.shape != want.shape:
            hint = "return the logits of every new position, (B, T_new, vocab_size)" \
                if got.shape[-1] == cfg.vocab_size else "the logits come from model.lm_head(model.ln_f(x))"
            fail(f"{where} returned shape {_shape(got)}, expected {tuple(want.shape)}", _also(hint, because))
        outs.append(got)
        if got.dtype != want.dtype:
            fail(f"{where} returned {str(got.dtype).removeprefix('torch.')} logits, expected "
                 f"{str(want.dtype).removeprefix('torch.')} (the model's dtype)",
                 _kv_cache_blame(KVCache) or _also("keep the model's dtype: no .float() and no tensor made "
                                                   "without dtype= in the way of the activations", because))
        if not _close(got, want):
            hint = _kv_cache_blame(KVCache) or _forward_mistake(model, pieces[:j + 1], outs, because)
            if not hint:
                hint = _also(("the prefill (an empty cache) must give the uncached model's logits: each block is "
                              "x + attention_with_cache(block.attn, block.ln_1(x), cache, i), then "
                              "x + block.mlp(block.ln_2(x)); then ln_f and lm_head") if j == 0 else
                             "check the positions (offset=cache.length) and that block i uses layer i of the cache",
                             because)
            fail(f"{where}: the logits differ from the uncached model's on the whole sequence {gap(got, want)}",
                 hint)
        length = call(lambda: cache.length, label="KVCache.length")
        if length != bounds[j + 1]:
            fail(f"{where}: afterwards cache.length is {show(length)}, expected {bounds[j + 1]}",
                 _also("every block appends the new positions' keys and values to its own layer of the cache",
                       because))


def _forward_crash_hint(error: str, KVCache, j: int, t_new: int, because: str) -> str:
    blame = _kv_cache_blame(KVCache)
    if blame:
        return blame
    if "block_size" in error or "index out of range" in error:
        return _also("the new tokens' positions start at cache.length (read before the first block extends the "
                     "cache)", because)
    if j and t_new > 1:
        return _named("several new tokens after cached ones: their mask must be causal_mask(T_new, T), the new "
                      "queries being the last T_new of T positions", FIX_ATTENTION, because)
    return because


def _forward_mistake(model, parts, outs, because: str) -> str:
    for mistake, why in FORWARD_MISTAKES:
        replay = _replay(model, parts, mistake)
        if replay is not None and all(_close(o, r) for o, r in zip(outs, replay)):
            return _named(why, FIX_ATTENTION, because) if mistake in ATTENTION_MISTAKE_NAMES else _also(why, because)
    return ""


def _named(why: str, fix: str, because: str) -> str:
    """The hint of a mistake of an earlier cell's function: with ``judge.because_of``'s note when that cell failed,
    else with ``fix`` ("fix attention_with_cache first ...")."""
    return _also(why, because) if because else f"{why} ({fix})"


# ---------------------------------------------------------------- CachedModel

class Theirs(NamedTuple):
    """A GPT on the learner's side whose block 0 computes its queries, keys and values here (``judge.serve``):
    every position the learner's code runs through the model is one this process computed and counted."""
    model: Remote
    qkv: Served | None  # None: a plain GPT, nothing counted (where the checks count nothing)


def _served_model(name: str) -> Theirs:
    """The GPT of shape ``name`` on the learner's side, its block 0's ``attn.c_attn`` served by the judge."""
    qkv = serve(_models(name).h[0].attn.c_attn)
    return Theirs(make("kv_cache.served_gpt", qkv.id, "h.0.attn.c_attn", **_recipe(name)), qkv)


def _wrap(CachedModel, theirs: Theirs, config, label, **kwargs):
    """The learner's CachedModel of ``theirs`` (the model on the learner's side, whose config is ``config``)."""
    cm = call(CachedModel, theirs.model, **kwargs,
              label=f"CachedModel(<GPT>{''.join(f', {k}={v}' for k, v in kwargs.items())})")
    if getattr(getattr(cm, "config", None), "block_size", None) != config.block_size:
        fail(f"{label}: CachedModel(model).config is not the model's config",
             "the loops of chapters 5 and 6 read model.config.block_size: keep self.config = model.config")
    return cm


STOP_ITERATION = ("next(...) raises StopIteration when the iterator has nothing left (no cache matches, the first "
                  "time): give it a default, next(iterator, None), or look the cache up with self.caches.get(key)")


def _counted(cm, theirs: Theirs, ids: list[int], label: str, because: str, hint: str = ""):
    """(what the learner's CachedModel returned for ids, the positions the model ran meanwhile: those whose keys
    and values block 0 computed, counted here, where block 0's c_attn runs)."""
    theirs.qkv.take()  # positions of earlier calls are theirs
    try:
        out = cm(torch.tensor([ids]))
        return out, sum(math.prod(shape[:-1]) for shape in theirs.qkv.take())
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except LearnerError as err:  # the learner's bug, with its line
        fail(f"{label} raised {describe_error(err)}",
             _also(STOP_ITERATION if err.type_name == "StopIteration" else hint, because))


def _logits(got, label: str, ids: list[int], positions: int, vocab: int, because: str) -> torch.Tensor:
    """The logits (1, T_new, V) that the learner's CachedModel returned for ``ids``, after running the model over
    ``positions`` positions, checked for their shape: T_new is the number of positions it ran, all of ids after a
    prefill, 1 after a decode step (never 0: no logits come without running the model)."""
    if not isinstance(got, torch.Tensor) or got.dim() != 3 or got.shape[0] != 1 or got.shape[-1] != vocab:
        fail(f"{label} returned {_shape(got) if isinstance(got, torch.Tensor) else show(got)}, expected logits "
             f"of shape (1, T_new, {vocab})",
             _also("return what forward_with_cache returns for the positions it ran", because))
    t_new = got.shape[1]
    if not positions:
        fail(f"{label} returned logits of shape {_shape(got)} without running the model: no position went through "
             "its blocks", _also("run the new positions through forward_with_cache(self.model, ...) and return its "
                                 "logits", because))
    if t_new != positions or not 1 <= t_new <= len(ids):
        fail(f"{label} returned logits of shape {_shape(got)} after running the model over {positions} positions, "
             f"expected (1, {positions}, {vocab})",
             "return the logits of every position the call ran through forward_with_cache, (1, T_new, V): all of "
             "ids after a prefill, the last one after a decode step. The loops read only the last row, but "
             "CachedModel stands for the model, whose logits cover the positions it computed")
    return got[0].detach()


def _probe(cm, model, theirs, ids: list[int], label: str, candidates=(), decode: bool = False,
           because: str = "") -> int:
    """Ask the learner's CachedModel for the logits after ``ids`` and compare them with the model's; return the
    number of positions it ran through the model (counted here: ``Theirs``).
    ``candidates``: (ids, why) pairs, the mistake being "gave the logits after those ids". The mistakes of
    forward_with_cache are named too, on a prefill of ids or, if ``decode``, a prefill of ids[:-1] and a decode
    step."""
    out, positions = _counted(cm, theirs, ids, label, because)
    rows = _logits(out, label, ids, positions, model.config.vocab_size, because)
    got = rows[-1]
    want = _plain_last(model, ids)
    if _close(got, want):
        with torch.no_grad():
            want_rows = model(torch.tensor([ids]))[0, -rows.shape[0]:]
        if not _close(rows, want_rows):
            fail(f"{label}: the last row of the logits is right, but the {rows.shape[0]} rows differ from the "
                 f"uncached model's logits of the last {rows.shape[0]} positions {gap(rows, want_rows)}",
                 _also("return forward_with_cache's logits as they are, every row", because))
        return positions
    hint = next((_also(why, because) for seq, why in candidates if len(seq) <= model.config.block_size
                 and _close(got, _plain_last(model, seq))), "")
    parts = [torch.tensor([ids[:-1]]), torch.tensor([ids[-1:]])] if decode else [torch.tensor([ids])]
    hint = hint or next((_named(why, FIX_ATTENTION if mistake in ATTENTION_MISTAKE_NAMES else FIX_FORWARD, because)
                         for mistake, why in FORWARD_MISTAKES
                         if (replay := _replay(model, parts, mistake)) is not None
                         and _close(got, replay[-1][0, -1])), "")
    fail(f"{label}: the last row of the logits differs from the uncached model's {gap(got, want)}",
         hint or because or BUILT_ON)


def _one_position(positions: int, what: str, hint: str) -> None:
    """A call for which a cache of ids[:-1] is kept must run only the last token."""
    if positions != 1:
        fail(f"{what} ran the model over {positions} positions for the one new token", hint)


RUN_ONE = ("find the cache of ids[:-1] and run only the last token through forward_with_cache: that is the point of "
           "the cache")


def _check_probes(CachedModel, model, theirs, prompts, because) -> None:
    """Direct calls, the way the loops make them, each compared with the uncached model."""
    p, q = prompts
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    name = "CachedModel(<GPT>)"
    seq = lambda ids: show(ids)  # noqa: E731
    positions = _probe(cm, model, theirs, p, f"{name} called first with ids {seq(p)} (a prefill)", because=because)
    if positions != len(p):
        fail(f"{name} called first with ids {seq(p)} (a prefill) ran the model over {positions} positions, "
             f"expected {len(p)}", "a prefill runs every id of a new prompt once, through forward_with_cache")
    a, b, c = 5, 7, 11  # three different next tokens: two siblings (a, b) and a grandchild (c)
    positions = _probe(cm, model, theirs, p + [a], f"{name}, then with {seq(p + [a])}", decode=True, because=because)
    _one_position(positions, f"{name}, called with {seq(p)} and then {seq(p + [a])},", RUN_ONE)
    # A new prompt: a cache of the previous call must not be continued.
    _probe(cm, model, theirs, q, f"{name}, after {seq(p + [a])}, called with a new prompt {seq(q)}",
           [(p + [a] + q[-1:], "a stale cache was reused for a different prompt: the new prompt's last token was "
                               "added to the cache of the previous call, which holds other tokens. A cache is "
                               "reused only for ids whose ids[:-1] it holds exactly; otherwise prefill a fresh "
                               "KVCache"),
            (p + q[-1:], "a stale cache was reused for a different prompt: the cache of an earlier call, which holds "
                         "other tokens, was continued. A cache is reused only for ids whose ids[:-1] it holds "
                         "exactly; otherwise prefill a fresh KVCache")], because=because)
    # Beams: two continuations of one sequence, then the first one again; each finds the cache of its ids[:-1].
    label = f"{name}, after {seq(p + [a])}, called with {seq(p + [b])} (as beam search does: two beams that share " \
            "a history)"
    positions = _probe(cm, model, theirs, p + [b], label, [
        (p + [a, b], "beams: the second beam read the cache that the first beam had extended (one cache shared "
                     "by the beams, in the order of the calls, or the parent's cache extended in place). Each "
                     "beam needs the cache of its own history, ids[:-1]: extend a branch (new lists), never the "
                     "parent that another beam may continue")], because=because)
    _one_position(positions, label, f"beams: the cache of {seq(p)}, the parent of both beams, was no longer kept "
                                    "when the second beam asked for it. Keep the parent after a beam extends it "
                                    "(another beam may continue from it): extend a branch, new lists, and leave the "
                                    "parent as it was, under its own ids")
    label = f"{name}, after {seq(p + [b])}, called with {seq(p + [a, c])} (the first beam continues)"
    positions = _probe(cm, model, theirs, p + [a, c], label, [
        (p + [b, c], "beams: the cache of the first beam was changed by the second one; the cache must follow "
                     "each beam's own history: extend a branch (new lists), never a cache that another "
                     "sequence still uses"),
        (p + [a, b, c], "beams: the cache holds the tokens of every beam in the order they were computed; each "
                        "beam needs the cache of its own history, ids[:-1]")], because=because)
    _one_position(positions, label, f"beams: the cache of {seq(p + [a])} was no longer kept when its beam "
                                    "continued: keep a cache for each sequence asked for (up to max_entries of "
                                    "them), not only the last one")
    # A prompt of one id (its ids[:-1] is empty), then a decode step after it.
    one = [c]
    _probe(cm, model, theirs, one, f"{name}, after {seq(p + [a, c])}, called with a prompt of one id, {seq(one)}",
           because=because)
    positions = _probe(cm, model, theirs, one + [a], f"{name}, then with {seq(one + [a])}", decode=True,
                       because=because)
    _one_position(positions, f"{name}, called with {seq(one)} and then {seq(one + [a])},", RUN_ONE)


def _check_eviction(CachedModel, model, theirs, prompts, because) -> None:
    """Three prompts with max_entries=3, then two beams of the first prompt: the first prompt's cache, used by the
    first beam, is then the most recently used but one, and must still be kept for the second beam."""
    p, q, r = prompts
    a, b = 5, 7
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel", max_entries=3)
    name = "CachedModel(<GPT>, max_entries=3)"
    for ids in (p, q, r, p + [a]):
        _probe(cm, model, theirs, ids, f"{name} called with {show(ids)} after {show(p)}, {show(q)} and {show(r)}"
               if ids == p + [a] else f"{name} called with {show(ids)}", because=because)
    label = (f"{name}, called with the prompts {show(p)}, {show(q)}, {show(r)}, then two beams of the first, "
             f"{show(p + [a])} and {show(p + [b])}: for the second beam it")
    positions = _probe(cm, model, theirs, p + [b], label, because=because)
    _one_position(positions, label, f"the cache of {show(p)} was dropped, though the first beam had just used it: "
                                    f"drop the LEAST recently used caches ({show(q)}'s, then {show(r)}'s). A cache "
                                    "found for ids[:-1] becomes the most recently used one (OrderedDict: "
                                    "move_to_end, or pop it and put it back); evict in insertion order only the "
                                    "caches never used since")


def _check_two_models(CachedModel, model, other, theirs, theirs_other, prompt, because) -> None:
    """Two CachedModels of two models: the second one's call must not find the first one's cache."""
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    cm_other = _wrap(CachedModel, theirs_other, other.config, "CachedModel")
    _probe(cm, model, theirs, prompt, f"CachedModel(<GPT 1>) called with {show(prompt)}", because=because)
    ids = prompt + [5]
    label = (f"CachedModel(<GPT 2>), a second CachedModel of another GPT of the same shape, called with {show(ids)} "
             f"after CachedModel(<GPT 1>) was called with {show(prompt)}")
    past = _Cache(model.config.n_layer)
    with torch.no_grad():
        _forward(model, torch.tensor([prompt]), past)
        mixed = _forward(other, torch.tensor([ids[-1:]]), past)[0, -1]
    out, positions = _counted(cm_other, theirs_other, ids, label, because)
    got = _logits(out, label, ids, positions, other.config.vocab_size, because)[-1]
    if _close(got, mixed):
        fail(f"{label}: its logits are GPT 2's last token on GPT 1's cached keys and values",
             "the caches of one CachedModel are its own (self.caches, made in __init__): a dict at module level or "
             "in the class is shared by every CachedModel, whatever model it wraps")
    _probe(cm_other, other, theirs_other, ids, label, because=because)


def _check_window(CachedModel, model, theirs, prompt, because) -> None:
    """Calls on the last block_size tokens of a growing sequence, as last_logits makes them: the window fills up
    (one new position a call, also when it is exactly full), then slides (a prefill a call)."""
    block = model.config.block_size
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    ids = list(prompt)
    for step in range(2 * block):
        window = ids[-block:]
        label = (f"CachedModel(<GPT with block_size={block}>) at step {step + 1} of a generation, called with the "
                 f"last {len(window)} of {len(ids)} ids")
        slid = len(ids) > block
        hint = ("window overflow: once the sequence is longer than block_size, the window of the last block_size "
                "tokens moves by one token every step, and every token sits at a new position (GPT-2's positions "
                "are absolute): every cached key and value is stale. Prefill the new window from scratch (its "
                "ids[:-1] is not a cached sequence)") if slid else ""
        out, positions = _counted(cm, theirs, window, label, because, hint)
        rows = _logits(out, label, window, positions, model.config.vocab_size, because)
        want = _plain_last(model, window)
        if not _close(rows[-1], want):
            fail(f"{label}: the last row of the logits differs from the uncached model's {gap(rows[-1], want)}",
                 _also(hint, because))
        if step and not slid:  # the call before was window[:-1]: its cache is there
            full = len(window) == block
            _one_position(positions, f"{label}{' (a window exactly full)' if full else ''}",
                          "the window is exactly full, not yet overfull: the cache of its first block_size - 1 ids "
                          "is kept and still right; the window slides (and a prefill is needed) only once the "
                          "sequence is LONGER than block_size" if full else RUN_ONE)
        ids.append(int(torch.argmax(want)))


def _check_memory(CachedModel, model, theirs) -> None:
    cfg = model.config
    per_cache = 2 * cfg.n_layer * cfg.n_embd * cfg.block_size * 4  # float32, a full window
    max_entries = 3
    cm = _wrap(CachedModel, theirs, cfg, "CachedModel", max_entries=max_entries)
    for seed in range(24):  # chapter 5's token_stream, run on the learner's side
        call(ask, "kv_cache.stream", cm, _ids((4,), cfg.vocab_size, seed=740 + seed).tolist(), 5,
             label=f"token_stream(CachedModel(<GPT>, max_entries={max_entries}), <4 ids>, 5)")
    held = call(ask, "kv_cache.held_bytes", cm, label=f"the tensors that CachedModel(<GPT>, max_entries={max_entries}) "
                                                      "holds after 24 prompts")
    if not (isinstance(held, int) and held <= 2 * max_entries * per_cache):
        fail(f"CachedModel(<GPT>, max_entries={max_entries}) holds {held:,} bytes of tensors after 24 prompts of "
             f"9 tokens; {max_entries} caches of a full window hold at most {max_entries * per_cache:,}",
             "memory grows without bound: keep at most max_entries caches, dropping the least recently used")


def _check_loops(CachedModel, model, theirs, prompt, other, because) -> None:
    """The loops of chapters 5 and 6 (run on the learner's side, with the learner's CachedModel of ``theirs``), each
    compared with the same loop here with the plain model."""
    block = model.config.block_size
    n = 3 * block
    label = f"<GPT with block_size={block}>, a prompt of {len(prompt)} ids, {n} new tokens"
    want = _plain_stream(model, prompt, n)
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    got = call(ask, "kv_cache.stream", cm, prompt, n, label=f"token_stream(CachedModel({label}))")
    if got != want:
        fail(f"greedy token_stream with CachedModel({label}) gave {show(got)}; without the cache {show(want)}",
             _also(_first_difference(got, want, len(prompt), block), because))
    want = _plain_stream(model, other, n)
    got = call(ask, "kv_cache.stream", cm, other, n, label="token_stream(<the same CachedModel>, another prompt)")
    if got != want:
        fail(f"greedy token_stream with the same CachedModel on a second prompt gave {show(got)}; without the cache "
             f"{show(want)}", _also("a stale cache of the first prompt was reused: a cache is reused only for ids "
                                    "whose ids[:-1] it holds exactly", because))
    for seed in (3, 4):
        sampler = dict(do_sample=True, seed=seed, top_k=20)  # its own generator, seeded: the same draws on both sides
        want = _plain_stream(model, prompt, n, sampler)
        got = call(lambda: ask("kv_cache.stream", CachedModel(theirs.model), prompt, n, sampler),
                   label="token_stream(CachedModel(...), choose=Sampler(do_sample=True, ...))")
        if got != want:
            fail(f"seeded sampling (Sampler(do_sample=True, seed={seed}, top_k=20)) with CachedModel({label}) gave "
                 f"{show(got)}; without the cache {show(want)}",
                 _also(_first_difference(got, want, len(prompt), block), because))
    for num_beams, steps, entries in ((3, block - len(prompt), 16), (2, block, 16), (3, 6, 2)):
        want = _plain_beams(model, prompt, steps, num_beams)
        label = f"beam_search(CachedModel(<GPT>, max_entries={entries}), <{len(prompt)} ids>, {steps}, " \
                f"num_beams={num_beams})"
        got = call(lambda: ask("kv_cache.beams", CachedModel(theirs.model, max_entries=entries), prompt, steps,
                               num_beams),
                   label=label)
        if got != want:
            fail(f"{label} gave {show(got)}; without the cache {show(want)}",
                 _also("beams: each beam must continue the cache of its own history (the cache follows the beams "
                       "as they are reordered); when the cache of ids[:-1] is gone, prefill", because))


def _plain_stream(model, prompt: list[int], n: int, sampler: dict | None = None) -> list[int]:
    """Chapter 5's token_stream of the plain ``model`` (``sampler``: the settings of the seeded Sampler that chooses),
    computed once for each case in this process: every notebook's check asks the same."""
    return list(_plain_stream_once(model, tuple(prompt), n, tuple(sorted((sampler or {}).items()))))


@once
def _plain_stream_once(model, prompt: tuple[int, ...], n: int, sampler: tuple) -> tuple[int, ...]:
    choose = {"choose": Sampler(**dict(sampler))} if sampler else {}
    return tuple(token_stream(model, list(prompt), n, **choose))


@once
def _plain_beams_once(model, prompt: tuple[int, ...], steps: int, num_beams: int) -> tuple[int, ...]:
    return tuple(beam_search(model, list(prompt), steps, num_beams=num_beams))


def _plain_beams(model, prompt: list[int], steps: int, num_beams: int) -> list[int]:
    """Chapter 6's beam_search of the plain ``model``, computed once for each case in this process."""
    return list(_plain_beams_once(model, tuple(prompt), steps, num_beams))


def _first_difference(got, want, prompt_len, block) -> str:
    k = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    if prompt_len + k >= block:
        return (f"the tokens differ from step {k + 1} on, when the window of block_size={block} is full: the window "
                "slides by one token every step and every token sits at a new position; prefill it again")
    return f"the tokens differ from step {k + 1} on"


PROBES, TWO_MODELS, EVICTION, WINDOW, LOOPS, MEMORY = (
    "prefill, decode steps and beams", "two models' caches apart", "the least recently used goes first",
    "a window that fills up and slides", "the loops of chapters 5 and 6", "memory stays bounded")


@cell("test_cached_model", parts={PROBES: 3, TWO_MODELS: 1, EVICTION: 1, WINDOW: 1, LOOPS: 2, MEMORY: 1})
def check_cached_model(CachedModel):
    because = because_of(**USES_FORWARD)
    runs = []  # (the reference model, the same on the learner's side, p, q, the shape) of each shape
    for shape, prompt_len in (("a", 5), ("b", 3)):
        model = _models(shape)
        vocab = model.config.vocab_size
        runs.append((model, _served_model(shape), _ids((prompt_len,), vocab, seed=730).tolist(),
                     _ids((prompt_len + 2,), vocab, seed=731).tolist(), shape))
    (model, theirs, p, q, _), _ = runs
    with part(PROBES):
        for model_, theirs_, p_, q_, _ in runs:
            _check_probes(CachedModel, model_, theirs_, (p_, q_), because)
    with part(TWO_MODELS):
        _check_two_models(CachedModel, model, _models("c"), theirs, _served_model("c"), q, because)
    with part(EVICTION):
        r = _ids((len(p) + 1,), model.config.vocab_size, seed=732).tolist()
        _check_eviction(CachedModel, model, theirs, (p, q, r), because)
    with part(WINDOW):
        for model_, theirs_, p_, _, _ in runs:
            _check_window(CachedModel, model_, theirs_, p_, because)
    # The loops and the memory count nothing: the plain GPT, whose forward passes (hundreds) run on that side alone.
    with part(LOOPS):
        for model_, _, p_, q_, shape in runs:
            _check_loops(CachedModel, model_, Theirs(_model(shape), None), p_, q_, because)
    with part(MEMORY):
        _check_memory(CachedModel, model, Theirs(_model("a"), None))


# ---------------------------------------------------------------- kv_cache_bytes

DEFAULT_BYTES = 4  # kv_cache_bytes's bytes_per_number when none is given (None in a case: left out)
BYTES_CASES = [  # (config, tokens, bytes_per_number, the precision of the model whose cache is measured)
    (GPTConfig(vocab_size=50, block_size=16, n_layer=3, n_head=2, n_embd=24), 11, None, torch.float32),
    (GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32), 32, 2, torch.bfloat16),
    (GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=1, n_embd=8), 1, 4, torch.float32),
]
BIG_CASES = [  # shapes too large to run: GPT-2 medium, large and XL, and a model with 64 heads of 16
    (GPTConfig(n_layer=24, n_head=16, n_embd=1024), 1024, 4),
    (GPTConfig(n_layer=36, n_head=20, n_embd=1280), 512, 2),
    (GPTConfig(n_layer=48, n_head=25, n_embd=1600), 2048, 1),
    (GPTConfig(n_layer=2, n_head=64, n_embd=1024), 77, 4),
]


def _measured_bytes(config, tokens: int, dtype) -> int:
    """Bytes of the keys and values a cache holds after a forward over ``tokens`` positions in ``dtype``."""
    with seeded(0), torch.no_grad():  # GPT's initializer draws from torch's generator (the weights do not matter)
        model = GPT(config).to(dtype).eval()
        past = _Cache(config.n_layer)
        _forward(model, torch.zeros(1, tokens, dtype=torch.long), past)
    return past.nbytes()


def _bytes_mistakes(c, tokens, b):
    head = c.n_embd // c.n_head
    return [
        (c.n_layer * c.n_head * head * tokens * b, "count the keys AND the values: the factor 2 is missing"),
        (2 * c.n_head * head * tokens * b, "every layer has a cache of its own: multiply by n_layer"),
        (2 * c.n_layer * c.n_head * c.n_embd * tokens * b,
         "a head has head_size = n_embd // n_head numbers, not n_embd: n_head x head_size = n_embd"),
        (2 * c.n_layer * head * tokens * b, "every head has keys and values of its own: multiply by n_head"),
        (2 * c.n_layer * c.n_embd * tokens * 4, "use bytes_per_number: 4 is float32 only (bfloat16 is 2, int8 is 1)"),
        (2 * c.n_layer * c.n_embd * tokens * b * 8, "that is bits: the answer is in bytes"),
        (2 * c.n_layer * c.n_embd * c.block_size * b, "the cache holds `tokens` positions, not block_size"),
        (2 * c.n_layer * c.n_embd * (tokens + 1) * b, "the cache holds exactly `tokens` positions, not tokens + 1"),
    ]


@cell("test_kv_cache_bytes")
def check_kv_cache_bytes(kv_cache_bytes):
    cases = [(c, t, b, _measured_bytes(c, t, dtype), " (what a cache of those positions holds)")
             for c, t, b, dtype in BYTES_CASES]
    cases += [(c, t, b, 2 * c.n_layer * c.n_embd * t * b, "") for c, t, b in BIG_CASES]
    for config, tokens, given, want, source in cases:
        label = (f"kv_cache_bytes(GPTConfig(n_layer={config.n_layer}, n_head={config.n_head}, n_embd={config.n_embd}, "
                 f"block_size={config.block_size}), {tokens}" + ("" if given is None else f", bytes_per_number={given}")
                 + ")")
        theirs = make("kv_cache.gpt_config", **dataclasses.asdict(config))  # the same GPTConfig, theirs
        got = call(kv_cache_bytes, theirs, tokens, label=label,
                   **({} if given is None else {"bytes_per_number": given}))
        b = DEFAULT_BYTES if given is None else given
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != want:
            hint = next((why for value, why in _bytes_mistakes(config, tokens, b) if got == value), "")
            fail(f"{label} returned {show(got)}, expected {want:,}{source}", hint)
        if isinstance(got, float):
            fail(f"{label} returned the float {got!r}; a number of bytes is an int",
                 "use // for the head size, not /")
