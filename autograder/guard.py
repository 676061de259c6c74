"""Installed in every grading kernel before the learner's code runs (see nbgrader_config.py).

What it keeps from the learner's code, for the whole life of the kernel:

- the course's reference implementation of the chapter being graded and of later chapters (chapter 4 may
  build on chapter 3's attention, but never import chapter 4's ``GPT``);
- the files that hold answers or other learners' work: the instructor notebooks (``solutions/``),
  nbgrader gradebooks, the reference modules it may not import, and whatever the grading tool lists in
  ``MINIGPT_GRADE_PROTECT`` (the rest of its workspace);
- starting other programs (``!cat``, ``subprocess``, ``os.system``) and raising the kernel's memory cap.

The rules live in an audit hook (PEP 578), which code running in the kernel cannot remove. They apply to
the learner's code: a request is the learner's when the innermost frame that is neither the standard library
nor an installed third-party package belongs to a notebook cell or to anything else outside the autograder
and the reference package. So ``nbformat.read("../solutions/...")`` typed in a cell is refused, while the
autograder's checks import what they need.

After every cell, the autograder's check modules are dropped from ``sys.modules``, so a cell that patches a
check (``checks.check_encode = lambda *a: None``) changes nothing: the next test cell imports the checks
afresh.

nbgrader runs a notebook in a folder named after its chapter (``autograded/<student>/<NN-topic>/``), so the
chapter is the name of the kernel's working folder; anywhere else, every chapter module is held back.

This stops honest mistakes, casual copying and the obvious tricks; it is not a sandbox (a process with the
grader's rights can do what the grader can). minigpt-grade also runs each notebook under a time limit and a
memory cap, and lists for review any submission whose code mentions the autograder's internals.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

PACKAGE = "minigpt"
PROTECT_ENV = "MINIGPT_GRADE_PROTECT"  # os.pathsep-separated paths the notebook may not read
ALLOW_ENV = "MINIGPT_GRADE_ALLOW"  # a folder inside those that it may read (its own grading folder)
CHECKS_PACKAGE = "autograder.checks"
_PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
})
_WATCHED = frozenset({"import", "open", "sqlite3.connect", "resource.setrlimit", *_PROCESS_EVENTS})


def blocked_modules(chapter: str, chapters: dict[str, str]) -> set[str]:
    """Full names of the reference modules a notebook of ``chapter`` may not import: those of its own chapter
    and later ones, by chapter number. A chapter without a module of its own (the capstone, 08-capstone) may
    import every chapter before it; a folder not named like a chapter (NN-topic) may import none."""
    if not (len(chapter) > 3 and chapter[:2].isdigit() and chapter[2] == "-"):
        return {f"{PACKAGE}.{module}" for module in chapters.values()}
    return {f"{PACKAGE}.{module}" for folder, module in chapters.items() if folder[:2] >= chapter[:2]}


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(found))


class Guard:
    """The audit hook's rules for one kernel (see the module docstring)."""

    def __init__(self, chapter: str, blocked: set[str], protected: list[str], allowed: list[str]):
        import minigpt

        self.chapter, self.blocked = chapter, frozenset(blocked)
        self.allowed = tuple(sorted({os.path.realpath(p) for p in allowed}))
        here = os.path.realpath(Path(__file__).parent)
        reference = os.path.realpath(Path(minigpt.__file__).parent)
        self.trusted = (here + os.sep, reference + os.sep)
        self.reference_files = {}
        for name in blocked:
            source = os.path.join(reference, name.split(".", 1)[1] + ".py")
            self.reference_files[source] = self.reference_files[importlib.util.cache_from_source(source)] = name
        self.protected = tuple(sorted({os.path.realpath(p) for p in protected} | set(self.reference_files)))
        self.library = _library_prefixes()

    def refusal(self, module: str) -> str:
        return (f"{module} is the course's reference solution, which is not available while grading "
                f"{self.chapter or 'this notebook'}: use the code you wrote in this notebook")

    # -- whose code is asking -------------------------------------------------------------------------------
    def learner_is_asking(self) -> bool:
        """Whether the innermost frame outside the standard library and installed packages is the learner's."""
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename == __file__ or filename.startswith("<frozen "):
                frame = frame.f_back
                continue
            if filename.startswith(os.sep):
                if filename.startswith(self.trusted):
                    return False
                if filename.startswith(self.library):
                    frame = frame.f_back
                    continue
            return True  # a notebook cell, <string>, or any other file
        return False

    def is_protected(self, path) -> bool:
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        if os.path.basename(real) != "gradebook.db" and not any(
                real == p or real.startswith(p + os.sep) for p in self.protected):
            return False
        return not any(real == a or real.startswith(a + os.sep) for a in self.allowed)

    # -- the hook -------------------------------------------------------------------------------------------
    def __call__(self, event: str, args: tuple) -> None:
        if event not in _WATCHED:
            return
        if event == "import":
            if args[0] in self.blocked and self.learner_is_asking():
                raise ImportError(self.refusal(args[0]))
        elif event in ("open", "sqlite3.connect"):
            if args and self.is_protected(args[0]) and self.learner_is_asking():
                module = self.reference_files.get(os.path.realpath(os.fsdecode(args[0])))
                if module:  # importlib.import_module raises no "import" event: its read of the file is refused
                    raise PermissionError(self.refusal(module))
                raise PermissionError(f"{os.fsdecode(args[0])}: grading keeps this file out of the notebook's reach")
        elif event == "resource.setrlimit":
            if self.learner_is_asking():
                raise PermissionError("a notebook may not change its resource limits while it is graded")
        elif self.learner_is_asking():  # starting a process
            raise PermissionError("a notebook may not start other programs while it is graded")


def default_protected() -> list[str]:
    """The course's instructor notebooks, its gradebook and its grading workspace (the reference modules
    held back are added by Guard)."""
    course = Path(__file__).resolve().parent.parent
    return [str(p) for p in (course / "solutions", course / "gradebook.db", course / ".grading")]


def forget_checks(*_args) -> None:
    """Run after every cell: drop the autograder's check modules, so that each test cell imports them afresh
    from disk and a cell that replaced a check (``checks.check_encode = lambda *a: None``) changed nothing.
    (Importing them again costs a few hundredths of a second.)"""
    for name in [n for n in sys.modules if n == CHECKS_PACKAGE or n.startswith(CHECKS_PACKAGE + ".")]:
        del sys.modules[name]


def install(cwd: Path | None = None) -> Guard:
    """Prepare a grading kernel: the audit hook above, the check refresher, one thread, and library chatter kept
    off stderr (nbgrader gives no points to a test cell that writes to stderr)."""
    import warnings

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per notebook: grading runs notebooks side by side
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.simplefilter("ignore")
    from minigpt import CHAPTERS  # the package root only: the chapter list, no chapter code

    chapter = (cwd or Path.cwd()).name
    blocked = blocked_modules(chapter, CHAPTERS)
    for name in [n for n in sys.modules if n in blocked]:
        del sys.modules[name]
    protected = default_protected()
    protected += [p for p in os.environ.get(PROTECT_ENV, "").split(os.pathsep) if p]
    allowed = [p for p in os.environ.get(ALLOW_ENV, "").split(os.pathsep) if p]
    guard = Guard(chapter if chapter in CHAPTERS else "", blocked, protected, allowed)
    sys.addaudithook(guard)
    try:
        from IPython import get_ipython
    except ImportError:  # not in a kernel (a plain interpreter, in the tests)
        return guard
    shell = get_ipython()
    if shell is not None:
        shell.events.register("post_run_cell", forget_checks)
    return guard
