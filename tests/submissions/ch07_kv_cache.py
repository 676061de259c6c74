"""Chapter 7 (the KV cache): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `kv_cache` (the `KVCache` class; the learner writes `append`), `attention_with_cache`,
`forward_with_cache`, `cached_model` (the `CachedModel` class; the learner writes `__call__`), `kv_cache_bytes`.
Test cells: test_kv_cache, test_attention_with_cache, test_forward_with_cache, test_cached_model,
test_kv_cache_bytes. Each part is built on the ones before it (attention_with_cache stores in a KVCache,
forward_with_cache calls attention_with_cache, CachedModel calls forward_with_cache), so a mistake in a part
also costs the cells after it, whose messages then name the part ("fix KVCache first"); a mistake in a later
part must cost nothing in the cells before it. test_kv_cache_bytes runs only a prefill (no concatenation, one
query per key), so only a mistake in kv_cache_bytes costs it.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "07-kv-cache"

CAT_K = "k = torch.cat([self.keys[layer], k], dim=2)"
CAT_V = "v = torch.cat([self.values[layer], v], dim=2)"
MASK = "causal_mask(q.shape[2], k.shape[2], device=x.device)"
BRANCH = """\
            cache = KVCache(self.config.n_layer)
            cache.keys, cache.values = list(parent.keys), list(parent.values)  # a branch; parent stays valid
"""
CALL_BODY = """\
        ids = tuple(idx[0].tolist())
        parent = self.caches.pop(ids[:-1], None)
"""
CALL = CALL_BODY + """\
        if parent is None:
            cache = KVCache(self.config.n_layer)
            logits = forward_with_cache(self.model, idx, cache)
        else:
""" + BRANCH + """\
            logits = forward_with_cache(self.model, idx[:, -1:], cache)
            self.caches[ids[:-1]] = parent  # another beam may continue from it
        self.caches[ids] = cache
        while len(self.caches) > self.max_entries:
            self.caches.popitem(last=False)
        return logits
"""  # the whole body of the reference CachedModel.__call__
AFTER_KV_CACHE = {"test_attention_with_cache": "fix KVCache first", "test_forward_with_cache": "fix KVCache first",
                  "test_cached_model": "CachedModel runs on your forward_with_cache, attention_with_cache and KVCache"}

MUTANTS = [
    # ---- KVCache.append
    Mutant(
        "cat-wrong-dim",
        "keys and values concatenated along the last dim (head_size), not time",
        (Edit("kv_cache", CAT_K, CAT_K.replace("dim=2", "dim=-1")),
         Edit("kv_cache", CAT_V, CAT_V.replace("dim=2", "dim=-1"))),
        {"test_kv_cache": "the keys were concatenated along the last dim (head_size)", **AFTER_KV_CACHE},
    ),
    Mutant(
        "values-not-cached",
        "the keys are concatenated, the values are not",
        (Edit("kv_cache", f"            {CAT_V}\n", ""),),
        {"test_kv_cache": "the values are not cached", **AFTER_KV_CACHE},
    ),
    Mutant(
        "values-from-keys",
        "the new keys appended to the values (copy-paste slip)",
        (Edit("kv_cache", CAT_V, "v = torch.cat([self.values[layer], k], dim=2)"),),
        {"test_kv_cache": "KEYS were appended to the values", **AFTER_KV_CACHE},
    ),
    # ---- attention_with_cache
    Mutant(
        "mask-hides-cache",
        "a (T_new, T) mask tril'ed from the start: the new query cannot see the cached keys",
        (Edit("attention_with_cache", MASK, "torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()"),),
        {"test_attention_with_cache": "the mask hides the cached keys from the new queries",
         "test_forward_with_cache": "the mask hides the cached keys",
         "test_cached_model": "the mask hides the cached keys"},
    ),
    Mutant(
        "mask-square",
        "causal_mask(T_new): right for one new token, breaks a chunk of several after cached ones",
        (Edit("attention_with_cache", MASK, "causal_mask(q.shape[2], device=x.device)"),),
        # The loops of chapters 5 and 6 only ever prefill an empty cache or decode one token: CachedModel works.
        {"test_attention_with_cache": "not causal_mask(T_new)", "test_forward_with_cache": "causal_mask(T_new, T)"},
    ),
    # ---- forward_with_cache
    Mutant(
        "no-position-offset",
        "the new tokens' positions restart at 0 after the prefill",
        (Edit("forward_with_cache", "model.emb(idx, offset=cache.length)", "model.emb(idx)"),),
        {"test_forward_with_cache": "no position offset", "test_cached_model": "no position offset"},
    ),
    Mutant(
        "one-cache-layer",
        "every block stores its keys and values in layer 0 of the cache",
        (Edit("forward_with_cache", "block.ln_1(x), cache, i)", "block.ln_1(x), cache, 0)"),),
        {"test_forward_with_cache": "every block used layer 0 of the cache",
         "test_cached_model": "every block used layer 0 of the cache"},
    ),
    # ---- CachedModel
    Mutant(
        "cache-never-reset",
        "one cache for every call: it is never reset, for a new prompt or another beam",
        (Edit("cached_model", CALL, """\
        if not hasattr(self, "cache"):
            self.cache = KVCache(self.config.n_layer)
        return forward_with_cache(self.model, idx[:, self.cache.length:], self.cache)  # the tokens it has not seen
