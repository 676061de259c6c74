"""Tests of the tests, chapter 7 (the KV cache), through real `nbgrader autograde` (DESIGN.md, invariant 6).

Each notebook of this chapter takes nbgrader several seconds (a kernel, torch, small GPTs generating), so the
one grading run, of one class folder, takes a sample: the reference, the untouched notebook, the mistakes in
GRADED_MUTANTS and the answers in GRADED_VARIANTS. Every mistake and every answer of
tests/submissions/ch07_kv_cache.py, sample included, also goes through the hidden checks in this process, a few
seconds each. The tests are the ones chapters share (tests/submissions/grading.py).
"""
from submissions import ch07_kv_cache as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_kv_cache", "test_attention_with_cache", "test_forward_with_cache", "test_cached_model",
              "test_kv_cache_bytes"]
SOLUTION_IDS = ["kv_cache", "attention_with_cache", "forward_with_cache", "cached_model", "kv_cache_bytes", "fast_cache"]
# The mistakes the course most wants caught (keys and values stored wrong, a mask that hides the past, positions
# that restart, a stale cache, beams sharing a cache), one of each class of issue 12 (a float32 buffer under
# float64 keys, charged in the three cells that use it; exp overflowing; the shape after a prefill; an eviction
# that is not least-recently-used; caches shared by two CachedModels; a cache dropped at a window exactly full; a
# StopIteration named with its cell and line), and every way of writing it right.
GRADED_MUTANTS = ["cat-wrong-dim", "values-not-cached", "mask-hides-cache", "no-position-offset",
                  "cache-never-reset", "beams-share-parent", "float32-concatenation", "softmax-overflow",
                  "last-row-only", "fifo-eviction", "caches-global", "reset-at-full-window", "next-without-default"]
GRADED_VARIANTS = [v.key for v in ch.VARIANTS]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS, mutants=GRADED_MUTANTS, variants=GRADED_VARIANTS))
globals().update(hidden_check_tests(ch))
