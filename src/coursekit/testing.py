"""Readable checks for the tests learners run and the autograder calls.

A failed check says what was called, what came back, what was expected and, where we can tell, why:
"pre_split(\"I'll\") returned ['I', \"'\", 'll'], expected ['I', \"'ll\"]" rather than a bare AssertionError.
"""
from __future__ import annotations

import contextlib
import warnings

import reprlib

_short = reprlib.Repr()
_short.maxstring = 80
_short.maxother = 80
_short.maxlist = 12
_short.maxdict = 6
_short.maxlevel = 3


def show(value) -> str:
    """A repr short enough for one line of feedback."""
    if isinstance(value, dict) and len(value) > _short.maxdict:
        return f"<dict of {len(value)} entries>"  # reprlib would sort all of them first: slow on 50,000 ranks
    return _short.repr(value)


def describe_call(name: str, args=(), kwargs=None) -> str:
    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in (kwargs or {}).items()]
    return f"{name}({', '.join(parts)})"


def not_written(label: str, err: NotImplementedError) -> AssertionError:
    """The failure for a call that reached a stub: "not written yet", naming the function that still raises (a
    method may be written and a helper it calls not)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_qualname if tb is not None else "it"
    return AssertionError(f"{label}: not written yet ({where} still raises NotImplementedError)")


def call(fn, *args, name: str | None = None, label: str | None = None, hint: str = "", **kwargs):
    """Call a learner's function; turn "not written yet" and crashes into messages that name the call.

    The call is described from ``name`` and the arguments, or by ``label`` where the caller has a better
    description (tensors by their shapes, models by their size); ``hint`` is added to a crash's message."""
    label = label or describe_call(name or getattr(fn, "__qualname__", repr(fn)), args, kwargs)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except Exception as err:  # the learner's bug, reported with the call that triggered it
        raise AssertionError(f"{label} raised {type(err).__name__}: {err}" + (f"\nHint: {hint}" if hint else "")) \
            from err


def expect(fn, *args, want, hint: str = "", name: str | None = None, **kwargs) -> None:
    """Check ``fn(*args, **kwargs) == want``; on failure say what came back and, if given, a hint.

    Returns None on purpose: nbgrader reads a number left as a test cell's last value as partial credit.
    """
    got = call(fn, *args, name=name, **kwargs)
    if got != want:
        label = describe_call(name or getattr(fn, "__qualname__", repr(fn)), args, kwargs)
        fail(f"{label} returned {show(got)}, expected {show(want)}", hint)


def expect_raises(exc_type, fn, *args, match: str = "", hint: str = "", name: str | None = None, **kwargs):
    """Check that ``fn(*args, **kwargs)`` raises ``exc_type`` (with ``match`` in its message)."""
    label = describe_call(name or getattr(fn, "__qualname__", repr(fn)), args, kwargs)
    try:
        got = fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except exc_type as err:
        if match and match not in str(err):
            fail(f"{label} raised {type(err).__name__}({str(err)!r}), whose message should mention {match!r}", hint)
        return None
    except Exception as err:
        fail(f"{label} raised {type(err).__name__}: {err}; expected {exc_type.__name__}", hint)
    fail(f"{label} returned {show(got)}; expected it to raise {exc_type.__name__}", hint)


def fail(message: str, hint: str = ""):
    raise AssertionError(message + (f"\nHint: {hint}" if hint else ""))


@contextlib.contextmanager
def isolated():
    """Run a check (``@isolated()``) or a block (``with isolated():``) on one CPU thread, with torch's random
    generator forked: afterwards the caller's thread setting and random state are as they were. A check runs in
    the learner's kernel, between the learner's cells, and must change nothing they compute next; and the
    course's tensors are small: on a busy machine, torch's threads mostly wait on each other."""
    import torch

    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


@contextlib.contextmanager
def quiet_transformers():
    """No logs, warnings or progress bars from Hugging Face transformers while the block runs."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
