"""The parameter-coverage tool (tests/submissions/coverage.py) on its own, cheaply: what it counts as graded, what
the judge's hook records of real requests (a trusted session of the reference's own functions), and the findings it
fails with. Each chapter's test of its hidden cases, over the reference's run, is in tests/submissions/grading.py."""
from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch

from autograder import judge
from autograder.sandboxed import helpers
from autograder.trusted import LocalSession
from minigpt.attention import causal_mask
from minigpt.tokens import Tokenizer

from submissions import coverage


def stand_ins(*objects):
    session = LocalSession(objects)
    return session, [session.remote(session.server.describe(i)) for i in range(len(objects))]


def test_what_is_graded_is_what_the_learner_writes_and_hands_to_check():
    callables, given = coverage.graded("04-transformer")
    assert {"gelu", "LayerNorm.__init__", "LayerNorm.forward", "GPT.__init__", "GPT.forward"} <= set(callables)
    assert callables["GPT()"].name == "GPT.forward"  # an instance's call runs forward
    assert "GPT.from_pretrained" not in callables and "GPT._init_weights" not in callables  # given methods
    assert given == {"GPTConfig": "given code, not the learner's"}
    assert list(callables["LayerNorm.__init__"].signature.parameters) == ["n_embd", "eps"]  # self left out


def test_the_judge_tells_the_recorder_each_argument_and_the_findings_name_what_is_missing():
    with coverage.recording("03-attention") as recorder:
        session, (fn,) = stand_ins(causal_mask)
        recorder.judging(session, "test_causal_mask", [fn])
        fn(3)
        fn(3, None)
    found = coverage.findings(recorder)
    assert judge.RECORDER is None  # given back after the block
    assert recorder.seen["causal_mask"].calls == 2
    assert found["causal_mask(t_k)"].startswith("causal_mask(t_k): never given a value other than its default None")
    assert "never left out" not in found["causal_mask(t_k)"]  # left out once; given None (its default) once
    assert "causal_mask(device)" in found and "causal_mask(t_q)" not in found
    assert found["softmax"] == "softmax is never called by a hidden case where the judge sees it"
    with coverage.recording("03-attention") as recorder:
        session, (fn,) = stand_ins(causal_mask)
        recorder.judging(session, "test_causal_mask", [fn])
        fn(3)
        fn(3, 5, device="cpu")
    assert not {"causal_mask(t_k)", "causal_mask(device)"} & set(coverage.findings(recorder))


def test_a_class_its_instances_their_methods_and_calls_through_helpers_are_followed():
    ranks = {bytes([b]): b for b in range(256)}
    with coverage.recording("01-tokens") as recorder:
        session, (cls,) = stand_ins(Tokenizer)
        recorder.judging(session, "test_special_tokens", [cls])
        tok = cls(ranks, {"<|x|>": 256})
        tok.encode("a<|x|>", allowed_special="all")
        session.request("ask", None, kind="kv_cache.held_bytes", args=(tok.decode,))  # to a helper: its calls unseen
    seen = recorder.seen
    assert seen["Tokenizer.decode"].handed_to == {"kv_cache.held_bytes"} and seen["Tokenizer.decode"].calls == 0
    assert "handed to kv_cache.held_bytes" in coverage.findings(recorder)["Tokenizer.decode"]
    assert seen["Tokenizer.__init__"].parameters["special_tokens"].kinds == {"dict": 1}
    assert seen["Tokenizer.encode"].parameters["allowed_special"].other == 1
    assert seen["Tokenizer.encode"].parameters["disallowed_special"].left_out == 1
    assert "Tokenizer.encode(allowed_special)" in coverage.findings(recorder)  # never left out
    with coverage.recording("03-attention") as recorder:
        session, (fn,) = stand_ins(causal_mask)
        recorder.judging(session, "test_causal_mask", [fn])
        session.request("ask", None, kind="attention.run", args=(fn, 2), kwargs={"t_k": 4})
    assert recorder.seen["causal_mask"].parameters["t_k"].kinds == {"int": 1}


def test_defaults_and_the_kinds_of_a_union():
    assert coverage.is_default([], ()) and coverage.is_default(set(), frozenset())
    assert not coverage.is_default([3], ()) and not coverage.is_default(None, ())
    assert coverage.is_default(1, 1.0) and not coverage.is_default(True, 1) and not coverage.is_default(0, None)
    assert coverage.is_default(-math.inf, -math.inf) and not coverage.is_default(torch.zeros(2), 0.0)
    assert coverage.alternatives("str | list[int]") == ["str", "list"]
    assert coverage.alternatives("Iterable[int] | None") == ["Iterable"]
    assert coverage.alternatives("dict[str, int | None]") == []  # not a union at the top
    assert coverage.alternatives("KVCache | None") == []  # a kind the tool does not know
    assert coverage.kind(torch.zeros(0, dtype=torch.int32)) == "tensor int32 (empty)"
    assert [coverage.kind(v) for v in (0, -2, 0.0, math.nan, "", b"x", ())] == \
        ["int 0", "int < 0", "float 0", "float nan", "str (empty)", "bytes", "tuple (empty)"]


def test_the_check_fails_on_what_is_missing_and_on_an_excuse_not_needed():
    with coverage.recording("03-attention") as recorder:
        session, (fn,) = stand_ins(causal_mask)
        recorder.judging(session, "test_causal_mask", [fn])
        fn(3, 5, device="cpu")
    found = coverage.findings(recorder)
    with pytest.raises(AssertionError, match=r"causal_mask\(t_k\): never left out"):
        coverage.check(recorder, {})
    excused = {key: "a reason" for key in found}
    coverage.check(recorder, excused)
    with pytest.raises(AssertionError, match=r"(?s)excused but covered now.*causal_mask\(t_q\) \(excused: a reason\)"):
        coverage.check(recorder, {**excused, "causal_mask(t_q)": "a reason"})


@pytest.mark.parametrize("kind", coverage.CALLS_THROUGH)
def test_each_helper_that_calls_through_calls_its_first_argument(kind):
    module, name = kind.split(".")
    module = importlib.import_module(f"{helpers.__name__}.{module}")
    assert name in module.__all__, f"{kind} is not a helper the judge can ask for"
    first = next(iter(inspect.signature(getattr(module, name)).parameters))
    assert first == "fn", f"{kind}: the tool reads its first argument as the callable, but it is {first!r}"
