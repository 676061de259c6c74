"""Helpers of every chapter: GPT-2's tokenizer data."""
from __future__ import annotations

import functools

__all__ = ["gpt2_ranks", "gpt2_encoding"]


@functools.cache
def gpt2_encoding():
    """tiktoken's GPT-2 encoding, read from the course's offline copy of its files."""
    import coursekit

    return coursekit.gpt2_encoding()


def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's merge table, {token bytes: rank}: a copy, so that learner code that changes it changes only its own."""
    return dict(gpt2_encoding()._mergeable_ranks)
