"""Tests of the tests, chapter 1 (tokens), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch01_tokens.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
The same mutants and variants also go through the hidden checks in this process (`hidden_check_tests`): every cell
a mutant loses, its hidden check loses (the hidden part of a test cell runs before its visible tests).
"""
from submissions import ch01_tokens as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_pre_split", "test_bpe_merge", "test_encode_ordinary", "test_special_tokens", "test_decode",
              "test_matches_tiktoken"]
SOLUTION_IDS = ["pre_split", "bpe_merge", "bpe_merge_fast", "tokenizer", "train_bpe"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
globals().update(hidden_check_tests(ch))
