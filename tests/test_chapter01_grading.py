"""Tests of the tests, chapter 1 (tokens) (DESIGN.md, invariant 6).

The reference, the untouched notebook, every mutant and every variant of tests/submissions/ch01_tokens.py, each
graded by the hidden checks through the real judge, in the chapter's warm kernel (tests/submissions/grading.py)."""
from submissions import ch01_tokens as ch
from submissions.grading import chapter_tests

TEST_CELLS = ["test_pre_split", "test_bpe_merge", "test_encode_ordinary", "test_special_tokens", "test_decode",
              "test_matches_tiktoken"]
SOLUTION_IDS = ["pre_split", "bpe_merge", "bpe_merge_fast", "tokenizer", "train_bpe"]

# Parameters no hidden case can give another value or leave out (tests/submissions/coverage.py), and why.
NOT_COVERED = {
    "Tokenizer.encode(disallowed_special)": "any value but \"all\" goes to the given encode_disallowing (Step 6), "
                                            "which the notebook defines after its last test cell",
}

globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS, NOT_COVERED))
