"""Tests of the tests, chapter 9 (constrained decoding) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch09_constrained.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch09_constrained as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_choices", "test_plain_regex", "test_fast_mask", "test_schema", "test_generate"]
SOLUTION_IDS = ["choices", "plain_regex", "fast_mask", "schema", "generate"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
