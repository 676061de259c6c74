"""The sandbox's executor (autograder/sandboxed/execute.py) is nbgrader's Execute preprocessor without importing
nbgrader: the same settings, the same hook, and the same executed notebook for the same cells (errors, a timeout,
counts)."""
from __future__ import annotations

import copy
import os

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

from autograder import base, intake
from autograder.sandboxed import execute
from autograder.run import judged_cells, skipped_when_graded, warm_ups
from submissions import graded_notebook, learner_notebook

# Traits of Execute that may differ from nbclient's defaults without the executor copying them: the ones the
# executor sets itself (kernel, timeout, manager), and nbgrader's own preprocessor switches.
SET_BY_THE_EXECUTOR = {"timeout", "kernel_name", "kernel_manager_class", "enabled", "default_language",
                       "display_data_priority"}


def test_the_executor_has_every_setting_of_nbgraders_execute():
    theirs, plain = Execute(), NotebookClient(nbformat.v4.new_notebook())
    differ = {name for name in theirs.trait_names() if name in plain.trait_names() and name != "on_cell_executed"
              and getattr(theirs, name) != getattr(plain, name)}
    assert differ - SET_BY_THE_EXECUTOR == set(execute.EXECUTE_SETTINGS)
    assert {name: getattr(theirs, name) for name in execute.EXECUTE_SETTINGS} == execute.EXECUTE_SETTINGS


def test_the_executors_hook_does_what_nbgraders_does():
    shown = NotebookNode(output_type="error", ename="ValueError", evalue="bad", traceback=["tb"])
    for outputs, content in [
        ([], {"status": "ok"}),
        ([shown], {"status": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["tb"]}),
        ([], {"status": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": ["timed out"]}),
        ([shown], {"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}),
    ]:
        cells = [nbformat.v4.new_code_cell("x", outputs=copy.deepcopy(outputs)) for _ in range(2)]
        Execute().on_cell_executed(cell=cells[0], execute_reply={"content": content})
        execute.Executor(nbformat.v4.new_notebook()).on_cell_executed(cell=cells[1], execute_reply={"content": content})
        assert cells[0].outputs == cells[1].outputs, content


def test_a_notebook_runs_as_under_nbgraders_execute(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in [
        "x = 1\nprint('hello')",
        "1 / 0",
        "",
        "x + 1",
        "import time\ntime.sleep(30)",
        "get_ipython().execution_count",
    ]])
    theirs, mine = copy.deepcopy(nb), copy.deepcopy(nb)
    Execute(timeout=3, kernel_name="python3").preprocess(theirs, {"metadata": {"path": str(tmp_path)}})
    execute.run_notebook(mine, 3, str(tmp_path))

    def seen(notebook):
        return [(c.execution_count, [(o.output_type, o.get("name"), o.get("text"), o.get("ename"), o.get("data"))
                                     for o in c.outputs]) for c in notebook.cells]

    assert seen(mine) == seen(theirs)
    # the interrupted cell: the interrupt's own error, then the timeout's (added by the hook)
    assert [o.ename for o in mine.cells[4].outputs if o.output_type == "error"] == ["KeyboardInterrupt",
                                                                                   "CellTimeoutError"]


def test_a_graded_run_skips_the_closing_demos_and_nothing_a_score_depends_on():
    """What the grader does not run (``run.skipped_when_graded``): the release's own code cells after the last judged
    test cell, such as the demos that close chapters 6, 8 and 9 (seconds each); never a test cell, a learner's answer,
    a cell that defines something, anything before the last test, or a cell the learner wrote or changed."""
    skipped = {}
    for chapter in intake.graded_chapters(base.DEFAULT_COURSE_ROOT):
        release = learner_notebook(chapter, None)
        nb = graded_notebook(learner_notebook(chapter, {}), chapter)
        last = max(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id")
                   in judged_cells(nb))
        skipped[chapter] = skipped_when_graded(nb, release)
        for i in skipped[chapter]:
            cell = nb.cells[i]
            assert i > last and cell.cell_type == "code" and not cell.metadata.get("nbgrader"), (chapter, i)
            assert "#| export" not in cell.source, (chapter, i)
        if skipped[chapter]:
            mine = skipped[chapter][-1]
            nb.cells[mine].source += "\nprint('mine')"  # changed by the learner: it runs
            nb.cells.append(nbformat.v4.new_code_cell("print('my own cell')"))  # added by the learner: it runs
            assert skipped_when_graded(nb, release) == skipped[chapter][:-1], chapter
    assert all(skipped[chapter] for chapter in ("06-samplers", "08-training", "09-constrained")), skipped


def test_the_fork_server_computes_ahead_the_answers_of_the_batchs_chapters_only():
    """``run.warm_ups``, once every chapter's checks are loaded (as in the fork server, ``warm.py``): a chapter's own
    checks' warm_up (chapters 9 and 10: 23 s), none for a chapter whose checks have none."""
    from autograder import judge
    from autograder.checks import batching, constrained
    from minigpt import CHAPTERS

    for chapter in CHAPTERS:
        judge.checks(chapter)
    assert warm_ups(["01-tokens", "08-training"]) == []
    assert warm_ups(["10-batching", "09-constrained", "11-capstone"]) == [batching.warm_up, constrained.warm_up]


def test_a_fork_server_of_chapter_1_loads_no_transformers_and_a_judge_loads_what_it_lacks():
    """``warm.py`` with the batch's chapters (``run.LOAD_ENV``, as ``grade`` starts it): chapter 1's checks need
    neither Hugging Face's transformers nor its GPT-2 (4 s of imports); a judge of a chapter whose checks use them,
    forked from that fork server (a later batch's chapter), loads them itself (``run.load_checks``)."""
    import subprocess
    import sys

    from autograder.run import LOAD_ENV

    probe = ("import sys\nimport autograder.warm\nprint('transformers' in sys.modules)\n"
             "from autograder.run import load_checks\nload_checks(['05-generation'])\n"
             "print('transformers.models.gpt2.modeling_gpt2' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, LOAD_ENV: "01-tokens"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout
