"""The grader's own work on one learner's notebook is linear in its size (DESIGN.md, invariant 5): intake, review
notes, the scores and the autograded copy, the inert copies, the feedback notebook, the errors named in the table.
A notebook of hostile text (tests/submissions/hostile.py: ``text_bomb``: thousands of cells, long lines, every marker
nbgrader and the course use, hidden-test blocks that never end) of 1, 2, 4, 8 and 20 MB (the intake's limit); the
grader's CPU time (``time.process_time``, this process's own: no sandbox, no judge, no nbgrader command runs here)
grows no faster than the size, and the 20 MB one takes seconds. (nbgrader's own preprocessors, ``intake.sanitize``,
need a workspace's gradebook: not measured here.)"""
from __future__ import annotations

import gc
import time

import nbformat
import pytest

from autograder import inert, intake, reports, scoring
from autograder.base import Result
from autograder.run import RunOutcome, judged_cells, skipped_when_graded, solution_cell_names
from submissions import hostile, learner_notebook

CHAPTER = hostile.CHAPTER
MB = 1 << 20
SIZES = [1, 2, 4, 8]  # MB
FLOOR = 0.05  # seconds: below it a time is noise, not a rate
LIMIT_20MB = 20.0  # seconds of the grader's CPU for a notebook of the intake's limit (about 3 on the 2-core machine)


def run_outputs(nb: dict) -> dict[int, tuple[list, int]]:
    """What a run of the notebook would send back: an error in each cell of the learner's own, as IPython shows one
    (the cell's place is read from its traceback), each cell run once, in order."""
    error = {"output_type": "error", "ename": "NameError", "evalue": "name 'socket' is not defined",
             "traceback": ["\x1b[0;31mNameError\x1b[0m  Traceback", "Cell In[{n}], line 1", "----> 1 socket.x"]}
    outputs = {}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            shown = dict(error, traceback=[line.format(n=i + 1) for line in error["traceback"]])
            outputs[i] = ([nbformat.from_dict(shown)], i + 1)
    return outputs


def grader_steps(data: bytes, outputs: dict, release: nbformat.NotebookNode, released: dict[str, str]) -> None:
    """What the grader's process does with one notebook, but nbgrader's sanitizing and the gradebook."""
    nb = intake.read_notebook(data)
    assert not isinstance(nb, str), nb
    assert intake.malformed(nb) == ""
    assert intake.wrong_chapter(nb, released, {}) is None
    notes = intake.review_notes(nb, release, CHAPTER)
    assert len(notes) <= intake.MAX_REVIEW_NOTES + 4, len(notes)
    skipped_when_graded(nb, release)
    solution_cell_names(nb)
    judged_cells(nb)
    scoring.cell_scores(nb, {})
    autograded = scoring.assemble(nb, RunOutcome({}, outputs, 0.0))
    inert.notebook(autograded)  # what record() writes for the formgrader
    errors = scoring.cell_errors(autograded)
    assert errors and errors[0].startswith("a cell before the first graded one: NameError"), errors[:1]
    reports.feedback_notebook(autograded)
    inert.terminal(data.decode("ascii"))  # a kept log as long as the notebook
    reports.format_table([Result("bomb", CHAPTER, "graded", 0, 13, review=notes, cell_errors=errors)])


@pytest.fixture(scope="module")
def release():
    return learner_notebook(CHAPTER, None)


def cpu_seconds(size_mb: float, release) -> float:
    import json

    text = hostile.text_bomb(int(size_mb * MB))
    outputs = run_outputs(json.loads(text))
    released = {c.metadata["nbgrader"]["grade_id"]: c.source for c in release.cells if "nbgrader" in c.metadata}
    data = text.encode("ascii")
    gc.collect()
    start = time.process_time()
    grader_steps(data, outputs, release, released)
    return time.process_time() - start


def test_the_graders_time_grows_linearly_with_a_hostile_notebook(release):
    seconds = {size: cpu_seconds(size, release) for size in SIZES}
    print(" ".join(f"{size} MB: {s:.2f} s" for size, s in seconds.items()))
    for small, big in zip(SIZES, SIZES[1:]):  # each doubling: at most twice the time, and noise
        assert seconds[big] < 2 * 1.5 * max(seconds[small], FLOOR), seconds
    assert seconds[8] < 8 * 2 * max(seconds[1], FLOOR), seconds


def test_a_notebook_of_the_intakes_limit_costs_the_grader_seconds(release):
    size = intake.MAX_SUBMISSION / MB
    seconds = cpu_seconds(size, release)
    print(f"{size:g} MB: {seconds:.2f} s")
    assert seconds < LIMIT_20MB, seconds
