"""Grade minigpt notebooks: one notebook, or a whole class in parallel, each in a sandbox, judged outside it.

    minigpt-grade notebooks/01-tokens/01-tokens.ipynb          # one notebook, student "you"
    minigpt-grade --class submissions/                         # submissions/<student>/<NN-topic>.ipynb
                                                               # or submissions/<student>/<NN-topic>/<NN-topic>.ipynb

For each submission:

1. **Intake**: a regular file (no links), not too large, copied into the workspace; a student id of plain
   characters. What is not a notebook, or is another chapter's, gets a row that says so.
2. **Sanitize** with nbgrader's own preprocessors (as ``nbgrader autograde`` does): outputs cleared, the locked
   cells and hidden tests put back from the instructor's version, the kernel fixed.
3. **Run** in a sandbox (``autograder.sandbox``): nbgrader's Execute preprocessor and the kernel, with no view
   of the course's answers, the checks, the workspace or other learners, no network, limits on time, memory,
   processes and output. Its hidden cells serve the judge's requests (``autograder.hidden``).
4. **Judge**, in this process, which never imports or runs learner code: each hidden test cell's checks run
   on stand-ins of the learner's objects; only plain data crosses (``autograder.judge``, ``autograder.wire``).
5. **Record**: the autograded notebook is the sanitized one with the run's outputs (checked, cut) and the
   judge's verdicts in the test cells; nbgrader's SaveAutoGrades writes its scores into the workspace's
   gradebook. A test cell gets its points when its hidden tests passed and the cell raised no error.

The workspace (default `.grading/` under the course root) is nbgrader's course directory: `solutions/`
(a copy of the chapters graded), `notebooks/` (their release), `submitted/`, `autograded/`, `feedback/`
and `gradebook.db`, into which every result is written by this process alone. It is kept between runs:
a result is reused while the submission, its chapter and the grader are unchanged, so running the same batch
again grades nothing twice, and a batch that was interrupted goes on where it stopped. `--fresh` starts over.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import csv
import dataclasses
import datetime
import errno
import hashlib
import html
import importlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tokenize
import traceback
import warnings
from pathlib import Path

import nbformat

from autograder import inert, sandbox
from autograder.run import HIDDEN_BLOCK, JudgeFailed, RunOutcome, blocked_modules, judged_cells, run_one, valid_text

PACKAGE_DIR = Path(__file__).resolve().parent
BASE_CONFIG = PACKAGE_DIR / "nbgrader_config.py"
DEFAULT_COURSE_ROOT = PACKAGE_DIR.parent
WORKSPACE_MARKER = ".minigpt-grade-workspace"
MESSAGE_MAX_LINES = 8
MESSAGE_MAX_CHARS = 1000
MAX_SUBMISSION = 20 * 1024 * 1024  # bytes of a notebook handed in
# nbgrader's receipt of a notebook handed in through its exchange: `nbgrader collect` puts these beside it in
# submitted/<student>/<chapter>/, and `nbgrader release_feedback` needs them beside the feedback page (the secret
# names the page that the learner's `fetch_feedback` looks for).
EXCHANGE_RECEIPT = ("timestamp.txt", "submission_secret.txt")
MAX_RECEIPT = 4096  # bytes of each receipt file
RECEIPT_SECRET = re.compile(r"[0-9a-f]{32,256}")  # nbgrader writes secrets.token_hex(64)
DEFAULT_TIMEOUT = 900  # seconds for one notebook, start to end
DEFAULT_MEMORY = "4G"  # all of one notebook's processes together, and each one's address space
DEFAULT_CELL_TIMEOUT = 120  # the course's nbgrader setting (autograder/nbgrader_config.py)
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
HIDDEN_NOTE = "# (hidden tests ran here; what they found is below)\n"
# What a submission's own code should have no business mentioning. A match does not change the score; it
# puts the submission on the instructor's review list.
SUSPICIOUS = [
    (re.compile(r"\bautograder\b|\bMINIGPT_JUDGE\b"), "mentions the autograder"),
    (re.compile(r"\bsolutions\b\s*[/\\'\"]|\bgradebook\b|\.grading\b"), "names grading files"),
    (re.compile(r"\b(exec|eval)\s*\((?!\s*\))"), "runs code from a string"),
    (re.compile(r"\bsys\.(modules|meta_path|path_hooks|addaudithook|setprofile|settrace|_getframe)\b"),
     "reaches into the interpreter"),
    (re.compile(r"\bget_ipython\(\)\.(events|input_transformers\w*|ast_transformers)\b|\bbuiltins\b|__builtins__"),
     "patches the interpreter"),
    (re.compile(r"\bos\._exit\b|\bctypes\b|\bsetrlimit\b|\bos\.kill\b|\bsignal\.SIG"), "kills or bypasses the kernel"),
    (re.compile(r"^\s*[!%]|\bsubprocess\b|\bos\.system\b|\bos\.popen\b|\bos\.fork\b"), "runs other programs"),
    (re.compile(r"\b__import__\s*\(|\bimportlib\b"), "imports by name"),
    (re.compile(r"\bsocket\b"), "opens sockets"),
]
# The oracles the checks compare a chapter's answers with (DESIGN.md, invariant 6; the docstrings of
# autograder/checks), as a line reaches them: by name, as an attribute, or as a string given to getattr, globals()
# or an import. A notebook that hands a chapter's work to its oracle gets the oracle's marks. Per chapter only what
# its lessons ask the learner to write: chapter 4 may call F.layer_norm, chapter 7 scaled_dot_product_attention.
# No pattern backtracks over more than a bounded stretch: matching takes time linear in the length of a line.
ORACLES = {
    "01-tokens": [(re.compile(r"\btiktoken\b|\bgpt2_encoding\b"), "tiktoken")],
    "02-embeddings": [(re.compile(r"\.\s*(one_hot|embedding)\b|\bEmbedding\b|'(one_hot|embedding)'"
                                  r"|\bfunctional import\b.{0,200}?\b(one_hot|embedding)\b"),
                       "torch's F.one_hot, F.embedding or nn.Embedding")],
    "03-attention": [(re.compile(r"\bscaled_dot_product_attention\b|\bMultiheadAttention\b"
                                 r"|\bmulti_head_attention_forward\b"),
                      "torch's scaled_dot_product_attention or nn.MultiheadAttention")],
    "08-training": [(re.compile(r"\.\s*cross_entropy\b|\bCrossEntropyLoss\b|'cross_entropy'"
                                r"|\bfunctional import\b.{0,200}?\bcross_entropy\b"), "torch's F.cross_entropy")],
}
# Hugging Face's models, tokenizers, logits processors and generate, and the capstone's oracles: in any chapter.
ORACLES_EVERYWHERE = [
    (re.compile(r"\btransformers\b|\b(from|import) tokenizers\b|'tokenizers'|\bGPT2[A-Z]|\bAuto(Model|Tokenizer)"
                r"|Logits(Processor|Warper)|\bprefix_allowed_tokens_fn\b"), "Hugging Face's transformers"),
    (re.compile(r"\bcapstone\b"), "coursekit.capstone"),
]
# Characters of a notebook's code read for oracles: five times the longest reference's (chapter 9's), and a few
# seconds of the grader's time at worst (a token per character); a longer notebook gets a note instead.
ORACLE_READ_LIMIT = 200_000


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


# ---------------------------------------------------------------------------------------------------
# What to grade


def course_chapters(course_root: Path) -> list[str]:
    """Chapters are the folders `solutions/<NN-topic>/` holding `<NN-topic>.ipynb`."""
    solutions = course_root / "solutions"
    if not solutions.is_dir():
        return []
    return sorted(p.name for p in solutions.iterdir() if (p / f"{p.name}.ipynb").is_file())


def graded_chapters(course_root: Path) -> list[str]:
    """The chapters with something to grade: a cell worth points (the capstone, 10-capstone, has none)."""
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


def check_student(student: str) -> None:
    if not STUDENT_ID.fullmatch(student):
        raise UsageError(f"student id {student!r}: use letters, digits and . _ @ + -, starting with a letter or "
                         "digit, at most 64 characters")


def notebook_submissions(paths: list[str], student: str, chapter: str | None, known: list[str]) -> list[Submission]:
    """Loose notebooks of one student; the chapter is the file name unless --chapter says otherwise."""
    if chapter and len(paths) > 1:
        raise UsageError("--chapter names the chapter of a single notebook; give one notebook with it")
    check_student(student)
    submissions = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise UsageError(f"no such notebook: {p}")
        submissions.append(Submission(student, chapter or path.stem, Path(os.path.abspath(path))))
    check_chapters([s.chapter for s in submissions], known)
    return submissions


def class_submissions(class_dir: Path, wanted: list[str], known: list[str]) -> list[Submission]:
    """Notebooks laid out `DIR/<student>/<NN-topic>.ipynb` or `DIR/<student>/<NN-topic>/<NN-topic>.ipynb`.

    Without --chapter, the chapters are those any student handed in; a student without one of them gets
    a "missing" row, so a class table has a row for every student and chapter. A student folder that is a
    link, or whose name is not a plain id, is left out with a warning.
    """
    if not class_dir.is_dir():
        raise UsageError(f"no such class folder: {class_dir}")
    check_chapters(wanted, known)
    students = []
    for p in sorted(class_dir.iterdir()):
        if p.name.startswith(".") or not p.is_dir():
            continue
        if p.is_symlink():
            warn(f"ignored {p}: a link, not a student folder")
        elif not STUDENT_ID.fullmatch(p.name):
            warn(f"ignored {p}: {p.name!r} is not a plain student id (letters, digits and . _ @ + -)")
        else:
            students.append(p)
    if not students:
        raise UsageError(f"no student folders in {class_dir}")
    found: dict[tuple[str, str], Path] = {}
    for student_dir in students:
        for ch in known:
            # A chapter folder that is a link stands for the notebook: reading it is refused like a linked notebook
            # (through it, the notebook's own path would follow the link to anywhere, the course's answers included).
            folder = student_dir / ch
            layouts = [student_dir / f"{ch}.ipynb", folder if folder.is_symlink() else folder / f"{ch}.ipynb"]
            present = [p for p in layouts if p.is_file() or p.is_symlink()]
            if len(present) > 1:
                warn(f"{student_dir.name} has both {present[0]} and {present[1]}; grading the first")
            if present:
                found[(student_dir.name, ch)] = Path(os.path.abspath(present[0]))
        for nb in sorted(student_dir.glob("*.ipynb")) + sorted(student_dir.glob("*/*.ipynb")):
            if nb.stem not in known and ".ipynb_checkpoints" not in nb.parts:
                warn(f"ignored {nb}: no chapter {nb.stem} in solutions/")
    chapters = wanted or sorted({ch for (_, ch) in found})
    if not chapters:
        raise UsageError(f"no notebook of any chapter in {class_dir}")
    return [Submission(s.name, ch, found.get((s.name, ch))) for s in students for ch in chapters]


def exchange_receipt(s: Submission) -> tuple[dict[str, bytes], dict[str, bytes], str]:
    """nbgrader's exchange receipt for a notebook: (the files of it that came with the notebook and are nbgrader's,
    the receipt to keep beside it, a note for the review list).

    The receipt is read beside a notebook laid out `<student>/<chapter>/<chapter>.ipynb` (as `nbgrader collect`
    leaves it), like the notebook itself: regular files only, small ones. The learner wrote these files, so each is
    checked: a timestamp that nbgrader cannot parse, or a secret that is not the hex text nbgrader writes, would stop
    `nbgrader release_feedback` (and a stock `generate_feedback`) for the whole class. What is missing or not
    nbgrader's is made up (the notebook's modification time, a new random secret), so the class's feedback can always
    be released; the learner's `fetch_feedback` then finds none for a receipt that was replaced.
    """
    found, bad = {}, []
    if s.path.parent.name == s.chapter:
        for name in EXCHANGE_RECEIPT:
            path = s.path.parent / name
            if not os.path.lexists(path):
                continue
            content = read_receipt(path)
            why = content if isinstance(content, str) else receipt_problem(name, content)
            if why:
                bad.append(f"{name}: {why}")
            else:
                found[name] = content
    kept = dict(found)
    if "timestamp.txt" not in kept:
        when = datetime.datetime.fromtimestamp(os.lstat(s.path).st_mtime, datetime.timezone.utc)
        kept["timestamp.txt"] = when.strftime("%Y-%m-%d %H:%M:%S.%f UTC").encode()
    if "submission_secret.txt" not in kept:
        kept["submission_secret.txt"] = secrets.token_hex(64).encode()  # as nbgrader makes one (not in the digest)
    note = ""
    if bad:
        note = (f"its exchange receipt is not nbgrader's ({'; '.join(bad)}): replaced, so the learner's "
                "`nbgrader fetch_feedback` will not find its feedback")
    return found, kept, note


def read_receipt(path: Path) -> bytes | str:
    """The bytes of a receipt file, or why they are not taken (a link, not a regular file, too big)."""
    return read_regular(path, MAX_RECEIPT, link="a symbolic link",
                        too_big=lambda size: f"{size} bytes, more than a receipt can be ({MAX_RECEIPT})")


def receipt_problem(name: str, content: bytes) -> str:
    """Why a receipt file is not one nbgrader wrote ('' when it is)."""
    try:
        text = content.decode("ascii").strip()
    except UnicodeDecodeError:
        return "not text"
    if name == "submission_secret.txt":
        return "" if RECEIPT_SECRET.fullmatch(text) else "not the hex text nbgrader writes"
    if not text:
        return "empty"
    from nbgrader.utils import parse_utc

    try:
        parse_utc(text)
    except Exception:  # noqa: BLE001 (dateutil raises several kinds)
        return "not a timestamp nbgrader can read"
    return ""


def read_submission(path: Path) -> bytes | str:
    """The bytes of a handed-in notebook, or why they cannot be taken: only a regular file, never a link (it
    could point at another learner's work or the course's answers), and not a huge one."""
    return read_regular(path, MAX_SUBMISSION, link="a symbolic link, not a notebook file (hand in the file itself)",
                        too_big=lambda size: f"{size / 2**20:.0f} MB, more than a notebook of this course can be "
                                             f"({MAX_SUBMISSION // 2**20} MB)")


def read_regular(path: Path, limit: int, *, link: str, too_big) -> bytes | str:
    """The bytes of a regular file of at most ``limit`` bytes, or why they are not taken: ``link`` when the path
    is a symbolic link (never followed), ``too_big(size)``, not a regular file (a pipe is not waited on), unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        return link if err.errno == errno.ELOOP else f"cannot be read ({err.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)  # (a file that grew since fstat is caught here)
        return too_big(max(info.st_size, len(data))) if max(info.st_size, len(data)) > limit else data
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# nbgrader


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


