"""The wall between the learner's code and the judge (autograder/sandboxed/wire.py, hidden.py, judge.py), piece by
piece: what crosses it as plain data, what stays behind as a reference, how an error of the learner's code comes back,
and what a notebook's connections may and may not ask of the judge."""
from __future__ import annotations

import json
import re
import socket
import threading

import numpy as np
import pytest
import torch

from autograder import judge, trusted
from autograder.sandboxed import hidden, wire


def roundtrip(value):
    return wire.decode(json.loads(json.dumps(wire.encode(value))))


@pytest.mark.parametrize("value", [
    None, True, 0, -3, 2**80, 1.5, "naïve 🤖 \udcff", b"\x00\xff", bytearray(b"ab"), [1, [2, "x"]], (1, (2,)),
    {b"ab": 1, (1, 2): "t", "k": None}, {1, 2}, frozenset({"a"}), torch.Size([2, 3]), torch.float16,
    torch.device("cpu"),
])
def test_plain_data_crosses_unchanged(value):
    got = roundtrip(value)
    assert got == value and type(got) is type(value)


def test_tensors_and_arrays_cross_with_dtype_shape_and_gradient_flag():
    for t in (torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.randn(3, 4).t(), torch.tensor(True),
              torch.randn(2, dtype=torch.bfloat16), torch.zeros(0, 5)):
        got = roundtrip(t)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
    grad = roundtrip(torch.ones(2, requires_grad=True) * 2)
    assert grad.requires_grad
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert np.array_equal(roundtrip(a), a) and roundtrip(np.int64(7)) == 7
    assert str(roundtrip(float("nan"))) == "nan" and roundtrip(float("-inf")) == float("-inf")


def test_subclasses_cross_as_their_plain_base():
    class Agreeable(list):
        def __eq__(self, other):
            return True

    class Loud(str):
        def __eq__(self, other):
            return True

    got = roundtrip(Agreeable([b"ab", b"c"]))
    assert type(got) is list and got != [b"a", b"bc"]
    assert type(roundtrip(Loud("x"))) is str
    point = roundtrip(torch.nn.Parameter(torch.ones(2)))
    assert type(point) is torch.Tensor and point.requires_grad


def test_what_is_not_plain_data_stays_behind():
    with pytest.raises(wire.Unsendable, match="not plain data"):
        wire.encode(object())
    with pytest.raises(wire.Unsendable, match="nested more than"):
        deep = []
        for _ in range(wire.MAX_DEPTH + 5):
            deep = [deep]
        wire.encode(deep)
    with pytest.raises(wire.Unsendable, match="dtype"):
        wire.encode(np.array([object()]))


