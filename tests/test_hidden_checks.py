"""What every chapter's hidden checks owe the notebook they run in and the learner who reads their messages.

The hidden test cells run in the learner's kernel, between the learner's own cells: a check that reseeds a
global random generator changes what the learner's next cells compute (a sampling demo, a training step).
The checks seed generators of their own, or fork torch's and put it back.
"""
import random

import numpy as np
import pytest
import torch

from autograder import base, intake
from submissions import hidden_tests, learner_namespace

CHAPTERS = intake.graded_chapters(base.DEFAULT_COURSE_ROOT)


def random_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def same_states(a, b) -> list[str]:
    """The generators whose states differ."""
    changed = []
    if not torch.equal(a[0], b[0]):
        changed.append("torch")
    if a[1] != b[1]:
        changed.append("random")
    if not (a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:]):
        changed.append("numpy")
    return changed


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hidden_checks_leave_the_notebooks_random_state_alone(chapter, torch_one_thread):
    namespace = learner_namespace(chapter, {})  # the reference answers
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    moved = {}
    for grade_id, source in hidden_tests(chapter).items():
        before = random_states()
        exec(source, dict(namespace))
        changed = same_states(before, random_states())
        if changed:
            moved[grade_id] = changed
    assert moved == {}, f"hidden checks that moved the notebook's random generators: {moved}"


def test_a_call_that_reaches_a_stub_names_the_stub():
    """A method may be written and the helper it calls not: "not written yet" names the function that raised."""
    from coursekit.testing import call, expect_raises

    class Cache:
        def append(self, k):
            return self._grow(k)

        def _grow(self, k):
            raise NotImplementedError()

    with pytest.raises(AssertionError, match=r"^Cache\.append\(1\): not written yet "
                                             r"\(test_a_call_that_reaches_a_stub_names_the_stub\.<locals>\.Cache\._grow "
                                             r"still raises NotImplementedError\)$"):
        call(Cache().append, 1, label="Cache.append(1)")
    with pytest.raises(AssertionError, match=r"not written yet \(.*Cache\._grow still raises"):
        expect_raises(ValueError, Cache().append, -1)


# ---------------------------------------------------------------- the one comparison every check uses


@pytest.mark.parametrize("got, want, kwargs, same", [
    (1.0 + 1e-7, 1.0, {}, True),
    (float("nan"), 1.0, {}, False),  # abs(nan - 1) > tol is False: a hand-written check would pass it
    (1.0, float("nan"), {}, False),
    (float("nan"), float("nan"), {}, True),  # expected there, in the same place
    (float("inf"), float("inf"), {}, True),
    (float("-inf"), float("inf"), {}, False),
    (float("inf"), 2.7e43, {"rtol": 1e-6}, False),  # e ** 100: finite in float64, inf if read as float32
    (1e-3 * (1 + 1e-8), 1e-3, {"atol": 0, "rtol": 1e-9}, False),  # a relative tolerance float32 cannot hold
    ([1.0, float("nan")], [1.0, float("nan")], {}, True),
    ([1.0, float("nan")], [1.0, 2.0], {}, False),
    (torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 3.0]), {}, False),
    (np.array([0.5, 0.25]), [0.5, 0.25], {}, True),
    ([1.0, 2.0], [1.0, 2.0, 3.0], {}, False),  # shapes differ
    ("1.0", 1.0, {}, False),  # not a number
    (1 + 2j, 1 + 2j, {}, True),
])
def test_close_fails_a_non_finite_value_unless_it_is_expected_in_the_same_place(got, want, kwargs, same):
    from coursekit.testing import close

    assert close(got, want, **kwargs) is same


def test_a_message_names_an_object_by_its_type_not_its_address():
    """A message that changed from one process to the next (an address) would tell two runs of one notebook apart."""
    from coursekit.testing import describe_call

    label = describe_call("get_batch", (torch.tensor([1, 2]), torch.Generator().manual_seed(0)), {"f": object()})
    assert label == "get_batch(tensor([1, 2], dtype=int64), <a Generator>, f=<a object>)", label
    assert "0x" not in describe_call("f", ([torch.Generator()],))


def test_a_visible_test_names_the_expression_it_checks_not_a_lambda():
    """A test cell's ``expect(lambda: ...)`` is named by what the cell wrote, the lambda's parameters by the values
    passed (the cell's source is in linecache, as IPython keeps it), where it said ``<lambda>()``."""
    import linecache

    from coursekit.testing import expect

    cell = ("def left_pad(rows, pad_id):\n    return [[pad_id] + row for row in rows], None\n"
            "expect(lambda: left_pad([[4], [5, 6]],\n"
            "                        50256)[0], want=[[50256, 4], [5, 6]], hint='pad to the longest row')\n")
    with_args = "expect(lambda *a: sorted(set(*a)), [3, 1, 3], want=[1, 3, 3])\n"
    for source, message in [(cell, "left_pad([[4], [5, 6]], 50256)[0] returned [[50256, 4], [50256, 5, 6]], "
                                    "expected [[50256, 4], [5, 6]]\nHint: pad to the longest row"),
                            (with_args, "sorted(set([3, 1, 3])) returned [1, 3], expected [1, 3, 3]")]:
        name = f"<ipython-input-{len(source)}>"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        try:
            with pytest.raises(AssertionError) as failed:
                exec(compile(source, name, "exec"), {"expect": expect})
        finally:
            del linecache.cache[name]
        assert str(failed.value) == message
    with pytest.raises(AssertionError, match=r"^<lambda>\(\) returned 1, expected 2$"):  # no source: as before
        exec(compile("expect(lambda: 1, want=2)", "<string>", "exec"), {"expect": expect})
