"""Tests of the tests, chapter 1 (tokens), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch01_tokens.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
"""
from submissions import ch01_tokens as ch
from submissions.grading import nbgrader_tests

TEST_CELLS = ["test_pre_split", "test_bpe_merge", "test_encode_ordinary", "test_special_tokens", "test_decode",
              "test_matches_tiktoken"]
SOLUTION_IDS = ["pre_split", "bpe_merge", "tokenizer", "train_bpe"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
