"""Submissions of chapter 1 that break, cheat or attack: what a real class hands in, on purpose or not.

Each must get a row of its own with a clear status or message, and none may stop the batch. The grader's
tests (tests/test_hostile_grading.py) say what each must get; the class benchmark (benchmarks/grade_class.py)
mixes them with right and wrong answers.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import nbformat

from . import apply_edits, learner_notebook
from . import ch01_tokens as ch

CHAPTER = ch.CHAPTER
MUTANTS = {m.key: m for m in ch.MUTANTS}


@dataclasses.dataclass(frozen=True)
class Hostile:
    key: str
    what: str
    build: Callable[[], str]  # the file's text, as handed in


def _text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb)


def _reference() -> nbformat.NotebookNode:
    return learner_notebook(CHAPTER, {})


def _mutant(key: str) -> nbformat.NotebookNode:
    return learner_notebook(CHAPTER, apply_edits(CHAPTER, MUTANTS[key].edits))


def _with_cell(nb: nbformat.NotebookNode, source: str, after: str = "imports") -> nbformat.NotebookNode:
    """A code cell of the learner's own (no nbgrader metadata), added after the cell ``after``."""
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    return nb


def _cell(nb: nbformat.NotebookNode, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _corrupt() -> str:
    text = _text(_reference())
    return text[: len(text) // 2]  # cut off in the middle, as a failed upload leaves it


def _other_chapter() -> str:
    return _text(learner_notebook("02-embeddings", {}))


def _not_the_course_notebook() -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def pre_split(text):\n    return text.split()\n")]
    return _text(nb)


def _infinite_loop() -> str:
    nb = _reference()
    cell = _cell(nb, "tokenizer")
    cell.source = "while True:  # never ends: the cell is interrupted at the cell time limit\n    pass\n" + cell.source
    return _text(nb)


def _deaf_loop() -> str:
    return _text(_with_cell(_reference(), (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignores the interrupt that ends a cell\n"
        "while True:\n"
        "    pass\n")))


def _memory_bomb() -> str:
    return _text(_with_cell(_reference(), "hog = 'x' * 10**11  # 100 GB\n"))


def _sys_exit() -> str:
    return _text(_with_cell(_reference(), "import sys\nsys.exit('done here')\n"))


def _os_exit() -> str:
    return _text(_with_cell(_reference(), "import os\nos._exit(0)\n"))


def _segfault() -> str:
    return _text(_with_cell(_reference(), "import ctypes\nctypes.string_at(0)  # reads address 0: the kernel crashes\n"))


def _edited_test() -> str:
    nb = _mutant("decode-per-token")
    _cell(nb, "test_decode").source = "pass  # this test is fine, trust me\n"
    return _text(nb)


def _deleted_test() -> str:
    nb = _reference()
    nb.cells.remove(_cell(nb, "test_decode"))
    return _text(nb)


def _renamed() -> str:
    nb = _reference()
    cell = _cell(nb, "pre_split")
    cell.source = cell.source.replace("def pre_split(", "def split_text(")
    _cell(nb, "tokenizer").source = _cell(nb, "tokenizer").source.replace("pre_split(", "split_text(")
    return _text(nb)


def _flood() -> str:
    return _text(_with_cell(_reference(), "print('x' * 5_000_000)\nfor i in range(200_000):\n    print(i)\n"))


def _imports_reference() -> str:
    nb = _reference()
    _cell(nb, "tokenizer").source = "#| export\nfrom minigpt.tokens import Tokenizer\n"
    return _text(nb)


SNOOP = '''\
import json, pathlib, minigpt
# The instructor notebook holds the answers: run its solution cells here.
where = pathlib.Path(minigpt.__file__).resolve().parents[2] / "solutions" / "01-tokens" / "01-tokens.ipynb"
for cell in json.loads(where.read_text())["cells"]:
    if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
        exec("".join(cell["source"]))
'''
SNOOP_GRADEBOOK = '''\
import sqlite3
hidden = sqlite3.connect("../../../gradebook.db").execute("select source from source_cell").fetchall()
'''
SNOOP_SHELL = '''\
import subprocess
answers = subprocess.run(["cat", str(where)], capture_output=True, text=True).stdout
'''


def _snoop() -> str:
    nb = learner_notebook(CHAPTER, None)  # nothing written: everything must come from the answers on disk
    for source in reversed([SNOOP, SNOOP_GRADEBOOK, SNOOP_SHELL]):
        _with_cell(nb, source)
    return _text(nb)


PATCH = '''\
import autograder.checks.tokens as checks_module
for name in dir(checks_module):
    if name.startswith("check_"):
        setattr(checks_module, name, lambda *args, **kwargs: None)  # every hidden check passes
'''


def _patches_checks() -> str:
    return _text(_with_cell(_mutant("bpe-leftmost"), PATCH))


HOSTILE = [
    Hostile("corrupt-json", "a notebook cut off in the middle", _corrupt),
    Hostile("other-chapter", "chapter 2's notebook handed in as chapter 1", _other_chapter),
    Hostile("not-the-notebook", "a notebook of the learner's own, not the released one", _not_the_course_notebook),
    Hostile("infinite-loop", "an endless loop at the top of the Tokenizer cell", _infinite_loop),
    Hostile("deaf-loop", "an endless loop that ignores interrupts", _deaf_loop),
    Hostile("memory-bomb", "a 100 GB string", _memory_bomb),
    Hostile("sys-exit", "sys.exit in a cell", _sys_exit),
    Hostile("os-exit", "os._exit in a cell: the kernel dies", _os_exit),
    Hostile("segfault", "a crash of the kernel (ctypes reads address 0)", _segfault),
    Hostile("edited-test", "a wrong decode, and its locked test cell replaced by `pass`", _edited_test),
    Hostile("deleted-test", "the locked cell test_decode deleted", _deleted_test),
    Hostile("renamed", "pre_split renamed split_text", _renamed),
    Hostile("flood", "megabytes of printed output", _flood),
    Hostile("imports-reference", "imports the course's Tokenizer", _imports_reference),
    Hostile("snoop", "reads the answers from the instructor notebook, the gradebook and a shell", _snoop),
    Hostile("patches-checks", "a wrong bpe_merge, and every hidden check replaced by a no-op", _patches_checks),
]


def write_class(folder, extra: dict[str, str] | None = None) -> list[str]:
    """Write every hostile submission (and ``extra``: {student: notebook text}) as folder/<student>/01-tokens.ipynb."""
    written = []
    for key, text in [(h.key, h.build()) for h in HOSTILE] + list((extra or {}).items()):
        (folder / key).mkdir(parents=True, exist_ok=True)
        (folder / key / f"{CHAPTER}.ipynb").write_text(text)
        written.append(key)
    return written


def reference_text() -> str:
    return _text(_reference())


def untouched_text() -> str:
    return _text(learner_notebook(CHAPTER, None))


def mutant_text(key: str) -> str:
    return _text(_mutant(key))



