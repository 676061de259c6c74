"""Grade minigpt notebooks with real `nbgrader autograde`: one notebook, or a whole class in parallel.

    minigpt-grade notebooks/01-tokens/01-tokens.ipynb          # one notebook, student "you"
    minigpt-grade --class submissions/                         # submissions/<student>/<NN-topic>.ipynb
                                                               # or submissions/<student>/<NN-topic>/<NN-topic>.ipynb

Each submission is graded by its own `nbgrader autograde` run, in a folder of its own, under a time limit
and a memory cap, several at once (one per core). A notebook that loops, eats memory, kills its kernel or
is not a notebook at all gets a row saying so; the others are graded all the same.

The workspace (default `.grading/` under the course root) is nbgrader's course directory: `solutions/`
(a copy of the chapters graded), `notebooks/` (their release), `submitted/`, `autograded/`, `feedback/`
and `gradebook.db`, into which every result is written by this process alone. It is kept between runs:
a result is reused while the submission and its chapter are unchanged, so running the same batch again
grades nothing twice, and a batch that was interrupted goes on where it stopped. `--fresh` starts over.

Scores come from nbgrader's gradebook; the message of a failed test cell is the `ename: evalue` of its
error output, never the traceback (which shows hidden test source). The feedback pages, nbgrader's per
chapter and one summary per learner, show the messages and never the hidden tests.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import ctypes
import dataclasses
import hashlib
import html
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat

PACKAGE_DIR = Path(__file__).resolve().parent
BASE_CONFIG = PACKAGE_DIR / "nbgrader_config.py"
DEFAULT_COURSE_ROOT = PACKAGE_DIR.parent
WORKSPACE_MARKER = ".minigpt-grade-workspace"
MESSAGE_MAX_LINES = 8
MESSAGE_MAX_CHARS = 1000
OUTPUT_MAX_CHARS = 100_000  # per output of the autograded notebook kept in the workspace
DEFAULT_TIMEOUT = 900  # seconds for one notebook, start to end
DEFAULT_MEMORY = "4G"  # address space of the grading processes (nbgrader and its kernel)
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
HIDDEN_BLOCK = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M)
SOCKETS_PREFIX = "minigpt-kernel-"  # the temp folder of one run's kernel sockets
# nbgrader's log when the kernel did not come up (it never ran a cell of the notebook)
KERNEL_NEVER_STARTED = re.compile(r"Kernel died before replying to kernel_info|Kernel didn't respond in \d+ seconds")
HIDDEN_NOTE = "# (hidden tests ran here; what they found is below)\n"
# What a submission's own code should have no business mentioning. A match does not change the score; it
# puts the submission on the instructor's review list.
SUSPICIOUS = [
    (re.compile(r"\bautograder\b"), "mentions the autograder"),
    (re.compile(r"\bsolutions\b\s*[/\\'\"]|\bgradebook\b|\.grading\b"), "names grading files"),
    (re.compile(r"\b(exec|eval)\s*\("), "runs code from a string"),
    (re.compile(r"\bsys\.(modules|meta_path|path_hooks|addaudithook|setprofile|settrace)\b"), "reaches into the import system"),
    (re.compile(r"\bget_ipython\(\)\.events\b|\bbuiltins\b|__builtins__"), "patches the interpreter"),
    (re.compile(r"\bos\._exit\b|\bctypes\b|\bsetrlimit\b|\bos\.kill\b"), "kills or bypasses the kernel"),
    (re.compile(r"^\s*[!%]|\bsubprocess\b|\bos\.system\b|\bos\.popen\b"), "runs other programs"),
    (re.compile(r"\b__import__\s*\(|\bimportlib\b"), "imports by name"),
]


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
    # graded | unreadable (not a notebook) | wrong-notebook (another chapter's) | timeout | error | missing
    status: str
    score: float | None = None
    max_score: float | None = None
    lost: list[LostPoints] = dataclasses.field(default_factory=list)
    needs_manual_grade: bool = False
    detail: str = ""
    submission: str | None = None
    feedback: str | None = None
    cell_errors: list[str] = dataclasses.field(default_factory=list)  # errors of the learner's own cells
    review: list[str] = dataclasses.field(default_factory=list)  # why an instructor should read the code
    seconds: float | None = None  # grading time of this notebook (None: reused from an earlier run)
    reused: bool = False
    log: str | None = None  # nbgrader's log of a run that ended without a score (timeout, error)

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        d = dict(d)
        d["lost"] = [LostPoints(**lp) for lp in d.get("lost", [])]
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Limits:
    timeout: float = DEFAULT_TIMEOUT  # seconds for one notebook
    memory: int = parse_size(DEFAULT_MEMORY)  # bytes of address space
    cell_timeout: int | None = None  # seconds per cell; None: the course's nbgrader setting


# ---------------------------------------------------------------------------------------------------
# What to grade


def course_chapters(course_root: Path) -> list[str]:
    """Chapters are the folders `solutions/<NN-topic>/` holding `<NN-topic>.ipynb`."""
    solutions = course_root / "solutions"
    if not solutions.is_dir():
        return []
    return sorted(p.name for p in solutions.iterdir() if (p / f"{p.name}.ipynb").is_file())


def graded_chapters(course_root: Path) -> list[str]:
    """The chapters with something to grade: a cell worth points (the capstone, 08-capstone, has none)."""
    graded = []
    for ch in course_chapters(course_root):
        try:
            cells = json.loads((course_root / "solutions" / ch / f"{ch}.ipynb").read_text())["cells"]
        except (OSError, ValueError, KeyError):
            graded.append(ch)  # let nbgrader say what is wrong with it
            continue
        if any(c.get("metadata", {}).get("nbgrader", {}).get("points") for c in cells):
            graded.append(ch)
    return graded


def check_chapters(wanted: list[str], known: list[str]) -> None:
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise UsageError(
            f"no chapter {', '.join(unknown)} to grade in solutions/ (chapters: {', '.join(known) or 'none'})"
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
# nbgrader


def nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # nbgrader runs `alembic` from PATH when it creates a gradebook: find this environment's first,
    # also when it is not activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **(extra or {})}


def nbgrader(workdir: Path, *args: str, verbose: bool = False) -> subprocess.CompletedProcess:
    """Run one nbgrader command in a course directory. Its python runs the `python3` kernel too, so the
    kernel sees the same installed packages (autograder's checks among them)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=workdir, env=nbgrader_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
    """Why nbgrader could not grade a notebook, in a learner's terms where the cause is known."""
    if "Timeout waiting for execute reply" in log:
        return ("a cell ran past the time limit for one cell and did not stop when interrupted: nbgrader keeps no "
                "score from a notebook it could not finish")
    if re.search(r"DeadKernelError|Kernel died|UnresponsiveKernelError", log):
        return ("the notebook's kernel died while it ran (sys.exit from a thread, os._exit, a crash, or the "
                "memory cap): nbgrader keeps no score from a notebook whose kernel died")
    for line in log.splitlines():
        if "ERROR]" in line:
            message = line.split("ERROR]", 1)[1].strip()
            if message and not message.startswith(("There was an error processing", "Traceback", "Please see")):
                return message
    return "nbgrader could not grade this notebook"


def write_config(root: Path, cell_timeout: int | None = None, kernel_sockets: Path | None = None) -> None:
    """A course directory's nbgrader_config.py: the course settings, with the root moved to ``root``.
    ``kernel_sockets``: the kernel talks over Unix sockets whose paths start with this absolute path, not over
    TCP ports. Kernels started at the same time by parallel runs can be handed the same free TCP port, and then
    one of them dies at start-up."""
    lines = [
        "# Written by minigpt-grade: the course's nbgrader settings, rooted in this folder.",
        "c = get_config()",
        f"load_subconfig({str(BASE_CONFIG)!r})",
        f"c.CourseDirectory.root = {str(root)!r}",
    ]
    if cell_timeout is not None:
        lines.append(f"c.Execute.timeout = {int(cell_timeout)}")
    if kernel_sockets is not None:
        lines.append("c.KernelManager.transport = 'ipc'")
        lines.append(f"c.KernelManager.ip = {str(kernel_sockets)!r}")
    (root / "nbgrader_config.py").write_text("\n".join(lines) + "\n")


def prepare_workspace(workdir: Path, course_root: Path, chapters: list[str]) -> None:
    """Clear a folder (only one this tool made) and make it a course directory with the chapters' sources."""
    if workdir.exists():
        check_workspace(workdir)
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / WORKSPACE_MARKER).write_text("made by minigpt-grade\n")
    write_config(workdir)
    copy_sources(workdir, course_root, chapters)


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
    h = hashlib.sha256()
    folder = course_root / "solutions" / chapter
    for p in sorted(folder.rglob("*")):
        if p.is_file() and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def autograded_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "autograded" / student / chapter / f"{chapter}.ipynb"


