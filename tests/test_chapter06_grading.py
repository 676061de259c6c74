"""Tests of the tests, chapter 6 (samplers) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch06_samplers.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch06_samplers as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_temperature", "test_filters", "test_penalties", "test_sample", "test_beam_search"]
SOLUTION_IDS = ["temperature", "filters", "penalties", "sample", "beam_search"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