# ---------------------------------------------------------------------------------------------------
# The workspace: nbgrader's course directory, kept between runs


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


# ---------------------------------------------------------------------------------------------------
# Before grading: what a look at the notebook can tell


def read_notebook(data: bytes | Path) -> nbformat.NotebookNode | str:
    """The notebook, or why it is not one."""
    try:
        text = (data.read_bytes() if isinstance(data, Path) else data).decode("utf-8")
        if re.search(r"\\u[dD][89a-fA-F]", text):  # a lone surrogate parses, and then nothing can write it
            text = json.dumps(_valid(json.loads(text)))
        return nbformat.reads(text, as_version=4)
    except Exception as e:  # noqa: BLE001 (any way of not being a notebook)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"not a notebook ({reason[:300]})"


def _valid(data):
    """JSON data with every string made valid Unicode (``run.valid_text``)."""
    if isinstance(data, str):
        return valid_text(data)
    if isinstance(data, list):
        return [_valid(v) for v in data]
    if isinstance(data, dict):
        return {valid_text(k): _valid(v) for k, v in data.items()}
    return data


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


def cell_name(nb: nbformat.NotebookNode, index: int) -> str:
    """A cell as JupyterLab lets a learner find it: its grade id, or the graded cell it follows."""
    grade_id = nb.cells[index].metadata.get("nbgrader", {}).get("grade_id")
    if grade_id:
        return grade_id
    before = next((c.metadata["nbgrader"]["grade_id"] for c in reversed(nb.cells[:index])
                   if c.metadata.get("nbgrader", {}).get("grade_id")), None)
    return f"the cell after {before}" if before else "a cell before the first graded one"