@pytest.mark.parametrize("data, why", [
    ({"$": "pickle", "v": "gASV"}, "unknown tag"),
    ({"$": "tensor", "dtype": "float32", "shape": [2], "data": "AAAA"}, "bytes of data"),
    ({"$": "tensor", "dtype": "object", "shape": [], "data": ""}, "unknown dtype"),
    ({"$": "ndarray", "dtype": "|O", "shape": [1], "data": ""}, "unknown dtype"),
    ({"$": "ref", "id": 3}, "reference"),
    ({"plain": "dict"}, "not a value"),
    ({"$": "dict", "v": [[[1], 2]]}, "cannot be a key"),
])
def test_malformed_data_is_refused_whole(data, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode(data)


# ---------------------------------------------------------------- the judge's stand-ins (in process)


class Counter:
    def __init__(self):
        self.n = 0
        self.items = [1, 2, 3]

    def add(self, k):
        if k < 0:
            raise ValueError(f"k must be positive, got {k}")
        self.n += k
        return self.n

    def stub(self):
        return self._helper()

    def _helper(self):
        raise NotImplementedError()

    def numbers(self):
        yield from range(3)


def session_for(*objects):
    s = trusted.LocalSession(objects)
    return s, [s.remote(s.server.describe(i)) for i in range(len(objects))]


def test_stand_ins_call_read_and_iterate_on_the_learners_side():
    s, (make_counter,) = session_for(Counter)
    c = make_counter()
    assert isinstance(c, judge.Remote) and judge.type_of(c).endswith("Counter")
    assert c.add(2) == 2 and c.add(3) == 5 and c.n == 5
    assert c.items == [1, 2, 3] and len(c.items) == 3
    assert list(c.numbers()) == [0, 1, 2]
    assert judge.collect(c.numbers(), limit=2) == ([0, 1, 2], False)  # the item after the limit is kept
    assert judge.collect(c.numbers(), limit=3) == ([0, 1, 2], True)
    assert judge.is_instance(c, "builtins.object") and not judge.is_instance(c, "torch.nn.Module")
    judge.set_attr(c, "n", 10)
    assert c.n == 10
    with pytest.raises(AttributeError):
        c.nothing_here
    assert c == c and c != make_counter()


def test_a_learners_error_comes_back_with_its_type_message_and_stub():
    from coursekit.testing import call

    _, (make_counter,) = session_for(Counter)
    c = make_counter()
    with pytest.raises(ValueError, match="k must be positive, got -1") as err:
        c.add(-1)
    assert isinstance(err.value, judge.LearnerError) and err.value.type_name == "ValueError"
    with pytest.raises(AssertionError, match=r"Counter.stub\(\): not written yet \(.*Counter._helper still raises"):
        call(c.stub, label="Counter.stub()")


def test_a_stopiteration_turned_into_runtimeerror_is_placed_at_its_line():
    def gen():
        yield next(iter([]))  # StopIteration inside a generator: Python raises RuntimeError from it

    _, (make,) = session_for(lambda: list(gen()))
    with pytest.raises(RuntimeError) as err:
        make()
    assert err.value.where and err.value.where["function"].endswith("gen") and "next(iter([]))" in \
        (err.value.where["text"] or "next(iter([]))")


def test_the_learners_random_state_is_given_back():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with hidden.untouched():
        torch.rand(10)
    assert torch.equal(before, torch.get_rng_state())


def test_judge_side_seeds_reach_the_learners_side():
    _, (rand,) = session_for(lambda: torch.rand(3))
    with judge.learner_side(seed=7):
        a, b = rand(), rand()
    assert torch.equal(a, b)
    with judge.seeded(7):
        assert torch.equal(a, torch.rand(3))


def test_forbidden_functions_raise_on_the_learners_side_only_during_the_request():
    _, (softmax,) = session_for(lambda x: torch.softmax(x, -1))
    with judge.learner_side(forbid=["torch.softmax"]):
        with pytest.raises(RuntimeError, match="not available here"):
            softmax(torch.zeros(2))
    assert torch.equal(softmax(torch.zeros(2)), torch.full((2,), 0.5))


def test_a_judge_side_function_cannot_be_handed_to_the_learner():
    _, (apply,) = session_for(lambda f: f(1))
    with pytest.raises(judge.GraderError, match="only plain data and stand-ins"):
        apply(lambda x: x)


# ---------------------------------------------------------------- a notebook's connections to the judge


def test_a_hidden_cell_is_judged_once_and_only_if_it_is_the_notebooks(tmp_path):
    calls = []

    @judge.cell("test_judge_demo")
    def check(fn):
        calls.append(fn(2))
        if fn(2) != 4:
            raise AssertionError(f"fn(2) returned {fn(2)}, expected 4")

    path = tmp_path / "judge"
    with judge.RunJudge(path, ["test_judge_demo"], {}, cell_timeout=10) as run:
        hidden.serve(str(path), "test_judge_demo", (lambda x: x * 3,))
        with pytest.raises(RuntimeError, match="already judged"):
            hidden.serve(str(path), "test_judge_demo", (lambda x: x * 2,))
        with pytest.raises(RuntimeError, match="not a test cell of this notebook"):
            hidden.serve(str(path), "test_pre_split", (lambda x: x,))
    assert calls == [6]
    verdict = run.verdicts["test_judge_demo"]
    assert verdict.status == "failed" and verdict.message == "fn(2) returned 6, expected 4"
    assert len(run.refused) == 2


def test_a_connection_that_stops_answering_leaves_the_cell_unfinished(tmp_path):
    @judge.cell("test_judge_hangup")
    def check(fn):
        fn(1)

    path = tmp_path / "judge"
    with judge.RunJudge(path, ["test_judge_hangup"], {}, cell_timeout=10) as run:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
            wire.send(sock, {"hello": "test_judge_hangup", "objects": [{"$": "ref", "id": 0, "type": "function"}]})
            wire.receive(sock)  # the judge's first request: hang up instead of answering
    assert run.verdicts["test_judge_hangup"].status == "unfinished"


def test_garbage_on_the_socket_is_survived(tmp_path):
    path = tmp_path / "judge"
    with judge.RunJudge(path, ["test_x"], {}, cell_timeout=10) as run:
        for garbage in (b"\x00" * 8, b"\xff" * 16, b"{not json at all"):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(str(path))
                sock.sendall(garbage)
        done = threading.Event()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
            wire.send(sock, {"executed": "{}", "status": "ran"})
            done.set()
    assert run.verdicts == {} and run.executed == {"executed": "{}", "status": "ran"}


# ---------------------------------------------------------------- partial credit: a cell's checks in weighted parts


def judge_local(grade_id: str, *objects) -> judge.Verdict:
    session = trusted.LocalSession(objects)
    stand_ins = [session.remote(session.server.describe(i)) for i in range(len(objects))]
    return judge.judge(session, grade_id, stand_ins, {})


@judge.cell("test_parts_demo", parts={"values": 3, "errors": 1})
def _check_parts_demo(fn):
    with judge.part("values"):
        for x in (1, 2, 3):
            if fn(x) != 2 * x:
                raise AssertionError(f"fn({x}) returned {fn(x)}, expected {2 * x}")
    with judge.part("errors"):
        try:
            fn(-1)
        except ValueError:
            return
        raise AssertionError("fn(-1) returned a value; expected ValueError")


def double(x):
    if x < 0:
        raise ValueError("negative")
    return 2 * x


def test_a_cell_whose_parts_all_pass_earns_everything():
    verdict = judge_local("test_parts_demo", double)
    assert verdict.passed and verdict.fraction == 1.0 and verdict.message == ""
    assert [(p.name, p.weight, p.passed) for p in verdict.parts] == [("values", 3, True), ("errors", 1, True)]


def test_one_failing_part_costs_its_weight_only():
    verdict = judge_local("test_parts_demo", lambda x: 2 * x)  # no error for negative numbers
    assert verdict.status == "failed" and verdict.fraction == 0.75
    assert verdict.message == "[errors: 1 of 4] fn(-1) returned a value; expected ValueError"


def test_an_error_of_the_learners_code_fails_its_part_and_the_next_part_still_runs():
    def broken(x):
        if x == 2:
            raise KeyError(x)
        return 2 * x if x > 0 else (_ for _ in ()).throw(ValueError("negative"))

    verdict = judge_local("test_parts_demo", broken)
    assert verdict.fraction == 0.25
    assert [p.passed for p in verdict.parts] == [False, True]
    assert "KeyError" in verdict.parts[0].message


def test_a_cell_without_parts_is_one_part_all_or_nothing():
    @judge.cell("test_parts_whole")
    def check(fn):
        if fn(1) != 2:
            raise AssertionError("fn(1) should be 2")

    assert judge_local("test_parts_whole", double).fraction == 1.0
    verdict = judge_local("test_parts_whole", lambda x: x)
    assert verdict.fraction == 0.0 and verdict.message == "fn(1) should be 2"
    assert [p.name for p in verdict.parts] == [judge.WHOLE]


def test_an_undeclared_or_untested_part_is_the_graders_mistake_not_a_pass():
    @judge.cell("test_parts_undeclared", parts={"a": 1})
    def check(fn):
        with judge.part("b"):
            fn(1)

    assert judge_local("test_parts_undeclared", double).status == "grader-error"

    @judge.cell("test_parts_untested", parts={"a": 1, "b": 1})
    def check2(fn):
        with judge.part("a"):
            fn(1)

    verdict = judge_local("test_parts_untested", double)
    assert verdict.fraction == 0.5 and "never reached" in verdict.message


def test_parts_must_have_positive_weights():
    with pytest.raises(ValueError, match="positive weights"):
        judge.cell("test_parts_bad", parts={"a": 0})
    with pytest.raises(ValueError, match="positive weights"):
        judge.cell("test_parts_bad", parts={"a": float("nan")})


def test_a_verdict_crosses_between_processes_as_plain_data():
    verdict = judge_local("test_parts_demo", lambda x: 2 * x)
    again = judge.Verdict.from_dict(json.loads(json.dumps(verdict.to_dict())))
    assert again == verdict and again.fraction == 0.75


def test_a_part_entered_in_a_loop_passes_only_if_it_passes_every_time():
    @judge.cell("test_parts_loop", parts={"each x": 1})
    def check(fn):
        for x in (1, 2, 3):
            with judge.part("each x"):
                if fn(x) != 2 * x:
                    raise AssertionError(f"fn({x}) returned {fn(x)}")

    verdict = judge_local("test_parts_loop", lambda x: 2 * x if x != 2 else 0)
    assert verdict.fraction == 0.0 and verdict.message == "fn(2) returned 0"
    assert judge_local("test_parts_loop", double).fraction == 1.0


# ---------------------------------------------------------------- served modules: calls made during a request


def judged(how: str, tmp_path, grade_id: str, *objects) -> judge.Verdict:
    """The verdict of ``grade_id`` on ``objects``: in this process (``local``) or over a real socket (``socket``)."""
    if how == "local":
        return judge_local(grade_id, *objects)
    path = tmp_path / "judge"
    with judge.RunJudge(path, [grade_id], {}, cell_timeout=10) as run:
        hidden.serve(str(path), grade_id, objects)
    return run.verdicts[grade_id]


SERVED = torch.nn.Linear(4, 3)  # the judge's weights: the learner's side never holds them


def twice_served(x):
    """The learner's side of a served module: its output comes from the judge."""
    return hidden.ask_judge(0, x) * 2


@judge.cell("test_serve_counted")
def _check_serve_counted(fn):
    served = judge.serve(SERVED)
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
    got = fn(x)
    with torch.no_grad():
        assert torch.equal(got, SERVED(x) * 2), "the served output differs"
    assert served.take() == [(2, 5, 4)], "the call was not counted"
    assert served.take() == [], "take forgets what it gave"
    fn(x[0])
    assert served.take() == [(5, 4)]


@pytest.mark.parametrize("how", ["local", "socket"])
def test_a_served_module_is_computed_and_counted_by_the_judge_during_its_request(how, tmp_path):
    verdict = judged(how, tmp_path, "test_serve_counted", twice_served)
    assert verdict.passed, verdict.message


@judge.cell("test_serve_refused", parts={"call": 1, "next request": 1})
def _check_serve_refused(fn):
    judge.serve(SERVED)
    with judge.part("call"):
        fn()  # the learner's error: a WireError naming what was refused
    with judge.part("next request"):
        assert judge.is_instance(fn, "builtins.object")  # the session goes on after a refusal


def _calls(n: int, x=None):
    def run():
        for _ in range(n):
            try:
                hidden.ask_judge(0, torch.zeros(1, 4) if x is None else x)
            except Exception:  # noqa: BLE001 (a refusal is not an Exception: the learner's code cannot swallow it)
                pass
    return run


def _sends(message):
    return lambda: hidden._channel(message)


@pytest.mark.parametrize("how", ["local", "socket"])
@pytest.mark.parametrize("fn, why", [
    (_calls(4), "more than 3 calls of its modules in one request"),
    (_calls(1, torch.zeros(3, 4)), "an input of 12 numbers \\(the limit is 10\\)"),
    (_calls(1, torch.zeros(2, 5)), "an input of shape \\(2, 5\\) and dtype float32, where the module takes"),
    (_calls(1, torch.zeros(2, 4, dtype=torch.float64)), "dtype float64"),
    (_calls(1, [1.0, 2.0, 3.0, 4.0]), "an input that is list, not a tensor"),
    (_sends({"serve": 1, "input": None}), "a call of no module the grader serves"),
    (_sends({"serve": "0"}), "a call of no module the grader serves"),
    (_sends({"serve": True}), "a call of no module the grader serves"),
    (_sends({"serve": 0, "input": {"$": "tensor", "dtype": "float32", "shape": [4], "data": "!!"}}),
     "a call it refuses"),
    (_sends({"serve": 0, "input": {"$": "nothing"}}), "a call it refuses"),
])
def test_too_many_too_large_or_malformed_serve_calls_are_the_learners_wire_error(how, fn, why, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(judge, "MAX_SERVES", 3)
    monkeypatch.setattr(judge, "MAX_SERVE_NUMBERS", 10)
    verdict = judged(how, tmp_path, "test_serve_refused", fn)
    call, after = verdict.parts
    assert not call.passed and call.message.startswith("WireError: the notebook's side sent the grader ")
    assert re.search(why, call.message), call.message
    assert after.passed, after.message


def test_a_served_module_answers_only_during_a_request():
    with pytest.raises(RuntimeError, match="only while a hidden test runs"):
        twice_served(torch.zeros(1, 4))
    session = trusted.LocalSession(())
    assert "no request is pending" in session.serve({"serve": 0, "input": None})["refused"]


@judge.cell("test_function_served", parts={"call": 1, "next request": 1})
def _check_function_served(fn):
    served = judge.serve_function(lambda done: done * 10)
    with judge.part("call"):
        fn()  # the learner's side calls it; a refusal is its WireError
        assert served.calls == [3], f"the judge recorded {served.calls}"
    with judge.part("next request"):
        assert judge.is_instance(fn, "builtins.object")


@pytest.mark.parametrize("how", ["local", "socket"])
@pytest.mark.parametrize("argument, why", [
    (3, None),  # answered by the judge, recorded there
    ("3", "an argument that is str, not a number"),
    (True, "an argument that is bool, not a number"),
    (torch.tensor(3), "an argument that is torch.Tensor, not a number"),
    ([3], "an argument that is list, not a number"),
])
def test_a_served_function_answers_numbers_and_refuses_anything_else(how, argument, why, tmp_path):
    """Chapter 8's evaluate is the judge's (``serve_function``): what the learner's side sends it is recorded there
    only when it is a number; anything else fails that request as the learner's error, and the session goes on."""
    def call():
        assert hidden.ask_judge(0, argument) == 30
    verdict = judged(how, tmp_path, "test_function_served", call)
    first, after = verdict.parts
    if why is None:
        assert first.passed, first.message
    else:
        assert not first.passed and first.message.startswith("WireError: the notebook's side sent the grader ")
        assert why in first.message, first.message
    assert after.passed, after.message
