"""The grading workspace: an nbgrader course directory (``.grading/`` by default) kept between runs, and the
nbgrader commands ``minigpt-grade`` runs in it (several in one process: nbgrader's start-up paid once).

Only the grader writes here; no sandbox can see it. ``results/<student>/<chapter>.json`` records each result with
the hash of what it depends on, so a result is reused while nothing it depends on changed."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat

from autograder import inert
from autograder.base import PACKAGE_DIR, NbgraderFailed, UsageError

BASE_CONFIG = PACKAGE_DIR / "nbgrader_config.py"
WORKSPACE_MARKER = ".minigpt-grade-workspace"


def nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # nbgrader runs `alembic` from PATH when it creates a gradebook: find this environment's first,
    # also when it is not activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **(extra or {})}


def nbgrader_steps(workdir: Path, steps: list[list[str]], verbose: bool = False) -> list[tuple[int, str]]:
    """Several nbgrader commands in one process (autograder.nbgrader_steps: nbgrader's start-up paid once, not
    once per command), one after the other; (exit code, output) of each."""
    if not steps:
        return []
    with NbgraderSession(workdir, verbose) as session:
        return session.run(steps)


class NbgraderSession:
    """One process that runs nbgrader's commands in ``workdir``, one after the other, as they are sent
    (``python -m autograder.nbgrader_steps NONCE -``): a batch pays nbgrader's start-up (2 s) once, for the
    assignments it generates first and for the feedback pages it makes while other notebooks are still running.
    ``submit`` sends a command and returns at once; ``result`` waits for one's (exit code, output). Each command's
    output is appended to ``logs/nbgrader.log`` as it ends. A process that dies fails the commands it did not end
    (exit code -1, with what it printed last)."""

    def __init__(self, workdir: Path, verbose: bool = False):
        self.workdir, self.verbose = workdir, verbose
        self.nonce = secrets.token_hex(16)  # marks the end of each command: no line a command prints can pose as one
        self.sent: list[list[str]] = []
        self.done: list[tuple[int, str, float]] = []
        self.ended = threading.Condition()
        self.dead = False
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        with open(workdir / "logs" / "nbgrader.log", "a") as f:
            f.write("# nbgrader commands in one process\n")
        self.proc = subprocess.Popen([sys.executable, "-m", "autograder.nbgrader_steps", self.nonce, "-"],
                                     cwd=workdir, env=nbgrader_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, name="nbgrader output", daemon=True)
        self.reader.start()

    def __enter__(self) -> "NbgraderSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, args: list[str]) -> int:
        """Send one command (its arguments, as after ``nbgrader``); its index for ``result``."""
        with self.ended:
            self.sent.append(list(args))
            index = len(self.sent) - 1
        try:
            self.proc.stdin.write(json.dumps(list(args)) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the process is gone: _read fails what it did not end
            pass
        return index

    def result(self, index: int) -> tuple[int, str]:
        """The (exit code, output) of command ``index``, once it has ended."""
        with self.ended:
            self.ended.wait_for(lambda: len(self.done) > index or self.dead)
            if len(self.done) > index:
                return self.done[index][:2]
        return -1, "(the process that ran nbgrader's commands had ended)\n"

    def run(self, steps: list[list[str]]) -> list[tuple[int, str]]:
        """Send ``steps`` and wait for all of them: (exit code, output) of each."""
        return [self.result(i) for i in [self.submit(args) for args in steps]]

    def close(self) -> None:
        """Let the commands sent end, then end the process."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait()
        self.reader.join()

    def _read(self) -> None:
        for code, text, seconds in command_ends(self.proc.stdout, self.nonce):
            if code is not None:
                self._end(code, text, seconds)
                continue
            # the process's last words, after its last command's end: each command it did not end fails with them
            text += f"(the process that ran nbgrader's commands exited {self.proc.wait()})\n"
            with self.ended:
                missing = len(self.sent) - len(self.done)
            for _ in range(missing):
                self._end(-1, text, 0.0)
        with self.ended:  # a command sent from now on fails at once
            self.dead = True
            self.ended.notify_all()

    def _end(self, code: int, text: str, seconds: float) -> None:
        with self.ended:
            args = self.sent[len(self.done)] if len(self.done) < len(self.sent) else ["?"]
            self.done.append((code, text, seconds))
            self.ended.notify_all()
        with open(self.workdir / "logs" / "nbgrader.log", "a") as f:
            f.write(f"$ nbgrader {' '.join(args)}  (exit {code}, {seconds:.1f} s)\n{text}\n")
        if self.verbose:
            sys.stderr.write(inert.terminal(text))