"""),),
        {"test_cached_model": "a stale cache was reused for a different prompt"},
    ),
    Mutant(
        "beams-share-parent",
        "a beam extends its parent's cache in place, so the parent's other beams see its token",
        (Edit("cached_model", BRANCH, "            cache = parent\n"),),
        {"test_cached_model": "beams: the second beam read the cache that the first beam had extended"},
    ),
    Mutant(
        "window-trimmed-cache",
        "when the window slides, the oldest position is dropped and the cache reused with shifted positions",
        (Edit("cached_model", CALL_BODY, CALL_BODY + """\
        if parent is None and self.caches:  # the window slid by one token: drop the oldest one and go on
            last_ids, last = next(reversed(self.caches.items()))
            if ids[:-1] == last_ids[1:]:
                parent = KVCache(self.config.n_layer)
                parent.keys = [k[:, :, 1:] for k in last.keys]
                parent.values = [v[:, :, 1:] for v in last.values]
"""),),
        {"test_cached_model": "window overflow"},
    ),
    Mutant(
        "unbounded-memory",
        "every cache is kept forever",
        (Edit("cached_model", """\
        while len(self.caches) > self.max_entries:
            self.caches.popitem(last=False)
""", ""),),
        {"test_cached_model": "memory grows without bound"},
    ),
    # ---- kv_cache_bytes
    Mutant(
        "bytes-keys-only",
        "the memory of the keys only",
        (Edit("kv_cache_bytes", "return 2 * config.n_layer", "return config.n_layer"),),
        {"test_kv_cache_bytes": "count the keys AND the values"},
    ),
    Mutant(
        "bytes-head-size-n-embd",
        "head_size taken as n_embd",
        (Edit("kv_cache_bytes", "head_size = config.n_embd // config.n_head", "head_size = config.n_embd"),),
        {"test_kv_cache_bytes": "head_size = n_embd // n_head"},
    ),
]


# ---------------------------------------------------------------- different but correct

# Preallocated buffers that double when full, written with an index; append returns views of them.
PREALLOCATED_KV_CACHE = '''\
#| export
class KVCache:
    """Per-layer keys and values of all positions so far, each (B, n_head, T, head_size), in buffers that
    double when full (no copy of the whole cache at every step)."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer    # buffers, (B, H, capacity, D)
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.filled = [0] * n_layer

    @property
    def length(self) -> int:
        return self.filled[0]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.filled[layer], self.filled[layer] + k.shape[2]
        if self.keys[layer] is None or end > self.keys[layer].shape[2]:
            capacity = end if self.keys[layer] is None else max(end, 2 * self.keys[layer].shape[2])
            for store in (self.keys, self.values):
                old = store[layer]
                store[layer] = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
                if old is not None:
                    store[layer][:, :, :start] = old[:, :, :start]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        self.filled[layer] = end
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def nbytes(self) -> int:
        """Memory held by the buffers."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
'''
# With buffers written in place, a branch must copy them: a deep copy per decode step.
COPYING_CACHED_MODEL_CALL = """\
        ids = tuple(idx[0].tolist())
        parent = self.caches.get(ids[:-1])
        cache = copy.deepcopy(parent) if parent is not None else KVCache(self.config.n_layer)
        logits = forward_with_cache(self.model, idx if parent is None else idx[:, -1:], cache)
        self.caches[ids] = cache
        self.caches.move_to_end(ids)
        if parent is not None:
            self.caches.move_to_end(ids[:-1])
        while len(self.caches) > self.max_entries:
            self.caches.popitem(last=False)
        return logits