def feedback_path(workdir: Path, student: str, chapter: str) -> Path:
    return workdir / "feedback" / student / chapter / f"{chapter}.html"


# ---------------------------------------------------------------------------------------------------
# The workspace: nbgrader's course directory, kept between runs


class Workspace:
    """``root`` is nbgrader's course directory; ``root/template`` another, holding only the assignments,
    whose gradebook each grading run starts from; ``root/work/<chapter>/<student>`` the folder of one
    grading run; ``root/results/<student>/<chapter>.json`` the record of each result, written once the
    gradebook holds it."""

    def __init__(self, root: Path, course_root: Path):
        self.root, self.course_root = root, course_root
        self.template = root / "template"
        self.state_file = root / "workspace.json"
        self.sources: dict[str, str] = {}  # {chapter: hash of its solution folder}, set by open()

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
        self.stop_leftover_runs()
        sources = state.setdefault("sources", {})
        self.sources = {ch: source_hash(self.course_root, ch) for ch in chapters}
        changed = [ch for ch in chapters if sources.get(ch) != self.sources[ch]]
        if changed:
            self.forget(changed)  # results of a chapter whose solution changed are out of date
            copy_sources(self.root, self.course_root, changed)
            self.template.mkdir(exist_ok=True)
            write_config(self.template)
            copy_sources(self.template, self.course_root, changed)
            for where in (self.root, self.template):
                for ch in changed:
                    proc = nbgrader(where, "generate_assignment", ch, "--force", verbose=verbose)
                    if proc.returncode != 0:
                        raise NbgraderFailed(f"nbgrader generate_assignment {ch} failed:\n{log_tail(proc.stdout)}")
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

        with Gradebook(f"sqlite:///{self.root / 'gradebook.db'}") as gb:
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

    def run_dir(self, student: str, chapter: str) -> Path:
        return self.root / "work" / chapter / student

    def keep_log(self, student: str, chapter: str) -> Path:
        """Copy the run's nbgrader log to logs/<chapter>/<student>.log, out of the run folder that is removed."""
        dest = self.root / "logs" / chapter / f"{student}.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.run_dir(student, chapter) / "nbgrader.log", dest)
        return dest

    def stop_leftover_runs(self) -> None:
        """Kill the grading runs of an interrupted batch that are still going: each process group whose
        leader is still the `nbgrader` of that run folder (a number in a pid file may belong to another
        process by now)."""
        import psutil

        for pid_file in self.root.glob("work/*/*/pid"):
            try:
                pid = int(pid_file.read_text())
                leader = psutil.Process(pid)
                if Path(leader.cwd()) == pid_file.parent.resolve() and "nbgrader" in leader.cmdline():
                    os.killpg(pid, signal.SIGKILL)
            except (ValueError, OSError, psutil.Error):
                pass
            pid_file.unlink(missing_ok=True)
        for sockets_file in self.root.glob("work/*/*/sockets"):
            folder = Path(sockets_file.read_text().strip())
            if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith(SOCKETS_PREFIX):
                shutil.rmtree(folder, ignore_errors=True)
            sockets_file.unlink()

    def released_grade_ids(self, chapter: str) -> dict[str, str]:
        """{grade_id: source} of the chapter's released notebook."""
        nb = nbformat.read(self.root / "notebooks" / chapter / f"{chapter}.ipynb", as_version=4)
        return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells if "nbgrader" in c.metadata}


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------
# Before grading: what a look at the notebook can tell


