"""Helpers of chapter 3 (masked attention), run next to the learner's code: a call that reports whether it changed
its tensor arguments in place (the caller's tensors are on that side). No answers here: the judge computes those.

This runs where ``minigpt.attention`` cannot be imported: torch and the learner's objects only.
"""
from __future__ import annotations

__all__ = ["run"]


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [whether fn changed args[i] in place, for each positional argument])``; an argument
    that is not a tensor counts as unchanged."""
    import torch

    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args, **kwargs)
    changed = [b is not None and not torch.equal(a, b) for a, b in zip(args, before)]
    return out, changed
