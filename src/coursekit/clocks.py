"""The pages' clocks: how a page times its demos, and how a run that checks only its numbers turns them down.

A page measures on the machine that builds it and asserts what its prose says of the times. Run again on another of
torch's kernel paths (tests/test_kernel_paths.py), only its numbers are checked, not the machine's speed: with
``MINIGPT_PAGE_CLOCKS=off`` a timing loop takes one round (``rounds``) and a claim about time is not asserted
(``timed``), so that run costs what the page computes, not what it measures.

Two timings are told apart only beyond their spread (``compared``): where the quartiles of two sets of runs overlap,
the page says "about as fast as", since the difference is no larger than the one between runs of the same code.
"""
from __future__ import annotations

import os

ENV = "MINIGPT_PAGE_CLOCKS"


def off() -> bool:
    return os.environ.get(ENV) == "off"


def rounds(n: int) -> int:
    """How many rounds a timing loop of ``n`` rounds takes: ``n``, or one with the clocks off."""
    return 1 if off() else n


def timed(claim: bool) -> bool:
    """``assert timed(a < b)``: a claim about measured time, asserted unless the clocks are off."""
    return off() or bool(claim)


def spread(times: list[float]) -> tuple[float, float, float]:
    """(low, middle, high) of measured times: the quartiles (with fewer than 4 times, the least and the most)."""
    t = sorted(times)
    return t[len(t) // 4], t[len(t) // 2], t[-1 - len(t) // 4]


def apart(a: list[float], b: list[float]) -> bool:
    """Whether the times ``a`` and ``b`` differ by more than their spread: their quartiles do not overlap."""
    (a_lo, _, a_hi), (b_lo, _, b_hi) = spread(a), spread(b)
    return a_hi < b_lo or b_hi < a_lo


def compared(a: list[float], b: list[float]) -> str:
    """How fast the runs timed in ``a`` were next to those in ``b``, as the words before b's name: "about as fast
    as" within the spread, else the ratio of the middle times ("2.1 times as fast as", "slower than (it took 1.4 times
    as long as)")."""
    if not apart(a, b):
        return "about as fast as"
    ratio = spread(b)[1] / spread(a)[1]
    times = lambda r: f"{r:.2f}" if r < 1.1 else f"{r:.1f}"  # noqa: E731 (1.04, not 1.0, for a tight spread)
    if ratio > 1:
        return f"{times(ratio)} times as fast as"
    return f"slower than (it took {times(1 / ratio)} times as long as)"
