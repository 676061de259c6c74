"""Intake: what ``minigpt-grade`` is asked to grade, and what a look at each notebook can tell before anything runs.

Everything here reads what learners wrote, and trusts none of it: regular files only (never a link, never a pipe),
bounded sizes, plain student ids, nbgrader's exchange receipt checked, a notebook made valid Unicode, the
chapter it belongs to told from its cells, nbgrader's own preprocessors to restore the instructor's cells, and the
review notes (code an instructor should read: reaching for the grader, or calling the chapter's oracle). Nothing
here runs a learner's code.
"""
from __future__ import annotations

import datetime
import errno
import io
import json
import os
import re
import secrets
import stat
import tokenize
from collections.abc import Iterable
from pathlib import Path

import nbformat

from autograder.base import Submission, UsageError, warn
from autograder.sandboxed.wire import make_valid
from autograder.workspace import Workspace

MAX_SUBMISSION = 20 * 1024 * 1024  # bytes of a notebook handed in
# nbgrader's receipt of a notebook handed in through its exchange: `nbgrader collect` puts these beside it in
# submitted/<student>/<chapter>/, and `nbgrader release_feedback` needs them beside the feedback page (the secret
# names the page that the learner's `fetch_feedback` looks for).
EXCHANGE_RECEIPT = ("timestamp.txt", "submission_secret.txt")
MAX_RECEIPT = 4096  # bytes of each receipt file
RECEIPT_SECRET = re.compile(r"[0-9a-f]{32,256}")  # nbgrader writes secrets.token_hex(64)
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
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
    (re.compile(r"\bcoursekit\.recorded\b|\bimport recorded\b"), "coursekit.recorded (the visible tests' answers)"),
]
# The nbgrader metadata of a cell as nbgrader's own cells have it (its schema, nbgrader/nbgraderformat/v3.json): each
# key, the types its value may have. A learner can write anything there; the grader reads these keys, so a cell whose
# metadata is not of this shape makes its notebook unreadable, at intake, before anything reads it. (Keys nbgrader does
# not know are left to nbgrader, which drops them.)
NBGRADER_KEYS = {"grade": (bool,), "solution": (bool,), "locked": (bool,), "task": (bool,), "grade_id": (str,),
                 "points": (int, float), "schema_version": (int,), "checksum": (str,), "cell_type": (str,)}
CELL_TYPES = ("code", "markdown", "raw")
# Review notes kept for one notebook: the first ones name what to read; thousands of them would only bury the
# others' rows (the table, grades.csv).
MAX_REVIEW_NOTES = 20
# A receipt's time is the learner's word (see exchange_receipt): taken only when it names a whole date, is no later
# than now (give or take the clock skew between the learner's machine and this one) and no earlier than this course
# could have been handed in.
CLOCK_SKEW = datetime.timedelta(minutes=10)
EARLIEST_SUBMISSION = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
# Characters of a notebook's code read for oracles: five times the longest reference's (chapter 9's), and a few
# seconds of the grader's time at worst (a token per character); a longer notebook gets a note instead.
ORACLE_READ_LIMIT = 200_000


def course_chapters(course_root: Path) -> list[str]:
    """Chapters are the folders `solutions/<NN-topic>/` holding `<NN-topic>.ipynb`."""
    solutions = course_root / "solutions"
    if not solutions.is_dir():
        return []
    return sorted(p.name for p in solutions.iterdir() if (p / f"{p.name}.ipynb").is_file())


def graded_chapters(course_root: Path) -> list[str]:
    """The chapters with something to grade: a cell worth points (the capstone, 11-capstone, has none)."""
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


