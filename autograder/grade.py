"""Grade minigpt notebooks with real `nbgrader autograde`, in a workspace of their own.

    minigpt-grade notebooks/01-tokens/01-tokens.ipynb          # one notebook, student "you"
    minigpt-grade --class submissions/ --chapter 01-tokens     # submissions/<student>/01-tokens.ipynb
                                                               # or submissions/<student>/01-tokens/01-tokens.ipynb

The workspace (default `.grading/` under the course root) gets a copy of `solutions/<chapter>` as
nbgrader's source, its own release, submitted/, autograded/, feedback/ and gradebook, so grading never
touches the course's `notebooks/` or its root gradebook. It is cleared at the start of each run and kept
afterwards, for a look at the feedback HTML. Scores come from nbgrader's gradebook; the message of a
failed test cell is the `ename: evalue` of its error output, never the traceback (which shows hidden
test source).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

PACKAGE_DIR = Path(__file__).resolve().parent
BASE_CONFIG = PACKAGE_DIR / "nbgrader_config.py"
DEFAULT_COURSE_ROOT = PACKAGE_DIR.parent
WORKSPACE_MARKER = ".minigpt-grade-workspace"
MESSAGE_MAX_LINES = 8
MESSAGE_MAX_CHARS = 1000
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The line nbgrader logs for each (assignment, student) it failed on, after a batch.
NBGRADER_FAILED_LINE = re.compile(r"There was an error processing assignment '(.+)' for student '(.+)'")


class UsageError(Exception):
    """The command line asks for something that cannot be graded (exit status 2)."""


class NbgraderFailed(Exception):
    """nbgrader itself could not run (exit status 1)."""


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
    status: str  # graded | unreadable (not a notebook) | error (nbgrader failed on it) | missing
    score: float | None = None
    max_score: float | None = None
    lost: list[LostPoints] = dataclasses.field(default_factory=list)
    needs_manual_grade: bool = False
    detail: str = ""
    submission: str | None = None
    feedback: str | None = None


# ---------------------------------------------------------------------------------------------------
# What to grade


def course_chapters(course_root: Path) -> list[str]:
    """Chapters are the folders `solutions/<NN-topic>/` holding `<NN-topic>.ipynb`."""
    solutions = course_root / "solutions"
    if not solutions.is_dir():
        return []
    return sorted(p.name for p in solutions.iterdir() if (p / f"{p.name}.ipynb").is_file())


def check_chapters(wanted: list[str], known: list[str]) -> None:
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise UsageError(
            f"no chapter {', '.join(unknown)} in solutions/ (chapters: {', '.join(known) or 'none'})"
        )


def notebook_submissions(paths: list[str], student: str, chapter: str | None, known: list[str]) -> list[Submission]:
    """Loose notebooks of one student; the chapter is the file name unless --chapter says otherwise."""
    if chapter and len(paths) > 1:
        raise UsageError("--chapter names the chapter of a single notebook; give one notebook with it")
    submissions = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise UsageError(f"no such notebook: {p}")
        submissions.append(Submission(student, chapter or path.stem, path.resolve()))
    check_chapters([s.chapter for s in submissions], known)
    return submissions


def class_submissions(class_dir: Path, wanted: list[str], known: list[str]) -> list[Submission]:
    """Notebooks laid out `DIR/<student>/<NN-topic>.ipynb` or `DIR/<student>/<NN-topic>/<NN-topic>.ipynb`.

    Without --chapter, the chapters are those any student handed in; a student without one of them gets
    a "missing" row, so a class table has a row for every student and chapter.
    """
    if not class_dir.is_dir():
        raise UsageError(f"no such class folder: {class_dir}")
    check_chapters(wanted, known)
    students = sorted(p for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise UsageError(f"no student folders in {class_dir}")
    found: dict[tuple[str, str], Path] = {}
    for student_dir in students:
        for ch in known:
            layouts = [student_dir / f"{ch}.ipynb", student_dir / ch / f"{ch}.ipynb"]
            present = [p for p in layouts if p.is_file()]
            if len(present) > 1:
                warn(f"{student_dir.name} has both {present[0]} and {present[1]}; grading the first")
            if present:
                found[(student_dir.name, ch)] = present[0].resolve()
        for nb in sorted(student_dir.glob("*.ipynb")) + sorted(student_dir.glob("*/*.ipynb")):
            if nb.stem not in known and ".ipynb_checkpoints" not in nb.parts:
                warn(f"ignored {nb}: no chapter {nb.stem} in solutions/")
    chapters = wanted or sorted({ch for (_, ch) in found})
    if not chapters:
        raise UsageError(f"no notebook of any chapter in {class_dir}")
    return [Submission(s.name, ch, found.get((s.name, ch))) for s in students for ch in chapters]


# ---------------------------------------------------------------------------------------------------
# The workspace and nbgrader


def prepare_workspace(workdir: Path, course_root: Path, chapters: list[str]) -> None:
    """Clear the workspace (only one this tool made) and give it the chapters' sources and a config."""
    if workdir.exists():
        if any(workdir.iterdir()) and not (workdir / WORKSPACE_MARKER).exists():
            raise UsageError(f"refusing to clear {workdir}: it is not a minigpt-grade workspace")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / WORKSPACE_MARKER).write_text("made by minigpt-grade; cleared at the start of each run\n")
    # The course settings (source/release folder names, cell timeout), with the root moved here.
    (workdir / "nbgrader_config.py").write_text(
        "# Written by minigpt-grade: the course's nbgrader settings, rooted in this workspace.\n"
        "c = get_config()\n"
        f"load_subconfig({str(BASE_CONFIG)!r})\n"
        f"c.CourseDirectory.root = {str(workdir)!r}\n"
    )
    for ch in chapters:
        shutil.copytree(
            course_root / "solutions" / ch,
            workdir / "solutions" / ch,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )


