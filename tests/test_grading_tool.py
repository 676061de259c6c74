"""minigpt-grade, end to end (sandbox, nbgrader's preprocessors, the judge), on a one-function demo chapter in a
tmp course.

The demo chapter `99-demo` asks for `add(a, b)`: a visible test, a hidden test whose check is registered for
the judge in a module outside the notebook (as the course's are in `autograder.checks`), and a one-point
visible test. The instructor solution is graded alone first; then a class folder, each of whose students is the case of
a test (right, untouched, wrong, not a notebook, a judge that dies, the grader's own failures, a sandbox that does not
start, exchange receipts...), is graded twice in the same workspace: one batch for all of them, nbgrader's start-up
paid once a run (``class_runs``).
"""
import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder import base, grade, intake, scoring, workspace

CHAPTER = "99-demo"
ROOT = Path(__file__).resolve().parents[1]

CHECKS = '''
from autograder.judge import cell


@cell("test_add")
def check_add(add):
    got = add(-2, 5)
    if got == -1234:  # a judge that dies on this answer: one notebook's judge process dying costs it alone
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    assert got == 3, f"add(-2, 5) returned {got!r}, expected 3: negative numbers add like any other"


@cell("test_add_floats")
def check_add_floats(add):
    got = add(0.25, 0.125)
    assert got == 0.375, f"add(0.25, 0.125) returned {got!r}, expected 0.375"
'''

SOLUTION = """\
def add(a, b):
    ### BEGIN SOLUTION
    return a + b
    ### END SOLUTION
"""

TEST_ADD = """\
assert add(1, 2) == 3, "add(1, 2) should be 3"
### BEGIN HIDDEN TESTS
from autograder.sandboxed.hidden import check
check("test_add", add)
### END HIDDEN TESTS
"""

TEST_FLOATS = """\
assert add(0.5, 0.25) == 0.75, "add(0.5, 0.25) should be 0.75"
### BEGIN HIDDEN TESTS
from autograder.sandboxed.hidden import check
check("test_add_floats", add)
### END HIDDEN TESTS
"""


def nbgrader_cell(source, grade_id, *, solution=False, points=None):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade": points is not None,
        "solution": solution,
        "locked": not solution,
        "grade_id": grade_id,
        "schema_version": 3,
        **({"points": points} if points is not None else {}),
    }
    return cell


def demo_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Demo\nWrite `add(a, b)`."),
        nbgrader_cell(SOLUTION, "add", solution=True),
        nbgrader_cell(TEST_ADD, "test_add", points=2),
        nbgrader_cell(TEST_FLOATS, "test_add_floats", points=1),
    ]
    return nb


def learner_copy(released: Path, body: str) -> nbformat.NotebookNode:
    """The released notebook with the learner's body in place of the stub."""
    nb = nbformat.read(released, as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "add")
    assert "raise NotImplementedError()" in cell.source, "the release should hold nbgrader's stub"
    cell.source = "def add(a, b):\n" + textwrap.indent(body, "    ")
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course root with two chapters, 98-early (open while the class is first graded) and 99-demo, the same
    notebook; its check lives in a module on the path, loaded with --checks."""
    root = tmp_path_factory.mktemp("course")
    for ch in (EARLY, CHAPTER):
        (root / "solutions" / ch).mkdir(parents=True)
        nbformat.write(demo_notebook(), root / "solutions" / ch / f"{ch}.ipynb")
    (root / "checks").mkdir()
    (root / "checks" / "demo_checks.py").write_text(CHECKS)
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(root / "checks"))  # for the batch run as a program
    mp.syspath_prepend(str(root / "checks"))
    yield root
    mp.undo()


def run_grade(capsys, *args):
    code = grade.main(list(map(str, args)))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def solution_run(course):
    """Grade the instructor notebook itself, as one learner notebook."""
    out = course / "solution.json"
    code = grade.main([str(course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"),
                       "--course-root", str(course), "--checks", "demo_checks", "--json", str(out)])
    return code, json.loads(out.read_text())


# The class graded by `class_runs`: {student: the body of add, or what is handed in instead}. Each student is the case
# of one test, which reads that student's rows alone.
CLASS = {
    "ada": "return a + b\n",  # right (flat layout)
    "ben": "release",  # the untouched release (<student>/<chapter>/<chapter>.ipynb)
    "cy": "return abs(a) + abs(b)\n",  # wrong: loses test_add
    "dee": "not a notebook",
    "redo": "return a + b\n",  # right, then wrong in the second run
    "dies": "return -1234 if (a, b) == (-2, 5) else a + b\n",  # its judge kills itself on this answer
    # a grader that raises, or never ends, at one step of one notebook (first run only: ``fenced``)
    "fence-intake": "return a + b  # fence-intake\n",
    "fence-scoring": "return a + b  # fence-scoring\n",
    "fence-intake-spin": "return a + b  # fence-intake-spin\n",
    "fence-scoring-spin": "return a + b  # fence-scoring-spin\n",
    "restart": "return a + b  # restart-me\n",  # whose sandbox's first starts fail (``late_bwrap``)
}
EARLY = "98-early"
# Exchange receipts beside a right notebook, as `nbgrader collect` leaves them (<student>/<chapter>/): {student:
# {file: its bytes; "good" or "new": a valid secret of its own; "private": a link to a file only the instructor may
# read; None: a pipe}}.
WHEN = b"2026-11-20 10:00:00.000000 UTC"
RECEIPTS = {
    "good": {"timestamp.txt": WHEN, "submission_secret.txt": "good"},
    "linked": {"timestamp.txt": WHEN, "submission_secret.txt": "private"},
    "binary": {"timestamp.txt": b"next tuesday", "submission_secret.txt": b"\xff\xfe" * 64},
    "huge": {"timestamp.txt": WHEN, "submission_secret.txt": b"a" * 10_000_000},
    "pipe": {"timestamp.txt": WHEN, "submission_secret.txt": None},
    "none": {},
    # times nbgrader can read: far ahead, far back and a day of this month are not taken; an offset is
    "future": {"timestamp.txt": b"9999-12-31 23:59:59.999999 UTC", "submission_secret.txt": "new"},
    "ancient": {"timestamp.txt": b"0001-01-01 00:00:00 UTC", "submission_secret.txt": "new"},
    "day-only": {"timestamp.txt": b"1", "submission_secret.txt": "new"},
    "offset": {"timestamp.txt": b"2026-11-20 10:00:00 +14:00", "submission_secret.txt": "new"},
}


@dataclasses.dataclass
class ClassRun:
    code: int
    rows: dict  # {student: its row of --json}
    table: str
    starts: int  # how many times "restart"'s sandbox was started
    pages: set  # the students with a feedback page of 99-demo after the run
    index: dict  # {student: the text of feedback/<student>/index.html after the run}


def write_class(course: Path, class_dir: Path, private: Path) -> dict[str, bytes]:
    """``CLASS`` and ``RECEIPTS`` handed in under ``class_dir``; {student: the secret of its receipt, where it wrote a
    valid one}."""
    import secrets

    released = course / ".grading" / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    for student, body in CLASS.items():
        (class_dir / student).mkdir(parents=True)
        path = class_dir / student / f"{CHAPTER}.ipynb"
        if body == "release":
            path = class_dir / student / CHAPTER / f"{CHAPTER}.ipynb"
            path.parent.mkdir()
            shutil.copyfile(released, path)
        elif body == "not a notebook":
            path.write_text('{"cells": [ truncated')
        else:
            nbformat.write(learner_copy(released, body), path)
    private.write_text(secrets.token_hex(64))  # a valid secret: kept if the link were followed
    private.chmod(0o600)
    kept = {}
    for student, files in RECEIPTS.items():
        folder = class_dir / student / CHAPTER
        folder.mkdir(parents=True)
        nbformat.write(learner_copy(released, "return a + b\n"), folder / f"{CHAPTER}.ipynb")
        for name, content in files.items():
            if content is None:
                os.mkfifo(folder / name)
            elif content == "private":
                (folder / name).symlink_to(private)
            else:
                if content in ("good", "new"):
                    content = kept[student] = secrets.token_hex(64).encode()
                (folder / name).write_bytes(content)
    return kept


def fenced(nb, step: str) -> None:
    """The grader's own failures, met at ``step`` ("intake" or "scoring") of a notebook marked for it."""
    if any(f"# fence-{step}-spin" in c.source for c in nb.cells):
        while True:  # a step that never ends
            pass
    if any(f"# fence-{step}\n" in c.source for c in nb.cells):
        raise RuntimeError(f"a bug met at {step}")


