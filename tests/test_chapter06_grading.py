"""Tests of the tests, chapter 6 (samplers) (DESIGN.md, invariant 6).

Every submission is the learner notebook filled in as a learner would (tests/submissions/): the reference
answer must get full marks, the untouched notebook 0, each realistic mistake must lose points in the cells
it breaks, and only there, with a message that names it, and each different-but-correct answer must get
full marks.

Two ways of grading, the same expectations:
- in-process (fast): the notebook's code cells run in order in one namespace, test cells whole, hidden part
  included, as nbgrader runs them: the hidden part's `check(...)` has the judge run the chapter's checks in this
  process (`autograder.trusted.judge_here`, the trusted setting, through the same plain data as the sandbox), and
  as in the sandbox, this chapter's reference module and later ones cannot be imported meanwhile; every mutant
  and variant; and the hidden parts alone after the learner's cells (`run_hidden_tests`, marked slow);
- real `nbgrader autograde` (slow): one class folder, one grading run, the reference, the untouched
  notebook, the mutants in `NBGRADER_MUTANTS` and every variant; the tests every chapter shares
  (tests/submissions/grading.py).
"""
from __future__ import annotations

import contextlib
import sys

import nbformat
import pytest

from submissions import ROOT, apply_edits, learner_notebook, reference_sources
from submissions import ch06_samplers as ch
from submissions.grading import hidden_check_tests, nbgrader_tests

CHAPTER = ch.CHAPTER
TEST_CELLS = ["test_temperature", "test_filters", "test_penalties", "test_sample", "test_beam_search"]
SOLUTION_IDS = ["temperature", "filters", "penalties", "sample", "beam_search"]
MUTANTS = {m.key: m for m in ch.MUTANTS}
VARIANTS = {v.key: v for v in ch.VARIANTS}
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


def mutant_cells(key: str) -> dict[str, str]:
    return apply_edits(CHAPTER, MUTANTS[key].edits)


def variant_cells(key: str) -> dict[str, str]:
    return apply_edits(CHAPTER, VARIANTS[key].edits, VARIANTS[key].cells)


def check_mutant(key: str, lost: dict[str, str]) -> None:
    mutant = MUTANTS[key]
    assert set(lost) == set(mutant.lost), f"{mutant.name}: lost\n" + "\n".join(f"  {g}: {m}" for g, m in lost.items())
    for grade_id, named in mutant.lost.items():
        assert named in lost[grade_id], f"{mutant.name}: {grade_id} should say {named!r}: {lost[grade_id]}"


# ---------------------------------------------------------------- in-process

@contextlib.contextmanager
def as_in_the_sandbox():
    """The reference modules of this chapter and later ones cannot be imported in the block (as in the grading
    sandbox, `autograder.grade.blocked_modules`), and no verdict of an earlier notebook is remembered."""
    from autograder.run import blocked_modules
    from autograder.trusted import forget_here

    forget_here()
    blocked = {name: sys.modules.get(name) for name in blocked_modules(CHAPTER)}
    sys.modules.update(dict.fromkeys(blocked))  # import raises ImportError
    try:
        yield
    finally:
        for name, module in blocked.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        forget_here()


def run_notebook(cells: dict[str, str] | None) -> dict[str, str]:
    """{grade_id: "ename: evalue"} of the test cells that fail when the instructor notebook's graded code runs
    with the learner's cells: `cells[grade_id]` where given, else the reference; `None`: as released, every
    solution cell a stub. Cells without a grade id (the closing demo) are left out."""
    with as_in_the_sandbox():
        return _run_notebook(cells)


def _run_notebook(cells: dict[str, str] | None) -> dict[str, str]:
    notebook = nbformat.read(ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    released = {c.metadata["nbgrader"]["grade_id"]: c.source
                for c in learner_notebook(CHAPTER, None).cells if c.metadata.get("nbgrader", {}).get("solution")}
    answers = released if cells is None else {**reference_sources(CHAPTER), **cells}
    namespace: dict = {}
    lost = {}
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id")
        if cell.cell_type != "code" or grade_id is None:
            continue
        source = answers[grade_id] if meta.get("solution") else "".join(
            line for line in cell.source.splitlines(keepends=True) if line.strip() not in HIDDEN_MARKERS)
        try:
            exec(compile(source, f"<cell {grade_id}>", "exec"), namespace)  # noqa: S102 (the notebook, as graded)
        except Exception as err:  # noqa: BLE001 (a failing cell is what is being measured)
            if meta.get("grade"):
                lost[grade_id] = f"{type(err).__name__}: {err}"
    return lost


def test_in_process_reference_passes_every_test_cell(torch_one_thread):
    assert run_notebook({}) == {}


def test_in_process_untouched_notebook_fails_every_test_cell_as_not_written(torch_one_thread):
    lost = run_notebook(None)
    assert list(lost) == TEST_CELLS
    for grade_id, message in lost.items():
        assert "not written yet" in message, f"{grade_id}: {message}"


@pytest.mark.parametrize("key", MUTANTS)
def test_in_process_mistake_loses_points_where_it_belongs_and_is_named(torch_one_thread, key):
    check_mutant(key, run_notebook(mutant_cells(key)))


@pytest.mark.parametrize("key", VARIANTS)
def test_in_process_different_correct_answer_passes(torch_one_thread, key):
    assert run_notebook(variant_cells(key)) == {}


def test_the_mutants_graded_by_nbgrader_exist():
    assert set(ch.NBGRADER_MUTANTS) <= set(MUTANTS)
    assert len(ch.NBGRADER_MUTANTS) >= 6


# The hidden parts alone, after the learner's cells (`submissions.run_hidden_tests`), every mutant and variant:
# marked slow, as in the other chapters.
globals().update(hidden_check_tests(ch))


# ---------------------------------------------------------------- real nbgrader

# Every test marked slow; one torch thread per grading kernel, as above.
globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS, mutants=ch.NBGRADER_MUTANTS))
