"""The tests of the tests that every chapter shares (DESIGN.md, invariant 6), for `tests/test_chapterNN_grading.py`.

Every submission is the learner notebook filled in as a learner would (this package): the reference answer must get
full marks, the untouched notebook 0, each realistic mistake must lose points in the cells it breaks, and only there,
with a message that names it, and each different-but-correct answer must get full marks.

Every mutant and variant is graded the way ``minigpt-grade`` grades, less the costs that do not judge anything (a
sandbox, nbgrader and a new kernel per notebook): one warm learner-side process per chapter (`WarmKernel`,
``kernel.py``) runs each notebook's code cells in order, as the grader's kernel would, and its hidden cells serve the
real judge (``autograder.judge.RunJudge``) through the real wire; the grader's own code then turns the verdicts and the
cells' errors into the autograded notebook, scores and messages (``executed_outputs``, ``scoring.assemble``,
``scoring.cell_scores``). `tests/test_grading_batch.py` grades two submissions of every chapter through the real
``minigpt-grade`` as well, in one batch, and checks that both ways give the same scores and messages (the chapters'
tests leave it their results of those two: ``share_warm``). The reference's run also measures which arguments the
hidden cases give each function the learner writes (``coverage``): every parameter given another value than its
default and left out, or excused in the chapter's test file with its reason.

A chapter's test file states what is its own and takes the rest from here, into its own namespace, so that each
chapter stays one file (pytest-xdist `--dist loadfile` spreads the chapters over the workers by file):

    globals().update(chapter_tests(ch, TEST_CELLS, SOLUTION_IDS))
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

import nbformat
import pytest

import minigpt

from autograder import base, intake, sandbox, scoring, workspace
from autograder.sandboxed import hidden
from autograder.judge import RunJudge
from autograder.run import (RunOutcome, blocked_modules, executed_outputs, judged_cells, skipped_when_graded,
                             solution_cell_names)

from kernel_paths import OTHER, describe

from . import Mutant, Variant, apply_edits, coverage, graded_notebook, learner_notebook, solution_ids

LIMITS = base.Limits()  # minigpt-grade's defaults: each cell's time limit, the whole notebook's
KERNEL = Path(__file__).with_name("kernel.py")


def submission(ch: ModuleType, case: str | Mutant | Variant) -> nbformat.NotebookNode:
    """The notebook a learner hands in: "reference", "untouched" (as released), a mutant or a variant."""
    if case == "reference":
        return learner_notebook(ch.CHAPTER, {})
    if case == "untouched":
        return learner_notebook(ch.CHAPTER, None)
    return learner_notebook(ch.CHAPTER, apply_edits(ch.CHAPTER, case.edits, getattr(case, "cells", None)))


class WarmKernel:
    """One chapter's learner side, kept warm from one submission to the next (``kernel.py``): each submission's
    cells run there as in a new kernel, and its hidden cells reach a ``RunJudge`` of this process, the judge
    ``minigpt-grade`` uses. A learner side that dies or runs past the notebook's time limit is started again for
    the next submission."""

    def __init__(self, chapter: str, path: tuple[str, int] | None = None):
        self.chapter = chapter
        self.path = path  # (ATEN_CPU_CAPABILITY, torch threads) of another kernel path (kernel_paths.OTHER); None: own
        self.folder = Path(tempfile.mkdtemp(prefix="mg-warm-"))  # short: a socket's path has at most 107 bytes
        blocked = blocked_modules(chapter)
        reference = Path(minigpt.__file__).resolve().parent  # where the sandbox puts its stubs
        sandbox.prepare(self.folder, chapter, blocked)  # the sandbox's own stubs of the held-back modules
        self.config = json.dumps({
            "chapter": chapter,
            "stubs": {m: [str(reference / f"{m.split('.', 1)[1]}.py"), (self.folder / "stubs" / f"{m}.py").read_text()]
                      for m in blocked},
            "sandbox_side": [n.removesuffix(".py") for n in sandbox.SANDBOX_SIDE if n != "__init__.py"],
        })
        self.release = learner_notebook(chapter, None)  # what ``skipped_when_graded`` compares with
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def environment(self) -> dict[str, str]:
        """The sandbox's environment (``sandbox.command``), with this machine's folders, and the backend ipykernel
        gives matplotlib."""
        venv = Path(sys.prefix)
        return {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.folder / "home"),
            "USER": "learner", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(self.folder / "hf"),
            "TIKTOKEN_CACHE_DIR": os.environ["TIKTOKEN_CACHE_DIR"],
            "MPLCONFIGDIR": str(self.folder / "matplotlib"), "JUPYTER_RUNTIME_DIR": str(self.folder / "runtime"),
            "IPYTHONDIR": str(self.folder / "ipython"), "OMP_NUM_THREADS": "1", "NBGRADER_EXECUTION": "autograde",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        } | ({} if self.path is None else {
            "ATEN_CPU_CAPABILITY": self.path[0], "OMP_NUM_THREADS": str(self.path[1]),
            "OMP_WAIT_POLICY": os.environ["OMP_WAIT_POLICY"],  # tests/conftest.py: idle threads sleep
            hidden.CHECK_THREADS_ENV: str(self.path[1])})

    def start(self) -> None:
        with open(self.folder / "kernel.log", "ab") as log:
            self.proc = Zygote.of(self.path, self.environment()).fork(self.config, self.environment(), self.folder, log)
        ready = self._answer(120)
        assert ready == {"ready": True}, f"the warm kernel of {self.chapter} did not start: {ready}\n{self.log()}"

    def log(self) -> str:
        return workspace.log_tail((self.folder / "kernel.log").read_text(errors="replace"), 25)

    def _answer(self, timeout: float) -> dict | str:
        """The learner side's next answer, or why there is none."""
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return f"no answer within {timeout:g} s"
        line = self.proc.stdout.readline()
        return json.loads(line) if line else "the kernel died"

    def run(self, nb: nbformat.NotebookNode) -> RunOutcome:
        """Run the notebook ``nb`` (as the grader runs it: ``graded_notebook``) and judge its hidden cells: the cells
        the grader's kernel runs, the same ones (``skipped_when_graded``: not the closing demos)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.runs += 1
        run_dir = self.folder / f"run{self.runs}"
        run_dir.mkdir()
        skipped = set(skipped_when_graded(nb, self.release))
        cells = [[i, c.source] for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in skipped]
        start = time.monotonic()
        with RunJudge(run_dir / "judge", judged_cells(nb), solution_cell_names(nb),
                      cell_timeout=LIMITS.cell_timeout + 15) as judge:  # as autograder.run gives it
            self.proc.stdin.write(json.dumps({"cells": cells, "judge": str(run_dir / "judge"),
                                              "home": str(run_dir / "home"), "cell_timeout": LIMITS.cell_timeout})
                                  + "\n")
            self.proc.stdin.flush()
            answer = self._answer(LIMITS.timeout)
            if not isinstance(answer, dict):
                self.proc.kill()
                self.proc.wait()
        assert not (isinstance(answer, dict) and "failed" in answer), f"the warm kernel failed: {answer['failed']}"
        ran = answer["cells"] if isinstance(answer, dict) else {}
        shutil.rmtree(run_dir, ignore_errors=True)
        # What the executor would report: the notebook with each cell's execution count and errors; read back
        # by the grader's own code, as minigpt-grade reads the sandbox's report.
        executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
        for i, cell in enumerate(executed.cells):
            if cell.cell_type == "code":
                cell.outputs = [nbformat.from_dict(o) for o in ran.get(str(i), {}).get("outputs", [])]
                cell.execution_count = ran.get(str(i), {}).get("count")
        outputs, _ = executed_outputs({"executed": nbformat.writes(executed)}, nb)
        incident = "" if isinstance(answer, dict) else f"the notebook's kernel died before the end ({answer})"
        return RunOutcome(judge.verdicts, outputs, time.monotonic() - start, incident)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # nothing of it is kept: no need to wait for torch's clean exit
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Zygote:
    """Where this process's warm kernels of one kernel path start (``kernel.py --zygote``): a process that has imported
    torch and IPython and forks a kernel for each ``fork``, in a tenth of a second where a new interpreter takes two.
    One a kernel path, for the life of this process."""

    started: dict[tuple[str, int] | None, "Zygote"] = {}

    @classmethod
    def of(cls, path: tuple[str, int] | None, env: dict[str, str]) -> "Zygote":
        """The zygote of ``path``, started (with the kernels' environment ``env``) if it is not running."""
        zygote = cls.started.get(path)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = cls.started[path] = cls(env)
        return zygote

    def __init__(self, env: dict[str, str]):
        self.folder = Path(tempfile.mkdtemp(prefix="mg-zygote-"))
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channel.settimeout(120)  # its first fork waits for its imports
        with theirs, open(self.folder / "zygote.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(KERNEL), "--zygote", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, env={**env, "HOME": str(self.folder)},
                                         cwd=self.folder)
        atexit.register(self.close)

    def fork(self, config: str, env: dict[str, str], cwd: Path, log) -> "Forked":
        """A kernel (``kernel.py``'s ``main(config)``) in the environment ``env`` and the working folder ``cwd``, its
        stderr going to the file ``log``."""
        kernel_in, to_kernel = os.pipe()
        from_kernel, kernel_out = os.pipe()
        try:
            socket.send_fds(self.channel, [json.dumps({"config": config, "env": env, "cwd": str(cwd)}).encode()],
                            [kernel_in, kernel_out, log.fileno()])
            answer = self.channel.recv(1024)
        finally:
            os.close(kernel_in)
            os.close(kernel_out)
        assert answer, "the kernels' zygote has gone:\n" + workspace.log_tail(
            (self.folder / "zygote.log").read_text(errors="replace"), 25)
        return Forked(json.loads(answer)["pid"], os.fdopen(to_kernel, "w", encoding="utf-8"),
                      os.fdopen(from_kernel, "r", encoding="utf-8"))

    def close(self) -> None:
        self.channel.close()  # the zygote ends when it reads that
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Forked:
    """A kernel forked by a ``Zygote``, with what ``WarmKernel`` uses of a ``subprocess.Popen``: its pipes, ``poll``,
    ``kill`` and ``wait``. It is the zygote's child, not this process's: watched through a pidfd."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self._pidfd: int | None = os.pidfd_open(pid)

    def poll(self) -> int | None:
        """None while it runs (its exit status is the zygote's to read: 0 once it has ended)."""
        if self._pidfd is not None and not select.select([self._pidfd], [], [], 0)[0]:
            return None
        self.wait()
        return 0

    def kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def wait(self) -> int:
        if self._pidfd is not None:
            select.select([self._pidfd], [], [])
            os.close(self._pidfd)
            self._pidfd = None
        return 0


def learner_errors(autograded: nbformat.NotebookNode) -> list[str]:
    """What ``scoring.read_result`` says of the errors of the learner's own cells (not test cells)."""
    return [f"{intake.cell_name(autograded, i)}: {scoring._located(cell, autograded)}"
            for i, cell in enumerate(autograded.cells)
            if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")
            and any(o.get("output_type") == "error" for o in cell.get("outputs", []))][:5]


def judge_submission(kernel: WarmKernel, student: str, submitted: nbformat.NotebookNode) -> base.Result:
    """A submission's row as ``minigpt-grade`` writes it (score, lost cells and their messages, errors of the
    learner's own cells: ``learner_errors``), from its run in the warm kernel: the
    grader's ``assemble`` and ``cell_scores``, then what ``scoring.read_result`` reads from the gradebook and the
    autograded notebook."""
    from nbgrader.preprocessors import LimitOutput

    nb = graded_notebook(submitted, kernel.chapter)
    outcome = kernel.run(nb)
    scores = scoring.cell_scores(nb, outcome.verdicts)
    autograded, _ = LimitOutput().preprocess(scoring.assemble(nb, outcome), {})
    lost, score, max_score = [], 0.0, 0.0
    for cell in autograded.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            points = float(meta.get("points") or 0)
            max_score += points
            if meta["grade_id"] not in scores:
                lost.append(base.LostPoints(meta["grade_id"], 0.0, points, "needs manual grading"))
            elif scores[meta["grade_id"]] < points:
                lost.append(base.LostPoints(meta["grade_id"], scores[meta["grade_id"]], points,
                                             scoring._located(cell, autograded)))
            score += scores.get(meta["grade_id"], 0.0)
    return base.Result(student, kernel.chapter, "graded", score, max_score, lost,
                        needs_manual_grade=any(lp.message == "needs manual grading" for lp in lost),
                        detail=outcome.incident, cell_errors=learner_errors(autograded),
                        seconds=round(outcome.seconds, 1))


@contextlib.contextmanager
def warm_kernel(chapter: str, path: tuple[str, int] | None = None):
    """A chapter's warm kernel, and this process as a judge process is (one torch thread: the checks are small; on
    another kernel path, its thread count)."""
    from coursekit.testing import isolated

    kernel = WarmKernel(chapter, path)
    try:
        with isolated(threads=1 if path is None else path[1]):
            yield kernel
    finally:
        kernel.close()


# ---------------------------------------------------------------- what every graded submission must show


def lost_cells(result: base.Result) -> dict[str, str]:
    return {lp.grade_id: lp.message for lp in result.lost}


def summary(result: base.Result) -> str:
    """What a failing test prints of a result: its score and lost cells, or why it has no score."""
    if result.status != "graded":
        log = Path(result.log).read_text(errors="replace") if result.log and Path(result.log).is_file() else ""
        return f"{result.status}: {result.detail}\n  nbgrader's log ends:\n{workspace.log_tail(log, 25)}"
    return f"{result.score} / {result.max_score}{f' ({result.detail})' if result.detail else ''}:\n" + "\n".join(
        f"  {lp.grade_id} ({lp.score:g} / {lp.max_score:g}): {lp.message}" for lp in result.lost)


def says_what_went_wrong(result: base.Result) -> None:
    """Every lost cell says what went wrong, not just `AssertionError`."""
    for lp in result.lost:
        _, _, text = lp.message.partition(": ")
        assert text.strip() and lp.message != "lost points without raising an error", \
            f"{result.student} {lp.grade_id}: {lp.message!r}"


def expect_graded(result: base.Result) -> None:
    assert result.status == "graded" and not result.detail, summary(result)
    says_what_went_wrong(result)


def expect_reference(result: base.Result) -> None:
    expect_graded(result)
    assert result.max_score > 0 and result.score == result.max_score and result.lost == [], summary(result)
    assert not result.needs_manual_grade


def expect_untouched(result: base.Result, test_cells: list[str]) -> None:
    expect_graded(result)
    assert result.score == 0, summary(result)
    lost = lost_cells(result)
    assert list(lost) == test_cells, summary(result)
    for grade_id, message in lost.items():
        assert "not written yet" in message, f"{grade_id}: {message}"


def expect_mutant(result: base.Result, mutant: Mutant) -> None:
    """Points lost in exactly the cells the mistake breaks, each with a message that names it."""
    expect_graded(result)
    lost = lost_cells(result)
    assert set(lost) == set(mutant.lost), f"{mutant.name}: {summary(result)}"
    assert all(lp.score < lp.max_score for lp in result.lost), summary(result)
    for grade_id, named in mutant.lost.items():
        assert named in lost[grade_id], f"{mutant.name}: {grade_id} should say {named!r}: {lost[grade_id]}"
    scores = {lp.grade_id: lp.score for lp in result.lost}
    for grade_id, points in mutant.kept.items():
        assert scores[grade_id] == pytest.approx(points, abs=0.01), \
            f"{mutant.name}: {grade_id} kept {scores[grade_id]}, expected {points}: {lost[grade_id]}"


def expect_variant(result: base.Result, variant: Variant) -> None:
    expect_graded(result)
    assert result.score == result.max_score and result.lost == [], f"{variant.name}: {summary(result)}"


@contextlib.contextmanager
def naming(where: str):
    """A failed expectation says ``where`` it failed first (e.g. the kernel path)."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from None


# ---------------------------------------------------------------- results one test file leaves for another

# A different correct answer is not among them: what the batch shows is that the warm kernel grades as minigpt-grade
# does (full marks, none, points lost with their messages), and the chapters' tests grade every variant.
# Not the untouched release: a sandboxed notebook's cost is its start (sandbox, kernel, torch), so it cost the batch what
# a reference does (83 of its 293 notebook-seconds on 2026-12-07); what its grading does beyond a mistake's (every
# solution cell raising) the hostile batch grades end to end (chapter 1) and each chapter's tests in the warm kernel.
BATCH_STUDENTS = ("reference", "mistake")


def batch_cases(ch: ModuleType) -> dict[str, str | Mutant]:
    """{student: case} of the chapter's notebooks in `tests/test_grading_batch.py`'s class: the reference and a
    mistake (the chapter's first that loses points in two cells or more)."""
    mistake = next((m for m in ch.MUTANTS if len(m.lost) >= 2), ch.MUTANTS[0])
    return dict(zip(BATCH_STUDENTS, ("reference", mistake)))


def _shared(chapter: str, student: str) -> Path | None:
    folder = os.environ.get("MINIGPT_TEST_WARM_RESULTS")  # this run's (tests/conftest.py: WARM_RESULTS)
    return Path(folder) / f"{chapter}.{student}.json" if folder else None


def share_warm(chapter: str, student: str, result: base.Result) -> None:
    """Leave a warm-kernel result of the batch's class for `tests/test_grading_batch.py`, which compares it with
    minigpt-grade's instead of judging the notebook again (whole, or not at all: written aside, then renamed)."""
    path = _shared(chapter, student)
    if path is not None:
        aside = path.with_suffix(f".{os.getpid()}.tmp")
        aside.write_text(json.dumps(dataclasses.asdict(result)), encoding="utf-8")
        aside.replace(path)


def shared_warm(chapter: str, student: str) -> base.Result | None:
    """The result `share_warm` left in this run, if a chapter's tests have judged that notebook already."""
    path = _shared(chapter, student)
    if path is None or not path.is_file():
        return None
    return base.Result.from_dict(json.loads(path.read_text(encoding="utf-8")))


# ---------------------------------------------------------------- a chapter's tests


def chapter_tests(ch: ModuleType, test_cells: list[str], solution_cells: list[str],
                  not_covered: dict[str, str] | None = None) -> dict[str, Callable]:
    """The `graded` fixture and the tests of chapter module `ch`: the reference, the untouched notebook, every
    mutant and every variant, each graded in the chapter's warm kernel, and the parameters the hidden cases give
    (``coverage``, measured on the reference's run). `test_cells` and `solution_cells` are the grade ids the chapter's
    notebook must have, in order; `not_covered` excuses what the coverage finds ({"train(progress)": why}). The tests
    that grade are marked slow (seconds each, a minute or more a chapter)."""
    chapter = ch.CHAPTER
    mutants = {m.key: m for m in ch.MUTANTS}
    variants = {v.key: v for v in ch.VARIANTS}
    assert not set(mutants) & set(variants) and not {"reference", "untouched"} & (set(mutants) | set(variants)), \
        f"{chapter}: two submissions share a key"
    slow = pytest.mark.slow

    in_batch = {case if isinstance(case, str) else case.key: student for student, case in batch_cases(ch).items()}

    @pytest.fixture(scope="module")
    def graded():
        """graded(case) -> the case's result, graded once in the chapter's warm kernel (and left for
        `tests/test_grading_batch.py` when the batch's class has it: ``share_warm``)."""
        results: dict[str, base.Result] = {}
        with warm_kernel(chapter) as kernel:
            def get(case: str | Mutant | Variant) -> base.Result:
                key = case if isinstance(case, str) else case.key
                if key not in results:
                    # the reference's run also records the arguments the checks give (get.coverage)
                    with (coverage.recording(chapter) if key == "reference" else contextlib.nullcontext()) as recorder:
                        results[key] = judge_submission(kernel, key, submission(ch, case))
                    get.coverage = recorder or get.coverage
                    if key in in_batch:
                        share_warm(chapter, in_batch[key], results[key])
                return results[key]
            get.coverage = None
            yield get

    @pytest.fixture(scope="module")
    def graded_on_another_path():
        """graded_on_another_path(case) -> the case's result, graded in a warm kernel on ``kernel_paths.OTHER``."""
        with warm_kernel(chapter, OTHER) as kernel:
            yield lambda case: judge_submission(kernel, case if isinstance(case, str) else case.key,
                                                submission(ch, case))

    on_path = f"on {describe(*OTHER)} (the judge on this machine's own kernels, {OTHER[1]} threads)"

    @slow
    def test_reference_answer_gets_full_marks(graded):
        expect_reference(graded("reference"))

    @slow
    def test_untouched_notebook_gets_zero_and_says_what_is_not_written(graded):
        expect_untouched(graded("untouched"), test_cells)

    @slow
    def test_every_parameter_is_given_another_value_and_left_out(graded):
        """Over the reference's run, each parameter of what the learner writes is given a value other than its
        default, left out, and given each kind its annotation names (``coverage.findings``)."""
        expect_reference(graded("reference"))
        coverage.check(graded.coverage, not_covered or {})

    def test_the_solution_cells_are_the_ones_these_tests_know():
        assert solution_ids(chapter) == solution_cells

    @slow
    @pytest.mark.parametrize("key", mutants)
    def test_mistake_loses_points_in_the_cells_it_breaks_and_only_there(graded, count_graded, key):
        count_graded(chapter, "mutant", key)
        expect_mutant(graded(mutants[key]), mutants[key])

    @slow
    def test_reference_answer_gets_full_marks_on_another_kernel_path(graded_on_another_path):
        with naming(on_path):
            expect_reference(graded_on_another_path("reference"))

    # A different correct answer is graded once, on the other path: the learner's side on the portable kernels and
    # the judge on this machine's, so that each check compares a result of the variant's own arithmetic, on one
    # kernel path, with the reference's on another, the harder of the two tests (on this machine's path both sides
    # share the kernels and only the variant's arithmetic differs). The reference is graded on both.
    @slow
    @pytest.mark.parametrize("key", variants)
    def test_different_correct_answer_gets_full_marks_on_another_kernel_path(graded_on_another_path, count_graded,
                                                                             key):
        count_graded(chapter, "variant", key)
        with naming(on_path):
            expect_variant(graded_on_another_path(variants[key]), variants[key])

    return {name: obj for name, obj in locals().items() if name.startswith(("graded", "test_"))}
