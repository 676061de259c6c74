"""Tests of the tests, chapter 3 (masked attention), through real `nbgrader autograde` (DESIGN.md, invariant 6).

Every submission is the learner notebook filled in as a learner would (tests/submissions/): the reference
answer must get full marks, the untouched notebook 0, each realistic mistake must lose points in the
cells it breaks, and only there, with a message that names it, and each different-but-correct answer
must get full marks. All of them are one class folder, graded in one run.
"""
from __future__ import annotations

import time

import nbformat
import pytest

from autograder import grade
from submissions import apply_edits, learner_notebook, solution_ids
from submissions import ch03_attention as ch

pytestmark = pytest.mark.slow

CHAPTER = ch.CHAPTER
TEST_CELLS = ["test_causal_mask", "test_softmax", "test_attention", "test_causal_self_attention"]
MUTANTS = {m.key: m for m in ch.MUTANTS}
VARIANTS = {v.key: v for v in ch.VARIANTS}


def submissions() -> dict[str, nbformat.NotebookNode]:
    """{student id: notebook}: the reference, the untouched release, every mutant and variant."""
    notebooks = {
        "reference": learner_notebook(CHAPTER, {}),
        "untouched": learner_notebook(CHAPTER, None),
    }
    for m in ch.MUTANTS:
        notebooks[m.key] = learner_notebook(CHAPTER, apply_edits(CHAPTER, m.edits))
    for v in ch.VARIANTS:
        notebooks[v.key] = learner_notebook(CHAPTER, apply_edits(CHAPTER, v.edits, v.cells))
    return notebooks


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, grade.Result]:
    class_dir = tmp_path_factory.mktemp("class")
    notebooks = submissions()
    assert len(notebooks) == 2 + len(MUTANTS) + len(VARIANTS), "two submissions share a student id"
    for student, nb in notebooks.items():
        (class_dir / student).mkdir()
        nbformat.write(nb, class_dir / student / f"{CHAPTER}.ipynb")
    subs = grade.class_submissions(class_dir, [CHAPTER], grade.course_chapters(grade.DEFAULT_COURSE_ROOT))
    start = time.monotonic()
    graded = grade.grade(subs, grade.DEFAULT_COURSE_ROOT, tmp_path_factory.mktemp("grading") / "workdir")
    print(f"graded {len(subs)} submissions of {CHAPTER} in {time.monotonic() - start:.0f} s")
    return {r.student: r for r in graded}


def lost_cells(result: grade.Result) -> dict[str, str]:
    return {lp.grade_id: lp.message for lp in result.lost}


def summary(result: grade.Result) -> str:
    return f"{result.score} / {result.max_score}:\n" + "\n".join(
        f"  {lp.grade_id}: {lp.message}" for lp in result.lost)


def test_every_submission_is_graded(results):
    assert {s: r.status for s, r in results.items() if r.status != "graded"} == {}
    assert {r.max_score for r in results.values()} == {results["reference"].max_score}


def test_reference_answer_gets_full_marks(results):
    ref = results["reference"]
    assert ref.max_score > 0 and ref.score == ref.max_score, summary(ref)
    assert ref.lost == [] and not ref.needs_manual_grade


def test_untouched_notebook_gets_zero_and_says_what_is_not_written(results):
    untouched = results["untouched"]
    assert untouched.score == 0, summary(untouched)
    lost = lost_cells(untouched)
    assert list(lost) == TEST_CELLS
    for grade_id, message in lost.items():
        assert "not written yet" in message, f"{grade_id}: {message}"


def test_the_test_cells_are_the_ones_these_tests_know(results):
    assert {lp.grade_id for lp in results["untouched"].lost} == set(TEST_CELLS)
    assert solution_ids(CHAPTER) == ["causal_mask", "softmax", "attention", "causal_self_attention"]


@pytest.mark.parametrize("key", MUTANTS)
def test_mistake_loses_points_in_the_cells_it_breaks_and_only_there(results, key):
    mutant, result = MUTANTS[key], results[key]
    assert result.score < result.max_score, f"{mutant.name}: full marks"
    assert set(lost_cells(result)) == set(mutant.lost), f"{mutant.name}: {summary(result)}"
    assert all(lp.score == 0 for lp in result.lost), summary(result)


@pytest.mark.parametrize("key", MUTANTS)
def test_mistake_is_named_in_the_message(results, key):
    mutant, lost = MUTANTS[key], lost_cells(results[key])
    for grade_id, named in mutant.lost.items():
        assert named in lost.get(grade_id, ""), f"{mutant.name}: {grade_id} should say {named!r}: {lost.get(grade_id)}"


def test_no_message_is_a_bare_error(results):
    """Every lost cell says what went wrong, not just `AssertionError`."""
    for student, result in results.items():
        for lp in result.lost:
            _, _, text = lp.message.partition(": ")
            assert text.strip() and lp.message != "lost points without raising an error", (
                f"{student} {lp.grade_id}: {lp.message!r}")


@pytest.mark.parametrize("key", VARIANTS)
def test_different_correct_answer_gets_full_marks(results, key):
    variant, result = VARIANTS[key], results[key]
    assert result.score == result.max_score and result.lost == [], f"{variant.name}: {summary(result)}"
