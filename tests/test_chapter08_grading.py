"""Tests of the tests, chapter 8 (training) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch08_training.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch08_training as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_get_batch", "test_cross_entropy", "test_estimate_loss", "test_lr_at", "test_train_step",
              "test_train"]
SOLUTION_IDS = ["get_batch", "cross_entropy", "estimate_loss", "lr_at", "train_step", "train"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
