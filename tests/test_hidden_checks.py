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