def exchange_receipt(s: Submission, now: datetime.datetime | None = None
                     ) -> tuple[dict[str, bytes], dict[str, bytes], str]:
    """nbgrader's exchange receipt for a notebook: (the files of it that came with the notebook and are nbgrader's,
    the receipt to keep beside it, a note for the review list).

    The receipt is read beside a notebook laid out `<student>/<chapter>/<chapter>.ipynb` (as `nbgrader collect`
    leaves it), like the notebook itself: regular files only, small ones. The learner wrote these files, so each is
    checked: a timestamp that nbgrader cannot parse, or a secret that is not the hex text nbgrader writes, would stop
    `nbgrader release_feedback` (and a stock `generate_feedback`) for the whole class. What is missing or not
    nbgrader's is made up (the notebook's modification time, a new random secret), so the class's feedback can always
    be released; the learner's `fetch_feedback` then finds none for a receipt that was replaced. The timestamp was
    written by the learner's side, on the learner's clock: one that names no whole date, lies in the future (beyond
    ``CLOCK_SKEW``) or before this course (``EARLIEST_SUBMISSION``) is not taken either. ``now``: the time of grading.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    found, bad = {}, {}
    if s.path.parent.name == s.chapter:
        for name in EXCHANGE_RECEIPT:
            path = s.path.parent / name
            if not os.path.lexists(path):
                continue
            content = read_receipt(path)
            why = content if isinstance(content, str) else receipt_problem(name, content, now)
            if why:
                bad[name] = why
            else:
                found[name] = content
    kept = dict(found)
    if "timestamp.txt" not in kept:
        when = datetime.datetime.fromtimestamp(os.lstat(s.path).st_mtime, datetime.timezone.utc)
        if time_problem(when, now):  # (the file's time may be the learner's too)
            when = now
        kept["timestamp.txt"] = when.strftime("%Y-%m-%d %H:%M:%S.%f UTC").encode()
    if "submission_secret.txt" not in kept:
        kept["submission_secret.txt"] = secrets.token_hex(64).encode()  # as nbgrader makes one (not in the digest)
    problems = "; ".join(f"{name}: {why}" for name, why in bad.items())
    note = ""
    if "submission_secret.txt" in bad:
        note = (f"its exchange receipt is not nbgrader's ({problems}): replaced, so the learner's "
                "`nbgrader fetch_feedback` will not find its feedback")
    elif bad:
        note = (f"its exchange receipt's time is not taken ({problems}): the gradebook has "
                f"{kept['timestamp.txt'].decode()} instead (the notebook file's time, or the time of grading)")
    return found, kept, note


def read_receipt(path: Path) -> bytes | str:
    """The bytes of a receipt file, or why they are not taken (a link, not a regular file, too big)."""
    return read_regular(path, MAX_RECEIPT, link="a symbolic link",
                        too_big=lambda size: f"{size} bytes, more than a receipt can be ({MAX_RECEIPT})")


def receipt_problem(name: str, content: bytes, now: datetime.datetime) -> str:
    """Why a receipt file is not one nbgrader wrote, or its time not a sensible one ('' when it is)."""
    try:
        text = content.decode("ascii").strip()
    except UnicodeDecodeError:
        return "not text"
    if name == "submission_secret.txt":
        return "" if RECEIPT_SECRET.fullmatch(text) else "not the hex text nbgrader writes"
    if not text:
        return "empty"
    import dateutil.parser
    from nbgrader.utils import parse_utc

    try:
        when = parse_utc(text).replace(tzinfo=datetime.timezone.utc)  # as nbgrader reads it: UTC, naive
        # dateutil fills in what a text leaves out from today ("1" is the 1st of this month): a whole date parses to
        # the same day whatever the defaults
        parts = text.split(" ")
        head = " ".join(parts[:2]) if len(parts) == 3 else text  # (parse_utc's reading of a zone's name)
        days = {dateutil.parser.parse(head, default=default, ignoretz=True).date()
                for default in (datetime.datetime(2001, 1, 1), datetime.datetime(2002, 2, 2))}
    except Exception:  # noqa: BLE001 (dateutil raises several kinds)
        return "not a timestamp nbgrader can read"
    if len(days) > 1:
        return f"{text[:40]!r} names no whole date"
    return time_problem(when, now, f"{text[:40]!r} ")


def time_problem(when: datetime.datetime, now: datetime.datetime, quoted: str = "") -> str:
    """Why ``when`` cannot be when a notebook was handed in ('' when it can)."""
    if when > now + CLOCK_SKEW:
        return f"{quoted}is in the future"
    if when < EARLIEST_SUBMISSION:
        return f"{quoted}is before this course ({EARLIEST_SUBMISSION:%Y-%m-%d})"
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


def read_notebook(data: bytes | Path) -> nbformat.NotebookNode | str:
    """The notebook, or why it is not one."""
    try:
        text = (data.read_bytes() if isinstance(data, Path) else data).decode("utf-8")
        if re.search(r"\\u[dD][89a-fA-F]", text):  # a lone surrogate parses, and then nothing can write it
            data = json.loads(text)
            make_valid(data)
            text = json.dumps(data)
        return nbformat.reads(text, as_version=4)
    except Exception as e:  # noqa: BLE001 (any way of not being a notebook)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"not a notebook ({reason[:300]})"


def malformed(nb: nbformat.NotebookNode) -> str:
    """Why the notebook's cells are not of the shape the grader reads ('' when they are): each cell an object of a
    type nbformat knows, with text for its source and an object for its metadata, and nbgrader's metadata, where a
    cell has any, of the types nbgrader's schema gives (``NBGRADER_KEYS``). nbformat reads a notebook that breaks its
    schema (it only logs it), and nbgrader's own checks run later, on what the intake has read. Cells are counted
    from 1, as they come in the file."""
    if not isinstance(nb.get("cells"), list):
        return "its cells are not a list"
    for number, cell in enumerate(nb.cells, 1):
        if not isinstance(cell, dict):
            return f"cell {number} is not an object"
        if cell.get("cell_type") not in CELL_TYPES:
            return f"cell {number} is of no type nbformat knows"
        if not isinstance(cell.get("source"), str):
            return f"the source of cell {number} is not text"
        if not isinstance(cell.get("metadata"), dict):
            return f"the metadata of cell {number} is not an object"
        if "nbgrader" not in cell.metadata:
            continue
        meta = cell.metadata.nbgrader
        if not isinstance(meta, dict):
            return f"the nbgrader metadata of cell {number} is not an object"
        for key, types in NBGRADER_KEYS.items():
            # (a bool is an int to Python, and no number to nbgrader's schema)
            if key in meta and (not isinstance(meta[key], types) or isinstance(meta[key], bool) and bool not in types):
                kind = {str: "text", bool: "true or false", int: "a number"}[types[0]]
                return f"the nbgrader metadata of cell {number} has a {key} that is not {kind}"
    return ""


def nbgrader_meta(cell) -> dict:
    """A cell's nbgrader metadata ({} where it has none): after ``malformed`` found nothing, always an object."""
    return cell.metadata.get("nbgrader") or {}