def late_bwrap(folder: Path) -> Path:
    """A folder holding a `bwrap` that fails the first starts (as many as ``folder/failing`` says) of the executor in
    the sandbox of a notebook marked ``# restart-me``, by naming a module that does not exist in its place (nothing
    runs), and counts them in ``folder/starts``; any other sandbox starts as it would."""
    bwrap = shutil.which("bwrap")
    (folder / "bin").mkdir()
    (folder / "bin" / "bwrap").write_text(f"""#!/bin/bash
marked=no
for a in "$@"; do [ -f "$a/{CHAPTER}.ipynb" ] && grep -q restart-me "$a/{CHAPTER}.ipynb" && marked=yes; done
if [ $marked = yes ] && printf '%s\\n' "$@" | grep -qx autograder.sandboxed.execute; then
  n=$(( $(cat {folder}/starts 2>/dev/null || echo 0) + 1 )); echo $n > {folder}/starts
  if [ $n -le $(cat {folder}/failing) ]; then
    args=(); for a in "$@"; do [ "$a" = autograder.sandboxed.execute ] && a=autograder.no_such_module; args+=("$a"); done
    exec {bwrap} "${{args[@]}}"
  fi
fi
exec {bwrap} "$@"
""")
    (folder / "bin" / "bwrap").chmod(0o755)
    return folder / "bin"


@pytest.fixture(scope="module")
def class_runs(course, solution_run, tmp_path_factory):
    """One class folder (``CLASS`` and ``RECEIPTS``, both layouts) graded twice in the course's workspace, after the
    loose notebook (``solution_run``): one batch for many cases, nbgrader's start-up paid once a run. The first run
    grades while 98-early is open, through a `bwrap` that fails "restart"'s first two starts, and with the grader
    failing at a step of the "fence-" students (a step limit of 3 s, ``grade.STEP_SECONDS``). The second grades the same
    folder again: 98-early closed, one failed start of "restart" left, no fences, and "redo"'s notebook changed to a
    wrong one. ``runs``: (the first ``ClassRun``, the second); ``args``: the command line of both; ``private``: the
    instructor's file "linked" links to; ``secrets``: ``write_class``'s."""
    work = tmp_path_factory.mktemp("class-runs")
    class_dir, private = course / "class", work / "instructor-only.txt"
    secrets_kept = write_class(course, class_dir, private)
    fake = late_bwrap(work)
    out = work / "results.json"
    args = ["--class", str(class_dir), "--course-root", str(course), "--checks", "demo_checks", "--json", str(out)]
    workdir = course / ".grading"

    def run(*more: str) -> ClassRun:
        with contextlib.redirect_stdout(io.StringIO()) as table:
            code = grade.main([*args, *more])
        starts = int((work / "starts").read_text()) if (work / "starts").exists() else 0
        return ClassRun(code, {r["student"]: r for r in json.loads(out.read_text())["results"]}, table.getvalue(),
                        starts, {p.parts[-3] for p in workdir.glob(f"feedback/*/{CHAPTER}/{CHAPTER}.html")},
                        {p.parent.name: p.read_text() for p in workdir.glob("feedback/*/index.html")})

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{fake}:{os.environ['PATH']}")
        (work / "failing").write_text("2")
        with pytest.MonkeyPatch.context() as fences:
            fences.setattr(grade, "STEP_SECONDS", 3.0)
            review_notes, assemble = grade.review_notes, grade.assemble
            fences.setattr(grade, "review_notes", lambda nb, *a: fenced(nb, "intake") or review_notes(nb, *a))
            fences.setattr(grade, "assemble", lambda nb, r: fenced(nb, "scoring") or assemble(nb, r))
            first = run("--open", EARLY)
        (work / "starts").unlink()
        (work / "failing").write_text("1")
        released = workdir / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
        nbformat.write(learner_copy(released, "return abs(a) + abs(b)\n"), class_dir / "redo" / f"{CHAPTER}.ipynb")
        second = run()
    return SimpleNamespace(runs=(first, second), args=args, private=private, secrets=secrets_kept)


