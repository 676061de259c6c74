"""Tests of the tests, chapter 5 (the generation loop), through real `nbgrader autograde` (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch05_generation.py,
one class folder graded in one run; the tests are the ones every chapter shares (tests/submissions/grading.py).
The same mutants and variants also go through the hidden checks in this process (`hidden_check_tests`: seconds,
not minutes), among them one of each class of issue 12: a window exactly full, a model that is not an nn.Module
(a StopIteration named with its line, charged to last_logits in the cells that use it), eos_ids as a generator,
choose given the window only, a stop string that ends the text, text before the stop string in the same token, a
stop string or end-of-text token on the last allowed token.
"""
from submissions import ch05_generation as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_last_logits", "test_token_stream", "test_stop_strings", "test_text_stream"]
SOLUTION_IDS = ["last_logits", "token_stream", "stop_strings", "text_stream"]

# One torch thread per grading kernel: the notebook runs small models, and on a busy machine two threads wait on
# each other (a 30-token run of the course's model: 7 s instead of 1 s).
globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
globals().update(hidden_check_tests(ch))
