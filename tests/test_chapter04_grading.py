"""Tests of the tests, chapter 4 (the transformer) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch04_transformer.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch04_transformer as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_layer_norm", "test_mlp", "test_block", "test_gpt"]
SOLUTION_IDS = ["layer_norm", "mlp", "block", "gpt"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
