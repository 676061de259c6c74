"""Checks that the hidden tests call, one module per chapter.

A hidden test cell holds only a call such as ``checks.check_bpe_merge(bpe_merge)``, so nbgrader's feedback,
which prints the hidden test source, shows the call and the message it raised, never the expected answers.
Each check compares the learner's code with an external oracle (tiktoken, torch, transformers), on inputs
the learner has not seen, and explains a mismatch in words: which call, what came back, what was expected,
and, when the mistake is a known one, what it is.
"""

import dataclasses
import functools
import threading


@dataclasses.dataclass(frozen=True)
class Shape:
    """The size of a small random GPT-2 that a check builds (with ``seed``) to run the learner's code on."""
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    seed: int


_ORACLE = threading.RLock()


def once(fn):
    """``fn`` computed once for each argument, by one thread at a time (the judge runs notebooks in threads)."""
    cached = functools.cache(fn)

    @functools.wraps(fn)
    def computed_once(*args):
        with _ORACLE:
            return cached(*args)

    return computed_once


_BY_KEY: dict = {}


def once_by(key, compute):
    """``compute()``, computed once for ``key`` (standing for arguments that cannot be a cache's key, such as tensors),
    by one thread at a time, as ``once``."""
    with _ORACLE:
        if key not in _BY_KEY:
            _BY_KEY[key] = compute()
        return _BY_KEY[key]


def gap(got, want) -> str:
    """How a tensor ``got`` differs from ``want`` of the same shape, to follow "differs from ..." in the message of a
    failed ``coursekit.testing.close``: "by up to 3.1e-04 (at index (0, 5): 0.1234, expected 0.1237)". A NaN or an
    infinity where ``want`` holds none is named first, "at index (0, 5): got nan, expected 0.1237" ("here: ..." for
    a single number): a largest difference taken with ``.max()`` would read "nan" and say nothing of where."""
    import torch

    g, w = got.detach().double(), want.detach().double()
    same = (g == w) | (torch.isnan(g) & torch.isnan(w))  # equal infinities and NaNs in the same place differ by 0
    diff = torch.where(same, torch.zeros_like(g), (g - w).abs())
    worst = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(worst.flatten().argmax()) if worst.numel() else 0
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape)) if g.dim() else ()
    if not torch.isfinite(diff[at]):
        return f"{f'at index {at}' if at else 'here'}: got {g[at].item():.6g}, expected {w[at].item():.6g}"
    return f"by up to {diff[at].item():.2e} ({f'at index {at}: ' if at else ''}{g[at].item():.6g}, expected " \
        f"{w[at].item():.6g})"
