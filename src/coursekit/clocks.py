"""The pages' clocks: how a page times its demos, and how a run that checks only its numbers turns them down.

A page measures on the machine that builds it and asserts what its prose says of the times. Run again on another of
torch's kernel paths (tests/test_kernel_paths.py), only its numbers are checked, not the machine's speed: with
``MINIGPT_PAGE_CLOCKS=off`` a timing loop takes one round (``rounds``) and a claim about time is not asserted
(``timed``), so that run costs what the page computes, not what it measures.
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
