"""The tests of the tests that every chapter shares (DESIGN.md, invariant 6), for `tests/test_chapterNN_grading.py`.

Every submission is the learner notebook filled in as a learner would (this package): the reference answer
must get full marks, the untouched notebook 0, each realistic mistake must lose points in the cells it breaks,
and only there, with a message that names it, and each different-but-correct answer must get full marks.

A chapter's test file states what is its own and takes the rest from here, into its own namespace, so that
each chapter stays one file (pytest-xdist `--dist loadfile` spreads the chapters over the workers by file) and
its class is graded once per file:

    globals().update(nbgrader_tests(ch, TEST_CELLS, SOLUTION_IDS))
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Callable

import nbformat
import pytest

from autograder import base, grade, intake, workspace

from . import apply_edits, learner_notebook, run_hidden_tests, solution_ids


def lost_cells(result: base.Result) -> dict[str, str]:
    return {lp.grade_id: lp.message for lp in result.lost}


def summary(result: base.Result) -> str:
    """What a failing test prints of a result: its score and lost cells, or why it has no score."""
    if result.status != "graded":
        log = Path(result.log).read_text(errors="replace") if result.log and Path(result.log).is_file() else ""
        return f"{result.status}: {result.detail}\n  nbgrader's log ends:\n{workspace.log_tail(log, 25)}"
    return f"{result.score} / {result.max_score}:\n" + "\n".join(
        f"  {lp.grade_id}: {lp.message}" for lp in result.lost)


def nbgrader_tests(ch: ModuleType, test_cells: list[str], solution_cells: list[str], *,
                   mutants: Iterable[str] | None = None, variants: Iterable[str] | None = None) -> dict[str, Callable]:
    """The `results` fixture and the tests of one real `nbgrader autograde` run of chapter module `ch`'s class:
    the reference, the untouched notebook, the mutants and variants of these keys (default: all of them).
    `test_cells` and `solution_cells` are the grade ids the chapter's notebook must have, in order. Every test is
    marked slow."""
    chapter = ch.CHAPTER
    all_mutants = {m.key: m for m in ch.MUTANTS}
    all_variants = {v.key: v for v in ch.VARIANTS}
    graded_mutants = list(all_mutants if mutants is None else mutants)
    graded_variants = list(all_variants if variants is None else variants)
    slow = pytest.mark.slow

    def submissions() -> dict[str, nbformat.NotebookNode]:
        """{student id: notebook}: the reference, the untouched release, the graded mutants and variants."""
        notebooks = {"reference": learner_notebook(chapter, {}), "untouched": learner_notebook(chapter, None)}
        for key in graded_mutants:
            notebooks[key] = learner_notebook(chapter, apply_edits(chapter, all_mutants[key].edits))
        for key in graded_variants:
            variant = all_variants[key]
            notebooks[key] = learner_notebook(chapter, apply_edits(chapter, variant.edits, variant.cells))
        return notebooks

    @pytest.fixture(scope="module")
    def results(tmp_path_factory) -> dict[str, base.Result]:
        """The whole class, graded in one run."""
        class_dir = tmp_path_factory.mktemp("class")
        notebooks = submissions()
        assert len(notebooks) == 2 + len(graded_mutants) + len(graded_variants), "two submissions share a student id"
        for student, nb in notebooks.items():
            (class_dir / student).mkdir()
            nbformat.write(nb, class_dir / student / f"{chapter}.ipynb")
        subs = intake.class_submissions(class_dir, [chapter], intake.course_chapters(base.DEFAULT_COURSE_ROOT))
        start = time.monotonic()
        graded = grade.grade(subs, base.DEFAULT_COURSE_ROOT, tmp_path_factory.mktemp("grading") / "workdir")
        print(f"graded {len(subs)} submissions of {chapter} in {time.monotonic() - start:.0f} s")
        return {r.student: r for r in graded}

    @slow
    def test_every_submission_is_graded(results):
        not_graded = {s: summary(r) for s, r in results.items() if r.status != "graded"}
        assert not_graded == {}, "\n".join(f"{s}: {why}" for s, why in not_graded.items())
        assert {r.max_score for r in results.values()} == {results["reference"].max_score}

    @slow
    def test_reference_answer_gets_full_marks(results):
        ref = results["reference"]
        assert ref.max_score > 0 and ref.score == ref.max_score, summary(ref)
        assert ref.lost == [] and not ref.needs_manual_grade

    @slow
    def test_untouched_notebook_gets_zero_and_says_what_is_not_written(results):
        untouched = results["untouched"]
        assert untouched.score == 0, summary(untouched)
        lost = lost_cells(untouched)
        assert list(lost) == test_cells
        for grade_id, message in lost.items():
            assert "not written yet" in message, f"{grade_id}: {message}"

    @slow
    def test_the_test_cells_are_the_ones_these_tests_know(results):
        assert {lp.grade_id for lp in results["untouched"].lost} == set(test_cells)
        assert solution_ids(chapter) == solution_cells

    @slow
    @pytest.mark.parametrize("key", graded_mutants)
    def test_mistake_loses_points_in_the_cells_it_breaks_and_only_there(results, key):
        mutant, result = all_mutants[key], results[key]
        assert result.status == "graded", f"{mutant.name}: {summary(result)}"
        assert result.score < result.max_score, f"{mutant.name}: full marks"
        assert set(lost_cells(result)) == set(mutant.lost), f"{mutant.name}: {summary(result)}"
        assert all(lp.score < lp.max_score for lp in result.lost), summary(result)

    @slow
    @pytest.mark.parametrize("key", graded_mutants)
    def test_mistake_is_named_in_the_message(results, key):
        mutant, lost = all_mutants[key], lost_cells(results[key])
        assert results[key].status == "graded", f"{mutant.name}: {summary(results[key])}"
        for grade_id, named in mutant.lost.items():
            assert named in lost.get(grade_id, ""), (
                f"{mutant.name}: {grade_id} should say {named!r}: {lost.get(grade_id)}")

    @slow
    def test_no_message_is_a_bare_error(results):
        """Every lost cell says what went wrong, not just `AssertionError`."""
        for student, result in results.items():
            for lp in result.lost:
                _, _, text = lp.message.partition(": ")
                assert text.strip() and lp.message != "lost points without raising an error", (
                    f"{student} {lp.grade_id}: {lp.message!r}")

    @slow
    @pytest.mark.parametrize("key", graded_variants)
    def test_different_correct_answer_gets_full_marks(results, key):
        variant, result = all_variants[key], results[key]
        assert result.score == result.max_score and result.lost == [], f"{variant.name}: {summary(result)}"

    return {name: obj for name, obj in locals().items() if name == "results" or name.startswith("test_")}


def hidden_check_tests(ch: ModuleType) -> dict[str, Callable]:
    """Every mutant and variant of chapter module `ch` through the hidden checks in this process, no nbgrader
    (`run_hidden_tests`): a second or a few each, so all of them, not a sample. Marked slow."""
    chapter = ch.CHAPTER
    mutants = {m.key: m for m in ch.MUTANTS}
    variants = {v.key: v for v in ch.VARIANTS}

    @pytest.mark.slow
    @pytest.mark.parametrize("key", mutants)
    def test_hidden_checks_name_every_mistake_in_the_cells_it_breaks(key):
        mutant = mutants[key]
        failed = run_hidden_tests(chapter, apply_edits(chapter, mutant.edits))
        assert set(failed) == set(mutant.lost), f"{mutant.name}: {failed}"
        for grade_id, named in mutant.lost.items():
            assert named in failed[grade_id], f"{mutant.name}: {grade_id} should say {named!r}: {failed[grade_id]}"

    @pytest.mark.slow
    @pytest.mark.parametrize("key", variants)
    def test_hidden_checks_accept_every_correct_answer(key):
        variant = variants[key]
        assert run_hidden_tests(chapter, apply_edits(chapter, variant.edits, variant.cells)) == {}, variant.name

    return {name: obj for name, obj in locals().items() if name.startswith("test_")}
