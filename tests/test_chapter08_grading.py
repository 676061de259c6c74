"""Tests of the tests, chapter 8 (training), through real sandboxed grading (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch08_training.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py),
and the hidden checks of every mutant and variant in this process too.
"""
from submissions import ch08_training as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_get_batch", "test_cross_entropy", "test_estimate_loss", "test_lr_at", "test_train_step",
              "test_train"]
SOLUTION_IDS = ["get_batch", "cross_entropy", "estimate_loss", "lr_at", "train_step", "train"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
globals().update(hidden_check_tests(ch))
