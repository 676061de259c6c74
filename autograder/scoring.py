"""Scores: from the judge's verdicts to the gradebook, and the autograded notebook that explains them.

A test cell's score is its points times the share of its checks' weights that passed (``cell_scores``), written
into the workspace's gradebook through nbgrader's own SaveAutoGrades with one change: the score is the judge's,
never read from the notebook's outputs (``judged_grades``). The autograded notebook (what the formgrader shows)
is the sanitized submission with the run's outputs, checked and cut, and each test cell's verdict; it explains
the score and never makes it."""
from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import nbformat

from autograder import inert
from autograder.base import ANSI_ESCAPE, LostPoints, Result, Submission
from autograder.intake import EXCHANGE_RECEIPT, cell_names
from autograder.run import RunOutcome, hidden_blocks, judged_cells
from autograder.workspace import Workspace, autograded_path, submitted_path

# A cell of seven weighted parts, all failed, says seven things, each with its hint on a line of its own: the limits
# keep all of them (a hint cut off at the part that matters is worse than a long note), and stop a message that is
# only long.
MESSAGE_MAX_LINES = 16
MESSAGE_MAX_CHARS = 4000


def assemble(nb: nbformat.NotebookNode, run: RunOutcome) -> nbformat.NotebookNode:
    """The sanitized notebook with the outputs the run reported (only text and pictures, cut to size, and only
    if the executed notebook has the same cells) and, in each test cell with hidden tests, what the judge found:
    each part's weight and result where the cell has several, and an error output when its tests failed or did
    not run. What is shown here explains the score; it never makes it (``cell_scores``)."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = run.outputs.get(i, ([], None))
        meta = cell.metadata.get("nbgrader", {})
        if not (meta.get("grade") and hidden_blocks(cell.source)):
            continue
        verdict = run.verdicts.get(meta["grade_id"])
        if verdict is None and not any(o.output_type == "error" for o in cell.outputs):
            # (a cell whose own error stopped it before its hidden tests is explained by that error)
            cell.outputs.append(_error("NotRun", "the hidden tests of this cell did not run" + (
                f": {run.incident}" if run.incident else " (the notebook stopped them before they reached the grader)")))
        elif verdict is not None and not verdict.passed:
            if verdict.parts_report():
                cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=verdict.parts_report()))
            cell.outputs.append(_error(verdict.ename, verdict.message))
    return nb


def cell_scores(nb: nbformat.NotebookNode, verdicts: dict) -> dict[str, float]:
    """{grade_id: score} of every test cell with hidden tests, from the judge's verdicts alone: the cell's points
    times the share of its checks' weights that passed; 0 where its hidden tests did not reach the judge. Nothing
    the notebook shows (an output, a number, an error) enters it."""
    points = {}
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id"):
            points.setdefault(c.metadata["nbgrader"]["grade_id"], float(c.metadata["nbgrader"].get("points") or 0))
    scores = {}
    for grade_id in judged_cells(nb):
        verdict = verdicts.get(grade_id)
        scores[grade_id] = verdict.score(points[grade_id]) if verdict is not None else 0.0
    return scores


def _error(ename: str, evalue: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def judged_grades(scores: dict[str, float]):
    """nbgrader's SaveAutoGrades (its gradebook rows, comments and bookkeeping), but a test cell's score is the
    judge's: nbgrader's own rule (``determine_grade``) reads it from the cell's outputs, which the learner's code
    wrote. A graded cell that the judge does not score waits for manual grading."""
    from nbgrader.preprocessors import SaveAutoGrades

    class JudgedGrades(SaveAutoGrades):
        def _add_score(self, cell, resources):
            grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                              self.assignment_id, self.student_id)
            grade.auto_score = scores.get(cell.metadata["nbgrader"]["grade_id"])
            grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
            self.gradebook.db.commit()

    return JudgedGrades()


def record(ws: Workspace, s: Submission, nb: nbformat.NotebookNode, scores: dict[str, float], submitted: bytes,
           receipt: dict[str, bytes] | None = None) -> None:
    """Put one run's scores (``cell_scores``: the judge's) into the workspace's gradebook through nbgrader's own
    SaveAutoGrades, and its notebooks where nbgrader keeps them (submitted/, with its exchange receipt;
    autograded/). The submission's time in the gradebook is its receipt's, as nbgrader's autograde records it: the
    formgrader lists a submission whose two times differ as "needs autograding", with no score."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import LimitOutput
    from nbgrader.utils import parse_utc

    dest = submitted_path(ws.root, s.student, s.chapter)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(submitted)
    for name in EXCHANGE_RECEIPT:
        (dest.parent / name).unlink(missing_ok=True)
        if name in (receipt or {}):
            (dest.parent / name).write_bytes(receipt[name])
    with Gradebook(ws.db_url) as gb, warnings.catch_warnings():
        # nbgrader's own autograde makes the same calls; SQLAlchemy warns about its session handling there too
        warnings.filterwarnings("ignore", message=".*not in session.*")
        gb.update_or_create_student(s.student)
        when = (receipt or {}).get("timestamp.txt", b"").decode("ascii", "replace").strip()
        gb.update_or_create_submission(s.chapter, s.student, **({"timestamp": parse_utc(when)} if when else {}))
    resources = {"nbgrader": {"notebook": s.chapter, "assignment": s.chapter, "student": s.student,
                              "db_url": ws.db_url}}
    nb, resources = LimitOutput().preprocess(nb, resources)
    # What the formgrader shows, made inert, and put in writing before the gradebook is touched (a notebook that
    # cannot be written records no score); the gradebook reads the notebook as it is (SaveAutoGrades tells an
    # untouched written answer by its checksum).
    text = nbformat.writes(inert.notebook(nb))
    judged_grades(scores).preprocess(nb, resources)
    path = autograded_path(ws.root, s.student, s.chapter)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_text(text, encoding="utf-8")


