"""A class batch of chapter 1 with every kind of bad submission (tests/submissions/hostile.py), graded in one
`minigpt-grade --class` run through real nbgrader: each gets a row that says what happened, none stops the
batch, no trick earns points, and no feedback page shows the hidden tests."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest

from autograder import grade
from submissions import hostile
from submissions.grading import lost_cells

pytestmark = pytest.mark.slow

CHAPTER = hostile.CHAPTER
TOKENIZER_TESTS = {"test_encode_ordinary", "test_special_tokens", "test_decode", "test_matches_tiktoken"}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    class_dir = tmp_path_factory.mktemp("class")
    workdir = tmp_path_factory.mktemp("grading") / "workspace"
    students = hostile.write_class(class_dir, {
        "reference": hostile.reference_text(),
        "untouched": hostile.untouched_text(),
        "bpe-leftmost": hostile.mutant_text("bpe-leftmost"),
    })
    out = workdir.parent / "results.json"
    with contextlib.redirect_stdout(io.StringIO()) as table:
        code = grade.main(["--class", str(class_dir), "--chapter", CHAPTER, "--workdir", str(workdir),
                           "--cell-timeout", "20", "--timeout", "100", "--json", str(out), "--quiet"])
    results = {r["student"]: grade.Result.from_dict(r) for r in json.loads(out.read_text())["results"]}
    return code, students, results, workdir, table.getvalue()


def outputs(workdir: Path, student: str) -> str:
    nb = nbformat.read(grade.autograded_path(workdir, student, CHAPTER), as_version=4)
    return json.dumps([c.get("outputs", []) for c in nb.cells])


def test_every_submission_gets_one_row_and_the_batch_succeeds(batch):
    code, students, results, workdir, table = batch
    assert code == 0
    assert sorted(results) == sorted(students)
    rows = (workdir / "grades.csv").read_text().splitlines()
    assert len(rows) == 1 + len(students)
    for student in students:
        assert (workdir / "feedback" / student / "index.html").is_file(), student
        assert f"\n{student} " in "\n" + table
    assert not list((workdir / "work").glob("*/*")), "grading folders of finished runs are removed"


def test_right_and_untouched_answers_still_score_as_usual(batch):
    _, _, results, _, _ = batch
    assert results["reference"].score == results["reference"].max_score == 13
    assert results["untouched"].score == 0


@pytest.mark.parametrize("student, status, detail", [
    ("corrupt-json", "unreadable", "not a notebook"),
    ("other-chapter", "wrong-notebook", "this is the notebook of 02-embeddings, not of this chapter"),
    ("not-the-notebook", "wrong-notebook", "no nbgrader cells"),
])
def test_what_is_not_this_chapters_notebook_is_named_and_not_run(batch, student, status, detail):
    _, _, results, _, _ = batch
    r = results[student]
    assert r.status == status and r.score is None and r.max_score == 13
    assert detail in r.detail
    assert r.seconds is None or r.seconds == 0


def test_an_endless_loop_costs_the_cells_that_needed_it(batch):
    _, _, results, _, _ = batch
    r = results["infinite-loop"]
    assert r.status == "graded" and set(lost_cells(r)) == TOKENIZER_TESTS, lost_cells(r)
    assert any("tokenizer: CellTimeoutError" in e for e in r.cell_errors), r.cell_errors


def test_a_loop_that_ignores_interrupts_is_stopped_and_says_so(batch):
    _, _, results, _, _ = batch
    r = results["deaf-loop"]
    assert r.status == "error" and "did not stop when interrupted" in r.detail
    assert r.seconds < 100 + 30


def test_a_memory_bomb_fails_only_its_own_cell(batch):
    _, _, results, _, _ = batch
    r = results["memory-bomb"]
    assert (r.status, r.score) == ("graded", 13)
    assert any("MemoryError" in e for e in r.cell_errors), r.cell_errors


def test_sys_exit_is_just_an_error_in_its_cell(batch):
    _, _, results, _, _ = batch
    assert (results["sys-exit"].status, results["sys-exit"].score) == ("graded", 13)


@pytest.mark.parametrize("student", ["os-exit", "segfault"])
def test_a_dead_kernel_gets_a_row_that_says_so(batch, student):
    _, _, results, _, _ = batch
    r = results[student]
    assert r.status == "error" and "kernel died" in r.detail
    assert any("kills or bypasses the kernel" in note for note in r.review)


def test_edited_test_cells_are_restored_and_listed_for_review(batch):
    _, _, results, _, _ = batch
    r = results["edited-test"]
    assert "token by token" in lost_cells(r)["test_decode"]
    assert "test_decode: a locked cell was edited (nbgrader restored it before grading)" in r.review


def test_a_deleted_test_cell_waits_for_the_instructor(batch):
    _, _, results, _, _ = batch
    r = results["deleted-test"]
    assert set(lost_cells(r)) == {"test_decode"} and "cell missing" in lost_cells(r)["test_decode"]
    assert r.needs_manual_grade and "cells deleted: test_decode" in r.review


def test_a_renamed_function_is_named(batch):
    _, _, results, _, _ = batch
    assert lost_cells(results["renamed"])["test_pre_split"] == "NameError: name 'pre_split' is not defined"


def test_megabytes_of_output_are_cut(batch):
    _, _, results, workdir, _ = batch
    assert results["flood"].score == 13
    assert grade.autograded_path(workdir, "flood", CHAPTER).stat().st_size < 1_000_000
    assert "more characters cut by the grader" in outputs(workdir, "flood")


def test_importing_the_reference_is_refused_with_a_reason(batch):
    _, _, results, _, _ = batch
    r = results["imports-reference"]
    assert set(lost_cells(r)) == TOKENIZER_TESTS
    assert any("minigpt.tokens is the course's reference solution, which is not available while grading 01-tokens"
               in e for e in r.cell_errors), r.cell_errors


def test_reading_the_answers_from_disk_gets_nothing(batch):
    _, _, results, workdir, _ = batch
    r = results["snoop"]
    assert r.score == 0
    seen = outputs(workdir, "snoop")
    assert "solutions/01-tokens/01-tokens.ipynb: grading keeps this file out of the notebook's reach" in seen
    assert "gradebook.db: grading keeps this file out of the notebook's reach" in seen
    assert "a notebook may not start other programs while it is graded" in seen
    assert {note.split(": ")[1] for note in r.review} >= {"names grading files", "runs code from a string",
                                                         "runs other programs"}


def test_patching_the_checks_changes_nothing(batch):
    _, _, results, _, _ = batch
    patched, plain = results["patches-checks"], results["bpe-leftmost"]
    assert (patched.score, lost_cells(patched)) == (plain.score, lost_cells(plain))
    assert "LOWEST rank" in lost_cells(patched)["test_bpe_merge"]
    assert any("mentions the autograder" in note for note in patched.review)


def test_feedback_shows_messages_never_hidden_tests(batch):
    _, students, results, workdir, _ = batch
    pages = list((workdir / "feedback").rglob("*.html"))
    assert len(pages) > len(students)  # a summary per learner, nbgrader's page per graded notebook
    for page in pages:
        text = page.read_text()
        assert "HIDDEN TESTS" not in text and "checks.check_" not in text, page
        if page.parent.parent.name != "patches-checks":  # whose own code imports autograder.checks
            assert "autograder.checks" not in text, page
    page = (workdir / "feedback" / "bpe-leftmost" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert "LOWEST rank" in page and "hidden tests ran here" in page
    summary = (workdir / "feedback" / "bpe-leftmost" / "index.html").read_text()
    assert "4 / 13" in summary and "test_bpe_merge" in summary and "LOWEST rank" in summary


def test_the_gradebook_holds_each_graded_submission_once(batch):
    from nbgrader.api import Gradebook

    _, _, results, workdir, _ = batch
    graded = {s for s, r in results.items() if r.status == "graded"}
    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gb:
        subs = gb.find_assignment(CHAPTER).submissions
        assert sorted(s.student.id for s in subs) == sorted(graded)
        assert {s.student.id: s.score for s in subs} == {s: results[s].score for s in graded}
