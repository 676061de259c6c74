"""Helpers of chapter 1 (tokens): a second, small merge table, so that a check can hold two tokenizers with
different tables at once, and a fingerprint of a table, to see whether the learner's code changed it. Plain
recipes, no answers: the judge builds the same table here to compute what the learner's tokenizer should give.
"""
from __future__ import annotations

import hashlib

__all__ = ["small_ranks", "fingerprint", "answers"]

# Merges learned in this order on top of the 256 single bytes (each one joins two tokens already in the table).
SMALL_MERGES = [
    (b"t", b"h"), (b"th", b"e"), (b" ", b"the"), (b"e", b"r"), (b"a", b"n"), (b"an", b"d"), (b" ", b"and"),
    (b"i", b"n"), (b"in", b"g"), (b"o", b"u"), (b" ", b"q"), (b"k", b"k"), (b"kk", b"a"), (b"Z", b"y"),
    (b"z", b"z"), (b"Zy", b"zz"), (b"y", b"v"), (b"yv", b"a"),
]


def small_ranks() -> dict[bytes, int]:
    """A byte-level merge table of 256 + 18 tokens, {token bytes: rank}: the single bytes in byte order (unlike
    GPT-2's), then ``SMALL_MERGES``; a new dict on every call."""
    ranks = {bytes([b]): b for b in range(256)}
    for left, right in SMALL_MERGES:
        ranks[left + right] = len(ranks)
    return ranks


def answers(fn, inputs: list, *args) -> list:
    """``fn(x, *args)`` for each x of ``inputs`` in turn, asked in one request: what came back, up to the first call
    that raised (left out: the judge makes that call again on its own, to report it as any call's error)."""
    out = []
    for x in inputs:
        try:
            out.append(fn(x, *args))
        except Exception:  # noqa: BLE001
            break
    return out


def fingerprint(table: dict) -> list:
    """[number of entries, sha1 of the sorted entries] of a dict: equal fingerprints, equal tables."""
    entries = sorted(dict.items(table), key=repr)
    return [len(entries), hashlib.sha1(repr(entries).encode("utf-8", "backslashreplace")).hexdigest()]
