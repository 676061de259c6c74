"""The grading workspace: an nbgrader course directory (``.grading/`` by default) kept between runs, and the
nbgrader commands ``minigpt-grade`` runs in it (several in one process: nbgrader's start-up paid once).

Only the grader writes here; no sandbox can see it. ``results/<student>/<chapter>.json`` records each result with
the hash of what it depends on, so a result is reused while nothing it depends on changed."""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
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
    once per command), one after the other; (exit code, output) of each, as split_steps reads them."""
    if not steps:
        return []
    start = time.monotonic()
    nonce = secrets.token_hex(16)  # marks the end of each command: no line a command prints can pose as one
    proc = subprocess.run([sys.executable, "-m", "autograder.nbgrader_steps", nonce, json.dumps(steps)],
                          cwd=workdir, env=nbgrader_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = split_steps(proc.stdout, nonce, len(steps), proc.returncode)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    with open(logs / "nbgrader.log", "a") as f:
        f.write(f"# {len(steps)} nbgrader commands in one process, {time.monotonic() - start:.1f} s\n")
        for args, (code, text, seconds) in zip(steps, results):
            f.write(f"$ nbgrader {' '.join(args)}  (exit {code}, {seconds:.1f} s)\n{text}\n")
            if verbose:
                sys.stderr.write(inert.terminal(text))
    return [(code, text) for code, text, _ in results]


def split_steps(stdout: str, nonce: str, count: int, returncode: int) -> list[tuple[int, str, float]]:
    """(exit code, output, seconds) of each of ``count`` commands from the output of autograder.nbgrader_steps;
    a command the process did not get to (it died) gets exit code -1 and what the process printed last."""
    from autograder.nbgrader_steps import MARKER

    marker = re.compile(rf"{re.escape(MARKER)} {re.escape(nonce)} (\d+) exit (-?\d+) seconds ([\d.]+)\n?")
    results, output = [], []
    for line in stdout.splitlines(keepends=True):
        found = marker.fullmatch(line)
        if found and int(found[1]) == len(results):
            results.append((int(found[2]), "".join(output), float(found[3])))
            output = []
        else:
            output.append(line)
    rest = "".join(output) + f"(the process that ran nbgrader's commands exited {returncode})\n"
    return (results + [(-1, rest, 0.0)] * count)[:count]


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

    def open(self, chapters: list[str], fresh: bool, verbose: bool) -> None:
        check_workspace(self.root)
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
            for ch, (code, output) in zip(changed, nbgrader_steps(self.root, steps, verbose=verbose)):
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
        dest = self.root / "logs" / chapter / f"{student}.log"
        atomic_write(dest, text)
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