def command_ends(lines, nonce: str):
    """(exit code, output, seconds) of each command, as its end is read from the lines autograder.nbgrader_steps
    prints; last, (None, what it printed after its last command's end, 0.0)."""
    from autograder.nbgrader_steps import MARKER

    marker = re.compile(rf"{re.escape(MARKER)} {re.escape(nonce)} (\d+) exit (-?\d+) seconds ([\d.]+)\n?")
    output, count = [], 0
    for line in lines:
        found = marker.fullmatch(line)
        if found and int(found[1]) == count:
            yield int(found[2]), "".join(output), float(found[3])
            output, count = [], count + 1
        else:
            output.append(line)
    yield None, "".join(output), 0.0


def split_steps(stdout: str, nonce: str, count: int, returncode: int) -> list[tuple[int, str, float]]:
    """(exit code, output, seconds) of each of ``count`` commands from the whole output of
    autograder.nbgrader_steps; a command the process did not get to (it died) gets exit code -1 and what the
    process printed last."""
    *ended, (_, rest, _) = command_ends(stdout.splitlines(keepends=True), nonce)
    rest += f"(the process that ran nbgrader's commands exited {returncode})\n"
    return (ended + [(-1, rest, 0.0)] * count)[:count]


def log_tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def write_config(root: Path) -> None:
    """A course directory's nbgrader_config.py: the course settings, with the root moved to ``root``."""
    lines = [
        "# Written by minigpt-grade: the course's nbgrader settings, rooted in this folder.",
        "c = get_config()",
        f"load_subconfig({str(BASE_CONFIG)!r})",
        f"c.CourseDirectory.root = {str(root)!r}",
    ]
    (root / "nbgrader_config.py").write_text("\n".join(lines) + "\n")


def check_workspace(workdir: Path) -> None:
    if workdir.exists() and any(workdir.iterdir()) and not (workdir / WORKSPACE_MARKER).exists():
        raise UsageError(f"refusing to clear {workdir}: it is not a minigpt-grade workspace")


def copy_sources(workdir: Path, course_root: Path, chapters: list[str]) -> None:
    for ch in chapters:
        dest = workdir / "solutions" / ch
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(course_root / "solutions" / ch, dest,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))


def source_hash(course_root: Path, chapter: str) -> str:
    """What a chapter's result depends on besides the notebook: its instructor notebook and the grader's code
    (the autograder and the course's test helpers)."""
    import coursekit

    h = hashlib.sha256()
    for folder, pattern in ((course_root / "solutions" / chapter, "*"), (PACKAGE_DIR, "*.py"),
                            (Path(coursekit.__file__).parent, "*.py")):
        for p in sorted(folder.rglob(pattern)):
            if p.is_file() and not {".ipynb_checkpoints", "__pycache__"} & set(p.parts):
                h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def autograded_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "autograded" / student / chapter / f"{chapter}.ipynb"


def submitted_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "submitted" / student / chapter / f"{chapter}.ipynb"


def feedback_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "feedback" / student / chapter / f"{chapter}.html"


