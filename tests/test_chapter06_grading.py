"""Tests of the tests, chapter 6 (samplers) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch06_samplers.py,
each graded by the hidden checks through the real judge, in the chapter's warm kernel
(tests/submissions/grading.py)."""
from submissions import ch06_samplers as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_temperature", "test_filters", "test_penalties", "test_sample", "test_beam_search"]
SOLUTION_IDS = ["temperature", "filters", "penalties", "sample", "beam_search"]

# Parameters no hidden case can give another value or leave out (tests/submissions/coverage.py), and why.
HF_EXTRAS = ("the given first lines hand it to hf_cut; answers that replace the cell without them (as the notebook "
             "was before issue 17) keep full marks (tests/submissions/ch06_samplers.py), so no case passes it")
NOT_COVERED = {f"{cut}({name})": HF_EXTRAS for cut in ("top_k_filter", "top_p_filter", "min_p_filter")
               for name in ("min_tokens_to_keep", "filter_value")}

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS, NOT_COVERED))
