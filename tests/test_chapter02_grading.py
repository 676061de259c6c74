"""Tests of the tests, chapter 2 (embeddings) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch02_embeddings.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch02_embeddings as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_one_hot", "test_embedding_lookup", "test_embeddings"]
SOLUTION_IDS = ["one_hot", "embedding_lookup", "embeddings"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