def read_notebook(path: Path) -> nbformat.NotebookNode | str:
    """The notebook, or why it is not one."""
    try:
        return nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 (any way of not being a notebook)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"not a notebook ({reason})"


def wrong_chapter(nb: nbformat.NotebookNode, released: dict[str, str], others: dict[str, set[str]]) -> str | None:
    """Why the notebook is not this chapter's, if it shares no graded cell with it."""
    ids = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}
    if not ids:
        return "no nbgrader cells: this is not the course's notebook (start from the released notebook)"

    def share(theirs) -> float:  # how much of a chapter's cells the notebook holds
        return len(ids & set(theirs)) / max(1, len(theirs))

    mine = share(released)
    better = sorted((ch for ch, theirs in others.items() if share(theirs) > mine), key=lambda ch: -share(others[ch]))
    if better:
        return f"this is the notebook of {better[0]}, not of this chapter"
    if mine == 0:
        return "none of its graded cells belongs to this chapter"
    return None


def review_notes(nb: nbformat.NotebookNode, released: dict[str, str]) -> list[str]:
    """What in the learner's own cells an instructor should look at: edited test cells (nbgrader puts them
    back before grading) and code that reaches for the grading machinery."""
    notes = []
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        locked = grade_id in released and not cell.metadata.get("nbgrader", {}).get("solution")
        if locked:
            if cell.source.strip() != released[grade_id].strip():
                notes.append(f"{grade_id}: a locked cell was edited (nbgrader restored it before grading)")
            continue
        if cell.cell_type != "code":
            continue
        where = grade_id or f"cell {nb.cells.index(cell) + 1}"
        for number, line in enumerate(cell.source.splitlines(), 1):
            for pattern, why in SUSPICIOUS:
                if pattern.search(line):
                    notes.append(f"{where}, line {number}: {why}: {line.strip()[:80]}")
                    break
    missing = [g for g, src in released.items() if g not in {
        c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}]
    if missing:
        notes.append(f"cells deleted: {', '.join(missing)}")
    return notes