def review_notes(nb: nbformat.NotebookNode, release: nbformat.NotebookNode, chapter: str) -> list[str]:
    """What in the learner's own cells an instructor should look at: edited locked cells (nbgrader puts them
    back before grading), code that reaches for the grading machinery, and the learner's own lines (not the
    notebook's given ones) that use an oracle of ``chapter``'s checks. ``release``: the chapter's released
    notebook."""
    released = {c.metadata["nbgrader"]["grade_id"]: c.source for c in release.cells if "nbgrader" in c.metadata}
    given = {line.strip() for c in release.cells if c.cell_type == "code" for line in c.source.split("\n")}
    oracles = chapter_oracles(release, chapter)
    notes = []
    size = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
    if size > ORACLE_READ_LIMIT:
        notes.append(f"not read for oracles: {size:,} characters of code (read it yourself)")
        oracles = []
    for i, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        locked = grade_id in released and not cell.metadata.get("nbgrader", {}).get("solution")
        if locked:
            if cell.source.strip() != released[grade_id].strip():
                notes.append(f"{grade_id}: a locked cell was edited (nbgrader restored it before grading)")
            continue
        if cell.cell_type != "code":
            continue
        for number, line in enumerate(cell.source.splitlines(), 1):
            for pattern, why in SUSPICIOUS:
                if pattern.search(line):
                    notes.append(f"{cell_name(nb, i)}, line {number}: {why}: {line.strip()[:80]}")
                    break
        if not oracles:
            continue
        lines = cell.source.split("\n")  # as the tokenizer counts them
        for number, code in code_lines(cell.source).items():
            if lines[number - 1].strip() in given:
                continue
            oracle = next((name for pattern, name in oracles if pattern.search(code)), None)
            if oracle:
                notes.append(f"{cell_name(nb, i)}, line {number}: uses {oracle}, an oracle of the checks: "
                             f"{lines[number - 1].strip()[:80]}")
    missing = [g for g in released if g not in {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}]
    if missing:
        notes.append(f"cells deleted: {', '.join(missing)}")
    return notes


