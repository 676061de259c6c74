"""What every part of ``minigpt-grade`` shares: the rows it makes (a ``Submission`` in, a ``Result`` out), the
limits a notebook runs under, its errors, and how it talks to the instructor (``warn``, always made inert)."""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

from autograder import inert

DEFAULT_TIMEOUT = 900  # seconds for one notebook, start to end
DEFAULT_MEMORY = "4G"  # all of one notebook's processes together, and each one's address space
DEFAULT_CELL_TIMEOUT = 120  # the course's nbgrader setting (autograder/nbgrader_config.py)
PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_COURSE_ROOT = PACKAGE_DIR.parent
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class UsageError(Exception):
    """The command line asks for something that cannot be graded (exit status 2)."""


class NbgraderFailed(Exception):
    """nbgrader itself could not run (exit status 1)."""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise UsageError(f"--memory must be a size like 4G or 1500M, got {text!r}")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


@dataclasses.dataclass
class Submission:
    student: str
    chapter: str
    path: Path | None  # None: the student has no notebook for this chapter


@dataclasses.dataclass
class LostPoints:
    grade_id: str
    score: float
    max_score: float
    message: str


@dataclasses.dataclass
class Result:
    student: str
    chapter: str
    # graded | unreadable (not a notebook) | wrong-notebook (another chapter's) | error (could not run) | missing
    status: str
    score: float | None = None
    max_score: float | None = None
    lost: list[LostPoints] = dataclasses.field(default_factory=list)
    needs_manual_grade: bool = False
    detail: str = ""  # why it has no score, or what stopped the notebook before its end
    submission: str | None = None
    feedback: str | None = None
    cell_errors: list[str] = dataclasses.field(default_factory=list)  # errors of the learner's own cells
    review: list[str] = dataclasses.field(default_factory=list)  # why an instructor should read the code
    seconds: float | None = None  # grading time of this notebook (None: reused from an earlier run)
    reused: bool = False
    log: str | None = None  # the run's log, kept when the notebook did not run to its end
    isolation: str = "sandbox"  # sandbox | none (graded with --no-sandbox: the learner's code ran as the grader)
    withheld: str = ""  # why its feedback is not given to the learner yet (an earlier chapter is still open)

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        d = dict(d)
        d["lost"] = [LostPoints(**lp) for lp in d.get("lost", [])]
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Limits:
    timeout: float = DEFAULT_TIMEOUT  # seconds for one notebook
    memory: int = parse_size(DEFAULT_MEMORY)  # bytes, all of a notebook's processes together
    cell_timeout: int = DEFAULT_CELL_TIMEOUT  # seconds per cell
    processes: int = 256  # processes and threads of one notebook


def points(x: float | None, none: str = "-") -> str:
    return none if x is None else f"{x:g}"


def warn(message: str) -> None:
    print(f"minigpt-grade: {inert.terminal(message)}", file=sys.stderr)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
