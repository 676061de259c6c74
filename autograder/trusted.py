"""The trusted setting: a hidden test cell judged in the learner's own process, by plain ``nbgrader autograde`` or the
course's own tests. The same checks and the same plain data as in the sandbox (every request and answer goes
through JSON, and the learner's objects are served by the same ``hidden.Server``), but no isolation: the learner's
code runs with the grader's rights and could patch the judge here. ``minigpt-grade`` never uses it.

Under plain ``nbgrader autograde`` (its kernel, ``NBGRADER_EXECUTION=autograde``) a test cell scores what
``minigpt-grade`` gives it: nbgrader reads a cell's score from its outputs (``nbgrader.utils.determine_grade``: an
error or anything on stderr first is 0, a number as the first result is that many points), so the hidden block ends
with the cell's score as its result, the judge's share of the cell's points (``Verdict.score``), then says what
failed; the visible tests after it run as in the sandbox, and their errors come after the score. The points are the
ones nbgrader put back into the notebook it runs, from the gradebook: in the kernel's working folder. Where they
cannot be read, the cell refuses, naming ``minigpt-grade``. Elsewhere (the course's tests, a notebook run by hand,
``nbgrader validate``) a cell whose checks fail raises.

The sandbox's side (``hidden``) and the judge (``judge``) meet only here and on the socket: neither imports the
other."""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from autograder.sandboxed.hidden import Server
from autograder.judge import Session, Verdict, judge


class LocalSession(Session):
    """The learner's objects in this very process: each request and answer still goes through JSON."""

    def __init__(self, objects: tuple):
        super().__init__()
        self.server = Server(objects, lambda message: _plain(self.serve(_plain(message))))

    def exchange(self, message: dict) -> dict:
        return _plain(self.server.answer(_plain(message)))


def _plain(message: dict) -> dict:
    return json.loads(json.dumps(message))


_here: dict[str, Verdict] = {}


def judge_here(grade_id: str, objects: tuple) -> None:
    """Judge a test cell in this process. In plain ``nbgrader autograde``'s kernel: the cell's score as its result,
    then what failed. Elsewhere: an AssertionError with the message unless every check passed."""
    hook = _autograde_hook()
    if hook is None:
        verdict = _judge(grade_id, objects)
        if not verdict.passed:
            raise AssertionError(verdict.message)
        return
    points = _points(grade_id)  # before the checks run: a cell that cannot be scored refuses at once
    said = io.StringIO()  # what reaches stderr while the checks run, shown after the score (stderr first is a 0)
    with contextlib.redirect_stderr(said):
        verdict = _judge(grade_id, objects)
    hook.start_displayhook()
    hook.write_output_prompt()
    hook.write_format_data({"text/plain": repr(verdict.score(points))}, {})
    hook.finish_displayhook()
    sys.stderr.write(said.getvalue())
    if not verdict.passed:
        sys.stdout.write(verdict.parts_report())
        sys.stderr.write(f"{verdict.ename}: {verdict.message}\n")
    sys.stdout.flush()
    sys.stderr.flush()


def _judge(grade_id: str, objects: tuple) -> Verdict:
    session = LocalSession(objects)
    stand_ins = [session.remote(session.server.describe(i)) for i in range(len(objects))]
    verdict = judge(session, grade_id, stand_ins, _here)
    _here[grade_id] = verdict
    return verdict


def _autograde_hook():
    """The display hook of plain ``nbgrader autograde``'s kernel, through which a cell's result reaches nbgrader;
    None outside an autograde run."""
    if os.environ.get("NBGRADER_EXECUTION") != "autograde":
        return None
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        raise RuntimeError("nbgrader autograde without a Jupyter kernel: this cell cannot show its score to nbgrader, "
                           "so nbgrader would give it another one than minigpt-grade's. Grade with minigpt-grade")
    return shell.displayhook


def _points(grade_id: str) -> float:
    """The points of the test cell ``grade_id`` in the notebook ``nbgrader autograde`` runs: it runs it in its own
    folder (autograded/<student>/<assignment>/), with its test cells' points put back from the gradebook."""
    found = []
    for path in sorted(Path.cwd().glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for cell in cells if isinstance(cells, list) else []:
            meta = cell.get("metadata") if isinstance(cell, dict) else None
            meta = meta.get("nbgrader") if isinstance(meta, dict) else None
            if isinstance(meta, dict) and meta.get("grade") and meta.get("grade_id") == grade_id:
                found.append(meta.get("points"))
    numbers = [float(p) for p in found if isinstance(p, (int, float)) and not isinstance(p, bool)]
    if not found or len(numbers) < len(found) or len(set(numbers)) > 1:
        given = f"the points {', '.join(map(repr, found))}" if found else "no points"
        raise RuntimeError(f"plain nbgrader cannot score {grade_id} here: the notebooks in {Path.cwd()} give it "
                           f"{given}, so nbgrader would give it another score than minigpt-grade's. Grade with "
                           "minigpt-grade")
    return numbers[0]


def forget_here() -> None:
    """Forget the verdicts of ``judge_here`` (a new notebook in the same process)."""
    _here.clear()
