"""Chapter 7 (the KV cache): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `kv_cache` (the `KVCache` class; the learner writes `append`), `attention_with_cache`,
`forward_with_cache`, `cached_model` (the `CachedModel` class; the learner writes `__call__`), `kv_cache_bytes`.
Test cells: test_kv_cache, test_attention_with_cache, test_forward_with_cache, test_cached_model,
test_kv_cache_bytes. Each part is built on the ones before it (attention_with_cache stores in a KVCache,
forward_with_cache calls attention_with_cache, CachedModel calls forward_with_cache), so a mistake in a part
also costs the cells after it, whose messages then name the part ("fix KVCache first", "it uses your KVCache,
which fails its own test"); a mistake in a later part must cost nothing in the cells before it. Neither the
hidden nor the visible part of test_kv_cache_bytes runs the learner's cache, so only a mistake in kv_cache_bytes
costs it.
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
                  "test_cached_model": "KVCache, which fail their own tests"}
ATTENTION_CALL = "    y, _ = attention(q, k, v, causal_mask(q.shape[2], k.shape[2], device=x.device))\n"
REINSERT = "            self.caches[ids[:-1]] = parent  # another beam may continue from it\n"
# One entry: the last sequence and its cache. Right logits, but beams re-prefill: the cache of a parent is gone.
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
# A CachedModel that caches nothing: every call runs all of ids. The first also empties the model's forward hooks
# (which counted the positions once); the second calls them as if one position ran and returns the last row only.
# The positions are counted by the judge, which computes block 0's keys and values.
NO_CACHE_HOOKS_EMPTIED_CALL = """\
        for module in self.model.modules():
            module._forward_hooks.clear()
        return forward_with_cache(self.model, idx, KVCache(self.config.n_layer))
"""
NO_CACHE_FAKED_COUNT_CALL = """\
        hooks = [(module, hook) for module in self.model.modules() for hook in module._forward_hooks.values()]
        for module in self.model.modules():
            module._forward_hooks.clear()
        logits = forward_with_cache(self.model, idx, KVCache(self.config.n_layer))[:, -1:]
        for module, hook in hooks:
            one = torch.zeros(1, 1, dtype=torch.long) if isinstance(module, torch.nn.Embedding) else \\
                torch.zeros(1, 1, self.config.n_embd)
            hook(module, (one,), None)
        return logits
"""
CACHED_MODEL_POINTS = 3  # of test_cached_model: parts 3 (probes), 1, 1 (eviction), 1 (window), 2, 1

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
    Mutant(
        "parent-dropped",
        "the parent's cache is taken out of the dict and never put back: a second beam of the parent re-prefills",
        (Edit("cached_model", REINSERT, ""),),
        {"test_cached_model": "the parent of both beams, was no longer kept"},
    ),
    Mutant(
        "single-entry",
        "only the last sequence's cache is kept: right logits, but every beam but one re-prefills",
        (Edit("cached_model", CALL, SINGLE_ENTRY_CALL),),
        {"test_cached_model": "the parent of both beams, was no longer kept"},
    ),
    Mutant(
        "fifo-eviction",
        "caches evicted in the order they were made, not by their last use: a parent in use is dropped",
        (Edit("cached_model", "parent = self.caches.pop(ids[:-1], None)", "parent = self.caches.get(ids[:-1])"),
         Edit("cached_model", REINSERT, "")),
        {"test_cached_model": "drop the LEAST recently used caches"},
    ),
    Mutant(
        "last-row-only",
        "CachedModel returns only the last row of the logits, (1, 1, V), also after a prefill",
        (Edit("cached_model", "        return logits\n",
              "        return logits[:, -1:]  # the loops read only this row\n"),),
        {"test_cached_model": "expected (1, 5, 97)"},
    ),
    Mutant(
        "reset-at-full-window",
        "the cache is dropped once the window is full (>= block_size), one token before it slides",
        (Edit("cached_model", CALL_BODY, CALL_BODY + """\
        if len(ids) >= self.config.block_size:  # the window is full: it slides, start again
            parent = None
