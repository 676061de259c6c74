"""Tests of the tests, chapter 10 (batching) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch10_batching.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch10_batching as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_left_pad", "test_position_ids", "test_padded_causal_mask", "test_forward_padded",
              "test_generate_batch"]
SOLUTION_IDS = ["left_pad", "position_ids", "padded_causal_mask", "forward_padded", "generate_batch"]

# Parameters no hidden case can give another value or leave out (tests/submissions/coverage.py), and why.
CHANGING = "chapter 10's cases are being changed for issue 46: add a case then"
NOT_COVERED = {
    "generate_batch(max_new_tokens)": CHANGING,  # never left out
    "generate_batch(stop)": CHANGING,  # never a single string
}

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS, NOT_COVERED))