def error_message(cell: dict) -> str:
    """`ename: evalue` of the cell's last error output: what the check said, not where it said it."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "lost points without raising an error"
    out = errors[-1]
    ename = out.get("ename") or "Error"
    lines = [ANSI_ESCAPE.sub("", line).rstrip() for line in (out.get("evalue") or "").splitlines()]
    lines = [line for line in lines if line.strip()]
    if not lines and ename == "CellTimeoutError":
        lines = ["no reply from the kernel before the time limit"]
    if len(lines) > MESSAGE_MAX_LINES:
        lines = lines[:MESSAGE_MAX_LINES] + ["..."]
    message = f"{ename}: " + "\n".join(lines) if lines else ename
    return message if len(message) <= MESSAGE_MAX_CHARS else message[: MESSAGE_MAX_CHARS - 3] + "..."


_CELL_FRAME = re.compile(r"^Cell In\[(\d+)\], line (\d+)$", re.M)
_ARROW_LINE = re.compile(r"^-+> *(\d+) ?(.*)$", re.M)


def error_place(out: dict, nb: nbformat.NotebookNode, names: list[str] | None = None,
                cells_run: dict[int, int] | None = None) -> str:
    """Where in the notebook a kernel's error was raised, from its traceback: ' (cell tokenizer, line 7:
    `code`)' for the innermost frame in a cell (IPython's "Cell In[12], line 7", the cell run as the 12th), or ''.
    ``names`` (``intake.cell_names``) and ``cells_run`` (``cells_by_run``) of ``nb``, when many errors are placed."""
    text = ANSI_ESCAPE.sub("", "\n".join(line for line in out.get("traceback", []) if isinstance(line, str)))
    frames = list(_CELL_FRAME.finditer(text))
    if not frames:
        return ""
    last = frames[-1]
    count, line = int(last.group(1)), int(last.group(2))
    index = (cells_by_run(nb) if cells_run is None else cells_run).get(count)
    if index is None:
        return ""
    code = next((m.group(2).strip() for m in _ARROW_LINE.finditer(text, last.end()) if int(m.group(1)) == line), "")
    name = (cell_names(nb) if names is None else names)[index]
    place = f"{name if name.startswith(('the cell', 'a cell')) else 'cell ' + name}, line {line}"
    return f" ({place}: `{code[:120]}`)" if code else f" ({place})"


def cells_by_run(nb: nbformat.NotebookNode) -> dict[int, int]:
    """{execution count: index of the first cell that shows it}."""
    found = {}
    for i, c in enumerate(nb.cells):
        found.setdefault(c.get("execution_count"), i)
    return found


def _located(cell: dict, nb: nbformat.NotebookNode, names: list[str] | None = None,
             cells_run: dict[int, int] | None = None) -> str:
    """error_message, with the place of the error when the kernel raised it (not when the judge reported it)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return error_message(cell) + (error_place(errors[-1], nb, names, cells_run) if errors else "")


def read_result(gb, workdir: Path, student: str, chapter: str) -> Result:
    """Score from the gradebook; messages from the error outputs of the autograded notebook."""
    submission = gb.find_submission(chapter, student)
    notebook = nbformat.read(autograded_path(workdir, student, chapter), as_version=4)
    cell_of = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in notebook.cells}
    names, cells_run = cell_names(notebook), cells_by_run(notebook)
    order = {grade_id: i for i, grade_id in enumerate(cell_of)}
    lost = []
    grades = [g for nb in submission.notebooks for g in nb.grades]
    for grade in sorted(grades, key=lambda g: order.get(g.name, len(order))):
        if grade.name not in cell_of:
            message = "cell missing from the submission (deleted, or its nbgrader metadata lost): needs manual grading"
        elif grade.needs_manual_grade:
            message = "needs manual grading"
        elif grade.score < grade.max_score:
            message = _located(cell_of[grade.name], notebook, names, cells_run)
        else:
            continue
        lost.append(LostPoints(grade.name, grade.score, grade.max_score, message))
    return Result(student, chapter, "graded", submission.score, submission.max_score, lost,
                  needs_manual_grade=submission.needs_manual_grade, cell_errors=cell_errors(notebook, names, cells_run))


def cell_errors(notebook: nbformat.NotebookNode, names: list[str] | None = None,
                cells_run: dict[int, int] | None = None, most: int = 5) -> list[str]:
    """The errors of the learner's own cells (not test cells), the first ``most``: they explain the lost points that
    follow. ``names``, ``cells_run``: ``intake.cell_names`` and ``cells_by_run`` of the notebook, if known."""
    names = cell_names(notebook) if names is None else names
    cells_run = cells_by_run(notebook) if cells_run is None else cells_run
    own = []
    for i, cell in enumerate(notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("grade") and any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            own.append(f"{names[i]}: {_located(cell, notebook, names, cells_run)}")
            if len(own) == most:
                break
    return own