"""),),
        {"test_cached_model": "a window exactly full"},
    ),
    Mutant(
        "caches-global",
        "the caches kept in a dict at module level: every CachedModel, of any model, shares them",
        (Edit("cached_model", CALL, CALL.replace("self.caches", "CACHES")),
         Edit("cached_model", "#| export\nclass CachedModel:",
              "#| export\nCACHES = OrderedDict()  # token ids -> their cache\n\n\nclass CachedModel:")),
        {"test_cached_model": "GPT 2's last token on GPT 1's cached keys and values"},
    ),
    Mutant(
        "no-cache-hooks-emptied",
        "a CachedModel that caches nothing (every call runs all of ids), the model's forward hooks emptied",
        (Edit("cached_model", CALL, NO_CACHE_HOOKS_EMPTIED_CALL),),
        {"test_cached_model": "ran the model over 6 positions for the one new token"},
        kept={"test_cached_model": CACHED_MODEL_POINTS * 4 / 9},  # two models apart, the loops, the memory
    ),
    Mutant(
        "no-cache-faked-count",
        "a CachedModel that caches nothing, tells the model's hooks of one position and returns the last row",
        (Edit("cached_model", CALL, NO_CACHE_FAKED_COUNT_CALL),),
        {"test_cached_model": "returned logits of shape (1, 1, 97) after running the model over 5 positions"},
        kept={"test_cached_model": CACHED_MODEL_POINTS * 3 / 9},  # the loops, the memory
    ),
    Mutant(
        "next-without-default",
        "the cache looked up with next() and no default: StopIteration when none matches",
        (Edit("cached_model", "parent = self.caches.pop(ids[:-1], None)",
              "parent = next(c for key, c in self.caches.items() if key == ids[:-1])"),),
        {"test_cached_model": "raised StopIteration ("},  # and where: the cell and line
    ),
    # ---- dtypes and ranges
    Mutant(
        "float32-concatenation",
        "append concatenates into a new torch.zeros tensor, which is float32 whatever the keys are",
        (Edit("kv_cache", f"""\
            {CAT_K}
            {CAT_V}
""", """\
            old_k, old_v, T = self.keys[layer], self.values[layer], self.keys[layer].shape[2]
            B, H, T_new, D = k.shape
            new_k, new_v = torch.zeros(B, H, T + T_new, D), torch.zeros(B, H, T + T_new, D)
            new_k[:, :, :T], new_k[:, :, T:] = old_k, k
            new_v[:, :, :T], new_v[:, :, T:] = old_v, v
            k, v = new_k, new_v
"""),),
        {"test_kv_cache": "the cache keeps the dtype of the k and v it is given",
         "test_attention_with_cache": "fix KVCache first", "test_forward_with_cache": "fix KVCache first"},
    ),
    Mutant(
        "softmax-overflow",
        "attention written by hand with exp(scores) / sum: inf / inf = nan once the scores pass 88",
        (Edit("attention_with_cache", ATTENTION_CALL, """\
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=x.device), float("-inf"))
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
    y = weights @ v
"""),),
        {"test_attention_with_cache": "exp overflows"},
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
    x = model.emb.wte(idx.long()) + model.emb.wpe(torch.arange(start, start + idx.shape[1]))
    for layer, block in enumerate(model.h):
        x = x + attention_with_cache(block.attn, block.ln_1(x), cache, layer)
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))
'''
# LRU by hand: a plain dict and the step at which each cache was last used; a branch copies the lists.
COUNTER_LRU_CALL = """\
        ids = tuple(idx[0].tolist())
        self.clock = getattr(self, "clock", 0) + 1
        self.used = getattr(self, "used", {})
        parent = self.caches.get(ids[:-1])
        cache = KVCache(self.config.n_layer)
        if parent is None:
            logits = forward_with_cache(self.model, idx, cache)
        else:
            cache.keys, cache.values = parent.keys[:], parent.values[:]
            logits = forward_with_cache(self.model, idx[:, -1:], cache)
            self.used[ids[:-1]] = self.clock
        self.caches[ids] = cache
        self.used[ids] = self.clock + 0.5
        while len(self.caches) > self.max_entries:
            oldest = min(self.caches, key=self.used.__getitem__)
            del self.caches[oldest], self.used[oldest]
        return logits
