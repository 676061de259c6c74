"""Tests of the tests, chapter 7 (the KV cache) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch07_kv_cache.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch07_kv_cache as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_kv_cache", "test_attention_with_cache", "test_forward_with_cache", "test_cached_model",
              "test_kv_cache_bytes"]
SOLUTION_IDS = ["kv_cache", "attention_with_cache", "forward_with_cache", "cached_model", "kv_cache_bytes",
                "fast_cache"]

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
