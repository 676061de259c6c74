"""Tests of the tests, chapter 8 (training) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch08_training.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch08_training as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_get_batch", "test_cross_entropy", "test_estimate_loss", "test_lr_at", "test_train_step",
              "test_train"]
SOLUTION_IDS = ["get_batch", "cross_entropy", "estimate_loss", "lr_at", "train_step", "train"]

# Parameters no hidden case can give another value or leave out (tests/submissions/coverage.py), and why.
CHECK_TRAIN = ("check_train gives it in every case; a case that leaves it out belongs there (check_train is being "
               "changed for issue 46: add it then)")
NOT_COVERED = {
    "train(progress)": "it only says whether train prints its progress, which no score reads",
    "train(generator)": CHECK_TRAIN, "train(eval_every)": CHECK_TRAIN, "train(start_step)": CHECK_TRAIN,
}

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS, NOT_COVERED))