"""
# A loop over the new queries, each against the keys up to its own position (no mask), softmax through logsumexp.
LOOP_LOGSUMEXP_ATTENTION = '''\
#| export
def attention_with_cache(attn: torch.nn.Module, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Causal self-attention of the new positions x (B, T_new, C) against all cached ones; updates the cache."""
    T_new = x.shape[1]
    q, k, v = (attn.split_heads(t) for t in attn.c_attn(x).split(attn.n_embd, dim=2))
    k, v = cache.append(layer, k, v)
    past = k.shape[2] - T_new
    rows = []
    for i in range(T_new):  # the new query i sits at position past + i and sees keys 0 .. past + i
        s = q[:, :, i:i + 1] @ k[:, :, :past + i + 1].transpose(-2, -1) / q.shape[-1] ** 0.5
        w = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
        rows.append(w @ v[:, :, :past + i + 1])
    return attn.c_proj(attn.merge_heads(torch.cat(rows, dim=2)))
'''
# A mask of a large negative number, the row maximum subtracted by hand; torch.concat along dim=-2.
LARGE_NEGATIVE_ATTENTION = '''\
#| export
def attention_with_cache(attn: torch.nn.Module, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Causal self-attention of the new positions x (B, T_new, C) against all cached ones; updates the cache."""
    B, T_new, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=-1)
    q, k, v = (t.view(B, T_new, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
    k, v = cache.append(layer, k, v)
    T = k.shape[2]
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / (C // attn.n_head) ** 0.5
    hidden = torch.ones(T_new, T, dtype=torch.bool).triu(diagonal=T - T_new + 1)
    scores = scores.masked_fill(hidden, -1e9)
    e = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    y = (e / e.sum(dim=-1, keepdim=True)) @ v
    return attn.c_proj(y.transpose(1, 2).reshape(B, T_new, C))
'''
# The longest cached prefix of ids is continued (a chunk of several new tokens when a shorter one is cached).
LONGEST_PREFIX_CALL = """\
        ids = tuple(idx[0].tolist())
        n = next((n for n in range(len(ids) - 1, 0, -1) if ids[:n] in self.caches), 0)
        cache = KVCache(self.config.n_layer)
        if n:
            parent = self.caches[ids[:n]]
            self.caches.move_to_end(ids[:n])
            cache.keys, cache.values = list(parent.keys), list(parent.values)
        logits = forward_with_cache(self.model, idx[:, n:], cache)
        self.caches[ids] = cache
        while len(self.caches) > self.max_entries:
            self.caches.popitem(last=False)
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
        "sdpa-inference-mode-counter-lru",
        "torch's attention with an index mask, inference mode, embeddings by hand, a CachedModel that evicts by "
        "a use counter in a plain dict, the byte count as 2 * n_layer * n_embd",
        cells={"attention_with_cache": SDPA_ATTENTION, "forward_with_cache": INFERENCE_MODE_FORWARD},
        edits=(Edit("cached_model", CALL, COUNTER_LRU_CALL),
               Edit("kv_cache_bytes", """\
    head_size = config.n_embd // config.n_head
    return 2 * config.n_layer * config.n_head * head_size * tokens * bytes_per_number
""", "    return 2 * config.n_layer * config.n_embd * tokens * bytes_per_number  # n_head * head_size = n_embd\n")),
    ),
    Variant(
        "loop-logsumexp-attention",
        "attention by hand, one new query at a time against the keys up to its position, softmax through logsumexp",
        cells={"attention_with_cache": LOOP_LOGSUMEXP_ATTENTION},
    ),
    Variant(
        "large-negative-longest-prefix",
        "a mask of -1e9 with the row maximum subtracted by hand, einsum; a CachedModel that continues the longest "
        "cached prefix; torch.concat along dim=-2",
        cells={"attention_with_cache": LARGE_NEGATIVE_ATTENTION},
        edits=(Edit("cached_model", CALL, LONGEST_PREFIX_CALL),
               Edit("kv_cache", CAT_K, "k = torch.concat((self.keys[layer], k), dim=-2)"),
               Edit("kv_cache", CAT_V, "v = torch.concat((self.values[layer], v), dim=-2)")),
    ),
]
