"""Tests of the tests, chapter 9 (constrained decoding), through real sandboxed grading (DESIGN.md, invariant 6).

The reference, the untouched notebook, the mutants in `NBGRADER_MUTANTS` and every variant of
tests/submissions/ch09_constrained.py, one class folder graded in one run; the tests are the ones every chapter shares
(tests/submissions/grading.py), and the hidden checks of every mutant and variant in this process too.
"""
from submissions import ch09_constrained as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_choices", "test_plain_regex", "test_fast_mask", "test_schema", "test_generate"]
SOLUTION_IDS = ["choices", "plain_regex", "fast_mask", "schema", "generate"]


def test_enough_mistakes_are_graded_by_nbgrader():
    assert set(ch.NBGRADER_MUTANTS) <= {m.key for m in ch.MUTANTS}
    assert len(ch.NBGRADER_MUTANTS) >= 10 and len(ch.VARIANTS) >= 3


globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS, mutants=ch.NBGRADER_MUTANTS))
globals().update(hidden_check_tests(ch))
