"""Tests of the tests, chapter 4 (the transformer), through real `nbgrader autograde` (DESIGN.md, invariant 6).

Each notebook of this chapter takes nbgrader several seconds (a kernel, torch, transformers, Hugging Face
models built and saved), so the one grading run, of one class folder, takes a sample: the reference, the
untouched notebook, the mistakes in GRADED_MUTANTS and the answers in GRADED_VARIANTS. Every mistake and every
answer of tests/submissions/ch04_transformer.py, sample included, also goes through the hidden checks in this
process, a second or two each. The tests are the ones chapters share (tests/submissions/grading.py).
"""
from submissions import ch04_transformer as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

TEST_CELLS = ["test_layer_norm", "test_mlp", "test_block", "test_gpt"]
SOLUTION_IDS = ["layer_norm", "mlp", "block", "gpt"]
# One mistake in each part, the ones the course most wants caught, one of each class of issue 12 (the window,
# dtypes, numeric range, gradients: a bug charged in every cell that uses it), and three ways of writing it right.
GRADED_MUTANTS = ["ln-unbiased-variance", "ln-eps-outside-sqrt", "gelu-exact-erf", "mlp-no-activation",
                  "block-post-norm", "block-no-mlp-residual", "gpt-no-ln-f", "gpt-untied-head",
                  "gpt-positions-by-hand", "gelu-upcast-float32", "gelu-tanh-by-exp", "gpt-no-grad",
                  "ln-detached-stats"]
GRADED_VARIANTS = ["torch-built-ins", "modules", "upcast-stable-exp"]

globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS, mutants=GRADED_MUTANTS, variants=GRADED_VARIANTS))
globals().update(hidden_check_tests(ch))