def chapter_oracles(release: nbformat.NotebookNode, chapter: str) -> list[tuple[re.Pattern, str]]:
    """The oracles of ``chapter``'s checks, and the names that the released notebook's given code binds to one at
    its top level, such as chapter 1's ``reference = coursekit.gpt2_encoding()``; its tests aside, whose names are
    plain ones (chapter 4's ``config = GPT2Config(...)``) that a learner's code uses for its own."""
    oracles = ORACLES.get(chapter, []) + ORACLES_EVERYWHERE
    names = []
    for cell in release.cells:
        if cell.cell_type != "code" or cell.metadata.get("nbgrader", {}).get("grade"):
            continue
        lines = cell.source.split("\n")
        for number, code in code_lines(cell.source).items():
            bound = re.match(r"([A-Za-z_]\w*) =(?!=)", code)
            oracle = next((name for pattern, name in oracles if pattern.search(code)), None)
            if bound and oracle and not lines[number - 1][:1].isspace():
                names.append((re.compile(rf"\b{bound[1]}\b"), f"{oracle} (as the notebook's {bound[1]})"))
    return oracles + names


def code_lines(source: str) -> dict[int, str]:
    """{line number: what the line runs} of a cell's code, its tokens joined by spaces: without comments and
    documentation (a statement that is only strings), and of its strings only those that could name something
    (``getattr(F, "one_hot")``, ``globals()["reference"]``), as 'name'. Where a cell stops tokenizing (a cell
    magic's text), its lines from there on are taken as they are written."""
    lines: dict[int, list[str]] = {}
    statement: list[tokenize.TokenInfo] = []
    last = 1  # the line of the last token read

    def end_statement() -> None:
        if any(t.type != tokenize.STRING for t in statement):
            for t in statement:
                lines.setdefault(t.start[0], []).append(_token_text(t))
        statement.clear()

    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            last = t.start[0]
            if t.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                end_statement()
            elif t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING, tokenize.ERRORTOKEN):
                statement.append(t)
    except (tokenize.TokenError, SyntaxError):
        for number, line in enumerate(source.split("\n")[last - 1:], last):
            lines.setdefault(number, []).append(line)
    end_statement()
    return {number: " ".join(parts) for number, parts in lines.items()}