def nbgrader(workdir: Path, *args: str, verbose: bool = False) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the workspace. Its python runs the `python3` kernel too, so the
    kernel sees the same installed packages (autograder's checks among them)."""
    # nbgrader runs `alembic` from PATH when it creates a gradebook: find this environment's first,
    # also when it is not activated.
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    with open(logs / "nbgrader.log", "a") as f:
        f.write(f"$ nbgrader {' '.join(args)}  (exit {proc.returncode}, {time.monotonic() - start:.1f} s)\n")
        f.write(proc.stdout + "\n")
    if verbose:
        sys.stderr.write(proc.stdout)
    return proc


def log_tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def nbgrader_error(log: str) -> str:
    """The first ERROR line nbgrader logged that says what went wrong (not where, not "see above")."""
    for line in log.splitlines():
        if "ERROR]" in line:
            message = line.split("ERROR]", 1)[1].strip()
            if message and not message.startswith(("There was an error processing", "Traceback", "Please see")):
                return message
    return "nbgrader could not grade this notebook"


def autograde_chapter(workdir: Path, chapter: str, students: list[str], verbose: bool) -> dict[str, str]:
    """Autograde all submissions of a chapter; return {student: why nbgrader failed} for the ones it
    could not grade.

    A batch run goes on past a notebook it cannot process but exits 1, and a few errors (a notebook in an
    older metadata format) stop the batch: so a student left without an autograded notebook gets a run
    of their own, and only a failure there marks them.
    """
    batch = nbgrader(workdir, "autograde", chapter, verbose=verbose)
    failed = {}
    for student in students:
        if autograded_path(workdir, student, chapter).is_file():
            continue
        solo = nbgrader(workdir, "autograde", chapter, "--student", student, "--force", verbose=verbose)
        if autograded_path(workdir, student, chapter).is_file():
            continue
        if not NBGRADER_FAILED_LINE.search(solo.stdout):
            # Not a failure on this notebook: nbgrader could not do its job at all.
            raise NbgraderFailed(f"nbgrader autograde {chapter} failed:\n{log_tail(solo.stdout or batch.stdout)}")
        failed[student] = nbgrader_error(solo.stdout)
    return failed


def autograded_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "autograded" / student / chapter / f"{chapter}.ipynb"


def feedback_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "feedback" / student / chapter / f"{chapter}.html"


# ---------------------------------------------------------------------------------------------------
# Results


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


def read_result(gb, workdir: Path, student: str, chapter: str) -> Result:
    """Score from the gradebook; messages from the error outputs of the autograded notebook."""
    submission = gb.find_submission(chapter, student)
    notebook = nbformat.read(autograded_path(workdir, student, chapter), as_version=4)
    cell_of = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in notebook.cells}
    order = {grade_id: i for i, grade_id in enumerate(cell_of)}
    lost = []
    grades = [g for nb in submission.notebooks for g in nb.grades]
    for grade in sorted(grades, key=lambda g: order.get(g.name, len(order))):
        if grade.name not in cell_of:
            message = "cell missing from the submission (deleted, or its nbgrader metadata lost): needs manual grading"
        elif grade.needs_manual_grade:
            message = "needs manual grading"
        elif grade.score < grade.max_score:
            message = error_message(cell_of[grade.name])
        else:
            continue
        lost.append(LostPoints(grade.name, grade.score, grade.max_score, message))
    feedback = feedback_path(workdir, student, chapter)
    return Result(
        student, chapter, "graded", submission.score, submission.max_score, lost,
        needs_manual_grade=submission.needs_manual_grade,
        feedback=str(feedback) if feedback.is_file() else None,
    )


