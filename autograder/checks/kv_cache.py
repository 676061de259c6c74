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
(``autograder.helpers.kv_cache``: a shape and a seed), as do the measurements that need the learner's objects
(the positions a model computed, the tensors a ``CachedModel`` holds, the generation loops of chapters 5 and 6
run with it). The expected answers are computed here, from the same recipes; what the learner's code returns
(logits, keys and values) comes back as plain tensors.

Inputs are ones the notebook's visible tests do not use: batches of 1 to 3 sequences, a prefill of one token,
a prefill of several tokens after decode steps, a window that fills up and slides.

When an answer is wrong, a check runs the known mistakes on the same weights (a KV-cached GPT-2 built here from
the model's own layers and torch's attention, with the mistake made on purpose) and names the one whose
numbers the learner's code gave. A mistake in ``KVCache`` is named in the later cells too ("fix KVCache
first"), since they store their keys and values in it: the learner's attention is tried with a cache that
answers with the right keys and values (``ScriptedCache``, scripted here), and the learner's KVCache is tried
on its own.

The checks test what the code computes, never how: a cache that preallocates its tensors and writes into them
with an index, ``F.scaled_dot_product_attention`` with a mask, a ``CachedModel`` that copies tensors or evicts
in another order, or keeps a single entry, all get full marks. Nothing here imports the chapter's reference,
``minigpt.kv_cache``: a module imported by a check would stay importable for the learner's later cells.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from autograder.checks import Shape
from autograder.helpers import kv_cache as recipes
from autograder.judge import LearnerError, Remote, ask, cell, learner_side, make, seeded, type_of
from coursekit.testing import call, describe_error, fail, not_written, show
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
    return got.shape == want.shape and \
        (got.detach().float() - want).abs().max().item() <= ATOL + RTOL * want.abs().max().item()


def _diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().float() - want).abs().max().item()


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
def _models(name: str) -> GPT:
    """The reference GPT (chapter 4, tested against Hugging Face's GPT-2) of the shape ``name``, random weights:
    the model the learner's side builds from the same recipe."""
    with seeded(SHAPES[name].seed):  # the recipe draws from torch's generator: one such block at a time
        return recipes.seeded_gpt(**_recipe(name))


def _model(name: str) -> Remote:
    """The GPT of shape ``name`` on the learner's side."""
    return make("kv_cache.seeded_gpt", **_recipe(name))