"""
# torch's attention with a boolean mask, inference mode, the embeddings by hand.
SDPA_ATTENTION = '''\
#| export
def attention_with_cache(attn: torch.nn.Module, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Causal self-attention of the new positions x (B, T_new, C) against all cached ones; updates the cache."""
    B, T_new, C = x.shape
    q, k, v = attn.c_attn(x).view(B, T_new, 3, attn.n_head, C // attn.n_head).permute(2, 0, 3, 1, 4)
    k, v = cache.append(layer, k, v)
    past = k.shape[2] - T_new
    mask = torch.arange(k.shape[2])[None, :] <= past + torch.arange(T_new)[:, None]
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.c_proj(y.transpose(1, 2).reshape(B, T_new, C))
'''
INFERENCE_MODE_FORWARD = '''\
#| export
@torch.inference_mode()
def forward_with_cache(model: torch.nn.Module, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits (B, T_new, V) of the new token ids idx (B, T_new), reusing and extending the cache."""
    start = cache.length
    x = model.emb.wte(idx) + model.emb.wpe(torch.arange(start, start + idx.shape[1]))
    for layer, block in enumerate(model.h):
        x = x + attention_with_cache(block.attn, block.ln_1(x), cache, layer)
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))
'''
# One entry: the last sequence and its cache. Beams re-prefill (slow but right); memory is one cache.
SINGLE_ENTRY_CALL = """\
        ids = idx[0].tolist()
        last = getattr(self, "last", None)
        if last is not None and last[0] == ids[:-1]:
            cache = last[1]
            logits = forward_with_cache(self.model, idx[:, -1:], cache)
        else:
            cache = KVCache(self.config.n_layer)
            logits = forward_with_cache(self.model, idx, cache)
        self.last = (ids, cache)
        return logits
"""

VARIANTS = [
    Variant(
        "preallocated-copying",
        "a KVCache with preallocated buffers written with an index; a CachedModel that deep-copies the cache",
        cells={"kv_cache": PREALLOCATED_KV_CACHE},
        edits=(Edit("cached_model", CALL, COPYING_CACHED_MODEL_CALL),
               Edit("cached_model", "#| export\n", "#| export\nimport copy\n\n")),
    ),
    Variant(
        "sdpa-inference-mode-single-entry",
        "torch's attention with an index mask, inference mode, embeddings by hand, a one-entry CachedModel, "
        "the byte count as 2 * n_layer * n_embd",
        cells={"attention_with_cache": SDPA_ATTENTION, "forward_with_cache": INFERENCE_MODE_FORWARD},
        edits=(Edit("cached_model", CALL, SINGLE_ENTRY_CALL),
               Edit("kv_cache_bytes", """\
    head_size = config.n_embd // config.n_head
    return 2 * config.n_layer * config.n_head * head_size * tokens * bytes_per_number
""", "    return 2 * config.n_layer * config.n_embd * tokens * bytes_per_number  # n_head * head_size = n_embd\n")),
    ),
]