def grade(submissions: list[Submission], course_root: Path, workdir: Path, verbose: bool = False) -> list[Result]:
    from nbgrader.api import Gradebook  # slow import: only once the command line is known to be good

    for s in submissions:
        if s.path is not None and s.path.is_relative_to(workdir):
            raise UsageError(f"{s.path} is inside the workspace {workdir}, which is cleared before grading")
    chapters = sorted({s.chapter for s in submissions})
    prepare_workspace(workdir, course_root, chapters)

    results: dict[tuple[str, str], Result] = {}
    for s in submissions:
        if s.path is None:
            results[s.student, s.chapter] = Result(s.student, s.chapter, "missing", detail="no notebook handed in")
            continue
        try:
            nbformat.read(s.path, as_version=4)
        except Exception as e:  # noqa: BLE001 (any way of not being a notebook)
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            results[s.student, s.chapter] = Result(
                s.student, s.chapter, "unreadable", detail=f"not a notebook ({reason})", submission=str(s.path)
            )
            continue
        dest = workdir / "submitted" / s.student / s.chapter / f"{s.chapter}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(s.path, dest)

    for ch in chapters:
        proc = nbgrader(workdir, "generate_assignment", ch, "--force", verbose=verbose)
        if proc.returncode != 0:
            raise NbgraderFailed(f"nbgrader generate_assignment {ch} failed:\n{log_tail(proc.stdout)}")
        students = [s.student for s in submissions if s.chapter == ch and (s.student, ch) not in results]
        if not students:
            continue
        failed = autograde_chapter(workdir, ch, students, verbose)
        for student, why in failed.items():
            results[student, ch] = Result(student, ch, "error", detail=why)
        if len(failed) < len(students):
            proc = nbgrader(workdir, "generate_feedback", ch, verbose=verbose)
            if proc.returncode != 0:
                warn(f"nbgrader generate_feedback {ch} failed (scores are unaffected):\n{log_tail(proc.stdout)}")

    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gb:
        max_of = {ch: gb.find_assignment(ch).max_score for ch in chapters}
        for s in submissions:
            key = (s.student, s.chapter)
            if key not in results:
                results[key] = read_result(gb, workdir, s.student, s.chapter)
            results[key].submission = str(s.path) if s.path else None
            if results[key].max_score is None:
                results[key].max_score = max_of[s.chapter]
    return [results[s.student, s.chapter] for s in submissions]


def points(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def format_table(results: list[Result]) -> str:
    rows = [("student", "chapter", "score", "")]
    notes: dict[int, list[str]] = {}
    for r in results:
        status = "" if r.status == "graded" else f"{r.status}: {r.detail}"
        if r.status == "graded" and r.needs_manual_grade:
            status = "needs manual grading"
        rows.append((r.student, r.chapter, f"{points(r.score)} / {points(r.max_score)}", status))
        notes[len(rows) - 1] = [
            f"    {lp.grade_id} ({points(lp.score)} / {points(lp.max_score)}): "
            + lp.message.replace("\n", "\n      ")
            for lp in r.lost
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
        lines.extend(notes.get(i, []))
    return "\n".join(line.rstrip() for line in lines)


def warn(message: str) -> None:
    print(f"minigpt-grade: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="minigpt-grade",
        description="Grade minigpt notebooks with nbgrader's hidden tests, in a workspace apart from the course.",
    )
    parser.add_argument("notebooks", nargs="*", help="notebooks of one student, each named <NN-topic>.ipynb")
    parser.add_argument("--class", dest="class_dir", metavar="DIR",
                        help="grade DIR/<student>/<NN-topic>.ipynb or DIR/<student>/<NN-topic>/<NN-topic>.ipynb")
    parser.add_argument("--chapter", action="append", default=[], metavar="NN-topic",
                        help="with --class: only these chapters (repeatable); with one notebook: its chapter")
    parser.add_argument("--student", default="you", help="student id for loose notebooks (default: you)")
    parser.add_argument("--course-root", type=Path, default=DEFAULT_COURSE_ROOT,
                        help="course folder holding solutions/ (default: the one this tool belongs to)")
    parser.add_argument("--workdir", type=Path, help="grading workspace (default: COURSE_ROOT/.grading)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
    args = parser.parse_args(argv)
    if bool(args.notebooks) == bool(args.class_dir):
        parser.error("give either notebooks or --class DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    course_root = args.course_root.resolve()
    workdir = (args.workdir or course_root / ".grading").resolve()
    try:
        known = course_chapters(course_root)
        if args.class_dir:
            submissions = class_submissions(Path(args.class_dir).resolve(), args.chapter, known)
        else:
            chapter = args.chapter[0] if args.chapter else None
            if len(args.chapter) > 1:
                raise UsageError("give one --chapter with loose notebooks")
            submissions = notebook_submissions(args.notebooks, args.student, chapter, known)
        results = grade(submissions, course_root, workdir, verbose=args.verbose)
    except UsageError as e:
        warn(str(e))
        return 2
    except NbgraderFailed as e:
        warn(f"{e}\n(full log: {workdir / 'logs' / 'nbgrader.log'})")
        return 1

    print(format_table(results))
    print(f"\nfeedback and nbgrader's log: {workdir}")
    if args.json:
        payload = {
            "course_root": str(course_root),
            "workdir": str(workdir),
            "results": [dataclasses.asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
