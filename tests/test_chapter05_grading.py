"""Tests of the tests, chapter 5 (the generation loop) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch05_generation.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch05_generation as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_last_logits", "test_token_stream", "test_stop_strings", "test_text_stream"]
SOLUTION_IDS = ["last_logits", "token_stream", "stop_strings", "text_stream"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
