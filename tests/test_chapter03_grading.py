"""Tests of the tests, chapter 3 (masked attention), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch03_attention.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
The same mutants and variants also go through the hidden checks in this process (`hidden_check_tests`): the
visible tests use only the function of their own cell, so every cell a mutant loses, its hidden check loses too.
"""
from submissions import ch03_attention as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_causal_mask", "test_softmax", "test_attention", "test_causal_self_attention"]
SOLUTION_IDS = ["causal_mask", "softmax", "attention", "causal_self_attention"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
globals().update(hidden_check_tests(ch))
