"""The warm kernel (tests/submissions/kernel.py) runs a notebook as the grader's sandboxed kernel does: the things that
could make the chapters' tests of the tests differ from real grading, each on a small notebook of its own.
tests/test_grading_batch.py compares the two on the course's notebooks."""
import nbformat
import pytest

from autograder import base, scoring
from submissions import grading

CHAPTER = "03-attention"


def notebook(*sources: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])


def errors(outcome) -> dict[int, str]:
    """{cell index: "ename: evalue"} of the cells that raised."""
    return {i: f"{o.ename}: {o.evalue}" for i, (outputs, _) in outcome.outputs.items() for o in outputs
            if o.output_type == "error"}


@pytest.fixture(scope="module")
def kernel():
    with grading.warm_kernel(CHAPTER) as k:
        yield k


def test_cells_run_in_order_and_a_cell_that_raises_does_not_stop_the_next(kernel):
    outcome = kernel.run(notebook("x = 1", "", "raise ValueError(x)", "y = x + 1", "print(y)\nassert y == 3, y"))
    assert errors(outcome) == {2: "ValueError: 1", 4: "AssertionError: 2"}
    assert {i: count for i, (_, count) in outcome.outputs.items()} == {0: 1, 1: None, 2: 2, 3: 3, 4: 4}
    nb = notebook("x = 1", "", "raise ValueError(x)", "y = x + 1", "print(y)\nassert y == 3, y")
    ran = scoring.assemble(nb, outcome)  # the grader reads where an error was raised from the kernel's traceback
    assert scoring.error_place(ran.cells[4].outputs[-1], ran).endswith(", line 2: `assert y == 3, y`)")


def test_each_notebook_starts_as_a_new_kernel_in_an_empty_folder_of_its_own(kernel):
    first = kernel.run(notebook("import os, torch\nmark = 1\ntorch.set_default_dtype(torch.float64)\n"
                                "open('left-behind', 'w').close()"))
    assert errors(first) == {}
    second = kernel.run(notebook(
        "import os, torch\n"
        "assert 'mark' not in globals(), 'a name of the notebook before'\n"
        "assert torch.get_default_dtype() == torch.float32, torch.get_default_dtype()\n"
        "assert os.listdir('.') == [] and os.path.basename(os.getcwd()) == '03-attention', os.listdir('.')\n"
        "assert os.environ['NBGRADER_EXECUTION'] == 'autograde'\n"
        "assert os.environ['OMP_NUM_THREADS'] == '1' and torch.get_num_threads() == 1"))
    assert errors(second) == {}
    assert second.outputs[0][1] == 1


def test_the_chapters_reference_and_later_ones_are_the_sandboxs_stubs(kernel):
    outcome = kernel.run(notebook("import minigpt.embeddings", "import minigpt.attention", "import minigpt.transformer",
                                  "import autograder.sandboxed.hidden, autograder.sandboxed.wire",
                                  "import autograder.judge",
                                  "import autograder.checks"))
    assert errors(outcome) == {
        1: "ImportError: minigpt.attention is the course's reference solution, which is not available while "
           "03-attention is graded: write it yourself in the notebook",
        2: "ImportError: minigpt.transformer is the course's reference solution, which is not available while "
           "03-attention is graded: write it yourself in the notebook",
        4: "ModuleNotFoundError: No module named 'autograder.judge'",
        5: "ModuleNotFoundError: No module named 'autograder.checks'"}


def test_a_cell_past_its_time_limit_is_interrupted_and_the_next_runs(kernel, monkeypatch):
    monkeypatch.setattr(grading, "LIMITS", base.Limits(cell_timeout=1))
    outcome = kernel.run(notebook("while True:\n    pass", "done = True"))
    assert errors(outcome) == {0: "KeyboardInterrupt: "}
    assert outcome.outputs[1][1] == 2 and not outcome.incident


def test_a_kernel_that_dies_stops_the_notebook_and_the_next_gets_a_new_one(kernel):
    died = kernel.run(notebook("x = 1", "import os\nos._exit(3)", "y = 2"))
    assert "the notebook's kernel died" in died.incident and died.outputs[2] == ([], None)
    assert errors(kernel.run(notebook("x = 1"))) == {}


def test_the_visible_catch_tool_tells_a_visible_failure_from_none(kernel):
    """tools/visible_catch.py (issue 28's measure): the learner's notebook as released, with the reference's answers,
    raises in no test cell; with a mask that leaves out the diagonal, the visible test of causal_mask raises."""
    import importlib.util

    from submissions import ROOT, ch03_attention as ch

    spec = importlib.util.spec_from_file_location("visible_catch", ROOT / "tools" / "visible_catch.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    mutant = next(m for m in ch.MUTANTS if m.key == "mask-off-by-one")
    assert tool.test_cells_that_raise(kernel, grading.submission(ch, "reference")) == []
    assert "test_causal_mask" in tool.test_cells_that_raise(kernel, grading.submission(ch, mutant))