def _ids(shape: tuple[int, ...], vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _plain_last(model, ids: list[int]) -> torch.Tensor:
    """The uncached model's next-token logits after ``ids`` (a window that fits)."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


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
    x = model.emb.wte(idx) + model.emb.wpe(torch.arange(start, start + idx.shape[1]))
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

def _kv_cache_problem(KVCache) -> tuple[str, str] | None:
    """(what went wrong, why) for a wrong KVCache on a fixed sequence of appends; None if it is right."""
    g = torch.Generator().manual_seed(700)
    B, H, D = 2, 3, 5

    def kv(t):
        return torch.randn(B, H, t, D, generator=g), torch.randn(B, H, t, D, generator=g)

    cache = call(KVCache, 3, label="KVCache(n_layer=3)")
    length = call(lambda: cache.length, label="KVCache(3).length")
    if length != 0:
        return f"an empty KVCache(3) has length {show(length)}, expected 0", "nothing is stored yet"
    stored = {0: [], 1: []}
    # Equal lengths first (a concatenation along the wrong dim then gives a wrong shape, not a crash), then a
    # one-token decode step and a chunk of three after it; layer 1 in between, to see that layers are apart.
    for layer, t in [(0, 2), (1, 2), (0, 2), (0, 1), (1, 1), (0, 3)]:
        k_new, v_new = kv(t)
        label = (f"KVCache.append(layer={layer}, k, v) with k, v of shape {(B, H, t, D)}, after appending "
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


@cell("test_kv_cache")
def check_kv_cache(KVCache):
    problem = _kv_cache_problem(KVCache)
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

# (n_embd, n_head, batch size, chunks): a prefill of several tokens or of one, decode steps, and a chunk of
# several new tokens after decode steps, whose mask must be causal_mask(T_new, T).
ATTENTION_CASES = [
    (16, 4, 1, [4, 1, 1, 3, 1]),
    (24, 3, 2, [1, 1, 2, 1, 4]),
    (12, 1, 3, [5, 2, 1, 1]),
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


@dataclasses.dataclass
class _AttentionCase:
    attn: torch.nn.Module  # this side's layer, built from the recipe the learner's side builds its own from
    xs: list[torch.Tensor]  # the inputs, chunk by chunk
    want: list[torch.Tensor]  # the oracle's outputs, chunk by chunk
    cached: list[tuple[torch.Tensor, torch.Tensor]]  # all keys and values after each chunk (what append returns)
    new: list[tuple[torch.Tensor, torch.Tensor]]  # the new keys and values of each chunk (what append is given)


def _attention_chunks(n_embd, n_head, B, chunks, seed) -> _AttentionCase:
    with seeded(seed):  # the recipe draws from torch's generator: one such block at a time
        attn, x = recipes.attention_case(n_embd, n_head, B, sum(chunks), seed)
    with torch.no_grad():  # the oracle: every position at once, torch's causal attention
        q, k, v = (_heads(attn, t) for t in attn.c_attn(x).split(n_embd, dim=2))
        full = attn.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape))
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


@cell("test_attention_with_cache")
def check_attention_with_cache(attention_with_cache, KVCache):
    for case, (n_embd, n_head, B, chunks) in enumerate(ATTENTION_CASES):
        seed = 710 + case
        c = _attention_chunks(n_embd, n_head, B, chunks, seed)
        xs, want = c.xs, c.want
        attn = ask("kv_cache.attention_case", n_embd, n_head, B, sum(chunks), seed)[0]  # the same layer, theirs
        label = f"attention_with_cache(<CausalSelfAttention(n_embd={n_embd}, n_head={n_head})>, x, cache, 0)"
        cache = call(KVCache, 1, label="KVCache(n_layer=1)")
        outs, crashed, error = _attention_run(attention_with_cache, attn, xs, cache, label)
        wrong = _first_wrong(outs, want)
        if crashed is None and wrong is None:
            length = call(lambda: cache.length, label="KVCache.length")
            if length != sum(chunks):
                fail(f"after {label} on chunks of {chunks} new positions, cache.length is {show(length)}, expected "
                     f"{sum(chunks)}", "append every new position's key and value to the cache")
            continue
        j = wrong if crashed is None or (wrong is not None and wrong < crashed) else crashed
        t_cached, t_new = sum(chunks[:j]), chunks[j]
        where = (f"{label}, batch of {B}, chunks of {chunks} new positions: on chunk {j + 1} ({t_new} new "
                 f"position{'s' * (t_new > 1)}, {t_cached} cached)")
        # The same calls with a cache known to be right (it answers with the right keys and values): if they are
        # right, the mistake is the learner's KVCache's.
        scripted = make("kv_cache.ScriptedCache", c.cached)
        trusted, trusted_crash, _ = _attention_run(attention_with_cache, attn, xs, scripted, label)
        right = trusted_crash is None and _first_wrong(trusted, want) is None and _appended_right(scripted.given, c)
        blame = _kv_cache_blame(KVCache) if right else ""
        if crashed == j:
            hint = blame or ("the scores are (T_new, T): the mask must be causal_mask(T_new, T), not causal_mask(T_new)"
                             if t_new > 1 and t_cached else "")
            fail(f"{where} raised {error}", hint)
        hint = blame or _matching_mistake(c.attn, xs[:j + 1], outs[:j + 1])
        fail(f"{where}: the outputs differ from attention over the whole sequence by up to "
             f"{_diff(outs[j], want[j]):.2e}", hint)


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

# (shape, batch size, chunks): the window filled exactly, a prefill of one token, a chunk after decode steps.
FORWARD_CASES = [
    ("a", 1, [5, 1, 1, 1, 3, 1]),
    ("b", 2, [1, 1, 1, 4, 1, 1]),
    ("a", 3, [3, 1, 2, 1]),
]

FORWARD_MISTAKES = [
    ("positions", "no position offset: the new tokens got positions 0, 1, ... again. After the prefill they sit "
                  "at positions cache.length, cache.length + 1, ...: model.emb(idx, offset=cache.length), read "
                  "before the first layer extends the cache"),
    ("offset+1", "the positions are one too far: the first new token sits at position cache.length (read before "
                 "the first layer appends to the cache)"),
    ("offset-1", "the positions are one short: the first new token sits at position cache.length"),
    ("one_layer", "every block used layer 0 of the cache: block i must store and read its keys and values in "
                  "layer i"),
    ("mask_from_start", ATTENTION_MISTAKES[0][1] + f" ({FIX_ATTENTION})"),
    ("no_cache", ATTENTION_MISTAKES[1][1] + f" ({FIX_ATTENTION})"),
    ("no_mask", ATTENTION_MISTAKES[2][1] + f" ({FIX_ATTENTION})"),
]


@cell("test_forward_with_cache")
def check_forward_with_cache(forward_with_cache, KVCache):
    theirs = {}  # the learner's side's model of each shape
    for shape, B, chunks in FORWARD_CASES:
        model = _models(shape)
        theirs[shape] = theirs.get(shape) or _model(shape)
        cfg = model.config
        idx = _ids((B, sum(chunks)), cfg.vocab_size, seed=720 + B)
        with torch.no_grad():
            want_all = model(idx)  # the same model without a cache, on the whole sequence
        bounds = [sum(chunks[:j]) for j in range(len(chunks) + 1)]
        parts = [idx[:, a:b] for a, b in zip(bounds, bounds[1:])]
        label = (f"forward_with_cache(<GPT n_layer={cfg.n_layer}, n_head={cfg.n_head}, block_size={cfg.block_size}>, "
                 f"idx, cache) on a batch of {B}, fed chunks of {chunks} tokens")
        cache = call(KVCache, cfg.n_layer, label="KVCache(n_layer)")
        outs = []
        for j, part in enumerate(parts):
            where = f"{label}: chunk {j + 1} ({part.shape[1]} new, {bounds[j]} cached)"
            try:
                got = forward_with_cache(theirs[shape], part, cache)
            except NotImplementedError as err:
                raise not_written(where, err) from None
            except LearnerError as err:  # the learner's bug, reported with the call that caused it
                fail(f"{where} raised {describe_error(err)}", _forward_crash_hint(str(err), KVCache, j,
                                                                                  part.shape[1]))
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
                fail(f"{where} returned shape {_shape(got)}, expected {tuple(want.shape)}", hint)
            outs.append(got)
            if not _close(got, want):
                hint = _kv_cache_blame(KVCache) or _forward_mistake(model, parts[:j + 1], outs)
                if not hint:
                    hint = ("the prefill (an empty cache) must give the uncached model's logits: each block is "
                            "x + attention_with_cache(block.attn, block.ln_1(x), cache, i), then "
                            "x + block.mlp(block.ln_2(x)); then ln_f and lm_head") if j == 0 else \
                        "check the positions (offset=cache.length) and that block i uses layer i of the cache"
                fail(f"{where}: the logits differ from the uncached model's on the whole sequence by up to "
                     f"{_diff(got, want):.2e}", hint)
            length = call(lambda: cache.length, label="KVCache.length")
            if length != bounds[j + 1]:
                fail(f"{where}: afterwards cache.length is {show(length)}, expected {bounds[j + 1]}",
                     "every block appends the new positions' keys and values to its own layer of the cache")


def _forward_crash_hint(error: str, KVCache, j: int, t_new: int) -> str:
    blame = _kv_cache_blame(KVCache)
    if blame:
        return blame
    if "block_size" in error or "index out of range" in error:
        return "the new tokens' positions start at cache.length (read before the first block extends the cache)"
    if j and t_new > 1:
        return ("several new tokens after cached ones: their mask must be causal_mask(T_new, T), the new queries "
                f"being the last T_new of T positions ({FIX_ATTENTION})")
    return ""


def _forward_mistake(model, parts, outs) -> str:
    for mistake, why in FORWARD_MISTAKES:
        replay = _replay(model, parts, mistake)
        if replay is not None and all(_close(o, r) for o, r in zip(outs, replay)):
            return why
    return ""


# ---------------------------------------------------------------- CachedModel

def _wrap(CachedModel, theirs, config, label, **kwargs):
    """The learner's CachedModel of ``theirs`` (the model on the learner's side, whose config is ``config``)."""
    cm = call(CachedModel, theirs, **kwargs,
              label=f"CachedModel(<GPT>{''.join(f', {k}={v}' for k, v in kwargs.items())})")
    if getattr(getattr(cm, "config", None), "block_size", None) != config.block_size:
        fail(f"{label}: CachedModel(model).config is not the model's config",
             "the loops of chapters 5 and 6 read model.config.block_size: keep self.config = model.config")
    return cm


def _last_row(got, label, vocab) -> torch.Tensor:
    if not isinstance(got, torch.Tensor) or got.dim() != 3 or got.shape[0] != 1 or got.shape[-1] != vocab:
        fail(f"{label} returned {_shape(got) if isinstance(got, torch.Tensor) else show(got)}, expected logits "
             f"of shape (1, T_new, {vocab})", "return what forward_with_cache returns for the positions it ran")
    return got[0, -1].detach().float()


def _probe(cm, model, theirs, ids: list[int], label: str, candidates=(), decode: bool = False) -> int:
    """Ask the learner's CachedModel for the logits after ``ids`` and compare the last row with the model's;
    return the number of positions it ran through the model (``theirs``, the model on the learner's side, counts
    them: the new positions of every call reach block 0's ln_1). ``candidates``: (ids, why) pairs, the mistake
    being "gave the logits after those ids". The mistakes of forward_with_cache are named too, on a prefill of
    ids or, if ``decode``, a prefill of ids[:-1] and a decode step."""
    out, positions = call(ask, "kv_cache.counted", cm, theirs, torch.tensor([ids]), label=label, hint=BUILT_ON)
    got = _last_row(out, label, model.config.vocab_size)
    want = _plain_last(model, ids)
    if _close(got, want):
        return positions
    hint = next((why for seq, why in candidates if len(seq) <= model.config.block_size
                 and _close(got, _plain_last(model, seq))), "")
    parts = [torch.tensor([ids[:-1]]), torch.tensor([ids[-1:]])] if decode else [torch.tensor([ids])]
    hint = hint or next((why if FIX_ATTENTION in why else f"{why} ({FIX_FORWARD})" for mistake, why in FORWARD_MISTAKES
                         if (replay := _replay(model, parts, mistake)) is not None
                         and _close(got, replay[-1][0, -1])), BUILT_ON)
    fail(f"{label}: the last row of the logits differs from the uncached model's by up to {_diff(got, want):.2e}",
         hint)


def _check_probes(CachedModel, model, theirs, prompts) -> None:
    """Direct calls, the way the loops make them, each compared with the uncached model."""
    p, q = prompts
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    name = "CachedModel(<GPT>)"
    seq = lambda ids: show(ids)  # noqa: E731
    _probe(cm, model, theirs, p, f"{name} called first with ids {seq(p)} (a prefill)")
    a, b, c = 5, 7, 11  # three different next tokens: two siblings (a, b) and a grandchild (c)
    positions = _probe(cm, model, theirs, p + [a], f"{name}, then with {seq(p + [a])}", decode=True)
    if positions not in (0, 1):  # 0: the learner's code does not go through block 0's ln_1 module
        fail(f"{name}, called with {seq(p)} and then {seq(p + [a])}, ran the model over {positions} "
             "positions for the one new token", "find the cache of ids[:-1] and run only the last token through "
             "forward_with_cache: that is the point of the cache")
    # A new prompt: a cache of the previous call must not be continued.
    _probe(cm, model, theirs, q, f"{name}, after {seq(p + [a])}, called with a new prompt {seq(q)}",
           [(p + [a] + q[-1:], "a stale cache was reused for a different prompt: the new prompt's last token was "
                               "added to the cache of the previous call, which holds other tokens. A cache is "
                               "reused only for ids whose ids[:-1] it holds exactly; otherwise prefill a fresh "
                               "KVCache"),
            (p + q[-1:], "a stale cache was reused for a different prompt: the cache of an earlier call, which holds "
                         "other tokens, was continued. A cache is reused only for ids whose ids[:-1] it holds "
                         "exactly; otherwise prefill a fresh KVCache")])
    # Beams: two continuations of one sequence, then the first one again.
    _probe(cm, model, theirs, p + [b], f"{name}, after {seq(p + [a])}, called with {seq(p + [b])} (as beam search "
                                       "does: two beams that share a history)",
           [(p + [a, b], "beams: the second beam read the cache that the first beam had extended (one cache shared "
                         "by the beams, in the order of the calls, or the parent's cache extended in place). Each "
                         "beam needs the cache of its own history, ids[:-1]: extend a branch (new lists), never the "
                         "parent that another beam may continue")])
    _probe(cm, model, theirs, p + [a, c], f"{name}, after {seq(p + [b])}, called with {seq(p + [a, c])} (the "
                                          "first beam continues)",
           [(p + [b, c], "beams: the cache of the first beam was changed by the second one; the cache must follow "
                         "each beam's own history: extend a branch (new lists), never a cache that another "
                         "sequence still uses"),
            (p + [a, b, c], "beams: the cache holds the tokens of every beam in the order they were computed; each "
                            "beam needs the cache of its own history, ids[:-1]")])


def _check_window(CachedModel, model, theirs, prompt) -> None:
    """Calls on the last block_size tokens of a growing sequence, as last_logits makes them: the window slides."""
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
        got = _last_row(call(cm, torch.tensor([window]), label=label, hint=hint), label, model.config.vocab_size)
        want = _plain_last(model, window)
        if not _close(got, want):
            fail(f"{label}: the last row of the logits differs from the uncached model's by up to "
                 f"{_diff(got, want):.2e}", hint)
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
    if held > 2 * max_entries * per_cache:
        fail(f"CachedModel(<GPT>, max_entries={max_entries}) holds {held:,} bytes of tensors after 24 prompts of "
             f"9 tokens; {max_entries} caches of a full window hold at most {max_entries * per_cache:,}",
             "memory grows without bound: keep at most max_entries caches, dropping the least recently used")


def _check_loops(CachedModel, model, theirs, prompt, other) -> None:
    """The loops of chapters 5 and 6 (run on the learner's side, with the learner's CachedModel of ``theirs``), each
    compared with the same loop here with the plain model."""
    block = model.config.block_size
    n = 3 * block
    label = f"<GPT with block_size={block}>, a prompt of {len(prompt)} ids, {n} new tokens"
    want = list(token_stream(model, prompt, n))
    cm = _wrap(CachedModel, theirs, model.config, "CachedModel")
    got = call(ask, "kv_cache.stream", cm, prompt, n, label=f"token_stream(CachedModel({label}))")
    if got != want:
        fail(f"greedy token_stream with CachedModel({label}) gave {show(got)}; without the cache {show(want)}",
             _first_difference(got, want, len(prompt), block))
    want = list(token_stream(model, other, n))
    got = call(ask, "kv_cache.stream", cm, other, n, label="token_stream(<the same CachedModel>, another prompt)")
    if got != want:
        fail(f"greedy token_stream with the same CachedModel on a second prompt gave {show(got)}; without the cache "
             f"{show(want)}", "a stale cache of the first prompt was reused: a cache is reused only for ids whose "
                              "ids[:-1] it holds exactly")
    for seed in (3, 4):
        sampler = dict(do_sample=True, seed=seed, top_k=20)  # its own generator, seeded: the same draws on both sides
        want = list(token_stream(model, prompt, n, choose=Sampler(**sampler)))
        got = call(lambda: ask("kv_cache.stream", CachedModel(theirs), prompt, n, sampler),
                   label="token_stream(CachedModel(...), choose=Sampler(do_sample=True, ...))")
        if got != want:
            fail(f"seeded sampling (Sampler(do_sample=True, seed={seed}, top_k=20)) with CachedModel({label}) gave "
                 f"{show(got)}; without the cache {show(want)}", _first_difference(got, want, len(prompt), block))
    for num_beams, steps, entries in ((3, block - len(prompt), 16), (2, block, 16), (3, 6, 2)):
        want = beam_search(model, prompt, steps, num_beams=num_beams)
        label = f"beam_search(CachedModel(<GPT>, max_entries={entries}), <{len(prompt)} ids>, {steps}, " \
                f"num_beams={num_beams})"
        got = call(lambda: ask("kv_cache.beams", CachedModel(theirs, max_entries=entries), prompt, steps, num_beams),
                   label=label)
        if got != want:
            fail(f"{label} gave {show(got)}; without the cache {show(want)}",
                 "beams: each beam must continue the cache of its own history (the cache follows the beams as "
                 "they are reordered); when the cache of ids[:-1] is gone, prefill")


def _first_difference(got, want, prompt_len, block) -> str:
    k = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    if prompt_len + k >= block:
        return (f"the tokens differ from step {k + 1} on, when the window of block_size={block} is full: the window "
                "slides by one token every step and every token sits at a new position; prefill it again")
    return f"the tokens differ from step {k + 1} on"


@cell("test_cached_model")
def check_cached_model(CachedModel):
    theirs = {}  # the learner's side's model of each shape
    for shape, prompt_len in (("a", 5), ("b", 3)):
        model, theirs[shape] = _models(shape), _model(shape)
        vocab = model.config.vocab_size
        p = _ids((prompt_len,), vocab, seed=730).tolist()
        q = _ids((prompt_len + 2,), vocab, seed=731).tolist()
        _check_probes(CachedModel, model, theirs[shape], (p, q))
        _check_window(CachedModel, model, theirs[shape], p)
        _check_loops(CachedModel, model, theirs[shape], p, q)
    _check_memory(CachedModel, _models("a"), theirs["a"])


# ---------------------------------------------------------------- kv_cache_bytes

BYTES_CASES = [  # (config, tokens, bytes_per_number, the precision of the model whose cache is measured)
    (GPTConfig(vocab_size=50, block_size=16, n_layer=3, n_head=2, n_embd=24), 11, 4, torch.float32),
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
    for config, tokens, b, want, source in cases:
        label = (f"kv_cache_bytes(GPTConfig(n_layer={config.n_layer}, n_head={config.n_head}, n_embd={config.n_embd}, "
                 f"block_size={config.block_size}), {tokens}, bytes_per_number={b})")
        theirs = make("kv_cache.gpt_config", **dataclasses.asdict(config))  # the same GPTConfig, theirs
        got = call(kv_cache_bytes, theirs, tokens, label=label, bytes_per_number=b)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != want:
            hint = next((why for value, why in _bytes_mistakes(config, tokens, b) if got == value), "")
            fail(f"{label} returned {show(got)}, expected {want:,}{source}", hint)
        if isinstance(got, float):
            fail(f"{label} returned the float {got!r}; a number of bytes is an int",
                 "use // for the head size, not /")
