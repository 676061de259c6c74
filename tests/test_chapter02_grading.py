"""Tests of the tests, chapter 2 (embeddings), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch02_embeddings.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
The same mutants and variants also go through the hidden checks in this process (a second or so each).
"""
from submissions import ch02_embeddings as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_one_hot", "test_embedding_lookup", "test_embeddings"]
SOLUTION_IDS = ["one_hot", "embedding_lookup", "embeddings"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
globals().update(hidden_check_tests(ch))
