"""Tests of the tests, chapter 5 (the generation loop), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch05_generation.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
"""
from submissions import ch05_generation as ch
from submissions.grading import nbgrader_tests

TEST_CELLS = ["test_last_logits", "test_token_stream", "test_stop_strings", "test_text_stream"]
SOLUTION_IDS = ["last_logits", "token_stream", "stop_strings", "text_stream"]

# One torch thread per grading kernel: the notebook runs small models, and on a busy machine two threads wait on
# each other (a 30-token run of the course's model: 7 s instead of 1 s).
globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
