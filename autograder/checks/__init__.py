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
