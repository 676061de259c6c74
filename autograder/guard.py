"""Installed in every grading kernel before the learner's code runs (see nbgrader_config.py).

A chapter's notebook may use the course's reference implementation of the chapters *before* it (chapter 4
builds its blocks on chapter 3's attention), but never of its own chapter or later ones: that is the code
being graded. nbgrader runs a notebook in a folder named after its chapter (`submitted/<student>/<NN-topic>/`),
so the chapter is the name of the kernel's working folder; anywhere else, every chapter module is held back.
The autograder's own checks may import anything.

This stops honest mistakes and casual copying (`from minigpt.tokens import Tokenizer`); it is not a sandbox.
"""
from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

PACKAGE = "minigpt"


def blocked_modules(chapter: str, chapters: dict[str, str]) -> set[str]:
    """Full names of the reference modules a notebook of ``chapter`` may not import."""
    order = list(chapters)
    start = order.index(chapter) if chapter in chapters else 0
    return {f"{PACKAGE}.{module}" for module in list(chapters.values())[start:]}


_TRUSTED = (str(Path(__file__).resolve().parent) + "/",)  # the autograder package's own files


def _imported_by_autograder() -> bool:
    """Whether the import comes from a file of the autograder or of the reference package itself (by the
    file the code was loaded from, which a notebook cannot fake by naming its globals)."""
    import minigpt

    trusted = _TRUSTED + (str(Path(minigpt.__file__).resolve().parent) + "/",)
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib") or filename == __file__:
            frame = frame.f_back
            continue
        return str(Path(filename).resolve()).startswith(trusted) if filename.startswith("/") else False
    return False


class ReferenceGuard(importlib.abc.MetaPathFinder):
    def __init__(self, chapter: str, blocked: set[str]):
        self.chapter, self.blocked = chapter, blocked

    def find_spec(self, name, path=None, target=None):
        if name in self.blocked and not _imported_by_autograder():
            raise ImportError(
                f"{name} is the course's reference solution, which is not available while grading "
                f"{self.chapter or 'this notebook'}: use the code you wrote in this notebook")
        return None


def install(cwd: Path | None = None) -> ReferenceGuard:
    """Prepare a grading kernel: hold back the reference of this chapter and later ones, and keep library
    chatter off stderr, since nbgrader gives no points to a test cell that writes to stderr."""
    import os
    import warnings

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per notebook: grading runs notebooks side by side
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.simplefilter("ignore")
    from minigpt import CHAPTERS  # the package root only: the chapter list, no chapter code

    chapter = (cwd or Path.cwd()).name
    for name in [n for n in sys.modules if n.startswith(f"{PACKAGE}.")]:
        if name in blocked_modules(chapter, CHAPTERS):
            del sys.modules[name]
    guard = ReferenceGuard(chapter if chapter in CHAPTERS else "", blocked_modules(chapter, CHAPTERS))
    sys.meta_path.insert(0, guard)
    return guard

