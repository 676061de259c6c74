"""Helpers of chapter 10 (batching), built next to the learner's code from plain recipes: a reference KVCache of
chapter 7 to hand to the learner's forward_padded, samplers of chapter 6 with their own seeds, the course's shipped
model, and runs that must happen where the learner's objects are: a call that reports whether it changed its
arguments, a generation turned into plain data. No answers here: the judge computes those. (The forward passes of
a generation are counted by the judge, through a model whose block 0 ``attn.c_attn`` it serves:
``kv_cache.served_gpt``.)

This runs where ``minigpt.batching`` cannot be imported: torch, the standard library, the course's reference of
chapters 3 to 7 and the learner's objects only.
"""
from __future__ import annotations

import copy
import functools

import torch

__all__ = ["run", "kv_cache", "sampler", "shipped_gpt", "generations"]


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), whether it changed any of its arguments)``: lists compared with a deep copy,
    tensors with a clone."""
    before = [a.clone() if isinstance(a, torch.Tensor) else copy.deepcopy(a) for a in args]
    out = fn(*args, **kwargs)
    changed = any(not torch.equal(a, b) if isinstance(a, torch.Tensor) else a != b for a, b in zip(args, before))
    return out, changed


def kv_cache(n_layer: int):
    """Chapter 7's reference ``KVCache(n_layer)``."""
    from minigpt.kv_cache import KVCache

    return KVCache(n_layer)


def sampler(**settings):
    """Chapter 6's reference ``Sampler(**settings)`` (a seed in the settings gives it a generator of its own)."""
    from minigpt.samplers import Sampler

    return Sampler(**settings)


def shipped_gpt():
    """The course's shipped model (chapter 8 trained it), as chapter 4's GPT, in eval mode: a copy of its own for each
    caller (the learner's code may change it), of a model read once in this process."""
    return copy.deepcopy(_shipped_gpt())


@functools.cache
def _shipped_gpt():
    """Read with torch's random state given back, as every helper's model is built: GPT's initializer draws the 13
    million numbers of its token table before the weights are loaded (half a second, and the caller's stream)."""
    import coursekit
    from minigpt.transformer import GPT

    with torch.random.fork_rng(devices=[]):
        return GPT.from_pretrained(coursekit.shipped_model_dir()).eval()


def generations(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a list of chapter 5's Generation), as plain data: a list of [ids, text, reason], or
    ("not a list", what came back) when it is not a list of objects with those three fields."""
    out = fn(*args, **kwargs)
    if not isinstance(out, (list, tuple)):
        return ["not a list", type(out).__name__]
    plain = []
    for g in out:
        try:
            ids, text, reason = list(g.ids), g.text, g.finish_reason
        except AttributeError:
            return ["not generations", type(g).__name__]
        plain.append([[int(i) for i in ids], str(text), reason if reason is None else str(reason)])
    return plain