def wrong_chapter(nb: nbformat.NotebookNode, released: dict[str, str], others: dict[str, set[str]]) -> str | None:
    """Why the notebook is not this chapter's, if it shares no graded cell with it."""
    ids = {nbgrader_meta(c).get("grade_id") for c in nb.cells} - {None}
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


def cell_names(nb: nbformat.NotebookNode) -> list[str]:
    """Each cell as JupyterLab lets a learner find it: its grade id, or the graded cell it follows; in one pass (a
    cell named by walking back to the graded cell before it costs a notebook of many cells the square of their
    number)."""
    names, before = [], None
    for cell in nb.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        names.append(grade_id or (f"the cell after {before}" if before else "a cell before the first graded one"))
        before = grade_id or before
    return names


def cell_name(nb: nbformat.NotebookNode, index: int) -> str:
    """The name of one cell (``cell_names``: to name many, name them all once)."""
    return cell_names(nb)[index]


def review_notes(nb: nbformat.NotebookNode, release: nbformat.NotebookNode, chapter: str) -> list[str]:
    """What in the learner's own cells an instructor should look at: edited locked cells (nbgrader puts them
    back before grading), code that reaches for the grading machinery, and the learner's own lines (not the
    notebook's given ones) that use an oracle of ``chapter``'s checks (the first ``MAX_REVIEW_NOTES`` such lines, and
    how many more). ``release``: the chapter's released notebook. Time linear in the notebook's size: each line is
    read once, by patterns that each match in time linear in the line."""
    released = {c.metadata["nbgrader"]["grade_id"]: c.source for c in release.cells if "nbgrader" in c.metadata}
    given = {line.strip() for c in release.cells if c.cell_type == "code" for line in c.source.split("\n")}
    oracles = chapter_oracles(release, chapter)
    notes, lines = [], [0]  # lines: how many lines were noted

    def note_line(text: str) -> None:
        if lines[0] < MAX_REVIEW_NOTES:
            notes.append(text)
        lines[0] += 1

    size = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
    if size > ORACLE_READ_LIMIT:
        notes.append(f"not read for oracles: {size:,} characters of code (read it yourself)")
        oracles = []
    names = cell_names(nb)
    for i, cell in enumerate(nb.cells):
        grade_id = nbgrader_meta(cell).get("grade_id")
        locked = grade_id in released and not nbgrader_meta(cell).get("solution")
        if locked:
            if cell.source.strip() != released[grade_id].strip():
                notes.append(f"{grade_id}: a locked cell was edited (nbgrader restored it before grading)")
            continue
        if cell.cell_type != "code":
            continue
        for number, line in enumerate(cell.source.splitlines(), 1):
            for pattern, why in SUSPICIOUS:
                if pattern.search(line):
                    note_line(f"{names[i]}, line {number}: {why}: {line.strip()[:80]}")
                    break
        if not oracles:
            continue
        source_lines = cell.source.split("\n")  # as the tokenizer counts them
        for number, code in code_lines(cell.source).items():
            if source_lines[number - 1].strip() in given:
                continue
            oracle = next((name for pattern, name in oracles if pattern.search(code)), None)
            if oracle:
                note_line(f"{names[i]}, line {number}: uses {oracle}, an oracle of the checks: "
                          f"{source_lines[number - 1].strip()[:80]}")
    if lines[0] > MAX_REVIEW_NOTES:
        notes.append(f"... and {lines[0] - MAX_REVIEW_NOTES:,} more lines like these")
    present = {nbgrader_meta(c).get("grade_id") for c in nb.cells}
    missing = [g for g in released if g not in present]
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


def sanitize(nb: nbformat.NotebookNode, ws: Workspace, s: Submission,
             known: Iterable[str] | None = None) -> nbformat.NotebookNode:
    """What `nbgrader autograde` does before it runs a notebook, with nbgrader's own preprocessors: outputs
    cleared, cell ids made unique, the kernel and the locked cells (hidden tests included) put back from the
    instructor's version, the cells' metadata checked. ``known``: the grade ids of the chapter's released notebook,
    if known; nbgrader's OverwriteCells looks each grade id up in the gradebook, and takes one it does not find off
    its cell: done here for the others, which a learner can add by the thousand, without a query each."""
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, DeduplicateIds, OverwriteCells, \
        OverwriteKernelspec

    resources = {"nbgrader": {"notebook": s.chapter, "assignment": s.chapter, "student": s.student,
                              "db_url": ws.db_url}}
    for preprocessor in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata):
        if preprocessor is OverwriteCells and known is not None:
            known = set(known)
            for cell in nb.cells:
                meta = nbgrader_meta(cell)
                if "grade_id" in meta and meta["grade_id"] not in known:
                    del meta["grade_id"]
        nb, resources = preprocessor().preprocess(nb, resources)
    return nb