def _token_text(t: tokenize.TokenInfo) -> str:
    if t.type != tokenize.STRING:
        return t.string
    quoted = re.fullmatch(r"""[A-Za-z]*('''|\"\"\"|'|")(.*)\1""", t.string, re.S)
    return f"'{quoted[2]}'" if quoted and re.fullmatch(r"[\w.]+", quoted[2]) else "''"


def sanitize(nb: nbformat.NotebookNode, ws: Workspace, s: Submission) -> nbformat.NotebookNode:
    """What `nbgrader autograde` does before it runs a notebook, with nbgrader's own preprocessors: outputs
    cleared, cell ids made unique, the kernel and the locked cells (hidden tests included) put back from the
    instructor's version, the cells' metadata checked."""
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, DeduplicateIds, OverwriteCells, \
        OverwriteKernelspec

    resources = {"nbgrader": {"notebook": s.chapter, "assignment": s.chapter, "student": s.student,
                              "db_url": ws.db_url}}
    for preprocessor in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata):
        nb, resources = preprocessor().preprocess(nb, resources)
    return nb


# ---------------------------------------------------------------------------------------------------
# One run: the notebook in a sandbox, its hidden cells judged here


# ---------------------------------------------------------------------------------------------------
# The autograded notebook: trusted cells, the run's outputs (checked), the judge's verdicts


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
        if not (meta.get("grade") and HIDDEN_BLOCK.search(cell.source)):
            continue
        verdict = run.verdicts.get(meta["grade_id"])
        if verdict is None and not any(o.output_type == "error" for o in cell.outputs):
            # (a cell whose own error stopped it before its hidden tests is explained by that error)
            cell.outputs.append(_error("NotRun", "the hidden tests of this cell did not run" + (
                f": {run.incident}" if run.incident else " (the notebook stopped them before they reached the grader)")))
        elif verdict is not None and not verdict.passed:
            if len(verdict.parts) > 1:
                total = sum(p.weight for p in verdict.parts)
                cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text="".join(
                    f"{'passed' if p.passed else 'FAILED'}: {p.name} ({p.weight:g} of {total:g} of this cell's "
                    f"points)\n" for p in verdict.parts)))
            ename = {"failed": "AssertionError", "unfinished": "Unfinished"}.get(verdict.status, "GraderError")
            cell.outputs.append(_error(ename, verdict.message))
    return nb


def cell_scores(nb: nbformat.NotebookNode, verdicts: dict) -> dict[str, float]:
    """{grade_id: score} of every test cell with hidden tests, from the judge's verdicts alone: the cell's points
    times the share of its checks' weights that passed; 0 where its hidden tests did not reach the judge. Nothing
    the notebook shows (an output, a number, an error) enters it."""
    scores = {}
    for grade_id in judged_cells(nb):
        points = next(float(c.metadata["nbgrader"].get("points") or 0) for c in nb.cells
                      if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        verdict = verdicts.get(grade_id)
        scores[grade_id] = round(points * verdict.fraction, 2) if verdict is not None else 0.0
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
    autograded/)."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import LimitOutput

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
        gb.update_or_create_submission(s.chapter, s.student)
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


_CELL_FRAME = re.compile(r"^Cell In\[(\d+)\], line (\d+)$", re.M)
_ARROW_LINE = re.compile(r"^-+> *(\d+) ?(.*)$", re.M)


def error_place(out: dict, nb: nbformat.NotebookNode) -> str:
    """Where in the notebook a kernel's error was raised, from its traceback: ' (cell tokenizer, line 7:
    `code`)' for the innermost frame in a cell (IPython's "Cell In[12], line 7", the cell run as the 12th), or ''."""
    text = ANSI_ESCAPE.sub("", "\n".join(line for line in out.get("traceback", []) if isinstance(line, str)))
    frames = list(_CELL_FRAME.finditer(text))
    if not frames:
        return ""
    last = frames[-1]
    count, line = int(last.group(1)), int(last.group(2))
    index = next((i for i, c in enumerate(nb.cells) if c.get("execution_count") == count), None)
    if index is None:
        return ""
    code = next((m.group(2).strip() for m in _ARROW_LINE.finditer(text, last.end()) if int(m.group(1)) == line), "")
    name = cell_name(nb, index)
    place = f"{name if name.startswith(('the cell', 'a cell')) else 'cell ' + name}, line {line}"
    return f" ({place}: `{code[:120]}`)" if code else f" ({place})"


