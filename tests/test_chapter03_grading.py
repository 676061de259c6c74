"""Tests of the tests, chapter 3 (masked attention) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch03_attention.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch03_attention as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_causal_mask", "test_softmax", "test_attention", "test_causal_self_attention"]
SOLUTION_IDS = ["causal_mask", "softmax", "attention", "causal_self_attention"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
