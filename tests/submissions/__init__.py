"""Learner submissions for the tests of the tests: the reference answers and realistic mistakes.

A submission starts from the learner notebook (`notebooks/<chapter>/`), as a learner would, and fills its
solution cells (nbgrader `solution: true`, known by `grade_id`) with code. By default a cell gets the
reference answer: the instructor cell from `solutions/<chapter>/` with its `### BEGIN/END SOLUTION` lines
removed. A mutant is the reference with one mistake edited in; a variant is a different correct answer.
Each chapter's module (`ch01_tokens.py`, ...) lists its mutants and variants; `grading.py` holds the tests
that every chapter runs on them, and `kernel.py` the warm learner side those tests grade them in.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_TESTS = re.compile(r"^### BEGIN HIDDEN TESTS\n(.*?)^### END HIDDEN TESTS", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace `old` by `new` in the reference source of cell `grade_id`; `old` must occur exactly once,
    so that an edit can never silently do nothing."""

    grade_id: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A realistic mistake. `lost` maps every test cell that must lose points to a piece of its message
    that names the mistake ("" where any message will do: a cell that fails only because it calls the
    broken function); every other test cell must keep full points. `kept`: the points some of those cells
    must keep (the parts the mistake does not touch). `key` is its student id."""

    key: str
    name: str
    edits: tuple[Edit, ...]
    lost: dict[str, str]
    kept: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A different but correct answer: cells replaced whole ({grade_id: source}) or edited; full marks.
    `key` is its student id."""

    key: str
    name: str
    cells: dict[str, str] = dataclasses.field(default_factory=dict)
    edits: tuple[Edit, ...] = ()


def _read(kind: str, chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / kind / chapter / f"{chapter}.ipynb", as_version=4)


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _is_solution(cell) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("solution"))


@functools.cache
def reference_sources(chapter: str) -> dict[str, str]:
    """{grade_id: source} of the chapter's solution cells, as a learner who got it right would type them."""
    return {
        _grade_id(cell): "".join(
            line for line in cell.source.splitlines(keepends=True) if line.strip() not in SOLUTION_MARKERS
        )
        for cell in _read("solutions", chapter).cells
        if _is_solution(cell)
    }


def solution_ids(chapter: str) -> list[str]:
    return [_grade_id(c) for c in _read("notebooks", chapter).cells if _is_solution(c)]


def apply_edits(chapter: str, edits: tuple[Edit, ...], cells: dict[str, str] | None = None) -> dict[str, str]:
    """The reference sources with whole `cells` swapped in, then `edits` applied; only the cells that differ."""
    sources = {**reference_sources(chapter), **(cells or {})}
    changed = dict(cells or {})
    for e in edits:
        count = sources[e.grade_id].count(e.old)
        assert count == 1, f"edit of {e.grade_id}: {e.old!r} occurs {count} times, expected exactly once"
        sources[e.grade_id] = changed[e.grade_id] = sources[e.grade_id].replace(e.old, e.new)
    return changed


def learner_notebook(chapter: str, cells: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The learner notebook with its solution cells filled in: `cells[grade_id]` where given, else the
    reference answer. `cells=None` leaves the notebook untouched, as released."""
    nb = _read("notebooks", chapter)
    if cells is None:
        return nb
    reference = reference_sources(chapter)
    unknown = set(cells) - set(reference)
    assert not unknown, f"no solution cells {sorted(unknown)} in {chapter}"
    for cell in nb.cells:
        if _is_solution(cell):
            cell.source = cells.get(_grade_id(cell), reference[_grade_id(cell)])
    return nb


def graded_notebook(submitted: nbformat.NotebookNode, chapter: str) -> nbformat.NotebookNode:
    """The notebook as the grader runs it: the submission with its locked cells (given code, test cells) put back
    from the instructor's version, hidden tests included, as nbgrader's OverwriteCells does when it sanitizes."""
    instructor = {_grade_id(c): c.source for c in _read("solutions", chapter).cells
                  if c.metadata.get("nbgrader", {}).get("locked") and _grade_id(c)}
    nb = nbformat.from_dict(copy.deepcopy(submitted))
    for cell in nb.cells:
        if _grade_id(cell) in instructor:
            cell.source = instructor[_grade_id(cell)]
    return nb


@functools.cache
def hidden_tests(chapter: str) -> dict[str, str]:
    """{grade_id: the hidden part} of the chapter's test cells, from the instructor notebook."""
    return {_grade_id(cell): HIDDEN_TESTS.search(cell.source).group(1)
            for cell in _read("solutions", chapter).cells if cell.metadata.get("nbgrader", {}).get("grade")}


def learner_namespace(chapter: str, cells: dict[str, str]) -> dict:
    """The globals of the learner notebook after its own cells ran in this process (imports, given code,
    solution cells filled with `cells`): what the hidden tests see. As in the grading sandbox, the reference
    modules of this chapter and later ones cannot be imported meanwhile."""
    from autograder.run import blocked_modules

    namespace: dict = {}
    blocked = {name: sys.modules.get(name) for name in blocked_modules(chapter)}
    try:
        sys.modules.update({name: None for name in blocked})  # import raises ImportError
        for cell in learner_notebook(chapter, cells).cells:
            nbgrader = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and nbgrader.get("grade_id") and not nbgrader.get("grade"):
                try:  # a cell that raises is an error in the notebook, and the next cells still run
                    exec(compile(cell.source, f"<{chapter} {nbgrader['grade_id']}>", "exec"), namespace)
                except Exception:  # noqa: BLE001
                    pass
    finally:
        for name, module in blocked.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return namespace