# ---------------------------------------------------------------------------------------------------
# One grading run: nbgrader autograde for one submission, in a folder of its own, limited


def _limit_child(memory: int):
    """In the child: a process group of its own (to kill it whole), the memory cap (inherited by the kernel),
    and death when the grading process dies."""
    def preexec() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return preexec


@dataclasses.dataclass
class RunOutcome:
    ok: bool
    status: str = "graded"
    detail: str = ""
    seconds: float = 0.0
    kernel_never_started: bool = False  # no cell of the learner's ran: the run may be repeated


def run_one(ws: Workspace, s: Submission, limits: Limits, protect: list[str], verbose: bool) -> RunOutcome:
    """`nbgrader autograde` of one submission in ``ws.run_dir``; the kernel may read only that folder's
    notebook folder, of everything in the workspace and the class. A run whose kernel never started (no cell
    of the learner's ran) is not the learner's doing: it is run once more."""
    outcome = _run_once(ws, s, limits, protect, verbose)
    if outcome.kernel_never_started:
        first = outcome.seconds
        outcome = _run_once(ws, s, limits, protect, verbose)
        outcome.seconds += first
    return outcome


def _run_once(ws: Workspace, s: Submission, limits: Limits, protect: list[str], verbose: bool) -> RunOutcome:
    run = ws.run_dir(s.student, s.chapter)
    if run.exists():
        shutil.rmtree(run)
    (run / "submitted" / s.student / s.chapter).mkdir(parents=True)
    shutil.copyfile(s.path, run / "submitted" / s.student / s.chapter / f"{s.chapter}.ipynb")
    shutil.copyfile(ws.template / "gradebook.db", run / "gradebook.db")
    # The kernel's sockets are files in a short folder of this run's own (a Unix socket path has at most 107
    # bytes; the run folder can be deeper than that allows).
    runtime = Path(tempfile.mkdtemp(prefix=SOCKETS_PREFIX))
    (run / "sockets").write_text(str(runtime))  # for stop_leftover_runs, should this process be killed
    write_config(run, limits.cell_timeout, kernel_sockets=runtime / "kernel")
    env = nbgrader_env({
        "MINIGPT_GRADE_PROTECT": os.pathsep.join(protect),
        "MINIGPT_GRADE_ALLOW": str(run / "autograded" / s.student / s.chapter),
        "PYTHONDONTWRITEBYTECODE": "1",
        "JUPYTER_RUNTIME_DIR": str(runtime),
    })
    log_path = run / "nbgrader.log"
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "nbgrader", "autograde", s.chapter, "--student", s.student],
                cwd=run, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_limit_child(limits.memory),
            )
            (run / "pid").write_text(str(proc.pid))
            try:
                proc.wait(timeout=limits.timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                kill_tree(proc)
                (run / "pid").unlink(missing_ok=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    seconds = time.monotonic() - start
    text = log_path.read_text(errors="replace")
    if verbose:
        sys.stderr.write(text)
    if timed_out:
        return RunOutcome(False, "timeout", f"stopped after the time limit of {limits.timeout:g} s for one notebook",
                          seconds)
    if autograded_path(run, s.student, s.chapter).is_file() and proc.returncode == 0:
        return RunOutcome(True, seconds=seconds)
    return RunOutcome(False, "error", nbgrader_error(text), seconds,
                      kernel_never_started=bool(KERNEL_NEVER_STARTED.search(text)))


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a grading run whatever state it is in: nbgrader's process group and its kernel, which
    jupyter_client starts in a session of its own."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def clip_outputs(nb: nbformat.NotebookNode) -> None:
    """Cap each output's text, so a notebook that printed megabytes stays a few hundred kilobytes."""
    def clip(text):
        text = "".join(text) if isinstance(text, list) else text
        if len(text) <= OUTPUT_MAX_CHARS:
            return text
        return text[:OUTPUT_MAX_CHARS] + f"\n... [{len(text) - OUTPUT_MAX_CHARS:,} more characters cut by the grader]\n"
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = clip(out["text"])
            for mime, value in list(out.get("data", {}).items()):
                if isinstance(value, (str, list)) and len(value) > OUTPUT_MAX_CHARS:
                    out["data"][mime] = clip(value)


def record(ws: Workspace, s: Submission, gb_url: str) -> None:
    """Put one run's grades into the workspace's gradebook with nbgrader's own SaveAutoGrades, and its
    notebooks where nbgrader keeps them (submitted/, autograded/)."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import SaveAutoGrades

    run = ws.run_dir(s.student, s.chapter)
    nb = nbformat.read(autograded_path(run, s.student, s.chapter), as_version=4)
    clip_outputs(nb)
    for kind, folder in (("submitted", run / "submitted"), ("autograded", run / "autograded")):
        dest = ws.root / kind / s.student / s.chapter
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(folder / s.student / s.chapter, dest)
    autograded_path(ws.root, s.student, s.chapter).unlink()  # nbgrader leaves it read-only
    nbformat.write(nb, autograded_path(ws.root, s.student, s.chapter))
    with Gradebook(gb_url) as gb, warnings.catch_warnings():
        # nbgrader's own autograde makes the same calls; SQLAlchemy warns about its session handling there too
        warnings.filterwarnings("ignore", message=".*not in session.*")
        gb.update_or_create_student(s.student)
        gb.update_or_create_submission(s.chapter, s.student)
    resources = {"nbgrader": {"notebook": s.chapter, "assignment": s.chapter, "student": s.student, "db_url": gb_url}}
    SaveAutoGrades().preprocess(nb, resources)


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
    own = []  # errors in cells that are not test cells: they explain the lost points that follow
    for i, cell in enumerate(notebook.cells, 1):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("grade") and any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            own.append(f"{meta.get('grade_id') or f'cell {i}'}: {error_message(cell)}")
    return Result(student, chapter, "graded", submission.score, submission.max_score, lost,
                  needs_manual_grade=submission.needs_manual_grade, cell_errors=own[:5])


def feedback_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The autograded notebook as a learner may see it: hidden tests cut out, errors without tracebacks."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = HIDDEN_BLOCK.sub(HIDDEN_NOTE, cell.source)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {ANSI_ESCAPE.sub('', out.get('evalue', ''))}"]
    return nb


def write_feedback(ws: Workspace, done: list[Submission], verbose: bool) -> None:
    """nbgrader's feedback page of each graded submission, made from the learner's view of its notebook."""
    for ch in sorted({s.chapter for s in done}):
        for s in [s for s in done if s.chapter == ch]:
            nb = nbformat.read(autograded_path(ws.root, s.student, ch), as_version=4)
            dest = ws.root / "feedback-source" / s.student / ch / f"{ch}.ipynb"
            dest.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(feedback_notebook(nb), dest)
        students = sorted({s.student for s in done if s.chapter == ch})
        args = ["generate_feedback", ch, "--force", "--CourseDirectory.autograded_directory=feedback-source"]
        if len(students) == 1:
            args += ["--student", students[0]]
        proc = nbgrader(ws.root, *args, verbose=verbose)
        if proc.returncode != 0:
            warn(f"nbgrader generate_feedback {ch} failed (scores are unaffected):\n{log_tail(proc.stdout)}")


def learner_page(student: str, results: list[Result], root: Path) -> str:
    """One learner's summary: a row per chapter, and the reason for every lost point."""
    e = html.escape
    rows, details = [], []
    for r in results:
        score = f"{points(r.score)} / {points(r.max_score)}"
        status = {"graded": "graded"}.get(r.status, f"{r.status}: {r.detail}")
        if r.status == "graded" and r.needs_manual_grade:
            status = "graded; some cells wait for the instructor"
        link = ""
        fb = feedback_path(root, student, r.chapter)
        if r.status == "graded" and fb.is_file():
            link = f' (<a href="{e(r.chapter)}/{e(r.chapter)}.html">the notebook with its results</a>)'
        rows.append(f"<tr><td>{e(r.chapter)}</td><td>{e(score)}</td><td>{e(status)}{link}</td></tr>")
        if r.cell_errors:
            items = "".join(f"<li><pre>{e(msg)}</pre></li>" for msg in r.cell_errors)
            details.append(f"<h2>{e(r.chapter)}: errors in your own cells</h2><ul>{items}</ul>")
        if r.lost:
            items = "".join(
                f"<li><code>{e(lp.grade_id)}</code> ({points(lp.score)} / {points(lp.max_score)}): "
                f"<pre>{e(lp.message)}</pre></li>" for lp in r.lost)
            details.append(f"<h2>{e(r.chapter)}: what lost points</h2><ul>{items}</ul>")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>minigpt feedback: {e(student)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
        "border-bottom:1px solid #ddd;text-align:left}pre{white-space:pre-wrap;margin:.2em 0}</style></head><body>"
        f"<h1>Feedback for {e(student)}</h1><table><tr><th>chapter</th><th>score</th><th>status</th></tr>"
        + "".join(rows) + "</table>" + "".join(details) + "</body></html>\n"
    )


def write_reports(ws: Workspace, results: list[Result]) -> Path:
    """grades.csv (a row per student and chapter) and feedback/<student>/index.html."""
    by_student: dict[str, list[Result]] = {}
    for r in results:
        by_student.setdefault(r.student, []).append(r)
    for student, rs in by_student.items():
        atomic_write(ws.root / "feedback" / student / "index.html", learner_page(student, rs, ws.root))
    table = ws.root / "grades.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "chapter", "status", "score", "max_score", "lost", "detail", "review"])
        for r in results:
            w.writerow([r.student, r.chapter, r.status, points(r.score, ""), points(r.max_score, ""),
                        "; ".join(f"{lp.grade_id} {points(lp.score)}/{points(lp.max_score)}" for lp in r.lost),
                        r.detail, " | ".join(r.review)])
    return table


# ---------------------------------------------------------------------------------------------------
# The batch


class Progress:
    """A progress bar on a terminal; a line per finished notebook otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="notebook", desc="grading", file=sys.stderr)

    def update(self, r: Result) -> None:
        self.done += 1
        if not self.enabled:
            return
        score = f"{points(r.score)}/{points(r.max_score)}" if r.status == "graded" else r.status
        if self.bar is not None:
            self.bar.set_postfix_str(f"{r.student} {r.chapter} {score}", refresh=False)
            self.bar.update(1)
        else:
            took = "" if r.seconds is None else f" ({r.seconds:.0f} s)"
            print(f"minigpt-grade: [{self.done}/{self.total}] {r.student} {r.chapter}: {score}{took}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def grade(submissions: list[Submission], course_root: Path, workdir: Path, *, jobs: int | None = None,
          limits: Limits = Limits(), fresh: bool = False, progress: bool = False,
          verbose: bool = False) -> list[Result]:
    """Grade every submission (reusing results recorded for the same notebook and chapter), and return a
    result per submission, in order."""
    from nbgrader.api import Gradebook  # slow import: only once the command line is known to be good

    for s in submissions:
        if s.path is not None and s.path.is_relative_to(workdir):
            raise UsageError(f"{s.path} is inside the workspace {workdir}, where grading keeps its own files")
    chapters = sorted({s.chapter for s in submissions})
    ws = Workspace(workdir, course_root)
    ws.open(chapters, fresh, verbose)
    gb_url = f"sqlite:///{ws.root / 'gradebook.db'}"
    released = {ch: ws.released_grade_ids(ch) for ch in chapters}
    all_ids = {ch: set(ids) for ch, ids in released.items()}
    for ch in course_chapters(course_root):
        if ch not in all_ids:
            nb = read_notebook(course_root / "solutions" / ch / f"{ch}.ipynb")
            if not isinstance(nb, str):
                all_ids[ch] = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}
    with Gradebook(gb_url) as gb:
        max_of = {ch: gb.find_assignment(ch).max_score for ch in chapters}

    results: dict[tuple[str, str], Result] = {}
    todo: list[tuple[Submission, str, list[str]]] = []
    bar = Progress(len(submissions), progress)

    def finish(s: Submission, r: Result, digest: str | None) -> None:
        r.submission = str(s.path) if s.path else None
        if r.max_score is None:
            r.max_score = max_of[s.chapter]
        results[s.student, s.chapter] = r
        if digest is not None and not r.reused:
            payload = {"submission_sha256": digest, "source": ws.sources[s.chapter], "result": dataclasses.asdict(r)}
            atomic_write(ws.result_file(s.student, s.chapter), json.dumps(payload, indent=2) + "\n")
        bar.update(r)

    for s in submissions:
        if s.path is None:
            finish(s, Result(s.student, s.chapter, "missing", detail="no notebook handed in"), None)
            continue
        digest = file_hash(s.path)
        cached = reuse(ws, s, digest)
        if cached is not None:
            finish(s, cached, digest)
            continue
        nb = read_notebook(s.path)
        if isinstance(nb, str):
            finish(s, Result(s.student, s.chapter, "unreadable", detail=nb), digest)
            continue
        others = {ch: ids for ch, ids in all_ids.items() if ch != s.chapter}
        why = wrong_chapter(nb, released[s.chapter], others)
        if why:
            finish(s, Result(s.student, s.chapter, "wrong-notebook", detail=why), digest)
            continue
        todo.append((s, digest, review_notes(nb, released[s.chapter])))

    protect = [str(ws.root / name) for name in
               ("solutions", "notebooks", "submitted", "autograded", "feedback", "feedback-source", "results",
                "work", "template", "gradebook.db")]
    protect += [str(course_root / "solutions")] + sorted({str(s.path) for s in submissions if s.path})
    graded: list[Submission] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or default_jobs()) as pool:
            futures = {pool.submit(run_one, ws, s, limits, protect, verbose): (s, digest, notes)
                       for s, digest, notes in todo}
            for future in concurrent.futures.as_completed(futures):
                s, digest, notes = futures[future]
                outcome = future.result()
                if outcome.ok:
                    record(ws, s, gb_url)  # this thread alone writes the gradebook
                    with Gradebook(gb_url) as gb:
                        r = read_result(gb, ws.root, s.student, s.chapter)
                    graded.append(s)
                else:
                    r = Result(s.student, s.chapter, outcome.status, detail=outcome.detail,
                               log=str(ws.keep_log(s.student, s.chapter)))
                r.review, r.seconds = notes, round(outcome.seconds, 1)
                finish(s, r, digest)
                shutil.rmtree(ws.run_dir(s.student, s.chapter), ignore_errors=True)
    finally:
        bar.close()
    if graded:
        write_feedback(ws, graded, verbose)
    ordered = [results[s.student, s.chapter] for s in submissions]
    for r in ordered:
        fb = feedback_path(ws.root, r.student, r.chapter)
        r.feedback = str(fb) if r.status == "graded" and fb.is_file() else None
    write_reports(ws, ordered)
    return ordered


def reuse(ws: Workspace, s: Submission, digest: str) -> Result | None:
    """The recorded result of this very notebook for this very chapter, if there is one."""
    try:
        saved = json.loads(ws.result_file(s.student, s.chapter).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("submission_sha256") != digest or saved.get("source") != ws.sources[s.chapter]:
        return None
    r = Result.from_dict(saved["result"])
    if r.status in ("timeout", "error"):  # no score: run it again (what stopped it may have been the machine)
        return None
    if r.status == "graded" and not autograded_path(ws.root, s.student, s.chapter).is_file():
        return None
    r.reused, r.seconds = True, None
    return r


def points(x: float | None, none: str = "-") -> str:
    return none if x is None else f"{x:g}"


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
        ] + [f"    error in {e}".replace("\n", "\n      ") for e in r.cell_errors] + [
            f"    review: {note}" for note in r.review] + ([f"    nbgrader's log: {r.log}"] if r.log else [])
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
    parser.add_argument("-j", "--jobs", type=int, default=default_jobs(),
                        help="notebooks graded at once (default: the cores this process may use)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds one notebook may take, start to end (default: {DEFAULT_TIMEOUT})")
    parser.add_argument("--cell-timeout", type=int, help="seconds one cell may take (default: the course's 120)")
    parser.add_argument("--memory", default=DEFAULT_MEMORY,
                        help=f"address space of one notebook's kernel, e.g. 4G (default: {DEFAULT_MEMORY})")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results and grade everything again")
    parser.add_argument("--csv", type=Path, metavar="PATH", help="also copy the grade table (grades.csv) to PATH")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or progress lines")
    parser.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
    args = parser.parse_args(argv)
    if bool(args.notebooks) == bool(args.class_dir):
        parser.error("give either notebooks or --class DIR")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.cell_timeout is not None and args.cell_timeout <= 0:
        parser.error(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    course_root = args.course_root.resolve()
    workdir = (args.workdir or course_root / ".grading").resolve()
    start = time.monotonic()
    try:
        limits = Limits(timeout=args.timeout, memory=parse_size(args.memory), cell_timeout=args.cell_timeout)
        known = graded_chapters(course_root)
        if args.class_dir:
            submissions = class_submissions(Path(args.class_dir).resolve(), args.chapter, known)
        else:
            chapter = args.chapter[0] if args.chapter else None
            if len(args.chapter) > 1:
                raise UsageError("give one --chapter with loose notebooks")
            submissions = notebook_submissions(args.notebooks, args.student, chapter, known)
        results = grade(submissions, course_root, workdir, jobs=args.jobs, limits=limits, fresh=args.fresh,
                        progress=not args.quiet, verbose=args.verbose)
    except UsageError as e:
        warn(str(e))
        return 2
    except NbgraderFailed as e:
        warn(f"{e}\n(full log: {workdir / 'logs' / 'nbgrader.log'})")
        return 1

    print(format_table(results))
    ran = [r for r in results if r.seconds is not None]
    reused = sum(r.reused for r in results)
    elapsed = time.monotonic() - start
    print(f"\n{len(ran)} notebooks graded in {elapsed:.0f} s"
          + (f" ({60 * len(ran) / elapsed:.1f} per minute, {args.jobs} at once)" if ran else "")
          + (f"; {reused} unchanged since an earlier run, not graded again" if reused else ""))
    print(f"grade table: {workdir / 'grades.csv'}; feedback: {workdir / 'feedback'}/<student>/index.html")
    if args.csv:
        shutil.copyfile(workdir / "grades.csv", args.csv)
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
