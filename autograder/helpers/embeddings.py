"""Helpers of chapter 2 (embeddings), run next to the learner's code: a forward and backward pass through the
learner's ``Embeddings``, whose gradients stay where the layer is. No answers here: the judge computes those.

This runs where ``minigpt.embeddings`` cannot be imported: torch and the learner's objects only.
"""
from __future__ import annotations

__all__ = ["gradients"]


def gradients(emb, idx, offset: int = 0) -> dict:
    """``emb(idx, offset=offset).sum().backward()`` (``emb(idx)`` for offset 0), then {"wte": the gradient of
    ``emb.wte.weight``, "wpe": that of ``emb.wpe.weight``}, None where there is none."""
    out = emb(idx, offset=offset) if offset else emb(idx)
    out.sum().backward()
    return {name: getattr(emb, name).weight.grad for name in ("wte", "wpe")}