@pytest.mark.slow
def test_solution_scores_full_marks_without_touching_the_course(course, solution_run):
    code, payload = solution_run
    assert code == 0
    [result] = payload["results"]
    assert (result["student"], result["chapter"], result["status"]) == ("you", CHAPTER, "graded")
    assert (result["score"], result["max_score"]) == (3, 3)
    assert result["lost"] == []
    assert result["feedback"] and Path(result["feedback"]).is_file()
    # Everything nbgrader wrote is in the workspace; the course's own folders are as they were.
    for made_by_nbgrader in ("notebooks", "submitted", "autograded", "feedback", "gradebook.db"):
        assert not (course / made_by_nbgrader).exists()
    assert sorted(p.name for p in (course / "solutions" / CHAPTER).iterdir()) == [f"{CHAPTER}.ipynb"]


@pytest.mark.slow
def test_class_folder_is_graded_per_student(class_runs):
    first = class_runs.runs[0]
    assert first.code == 0
    assert set(first.rows) == set(CLASS) | set(RECEIPTS)
    assert {s: (first.rows[s]["status"], first.rows[s]["score"], first.rows[s]["max_score"])
            for s in ("ada", "ben", "cy", "dee")} == {
        "ada": ("graded", 3, 3),
        "ben": ("graded", 0, 3),
        "cy": ("graded", 1, 3),
        "dee": ("unreadable", None, 3),
    }


@pytest.mark.slow
def test_untouched_release_loses_every_test_with_its_error(class_runs):
    results = class_runs.runs[0].rows
    assert [(lp["grade_id"], lp["score"], lp["message"]) for lp in results["ben"]["lost"]] == [
        ("test_add", 0, 'NotImplementedError (cell test_add, line 1: `assert add(1, 2) == 3, "add(1, 2) should be 3"`)'),
        ("test_add_floats", 0, "NotImplementedError (cell test_add_floats, line 1: "
                               '`assert add(0.5, 0.25) == 0.75, "add(0.5, 0.25) should be 0.75"`)'),
    ]


@pytest.mark.slow
def test_wrong_answer_reports_the_checks_message_not_the_hidden_source(class_runs):
    [lost] = class_runs.runs[0].rows["cy"]["lost"]
    assert lost["grade_id"] == "test_add"
    assert lost["message"] == (
        "AssertionError: add(-2, 5) returned 7, expected 3: negative numbers add like any other"
    )


@pytest.mark.slow
def test_corrupt_submission_gets_a_clear_status(class_runs):
    results = class_runs.runs[0].rows
    assert results["dee"]["detail"].startswith("not a notebook (")
    assert results["dee"]["submission"].endswith(f"dee/{CHAPTER}.ipynb")


def table_row(table: str, student: str) -> str:
    """The line of the table that starts with ``student``'s row (its lost points follow it, indented)."""
    [line] = [line for line in table.splitlines() if line.split()[:1] == [student]]
    return line


@pytest.mark.slow
def test_table_shows_scores_and_lost_points(class_runs):
    table = class_runs.runs[0].table
    assert table.splitlines()[0].split() == ["student", "chapter", "score"]
    assert table_row(table, "cy").split()[:4] == ["cy", CHAPTER, "1", "/"]
    assert "    test_add (0 / 2): AssertionError: add(-2, 5) returned 7, expected 3" in table
    assert "unreadable: not a notebook" in table_row(table, "dee")
    assert "check_add(" not in table and "check(" not in table