def _located(cell: dict, nb: nbformat.NotebookNode) -> str:
    """error_message, with the place of the error when the kernel raised it (not when the judge reported it)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return error_message(cell) + (error_place(errors[-1], nb) if errors else "")


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
            message = _located(cell_of[grade.name], notebook)
        else:
            continue
        lost.append(LostPoints(grade.name, grade.score, grade.max_score, message))
    own = []  # errors in cells that are not test cells: they explain the lost points that follow
    for i, cell in enumerate(notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("grade") and any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            own.append(f"{cell_name(notebook, i)}: {_located(cell, notebook)}")
    return Result(student, chapter, "graded", submission.score, submission.max_score, lost,
                  needs_manual_grade=submission.needs_manual_grade, cell_errors=own[:5])


def feedback_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The autograded notebook as a learner may see it: hidden tests cut out, errors without tracebacks, markdown
    made inert."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = HIDDEN_BLOCK.sub(HIDDEN_NOTE, cell.source)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {ANSI_ESCAPE.sub('', out.get('evalue', ''))}"]
    return inert.notebook(nb)


def write_feedback(ws: Workspace, done: list[Submission], verbose: bool) -> None:
    """nbgrader's feedback page of each graded submission, made from the learner's view of its notebook."""
    for ch in sorted({s.chapter for s in done}):
        for s in [s for s in done if s.chapter == ch]:
            nb = nbformat.read(autograded_path(ws.root, s.student, ch), as_version=4)
            dest = ws.root / "feedback-source" / s.student / ch / f"{ch}.ipynb"
            if dest.parent.exists():
                shutil.rmtree(dest.parent)
            dest.parent.mkdir(parents=True)
            nbformat.write(feedback_notebook(nb), dest)
            for name in EXCHANGE_RECEIPT:  # generate_feedback copies them beside the page, for release_feedback
                receipt = submitted_path(ws.root, s.student, ch).parent / name
                if receipt.is_file():
                    shutil.copyfile(receipt, dest.parent / name)
    steps = []
    for ch in sorted({s.chapter for s in done}):
        students = sorted({s.student for s in done if s.chapter == ch})
        args = ["generate_feedback", ch, "--force", "--CourseDirectory.autograded_directory=feedback-source"]
        steps.append(args + (["--student", students[0]] if len(students) == 1 else []))
    for args, (code, output) in zip(steps, nbgrader_steps(ws.root, steps, verbose=verbose)):
        if code != 0:
            warn(f"nbgrader generate_feedback {args[1]} failed (scores are unaffected):\n{log_tail(output)}")


def learner_page(student: str, results: list[Result], root: Path) -> str:
    """One learner's summary: a row per chapter, and the reason for every lost point."""
    e = html.escape
    rows, details = [], []
    for r in results:
        score = f"{points(r.score)} / {points(r.max_score)}"
        status = {"graded": "graded"}.get(r.status, f"{r.status}: {r.detail}")
        if r.status == "graded" and r.detail:
            status = f"graded; {r.detail}"
        if r.status == "graded" and r.needs_manual_grade:
            status += "; some cells wait for the instructor"
        if r.withheld:
            rows.append(f"<tr><td>{e(r.chapter)}</td><td>{e(score)}</td><td>{e(r.withheld)}</td></tr>")
            continue
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


