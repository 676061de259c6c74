"""Tests of the tests, chapter 7 (the KV cache), through real `nbgrader autograde` (DESIGN.md, invariant 6).

Every submission is the learner notebook filled in as a learner would (tests/submissions/): the reference
answer must get full marks, the untouched notebook 0, each realistic mistake must lose points in the
cells it breaks, and only there, with a message that names it, and each different-but-correct answer
must get full marks.

Each notebook of this chapter takes nbgrader several seconds (a kernel, torch, small GPTs generating), so one
grading run, of one class folder, takes a sample: the reference, the untouched notebook, the mistakes in
GRADED_MUTANTS and the answers in GRADED_VARIANTS. Every mistake and every answer, sample included, also goes
through the hidden checks directly (the notebook's cells run in this process, then each test cell's hidden
part), which takes a few seconds each.
"""
from __future__ import annotations

import re
import time

import nbformat
import pytest

from autograder import grade
from autograder.grade import DEFAULT_COURSE_ROOT as ROOT
from submissions import apply_edits, learner_notebook, solution_ids
from submissions import ch07_kv_cache as ch

pytestmark = pytest.mark.slow

CHAPTER = ch.CHAPTER
TEST_CELLS = ["test_kv_cache", "test_attention_with_cache", "test_forward_with_cache", "test_cached_model",
              "test_kv_cache_bytes"]
MUTANTS = {m.key: m for m in ch.MUTANTS}
VARIANTS = {v.key: v for v in ch.VARIANTS}
# The mistakes the course most wants caught (keys and values stored wrong, a mask that hides the past, positions
# that restart, a stale cache, beams sharing a cache), and two ways of writing it right.
GRADED_MUTANTS = ["cat-wrong-dim", "values-not-cached", "mask-hides-cache", "no-position-offset",
                  "cache-never-reset", "beams-share-parent"]
GRADED_VARIANTS = ["preallocated-copying", "sdpa-inference-mode-single-entry"]
HIDDEN_TESTS = re.compile(r"^### BEGIN HIDDEN TESTS\n(.*?)^### END HIDDEN TESTS", re.S | re.M)


def submissions() -> dict[str, nbformat.NotebookNode]:
    """{student id: notebook}: the reference, the untouched release, the graded mistakes and answers."""
    notebooks = {
        "reference": learner_notebook(CHAPTER, {}),
        "untouched": learner_notebook(CHAPTER, None),
    }
    for key in GRADED_MUTANTS:
        notebooks[key] = learner_notebook(CHAPTER, apply_edits(CHAPTER, MUTANTS[key].edits))
    for key in GRADED_VARIANTS:
        notebooks[key] = learner_notebook(CHAPTER, apply_edits(CHAPTER, VARIANTS[key].edits, VARIANTS[key].cells))
    return notebooks


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, grade.Result]:
    class_dir = tmp_path_factory.mktemp("class")
    notebooks = submissions()
    assert len(notebooks) == 2 + len(GRADED_MUTANTS) + len(GRADED_VARIANTS), "two submissions share a student id"
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
    assert solution_ids(CHAPTER) == ["kv_cache", "attention_with_cache", "forward_with_cache", "cached_model",
                                     "kv_cache_bytes"]


@pytest.mark.parametrize("key", GRADED_MUTANTS)
def test_mistake_loses_points_in_the_cells_it_breaks_and_only_there(results, key):
    mutant, result = MUTANTS[key], results[key]
    assert result.score < result.max_score, f"{mutant.name}: full marks"
    assert set(lost_cells(result)) == set(mutant.lost), f"{mutant.name}: {summary(result)}"
    assert all(lp.score == 0 for lp in result.lost), summary(result)


@pytest.mark.parametrize("key", GRADED_MUTANTS)
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


@pytest.mark.parametrize("key", GRADED_VARIANTS)
def test_different_correct_answer_gets_full_marks(results, key):
    variant, result = VARIANTS[key], results[key]
    assert result.score == result.max_score and result.lost == [], f"{variant.name}: {summary(result)}"


# ---------------------------------------------------------------- every mistake and answer, without nbgrader

def hidden_tests() -> dict[str, str]:
    """{grade_id: the hidden part} of the chapter's test cells, from the instructor notebook."""
    nb = nbformat.read(ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    return {cell.metadata.nbgrader["grade_id"]: HIDDEN_TESTS.search(cell.source).group(1)
            for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("grade")}


def run_hidden_tests(cells: dict[str, str]) -> dict[str, str]:
    """Run the learner notebook's own cells (imports, given code, solution cells filled with `cells`), then
    each test cell's hidden part as the grader does; {grade_id: message} of those that fail."""
    namespace: dict = {}
    for cell in learner_notebook(CHAPTER, cells).cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and nbgrader.get("grade_id") and not nbgrader.get("grade"):
            exec(compile(cell.source, f"<{CHAPTER} {nbgrader['grade_id']}>", "exec"), namespace)
    failed = {}
    for grade_id, source in hidden_tests().items():
        try:
            exec(source, dict(namespace))
        except AssertionError as err:
            failed[grade_id] = str(err)
    return failed


@pytest.mark.parametrize("key", MUTANTS)
def test_hidden_checks_name_every_mistake_in_the_cells_it_breaks(key):
    mutant = MUTANTS[key]
    failed = run_hidden_tests(apply_edits(CHAPTER, mutant.edits))
    assert set(failed) == set(mutant.lost), f"{mutant.name}: {failed}"
    for grade_id, named in mutant.lost.items():
        assert named in failed[grade_id], f"{mutant.name}: {grade_id} should say {named!r}: {failed[grade_id]}"


@pytest.mark.parametrize("key", VARIANTS)
def test_hidden_checks_accept_every_correct_answer(key):
    variant = VARIANTS[key]
    assert run_hidden_tests(apply_edits(CHAPTER, variant.edits, variant.cells)) == {}, variant.name