def test_nbgrader_commands_share_one_process_and_keep_their_own_results(course, solution_run):
    """The instructor-side nbgrader commands of a batch run in one process: a failing one neither hides the
    others' results nor stops them, and each keeps its own exit code and output."""
    workdir = course / ".grading"
    steps = [["generate_assignment", "no-such-chapter", "--force"], ["generate_assignment", CHAPTER, "--force"],
             ["generate_feedback", CHAPTER, "--no-such-flag"]]
    results = workspace.nbgrader_steps(workdir, steps)
    assert [code != 0 for code, _ in results] == [True, False, True]
    assert "no-such-chapter" in results[0][1] and "no-such-chapter" not in results[1][1]
    assert (workdir / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb").is_file()
    log = (workdir / "logs" / "nbgrader.log").read_text()
    assert "# nbgrader commands in one process" in log and f"$ nbgrader generate_assignment {CHAPTER} --force" in log


def test_a_feedback_page_that_cannot_be_made_costs_that_page_alone(tmp_path, capsys):
    """Pages are asked for while the batch still runs: one that fails (here, no autograded notebook) is said, and
    the batch goes on; no nbgrader process is started for it."""
    from autograder import reports

    ws = workspace.Workspace(tmp_path, tmp_path)
    pages = reports.FeedbackPages(ws)
    pages.ask(base.Submission("ada", CHAPTER, tmp_path / "ada.ipynb"))
    pages.wait()
    assert pages.asked == [] and ws._nbgrader is None
    assert "the feedback page of ada 99-demo could not be made (FileNotFoundError" in capsys.readouterr().err


def test_a_command_for_an_nbgrader_process_that_died_fails_instead_of_waiting(tmp_path):
    session = workspace.NbgraderSession(tmp_path)
    session.proc.kill()
    code, output = session.result(session.submit(["generate_assignment", CHAPTER, "--force"]))
    assert code == -1 and ("exited -9" in output or "had ended" in output)
    session.close()


def test_a_line_printed_by_a_command_cannot_pose_as_the_end_of_a_command():
    """nbgrader's logs can hold text from a learner's notebook: a line shaped like the runner's marker, without the
    run's nonce, stays part of the command's output; a command the process never reached fails."""
    from autograder.nbgrader_steps import MARKER

    forged = f"{MARKER} 0 exit 0 seconds 0.1\n{MARKER} guess 0 exit 0 seconds 0.1\n"
    stdout = f"[ERROR] feedback failed\n{forged}{MARKER} n0nce 0 exit 1 seconds 2.0\nsecond\n"
    results = workspace.split_steps(stdout, "n0nce", 2, returncode=-9)
    assert results[0] == (1, "[ERROR] feedback failed\n" + forged, 2.0)
    assert results[1][0] == -1 and "second" in results[1][1] and "exited -9" in results[1][1]


@pytest.mark.slow
def test_exit_1_when_nbgrader_cannot_run(tmp_path, capsys):
    (tmp_path / "solutions" / CHAPTER).mkdir(parents=True)
    (tmp_path / "solutions" / CHAPTER / f"{CHAPTER}.ipynb").write_text("not json")
    learner = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(demo_notebook(), learner)
    code, out, err = run_grade(capsys, learner, "--course-root", tmp_path)
    assert code == 1 and out == ""
    assert f"nbgrader generate_assignment {CHAPTER} failed" in err


# ---------------------------------------------------------------------------------------------------
# Fast: the command line and the pieces that need no nbgrader run


def test_usage_errors_exit_2(course, capsys):
    code, _, err = run_grade(capsys, "--course-root", course, course / "nope.ipynb")
    assert code == 2 and "no such notebook" in err
    stray = course / "class-x" / "al"
    stray.mkdir(parents=True, exist_ok=True)
    nbformat.write(demo_notebook(), stray / "42-nothing.ipynb")
    code, _, err = run_grade(capsys, "--course-root", course, stray / "42-nothing.ipynb")
    assert code == 2 and "no chapter 42-nothing" in err and CHAPTER in err
    code, _, err = run_grade(capsys, "--course-root", course, "--class", course / "class-x", "--chapter", "01-x")
    assert code == 2 and "no chapter 01-x" in err
    with pytest.raises(SystemExit) as exit_:
        grade.main([])
    assert exit_.value.code == 2


def test_refuses_to_clear_a_folder_it_did_not_make(course, tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    code, _, err = run_grade(capsys, "--course-root", course, "--workdir", tmp_path,
                             course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    assert code == 2 and "refusing to clear" in err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_class_layouts_and_missing_chapters(tmp_path):
    for path in ("ann/01-a.ipynb", "bob/01-a/01-a.ipynb", "bob/02-b.ipynb"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    subs = intake.class_submissions(tmp_path, [], ["01-a", "02-b", "03-c"])
    assert [(s.student, s.chapter, s.path and s.path.relative_to(tmp_path).as_posix()) for s in subs] == [
        ("ann", "01-a", "ann/01-a.ipynb"),
        ("ann", "02-b", None),
        ("bob", "01-a", "bob/01-a/01-a.ipynb"),
        ("bob", "02-b", "bob/02-b.ipynb"),
    ]


def test_error_message_is_the_last_line_not_the_traceback():
    cell = {"outputs": [{
        "output_type": "error", "ename": "AssertionError", "evalue": "bpe_merge(b'ab') returned [1], expected [2]",
        "traceback": ["\x1b[0;31m---\x1b[0m", "check_bpe_merge(bpe_merge)  # hidden source", "AssertionError: ..."],
    }]}
    assert scoring.error_message(cell) == "AssertionError: bpe_merge(b'ab') returned [1], expected [2]"
    timeout = {"output_type": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": []}
    assert scoring.error_message({"outputs": [timeout]}) == (
        "CellTimeoutError: no reply from the kernel before the time limit"
    )
    assert scoring.error_message({"outputs": []}) == "lost points without raising an error"


def test_kernel_runs_this_python():
    """nbgrader starts the `python3` kernel; it must be this environment's python so that the hidden
    tests can import autograder's checks."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    assert "python3" in KernelSpecManager().find_kernel_specs()
    cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert Path(cmd[0]).resolve() == Path(sys.executable).resolve()


def test_course_config_roots_at_the_repo_wherever_it_runs(tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.chdir(tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert config.CourseDirectory.root == str(ROOT)
    assert (config.CourseDirectory.source_directory, config.CourseDirectory.release_directory) == (
        "solutions", "notebooks"
    )
    assert config.ExecutePreprocessor.timeout == base.DEFAULT_CELL_TIMEOUT  # minigpt-grade's default is the course's


# ---------------------------------------------------------------------------------------------------
# A class batch: parallel, killed half way, resumed, run again


def _class_of(course, n: int, folder: str) -> Path:
    released = course / ".grading" / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    class_dir = course / folder
    for i in range(n):
        (class_dir / f"s{i:02d}").mkdir(parents=True)
        body = "return a + b\n" if i % 2 == 0 else "return abs(a) + abs(b)\n"
        nbformat.write(learner_copy(released, body), class_dir / f"s{i:02d}" / f"{CHAPTER}.ipynb")
    return class_dir


def _gradebook_rows(workdir: Path) -> list[tuple[str, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gb:
        return sorted((s.student.id, s.score) for s in gb.find_assignment(CHAPTER).submissions)


@pytest.mark.slow
def test_a_killed_batch_resumes_and_grades_everything_once(course, solution_run, tmp_path):
    import os
    import signal
    import subprocess
    import time

    n = 3
    class_dir = _class_of(course, n, "class-resume")
    workdir = tmp_path / "workspace"
    args = ["--class", str(class_dir), "--course-root", str(course), "--checks", "demo_checks", "--workdir",
            str(workdir), "-j", "1"]
    batch = subprocess.Popen([sys.executable, "-m", "autograder.grade", *args, "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(list(workdir.glob(f"results/*/{CHAPTER}.json"))) < 2:
        assert batch.poll() is None, "the batch ended before it could be interrupted"
        assert time.monotonic() < deadline, "no result recorded in 300 s"
        time.sleep(0.2)
    os.kill(batch.pid, signal.SIGKILL)  # the grading process only: its runs must not outlive it
    batch.wait()

    def runs_left() -> list[str]:
        """This batch's runs (other test files grade other chapters at the same time under pytest -n)."""
        processes = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout.splitlines()
        return [p for p in processes
                if "autograder.sandboxed.execute" in p and f"{CHAPTER}.ipynb" in p and p[:1] != "Z"]

    # The kill reaches the sandbox through bwrap's parent-death signal and the end of its pid namespace: at once,
    # but a process that held torch takes a moment to exit on a busy machine.
    gone_by = time.monotonic() + 20
    while runs_left() and time.monotonic() < gone_by:
        time.sleep(0.5)
    assert not runs_left(), "a run outlived the grader"
    done_before = {p.parent.name for p in workdir.glob(f"results/*/{CHAPTER}.json")}
    assert 2 <= len(done_before) < n

    out = tmp_path / "resumed.json"
    with contextlib.redirect_stdout(io.StringIO()) as table:
        assert grade.main([*args, "--json", str(out), "--quiet"]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["student"], r["status"], r["score"]) for r in results] == [
        (f"s{i:02d}", "graded", 3 if i % 2 == 0 else 1) for i in range(n)]
    reused = {r["student"] for r in results if r["reused"]}
    assert reused == done_before
    assert f"{n - len(reused)} notebooks graded" in table.getvalue()
    expected = [(f"s{i:02d}", 3.0 if i % 2 == 0 else 1.0) for i in range(n)]
    assert _gradebook_rows(workdir) == expected

    # Run again: nothing is graded twice, the gradebook is the same.
    with contextlib.redirect_stdout(io.StringIO()) as table:
        assert grade.main([*args, "--json", str(out), "--quiet"]) == 0
    assert all(r["reused"] for r in json.loads(out.read_text())["results"])
    assert "0 notebooks graded" in table.getvalue()
    assert _gradebook_rows(workdir) == expected
    assert len((workdir / "grades.csv").read_text().splitlines()) == 1 + n


def test_the_capstone_is_not_offered_for_grading(capsys):
    """11-capstone has no graded cells: a class folder holding it gets no rows of 0 points for it."""
    assert "11-capstone" in intake.course_chapters(ROOT)
    assert "11-capstone" not in intake.graded_chapters(ROOT)
    assert intake.graded_chapters(ROOT) == [ch for ch in intake.course_chapters(ROOT) if ch != "11-capstone"]
    code, _, err = run_grade(capsys, ROOT / "notebooks" / "11-capstone" / "11-capstone.ipynb")
    assert code == 2 and "no chapter 11-capstone to grade" in err


def test_limits_on_the_command_line(course, capsys):
    assert base.parse_size("4G") == 4 << 30 and base.parse_size("1500M") == 1500 << 20
    learner = course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    code, _, err = run_grade(capsys, learner, "--course-root", course, "--memory", "lots")
    assert code == 2 and "--memory must be a size like 4G or 1500M, got 'lots'" in err
    for flag, value, message in [("--jobs", "0", "--jobs must be at least 1, got 0"),
                                 ("--timeout", "-5", "--timeout must be a positive number of seconds, got -5")]:
        with pytest.raises(SystemExit) as exit_:
            grade.main([str(learner), "--course-root", str(course), flag, value])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_without_bubblewrap_grading_refuses_unless_asked_not_to_isolate(course, capsys, monkeypatch):
    from autograder import sandbox

    monkeypatch.setattr(sandbox, "missing", lambda: "bubblewrap is not installed (apt-get install bubblewrap)")
    learner = course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    code, out, err = run_grade(capsys, learner, "--course-root", course, "--workdir", course / "ws-refused")
    assert code == 2 and "cannot grade in a sandbox: bubblewrap is not installed" in err and "--no-sandbox" in err


def test_a_dask_scheduler_that_cannot_grade_is_a_usage_error(course, capsys, monkeypatch):
    """--scheduler: a scheduler that does not answer, and one whose workers are daemonic (Dask's default, under which
    a worker may not start the judge processes), are refused before anything is read or graded, with what to do.
    (The cluster's grading itself: tests/test_hostile_grading.py.)"""
    import socket

    from distributed import LocalCluster

    from autograder import cluster

    learner = course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 0.5)  # waited out in full: nothing answers
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, _, err = run_grade(capsys, learner, "--course-root", course, "--workdir", course / "ws-dask",
                             "--scheduler", f"tcp://127.0.0.1:{port}")
    assert code == 2 and f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in err, err
    monkeypatch.undo()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      host="127.0.0.1") as daemonic:
        code, _, err = run_grade(capsys, learner, "--course-root", course, "--workdir", course / "ws-dask",
                                 "--scheduler", daemonic.scheduler_address)
    assert code == 2 and "Dask workers that cannot grade" in err and "DASK_DISTRIBUTED__WORKER__DAEMON=False" in err
    assert not (course / "ws-dask").exists()


def test_a_dask_hosts_cores_are_shared_among_its_workers_threads_and_plain_tcp_beyond_loopback_is_named():
    from autograder import cluster

    states = {"tcp://10.0.0.1:1": {"host": "10.0.0.1", "cores": 2, "nthreads": 1},
              "tcp://10.0.0.1:2": {"host": "10.0.0.1", "cores": 2, "nthreads": 1},
              "tcp://10.0.0.2:1": {"host": "10.0.0.2", "cores": 16, "nthreads": 4},
              "tcp://10.0.0.3:1": {"host": "10.0.0.3", "cores": 2, "nthreads": 8}}
    assert cluster.threads_per_host(states) == {"10.0.0.1": 1, "10.0.0.2": 4, "10.0.0.3": 1}
    assert [cluster.secure(a) for a in ("tcp://127.0.0.1:8786", "tcp://localhost:8786", "tls://10.0.0.5:8786",
                                        "tcp://10.0.0.5:8786", "10.0.0.5:8786", "tcp://[::1]:8786")] == \
        [True, True, True, False, False, True]


@pytest.mark.slow
def test_grading_without_the_sandbox_says_so_on_every_row(course, solution_run, tmp_path, capsys):
    learner = course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    out = tmp_path / "r.json"
    code, table, err = run_grade(capsys, learner, "--course-root", course, "--checks", "demo_checks", "--workdir",
                                 tmp_path / "ws", "--no-sandbox", "--json", out)
    assert code == 0 and "not isolated" in err
    [r] = json.loads(out.read_text())["results"]
    assert (r["score"], r["isolation"]) == (3, "none")
    assert "NOT ISOLATED" in table
    assert "none" in (tmp_path / "ws" / "grades.csv").read_text().splitlines()[1].split(",")


def test_student_ids_and_links_are_checked_at_intake(tmp_path, capsys):
    for name in ("-rf", ".hidden", "ok.student", "a b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "01-a.ipynb").write_text("{}")
    (tmp_path / "linked").symlink_to(tmp_path / "ok.student")
    subs = intake.class_submissions(tmp_path, [], ["01-a"])
    assert [s.student for s in subs] == ["ok.student"]
    err = capsys.readouterr().err
    assert "'-rf' is not a plain student id" in err and "'a b' is not a plain student id" in err
    assert "a link, not a student folder" in err
    with pytest.raises(base.UsageError, match="student id '--x'"):
        intake.notebook_submissions([str(tmp_path / "ok.student" / "01-a.ipynb")], "--x", None, ["01-a"])
    (tmp_path / "target.ipynb").write_text("{}")
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "target.ipynb")
    assert "symbolic link" in intake.read_submission(tmp_path / "link.ipynb")
    assert intake.read_submission(tmp_path / "target.ipynb") == b"{}"
    assert "not a regular file" in intake.read_submission(tmp_path)


# A learner's debugging line: on stderr while the hidden tests of test_pre_split run ("" is their first text), before
# the cell's score, where nbgrader would read any stderr as a failed cell.
NOISY_PRE_SPLIT = """\
import sys
_their_pre_split = pre_split
def pre_split(text):
    if not text:
        print("pre_split: empty text", file=sys.stderr)
    return _their_pre_split(text)
"""


@pytest.mark.slow
def test_plain_nbgrader_grades_in_the_trusted_setting(tmp_path):
    """Stock `nbgrader autograde` with the course's configuration (run from the repository root, rooted in a copy
    so that the checkout stays clean): the hidden tests find no judge to connect to and judge in the kernel. Each test
    cell gets the score minigpt-grade gives it (its judge and ``cell_scores``, run here in the warm kernel on the same
    notebook): full marks, also after a learner's line on stderr, and partial credit where the mistake fails some
    parts of a cell, also where the cell's visible tests fail after the score; the autograded notebook says what
    failed."""
    import subprocess

    from nbgrader.api import Gradebook
    from submissions import graded_notebook, hostile
    from submissions.grading import warm_kernel

    nb = nbformat.reads(hostile.mutant_text(hostile.WRONG), as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "test_pre_split")
    nb.cells.insert(at, nbformat.v4.new_code_cell(NOISY_PRE_SPLIT))
    root = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / "01-tokens", root / "solutions" / "01-tokens")
    (root / "submitted" / "wrong" / "01-tokens").mkdir(parents=True)
    nbformat.write(nb, root / "submitted" / "wrong" / "01-tokens" / "01-tokens.ipynb")
    # nbgrader's two commands as its command line runs them, in one process (its start-up paid once)
    steps = [[step, "01-tokens", f"--CourseDirectory.root={root}"] for step in ("generate_assignment", "autograde")]
    proc = subprocess.run([sys.executable, "-m", "autograder.nbgrader_steps", "plain", json.dumps(steps)], cwd=ROOT,
                          env=workspace.nbgrader_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        grades = gb.find_submission_notebook("01-tokens", "01-tokens", "wrong").grades
        assert not any(g.needs_manual_grade for g in grades)
        plain = {g.name: g.score for g in grades}
    with warm_kernel("01-tokens") as kernel:
        graded = graded_notebook(nb, "01-tokens")
        judged = scoring.cell_scores(graded, kernel.run(graded).verdicts)
    assert plain == judged
    assert plain["test_pre_split"] == 2  # its stderr line came before the cell's score
    assert plain["test_bpe_merge"] == 0.43  # 3 points times 1 of 7: one part passed, and its visible tests fail
    autograded = nbformat.read(root / "autograded" / "wrong" / "01-tokens" / "01-tokens.ipynb", as_version=4)
    said = [o.get("text", "") for c in autograded.cells for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert any("returned [b'ab', b'c'], expected [b'a', b'bc']" in text for text in said), said


def test_review_notes_flag_nothing_in_right_answers():
    """No false alarms: the reference answers of every chapter get no review note, and the different-but-correct
    answers none but the oracle's, where they call it (chapter 2's with torch's F.one_hot or F.embedding: full
    marks, and a note for the instructor)."""
    import importlib

    from submissions import apply_edits, learner_notebook

    calls_its_oracle = {"functional-sliced", "eye-position-ids", "compare-functional-embedding"}
    for ch in intake.graded_chapters(ROOT):
        module = importlib.import_module(f"submissions.ch{ch[:2]}_{ch[3:].replace('-', '_')}")
        released = learner_notebook(ch, None)
        assert intake.review_notes(learner_notebook(ch, {}), released, ch) == [], ch
        for v in module.VARIANTS:
            notes = intake.review_notes(learner_notebook(ch, apply_edits(ch, v.edits, v.cells)), released, ch)
            assert [n for n in notes if "an oracle of the checks" not in n] == [], (ch, v.key)
            assert bool(notes) == (v.key in calls_its_oracle), (ch, v.key, notes)


@pytest.mark.parametrize("route", [
    'import tiktoken\n        return tiktoken.get_encoding("gpt2").encode_ordinary(text)',
    "return coursekit.gpt2_encoding().encode_ordinary(text)",  # the name the notebook's imports cell gives
    "return reference.encode_ordinary(text)",  # the name its given demo cells bind to tiktoken's encoding
    'return globals()["reference"].encode_ordinary(text)',
    'return getattr(coursekit, "gpt2_encoding")().encode_ordinary(text)',
])
def test_a_tokenizer_that_calls_tiktoken_gets_a_review_note(route):
    """Chapter 1's checks compare the learner's tokenizer with tiktoken: one that hands its work to tiktoken gets
    full marks, so the instructor is told, with the cell, the line and the oracle. A mention of tiktoken in a
    comment or a message is no call."""
    from submissions import Edit, apply_edits, learner_notebook

    body = "        ids = []\n        for piece in pre_split(text):\n"
    mention = '        assert isinstance(text, str), "text, as for tiktoken"  # tiktoken takes str only\n'
    cells = apply_edits("01-tokens", (Edit("tokenizer", body, f"{mention}        {route}\n{body}"),))
    lines = cells["tokenizer"].splitlines()
    calls = [i for i, line in enumerate(lines, 1) if line.strip() in route.split("\n        ")]
    notes = intake.review_notes(learner_notebook("01-tokens", cells), learner_notebook("01-tokens", None), "01-tokens")
    assert len(notes) == len(calls), notes
    for i, note in zip(calls, notes):
        assert note.startswith(f"tokenizer, line {i}: uses tiktoken") and note.endswith(lines[i - 1].strip()), note


def test_a_cell_of_the_learners_own_that_calls_the_oracle_gets_a_review_note():
    """The learner's own cells count, not only the solution cells: a cell added after the Tokenizer that patches
    its encode with tiktoken's."""
    from submissions import learner_notebook

    nb = learner_notebook("01-tokens", {})
    after = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "tokenizer")
    nb.cells.insert(after + 1, nbformat.v4.new_code_cell(
        "import coursekit\n\nTokenizer.encode = lambda self, text: coursekit.gpt2_encoding().encode(text)\n"))
    assert intake.review_notes(nb, learner_notebook("01-tokens", None), "01-tokens") == [
        "the cell after tokenizer, line 3: uses tiktoken, an oracle of the checks: "
        "Tokenizer.encode = lambda self, text: coursekit.gpt2_encoding().encode(text)"]



def test_a_notebook_too_long_to_read_for_oracles_is_noted(monkeypatch):
    """Reading code for oracles takes the grader a second or more per 100,000 characters: a notebook longer than
    the limit is noted unread, so that one learner's notebook cannot hold up the batch."""
    from submissions import learner_notebook

    monkeypatch.setattr(intake, "ORACLE_READ_LIMIT", 1000)
    nb = learner_notebook("01-tokens", {})
    size = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
    assert intake.review_notes(nb, learner_notebook("01-tokens", None), "01-tokens") == [
        f"not read for oracles: {size:,} characters of code (read it yourself)"]


# ---------------------------------------------------------------------------------------------------
# The class graded twice (``class_runs``): each test reads its own students' rows


@pytest.mark.slow
def test_a_changed_submission_is_graded_again(course, class_runs):
    first, second = class_runs.runs
    assert (first.rows["redo"]["score"], second.rows["redo"]["score"], second.rows["redo"]["reused"]) == (3, 1, False)
    assert [row for row in _gradebook_rows(course / ".grading") if row[0] == "redo"] == [("redo", 1.0)]


@pytest.mark.slow
def test_unchanged_submissions_are_not_graded_again_unless_their_row_was_an_error(class_runs):
    first, second = class_runs.runs
    assert not any(r["reused"] for r in first.rows.values())
    errors = {s for s, r in first.rows.items() if r["status"] == "error"}
    assert errors == {"dies", "restart", "fence-intake", "fence-scoring", "fence-intake-spin", "fence-scoring-spin"}
    assert {s for s, r in second.rows.items() if not r["reused"]} == errors | {"redo"}


@pytest.mark.slow
def test_a_judge_process_that_dies_costs_its_notebook_alone(course, class_runs):
    for run, again in zip(class_runs.runs, (False, True)):
        rows = run.rows
        assert (rows["ada"]["status"], rows["ada"]["score"], rows["ada"]["reused"]) == ("graded", 3, again)
        assert (rows["dies"]["status"], rows["dies"]["reused"]) == ("error", False), rows["dies"]
        assert rows["dies"]["detail"] == "its judge stopped: the judge process was killed (signal 9)"
        assert table_row(run.table, "dies").split()[:6] == ["dies", CHAPTER, "-", "/", "3", "error:"]
        assert "error: its judge stopped" in table_row(run.table, "dies")
    assert "ada" in class_runs.runs[1].pages  # made in the batch in which "dies"'s judge died again


@pytest.mark.slow
def test_whatever_the_grader_raises_on_one_notebook_is_that_notebooks_row(class_runs):
    """A fence per submission: an exception in the intake of one notebook, or in the scoring of another, is that
    notebook's `error` row naming the step, never the batch's; so is a step that does not end (here, one that would
    spin for ever in the intake of a third notebook, and in the scoring of a fourth): stopped at the step's time limit
    (``grade.STEP_SECONDS``, 3 s here). The next run grades each of them again (the grader's fault is gone then)."""
    first, second = class_runs.runs
    assert (first.rows["ada"]["status"], first.rows["ada"]["score"]) == ("graded", 3)
    for step in ("intake", "scoring"):
        row = first.rows[f"fence-{step}"]
        assert (row["status"], row["detail"]) == \
            ("error", f"the grader failed at its {step} (RuntimeError; see the grader's log)"), row
        row = first.rows[f"fence-{step}-spin"]
        assert (row["status"], row["detail"]) == \
            ("error", f"the grader stopped its {step} after 3 s (see the grader's log)"), row
    for student in ("fence-intake", "fence-scoring", "fence-intake-spin", "fence-scoring-spin"):
        row = second.rows[student]
        assert (row["status"], row["score"], row["reused"]) == ("graded", 3, False), row


@pytest.mark.slow
def test_feedback_waits_while_an_earlier_chapter_is_open(course, class_runs):
    """A chapter's sandbox holds the reference of the chapters before it: with one of them still open, the
    notebook is graded but its feedback (which shows whatever it printed) is not written until it closes."""
    first, second = class_runs.runs
    r = first.rows["ada"]
    assert (r["status"], r["score"], r["withheld"], r["feedback"]) == \
        ("graded", 3, f"feedback withheld while {EARLY} is open", None)
    assert f"feedback withheld while {EARLY} is open" in table_row(first.table, "ada")
    assert first.pages == {"you"}  # the loose notebook's, graded before
    assert f"feedback withheld while {EARLY} is open" in first.index["ada"]

    r = second.rows["ada"]
    assert (r["reused"], r["withheld"]) == (True, "")
    assert r["feedback"] and Path(r["feedback"]).is_file()
    assert "ada" in second.pages and "withheld" not in second.index["ada"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert grade.main([*class_runs.args, "--open", "no-such-chapter"]) == 2


@pytest.mark.slow
def test_a_kernel_that_does_not_start_is_started_again(class_runs):
    """A run in which no cell ran is no fault of the learner's: it runs once more. A sandbox that cannot start
    at all gets an error row with the run's log kept, and the next batch tries that submission again instead of
    reusing the error. (The notebook runs in a judge process of its own, so the fault is a `bwrap` first on PATH
    whose first starts run a module that does not exist: nothing runs; ``late_bwrap``.)"""
    first, second = class_runs.runs
    r = first.rows["restart"]
    assert (first.starts, r["status"]) == (2, "error"), r
    assert "did not start" in r["detail"]
    assert "No module named autograder.no_such_module" in Path(r["log"]).read_text()
    assert f"log: {r['log']}" in first.table

    r = second.rows["restart"]  # its first start fails, the second runs it
    assert (second.starts, r["status"], r["score"], r["reused"]) == (2, "graded", 3, False), r


@pytest.mark.slow
def test_reports_hold_every_result_of_the_workspace(course, class_runs):
    """The loose notebook graded first and the class graded after it share the workspace: grades.csv and the
    learners' pages hold both, whatever the last run graded."""
    import csv

    rows = list(csv.DictReader((course / ".grading" / "grades.csv").open()))
    assert sorted(r["student"] for r in rows) == sorted([*CLASS, *RECEIPTS, "you"])
    page = (course / ".grading" / "feedback" / "you" / "index.html").read_text()
    assert CHAPTER in page and "3 / 3" in page


@pytest.mark.slow
def test_a_receipt_not_written_by_nbgrader_is_replaced_and_the_class_feedback_is_released(course, class_runs,
                                                                                          tmp_path):
    """`nbgrader collect` copies whatever a learner's exchange folder holds, so the receipt beside a notebook
    (timestamp.txt, submission_secret.txt) is the learner's to write: a link to a file only the instructor may
    read, bytes that are not text, a huge file, a pipe. None of it is followed or kept; each such learner is on
    the review list, and nbgrader's own `release_feedback` then releases the whole class's feedback. A time nbgrader
    can read but that makes no sense (the learner's clock: the year 9999, the year 1, a day of this month) is not
    taken either: the gradebook has the notebook file's time."""
    import datetime
    import subprocess

    from nbgrader.utils import notebook_hash

    workdir = course / ".grading"
    results = class_runs.runs[0].rows
    assert {s: (results[s]["status"], results[s]["score"]) for s in RECEIPTS} == {s: ("graded", 3) for s in RECEIPTS}
    for student in ("linked", "binary", "huge", "pipe"):
        [note] = [n for n in results[student]["review"] if "receipt" in n]
        assert "submission_secret.txt: " in note and "fetch_feedback" in note, note
    assert "a symbolic link" in results["linked"]["review"][-1]
    assert "timestamp.txt: not a timestamp" in results["binary"]["review"][-1]
    assert not any(results[s]["review"] for s in ("good", "none", "offset"))
    for student, why in [("future", "is in the future"), ("ancient", "is before this course"),
                         ("day-only", "names no whole date")]:
        [note] = results[student]["review"]
        assert note.startswith("its exchange receipt's time is not taken (timestamp.txt: ") and why in note, note
    good = class_runs.secrets["good"]
    kept = {p.read_bytes() for p in workdir.rglob("submission_secret.txt")}
    assert class_runs.private.read_bytes() not in kept and good in kept

    # the instructor's next step, stock nbgrader: every learner's page is released, the good one where the
    # learner's fetch_feedback looks for it (named from the secret it keeps)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "release_feedback", CHAPTER,
                           f"--Exchange.root={exchange}", "--CourseDirectory.course_id=demo"],
                          cwd=workdir, env=workspace.nbgrader_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = {p.name for p in (exchange / "demo" / "feedback").iterdir()}
    assert len(pages) == len(class_runs.runs[1].pages), pages
    assert set(RECEIPTS) <= class_runs.runs[1].pages
    assert f"{notebook_hash(secret=good.decode(), notebook_id=CHAPTER)}.html" in pages

    # and the formgrader (nbgrader's API behind its pages) counts every submission graded, at its receipt's time:
    # a gradebook time that is not the receipt's shows as "needs autograding", with no score
    proc = subprocess.run([sys.executable, "-c", FORMGRADER_VIEW, CHAPTER], cwd=workdir, env=workspace.nbgrader_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    view = json.loads(proc.stdout)
    graded = {s for s, r in class_runs.runs[1].rows.items() if r["status"] == "graded"} | {"you"}
    assert set(view["autograded"]) == graded, view
    assert {s: (v["score"], v["max_score"], v["autograded"]) for s, v in view["submissions"].items()
            if s in RECEIPTS} == {s: (3.0, 3.0, True) for s in RECEIPTS}, view
    assert view["submissions"]["good"]["timestamp"].startswith("2026-11-20T10:00:00"), view["submissions"]["good"]
    from nbgrader.utils import parse_utc  # each time as nbgrader itself reads the receipt (its formgrader compares)
    for student in ("future", "ancient", "day-only", "offset"):
        kept = (workdir / "submitted" / student / CHAPTER / "timestamp.txt").read_text()
        assert (kept == RECEIPTS[student]["timestamp.txt"].decode()) == (student == "offset"), (student, kept)
        want = parse_utc(kept).isoformat()
        assert view["submissions"][student]["timestamp"] == want, (student, view["submissions"][student])
        assert want < datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat(), want


FORMGRADER_VIEW = """\
import json, sys
from nbgrader.apps import NbGrader
from nbgrader.apps.api import NbGraderAPI
from nbgrader.coursedir import CourseDirectory

app = NbGrader()
app.load_config_file()  # the workspace's nbgrader_config.py, as the formgrader opened there reads it
api = NbGraderAPI(CourseDirectory(config=app.config), config=app.config)
chapter = sys.argv[1]
print(json.dumps({"autograded": sorted(api.get_autograded_students(chapter)),
                  "submissions": {s["student"]: s for s in api.get_submissions(chapter)}}, default=str))
"""
