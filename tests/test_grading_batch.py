"""minigpt-grade, end to end, on every chapter in one batch, against the warm kernel's grading of the same notebooks.

The chapters' tests (tests/test_chapterNN_grading.py) grade every mutant and variant in a warm learner-side process
through the real judge (tests/submissions/grading.py): no sandbox, no nbgrader, no new kernel per notebook. Here two
notebooks of every chapter go through the real ``minigpt-grade`` path (``grade.grade``: intake, nbgrader's
preprocessors, a sandboxed kernel per notebook, a judge process each, the gradebook, feedback), in one class folder
graded as one batch, so that nbgrader's start-up is paid once: the reference and a mistake (the
chapter's first that loses points in two cells or more). Each must meet the chapter's
expectations, and get, cell for cell, the same scores and messages from the warm kernel: what lets the chapters'
tests stand for the grader. The warm kernel's results are those the chapters' tests left in this run
(``share_warm``; `make test` runs this file last); a notebook no chapter's tests judged (this file run alone) is
judged here in a warm kernel of its own.
"""
from __future__ import annotations

import importlib
import time

import nbformat
import pytest

from autograder import base, grade, intake, workspace
from minigpt import CHAPTERS as MODULES
from submissions.grading import (BATCH_STUDENTS, batch_cases, expect_mutant, expect_reference,
                                 judge_submission, learner_errors, shared_warm, submission, summary,
                                 warm_kernel)

pytestmark = pytest.mark.slow

ROOT = base.DEFAULT_COURSE_ROOT
CHAPTERS = intake.graded_chapters(ROOT)
STUDENTS = BATCH_STUDENTS


def chapter_module(chapter: str):
    return importlib.import_module(f"submissions.ch{chapter[:2]}_{MODULES[chapter]}")


def cases(chapter: str) -> dict:
    """{student: case} of one chapter: what each of the two students hands in."""
    return batch_cases(chapter_module(chapter))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("grading") / "workdir"


@pytest.fixture(scope="module")
def batch(tmp_path_factory, workdir) -> dict[tuple[str, str], base.Result]:
    """{(student, chapter): result} of one minigpt-grade run of the whole class."""
    class_dir = tmp_path_factory.mktemp("class")
    for student in STUDENTS:
        (class_dir / student).mkdir()
    for chapter in CHAPTERS:
        ch = chapter_module(chapter)
        for student, case in cases(chapter).items():
            nbformat.write(submission(ch, case), class_dir / student / f"{chapter}.ipynb")
    subs = intake.class_submissions(class_dir, [], intake.course_chapters(ROOT))
    assert len(subs) == len(STUDENTS) * len(CHAPTERS)
    start = time.monotonic()
    results = grade.grade(subs, ROOT, workdir)
    print(f"minigpt-grade: {len(subs)} notebooks of {len(CHAPTERS)} chapters in {time.monotonic() - start:.0f} s")
    return {(r.student, r.chapter): r for r in results}


def test_every_notebook_of_the_batch_is_graded(batch):
    assert {key: r.status for key, r in batch.items() if r.status != "graded"} == {}
    assert len(batch) == len(STUDENTS) * len(CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_grader_meets_the_chapters_expectations(batch, chapter):
    graded = {student: batch[student, chapter] for student in STUDENTS}
    chosen = cases(chapter)
    expect_reference(graded["reference"])
    expect_mutant(graded["mistake"], chosen["mistake"])


def row(result: base.Result) -> tuple:
    """What a learner is told of a graded notebook: score, each lost cell's points and message, what stopped the
    run."""
    score = None if result.score is None else round(result.score, 6)  # a sum of fractions, in the gradebook's order
    return (result.status, score, result.max_score, result.needs_manual_grade, result.detail,
            [(lp.grade_id, lp.score, lp.max_score, lp.message) for lp in result.lost])


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_warm_kernel_gives_the_graders_scores_and_messages(batch, workdir, chapter):
    """Cell for cell; and the same errors of the learner's own cells (both run the same cells: not the closing demos,
    ``run.skipped_when_graded``)."""
    ch = chapter_module(chapter)
    warm = {student: shared_warm(chapter, student) for student in STUDENTS}
    if None in warm.values():  # not judged by the chapter's tests in this run
        with warm_kernel(chapter) as kernel:
            warm.update({student: judge_submission(kernel, student, submission(ch, case))
                         for student, case in cases(chapter).items() if warm[student] is None})
    for student in STUDENTS:
        real = batch[student, chapter]
        assert row(warm[student]) == row(real), \
            f"{student} {chapter}:\n  minigpt-grade {summary(real)}\n  warm kernel {summary(warm[student])}"
        autograded = nbformat.read(workspace.autograded_path(workdir, student, chapter), as_version=4)
        assert warm[student].cell_errors == learner_errors(autograded), f"{student} {chapter}"
