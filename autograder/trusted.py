"""The trusted setting: a hidden test cell judged in the learner's own process, by plain ``nbgrader autograde`` or the
course's own tests. The same checks and the same plain data as in the sandbox (every request and answer goes
through JSON, and the learner's objects are served by the same ``hidden.Server``), but no isolation: the learner's
code runs with the grader's rights and could patch the judge here. ``minigpt-grade`` never uses it.

The sandbox's side (``hidden``) and the judge (``judge``) meet only here and on the socket: neither imports the
other."""
from __future__ import annotations

import json

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
    """Judge a test cell in this process; an AssertionError with the message unless every check passed."""
    session = LocalSession(objects)
    stand_ins = [session.remote(session.server.describe(i)) for i in range(len(objects))]
    verdict = judge(session, grade_id, stand_ins, _here)
    _here[grade_id] = verdict
    if not verdict.passed:
        raise AssertionError(verdict.message)


def forget_here() -> None:
    """Forget the verdicts of ``judge_here`` (a new notebook in the same process)."""
    _here.clear()