def workspace_results(ws: Workspace, current: list[Result]) -> list[Result]:
    """Every result the workspace holds, whichever run graded it, with this run's rows in place of older ones (a
    missing chapter has no record): the reports of a class, however it was graded, chapter by chapter."""
    rows: dict[tuple[str, str], Result] = {}
    for path in ws.root.glob("results/*/*.json"):
        try:
            r = Result.from_dict(json.loads(path.read_text())["result"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        fb = feedback_path(ws.root, r.student, r.chapter)
        r.feedback = str(fb) if r.status == "graded" and fb.is_file() else None
        rows[r.student, r.chapter] = r
    rows.update({(r.student, r.chapter): r for r in current})
    return [rows[key] for key in sorted(rows)]


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
        w.writerow(["student", "chapter", "status", "score", "max_score", "lost", "detail", "review", "isolation"])
        for r in results:
            w.writerow(inert.csv_cell(v) for v in [
                r.student, r.chapter, r.status, points(r.score, ""), points(r.max_score, ""),
                "; ".join(f"{lp.grade_id} {points(lp.score)}/{points(lp.max_score)}" for lp in r.lost),
                r.detail, " | ".join(r.review), r.isolation])
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
            self.bar.set_postfix_str(inert.terminal(f"{r.student} {r.chapter} {score}"), refresh=False)
            self.bar.update(1)
        else:
            took = "" if r.seconds is None else f" ({r.seconds:.0f} s)"
            line = f"minigpt-grade: [{self.done}/{self.total}] {r.student} {r.chapter}: {score}{took}"
            print(inert.terminal(line), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def settle(ws: Workspace, s: Submission, prepared: nbformat.NotebookNode, future, data, Gradebook) -> Result:
    """One notebook's row once its judge process is done: its scores recorded (in this process alone, which
    writes the gradebook), or an ``error`` row that says what went wrong. Whatever goes wrong here (the judge
    process, its result, the writing of this notebook's files) costs this notebook alone, and is graded again
    on the next run."""
    seconds = None
    try:
        run = future.result()
        seconds = round(run.seconds, 1)
        if not run.started:
            r = Result(s.student, s.chapter, "error", detail="the notebook's kernel did not start, twice "
                       "(the machine's doing, not the notebook's: run the batch again)")
            r.log = str(ws.keep_log(s.student, s.chapter, run.log))
        else:
            nb = assemble(prepared, run)
            record(ws, s, nb, cell_scores(prepared, run.verdicts), *data)
            with Gradebook(ws.db_url) as gb:
                r = read_result(gb, ws.root, s.student, s.chapter)
            r.detail = run.incident
            if run.incident:
                r.log = str(ws.keep_log(s.student, s.chapter, run.log))
    except JudgeFailed as err:
        r = Result(s.student, s.chapter, "error", detail=f"its judge stopped: {err}")
    except Exception as err:  # noqa: BLE001 (a bug of ours, or a result we cannot write: this notebook's row)
        warn(f"{s.student} {s.chapter}: {traceback.format_exc()}")
        r = Result(s.student, s.chapter, "error",
                   detail=f"the grader could not record it ({type(err).__name__}; see the grader's log)")
    r.seconds = seconds
    return r


def grade(submissions: list[Submission], course_root: Path, workdir: Path, *, jobs: int | None = None,
          limits: Limits = Limits(), fresh: bool = False, progress: bool = False, verbose: bool = False,
          sandboxed: bool = True, checks: list[str] = (), open_chapters: list[str] = ()) -> list[Result]:
    """Grade every submission (reusing results recorded for the same notebook, chapter and grader), and return
    a result per submission, in order. ``sandboxed=False`` runs the notebooks without a sandbox (the learner's
    code then runs with the grader's rights: every row says so). ``checks``: modules of checks of the course's own,
    imported by each notebook's judge. ``open_chapters``: chapters still open (see ``withheld_because``)."""
    from nbgrader.api import Gradebook  # slow import: only once the command line is known to be good

    if sandboxed and (why := sandbox.missing()):
        raise UsageError(f"cannot grade in a sandbox: {why}. Install it, or grade without isolation with "
                         "--no-sandbox (only for notebooks you trust)")
    for s in submissions:
        check_student(s.student)
        if s.path is not None and s.path.is_relative_to(workdir):
            raise UsageError(f"{s.path} is inside the workspace {workdir}, where grading keeps its own files")
    chapters = sorted({s.chapter for s in submissions})
    ws = Workspace(workdir, course_root)
    ws.open(chapters, fresh, verbose)
    released = {ch: ws.released_grade_ids(ch) for ch in chapters}
    all_ids = {ch: set(ids) for ch, ids in released.items()}
    for ch in course_chapters(course_root):
        if ch not in all_ids:
            nb = read_notebook(course_root / "solutions" / ch / f"{ch}.ipynb")
            if not isinstance(nb, str):
                all_ids[ch] = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}
    with Gradebook(ws.db_url) as gb:
        max_of = {ch: gb.find_assignment(ch).max_score for ch in chapters}

    results: dict[tuple[str, str], Result] = {}
    todo: list[tuple[Submission, str, tuple[bytes, dict[str, bytes]], nbformat.NotebookNode, list[str]]] = []
    bar = Progress(len(submissions), progress)
    isolation = "sandbox" if sandboxed else "none"

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
        data = read_submission(s.path)
        if isinstance(data, str):
            finish(s, Result(s.student, s.chapter, "unreadable", detail=data), None)
            continue
        found, receipt, receipt_note = exchange_receipt(s)
        # a notebook handed in again through the exchange is a new submission (a new secret): graded again, so that
        # its feedback is released under its own receipt
        digest = hashlib.sha256(data + b"".join(found[name] for name in sorted(found))).hexdigest()
        cached = reuse(ws, s, digest, isolation)
        if cached is not None:
            finish(s, cached, digest)
            continue
        nb = read_notebook(data)
        if isinstance(nb, str):
            finish(s, Result(s.student, s.chapter, "unreadable", detail=nb), digest)
            continue
        others = {ch: ids for ch, ids in all_ids.items() if ch != s.chapter}
        why = wrong_chapter(nb, released[s.chapter], others)
        if why:
            finish(s, Result(s.student, s.chapter, "wrong-notebook", detail=why), digest)
            continue
        notes = review_notes(nb, ws.released(s.chapter), s.chapter) + ([receipt_note] if receipt_note else [])
        try:
            prepared = sanitize(nb, ws, s)
        except Exception as err:  # noqa: BLE001 (nbgrader refuses what it cannot read)
            finish(s, Result(s.student, s.chapter, "unreadable", detail=f"nbgrader cannot grade it: {err}"[:300]),
                   digest)
            continue
        todo.append((s, digest, (data, receipt), prepared, notes))

    graded: list[Submission] = []
    try:
        jobs = jobs or default_jobs()
        threads = max(1, default_jobs() // min(jobs, max(1, len(todo))))  # each notebook's share of the cores
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_one, s.chapter, prepared, limits, sandboxed, threads, checks):
                       (s, digest, data, prepared, notes) for s, digest, data, prepared, notes in todo}
            for future in concurrent.futures.as_completed(futures):
                s, digest, data, prepared, notes = futures[future]
                r = settle(ws, s, prepared, future, data, Gradebook)
                if r.status == "graded":
                    graded.append(s)
                r.review, r.isolation = notes, isolation
                finish(s, r, digest)
    finally:
        bar.close()
    ordered = [results[s.student, s.chapter] for s in submissions]
    pages = []
    for s, r in zip(submissions, ordered):
        r.withheld = withheld_because(r.chapter, open_chapters) if r.status == "graded" else ""
        if r.withheld:
            shutil.rmtree(feedback_path(ws.root, s.student, s.chapter).parent, ignore_errors=True)
        elif r.status == "graded" and (s in graded or not feedback_path(ws.root, s.student, s.chapter).is_file()):
            pages.append(s)
    if pages:
        write_feedback(ws, pages, verbose)
    for r in ordered:
        fb = feedback_path(ws.root, r.student, r.chapter)
        r.feedback = str(fb) if r.status == "graded" and fb.is_file() else None
    write_reports(ws, workspace_results(ws, ordered))
    return ordered


def withheld_because(chapter: str, open_chapters: list[str]) -> str:
    """Why a graded notebook's feedback must wait, or ''. A chapter's notebook builds on the reference of the
    chapters before it, which its sandbox therefore holds (never its own chapter's); whatever the notebook prints,
    its feedback shows. So while an earlier chapter is still open (its deadline not passed), the feedback of a
    later one could hand out that chapter's answers: it is withheld until a run without that chapter in
    ``--open`` writes it."""
    earlier = sorted(ch for ch in open_chapters if ch[:2] < chapter[:2])
    return f"feedback withheld while {', '.join(earlier)} {'is' if len(earlier) == 1 else 'are'} open" if earlier else ""


def reuse(ws: Workspace, s: Submission, digest: str, isolation: str) -> Result | None:
    """The recorded result of this very notebook for this very chapter and grader, if there is one."""
    try:
        saved = json.loads(ws.result_file(s.student, s.chapter).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("submission_sha256") != digest or saved.get("source") != ws.sources[s.chapter]:
        return None
    r = Result.from_dict(saved["result"])
    if r.status == "error" or r.isolation != isolation:  # run it again: what stopped it may have been the machine
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
        if r.status == "graded" and r.detail:
            status = r.detail
        if r.status == "graded" and r.needs_manual_grade:
            status = (status + "; " if status else "") + "needs manual grading"
        if r.withheld:
            status = (status + "; " if status else "") + r.withheld
        if r.isolation == "none":
            status = "NOT ISOLATED" + (f"; {status}" if status else "")
        rows.append(tuple(map(inert.terminal, (r.student, r.chapter, f"{points(r.score)} / {points(r.max_score)}",
                                               status))))
        notes[len(rows) - 1] = [inert.terminal(line) for line in [
            f"    {lp.grade_id} ({points(lp.score)} / {points(lp.max_score)}): "
            + lp.message.replace("\n", "\n      ")
            for lp in r.lost
        ] + [f"    error in {e}".replace("\n", "\n      ") for e in r.cell_errors] + [
            f"    review: {note}" for note in r.review] + ([f"    log: {r.log}"] if r.log else [])]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
        lines.extend(notes.get(i, []))
    return "\n".join(line.rstrip() for line in lines)


def warn(message: str) -> None:
    print(f"minigpt-grade: {inert.terminal(message)}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="minigpt-grade",
        description="Grade minigpt notebooks with the hidden tests: each notebook runs in a sandbox, and is judged "
                    "outside it.",
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
    parser.add_argument("--cell-timeout", type=int, default=DEFAULT_CELL_TIMEOUT,
                        help=f"seconds one cell may take (default: {DEFAULT_CELL_TIMEOUT})")
    parser.add_argument("--memory", default=DEFAULT_MEMORY,
                        help=f"memory of one notebook's processes together, e.g. 4G (default: {DEFAULT_MEMORY})")
    parser.add_argument("--checks", action="append", default=[], metavar="MODULE",
                        help="also load the checks registered in this Python module (a course folder of your own "
                             "given with --course-root)")
    parser.add_argument("--open", dest="open_chapters", action="append", default=[], metavar="NN-topic",
                        help="a chapter whose deadline has not passed (repeatable): the feedback of later chapters, "
                             "whose sandboxes hold its reference, is withheld until you grade again without it")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run notebooks without the sandbox (the learner's code runs with your rights: only "
                             "for notebooks you trust; every row says NOT ISOLATED)")
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
    if args.cell_timeout <= 0:
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
        check_chapters(args.open_chapters, course_chapters(course_root))
        if args.class_dir:
            submissions = class_submissions(Path(args.class_dir).resolve(), args.chapter, known)
        else:
            chapter = args.chapter[0] if args.chapter else None
            if len(args.chapter) > 1:
                raise UsageError("give one --chapter with loose notebooks")
            submissions = notebook_submissions(args.notebooks, args.student, chapter, known)
        for module in args.checks:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise UsageError(f"--checks {module}: {err}") from None
        if args.no_sandbox:
            warn("--no-sandbox: the notebooks' code runs with your rights, not isolated; grade only notebooks you trust")
        results = grade(submissions, course_root, workdir, jobs=args.jobs, limits=limits, fresh=args.fresh,
                        progress=not args.quiet, verbose=args.verbose, sandboxed=not args.no_sandbox,
                        checks=args.checks, open_chapters=args.open_chapters)
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
