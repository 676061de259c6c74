"""Helpers of every chapter: GPT-2's tokenizer data, and wrappers that watch how the learner's code uses a model."""
from __future__ import annotations

import functools

__all__ = ["gpt2_ranks", "gpt2_encoding", "Counting"]


@functools.cache
def gpt2_encoding():
    """tiktoken's GPT-2 encoding, read from the course's offline copy of its files."""
    import coursekit

    return coursekit.gpt2_encoding()


def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's merge table, {token bytes: rank}: a copy, so that learner code that changes it changes only its own."""
    return dict(gpt2_encoding()._mergeable_ranks)


def Counting(model):
    """``model``, wrapped to count its forward passes in ``.calls``; ``.config`` is the model's."""
    import torch

    class CountingModel(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model, self.config, self.calls = inner, inner.config, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.model(*args, **kwargs)

    return CountingModel(model)