class Workspace:
    """``root`` is nbgrader's course directory; ``root/results/<student>/<chapter>.json`` the record of each
    result, written once the gradebook holds it."""

    def __init__(self, root: Path, course_root: Path):
        self.root, self.course_root = root, course_root
        self.state_file = root / "workspace.json"
        self.sources: dict[str, str] = {}  # {chapter: hash of its solution folder and the grader}, set by open()
        self.db_url = f"sqlite:///{root / 'gradebook.db'}"
        self.verbose = False
        self._nbgrader: NbgraderSession | None = None

    def nbgrader(self) -> NbgraderSession:
        """The workspace's nbgrader process (started on first use, once the workspace is open), for the batch."""
        if self._nbgrader is None:
            self._nbgrader = NbgraderSession(self.root, self.verbose)
        return self._nbgrader

    def close(self, abort: bool = False) -> None:
        """End the nbgrader process: once the commands sent have ended, or at once (``abort``)."""
        if self._nbgrader is not None:
            if abort:
                self._nbgrader.proc.kill()
            self._nbgrader.close()
            self._nbgrader = None

    def open(self, chapters: list[str], fresh: bool, verbose: bool) -> None:
        check_workspace(self.root)
        self.verbose = verbose
        state = self.read_state()
        if fresh or state.get("course_root") != str(self.course_root):
            if self.root.exists():
                shutil.rmtree(self.root)
            state = {}
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / WORKSPACE_MARKER).write_text(
            "made by minigpt-grade: grading results live here; `minigpt-grade --fresh` starts over\n")
        write_config(self.root)
        sources = state.setdefault("sources", {})
        self.sources = {ch: source_hash(self.course_root, ch) for ch in chapters}
        changed = [ch for ch in chapters if sources.get(ch) != self.sources[ch]]
        if changed:
            self.forget(changed)  # results of a chapter whose solution or grader changed are out of date
            copy_sources(self.root, self.course_root, changed)
            steps = [["generate_assignment", ch, "--force"] for ch in changed]
            for ch, (code, output) in zip(changed, self.nbgrader().run(steps)):
                if code != 0:
                    raise NbgraderFailed(f"nbgrader generate_assignment {ch} failed:\n{log_tail(output)}")
            sources.update(self.sources)
            state["course_root"] = str(self.course_root)
            self.write_state(state)

    def forget(self, chapters: list[str]) -> None:
        """Drop every result of these chapters: records, notebooks and the gradebook's submissions."""
        for ch in chapters:
            for path in self.root.glob(f"results/*/{ch}.json"):
                path.unlink()
            for kind in ("submitted", "autograded", "feedback", "feedback-source"):
                for path in self.root.glob(f"{kind}/*/{ch}"):
                    shutil.rmtree(path)
        if not (self.root / "gradebook.db").is_file():
            return
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.db_url) as gb:
            for ch in chapters:
                try:
                    students = [sub.student.id for sub in gb.find_assignment(ch).submissions]
                except MissingEntry:
                    continue
                for student in students:
                    gb.remove_submission(ch, student)

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def write_state(self, state: dict) -> None:
        atomic_write(self.state_file, json.dumps(state, indent=2) + "\n")

    def result_file(self, student: str, chapter: str) -> Path:
        return self.root / "results" / student / f"{chapter}.json"

    def keep_log(self, student: str, chapter: str, text: str) -> Path:
        """Keep a run's log, whose path the table prints: escaped as the table is (``inert.terminal``), since the
        executor's output in it is the learner's text, and an instructor reads it with ``cat`` or ``less``."""
        dest = self.root / "logs" / chapter / f"{student}.log"
        atomic_write(dest, inert.terminal(text))
        return dest

    def released(self, chapter: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)

    def released_grade_ids(self, chapter: str) -> dict[str, str]:
        """{grade_id: source} of the chapter's released notebook."""
        return {c.metadata["nbgrader"]["grade_id"]: c.source for c in self.released(chapter).cells
                if "nbgrader" in c.metadata}


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
