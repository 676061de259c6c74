"""Grade minigpt notebooks: one notebook, or a whole class in parallel, each in a sandbox, judged outside it.

    minigpt-grade notebooks/01-tokens/01-tokens.ipynb          # one notebook, student "you"
    minigpt-grade --class submissions/                         # submissions/<student>/<NN-topic>.ipynb
                                                               # or submissions/<student>/<NN-topic>/<NN-topic>.ipynb

For each submission, in this process unless said otherwise:

1. **Intake** (``autograder.intake``): a regular file (no links), not too large, under a plain student id; what
   is not a notebook, or is another chapter's, gets a row that says so. nbgrader's own preprocessors put the
   instructor's locked cells and hidden tests back; review notes list code an instructor should read.
2. **Run and judge** (``autograder.run``), in a judge process of the notebook's own, forked from a warm parent:
   the notebook runs in a sandbox (``autograder.sandbox``: no view of the answers, the checks, the workspace or
   other learners; no network; limits on time, memory, processes and output), its hidden cells serve the judge's
   requests with plain data (``sandboxed.hidden``, ``sandboxed.wire``), and the checks (``autograder.judge``,
   ``autograder.checks``) give verdicts that come back here as plain data. No process of the grader's ever runs
   learner code.
3. **Score and record** (``autograder.scoring``): each test cell's score from its verdict alone, written into the
   workspace's gradebook (``autograder.workspace``) by this process alone; the autograded notebook explains it.
4. **Report** (``autograder.reports``): the table, ``grades.csv``, the feedback pages, all made inert.

Whatever goes wrong while one notebook is handled becomes that notebook's row, and so does a step of the grader's own
on it (intake, scoring, its feedback page) that runs past ``STEP_SECONDS``: the batch always finishes. The
workspace is kept between runs: a result is reused while the submission, its chapter and the grader are
unchanged, so running the same batch again grades nothing twice, and a batch that was interrupted goes on where
it stopped. `--fresh` starts over.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib
import json
import contextlib
import shutil
import signal
import threading
import time
import traceback
from pathlib import Path

import nbformat

from autograder import sandbox
from autograder.base import DEFAULT_CELL_TIMEOUT, DEFAULT_COURSE_ROOT, DEFAULT_MEMORY, DEFAULT_TIMEOUT, Limits, \
    NbgraderFailed, Result, Submission, UsageError, default_jobs, parse_size, warn
from autograder.inert import terminal_logging
from autograder.intake import check_chapters, check_student, class_submissions, course_chapters, exchange_receipt, \
    graded_chapters, malformed, notebook_submissions, read_notebook, read_submission, review_notes, sanitize, \
    wrong_chapter
from autograder.reports import FeedbackPages, Progress, format_table, workspace_results, write_reports, \
    withheld_because
from autograder.run import JudgeFailed, fork_server, run_one, skipped_when_graded
from autograder.scoring import assemble, cell_scores, read_result, record
from autograder.workspace import Workspace, atomic_write, autograded_path, feedback_path


# Seconds of the grader's own time that one step on one submission may take (its intake, its scoring and records):
# each is linear in the notebook (tests/test_intake_linear.py: a 20 MB notebook of hostile text takes about 3 s), so a
# step past this is a bug met on that notebook, and it is that notebook's error row, not a batch that never ends.
STEP_SECONDS = 60.0


class StepTimeout(Exception):
    """A step on one submission took longer than ``STEP_SECONDS``."""


@contextlib.contextmanager
def step_limit(step: str, seconds: float | None = None):
    """Raise ``StepTimeout`` in this thread if the block takes longer than ``seconds`` (default ``STEP_SECONDS``) of
    wall time: a SIGALRM timer, in the main thread (where signals are delivered); elsewhere the block runs unlimited
    (the grader calls its steps from its main thread)."""
    seconds = STEP_SECONDS if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0]:
        yield  # not ours to time: another thread, or a timer someone else set
        return

    def expired(signum, frame):
        raise StepTimeout(f"its {step} took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def step_failed(s: Submission, step: str, err: BaseException) -> Result:
    """The row of a submission at one of whose steps (its intake, its scoring, its feedback page...) the grader
    raised: an ``error``, graded again on the next run; the traceback goes to the grader's log (escaped, ``warn``).
    Called in the step's ``except``."""
    warn(f"{s.student} {s.chapter}: the grader failed at its {step}:\n{traceback.format_exc()}")
    if isinstance(err, StepTimeout):
        return Result(s.student, s.chapter, "error",
                      detail=f"the grader stopped its {step} after {STEP_SECONDS:g} s (see the grader's log)")
    return Result(s.student, s.chapter, "error",
                  detail=f"the grader failed at its {step} ({type(err).__name__}; see the grader's log)")


def intake(ws: Workspace, s: Submission, release: nbformat.NotebookNode, released: dict[str, str],
           others: dict[str, set[str]], isolation: str) -> tuple[Result | tuple, str | None]:
    """A submission's intake, in the grader's process: (its row, where intake tells it all, or what to run: the item
    ``runs`` takes; the digest its result is recorded under). ``release``, ``released``: its chapter's released
    notebook and {grade id: source} of it; ``others``: the grade ids of the other chapters."""
    data = read_submission(s.path)
    if isinstance(data, str):
        return Result(s.student, s.chapter, "unreadable", detail=data), None
    found, receipt, receipt_note = exchange_receipt(s)
    # a notebook handed in again through the exchange is a new submission (a new secret): graded again, so that
    # its feedback is released under its own receipt
    digest = hashlib.sha256(data + b"".join(found[name] for name in sorted(found))).hexdigest()
    cached = reuse(ws, s, digest, isolation)
    if cached is not None:
        return cached, digest
    nb = read_notebook(data)
    if isinstance(nb, str):
        return Result(s.student, s.chapter, "unreadable", detail=nb), digest
    why = malformed(nb)  # (before anything reads a cell)
    if why:
        return Result(s.student, s.chapter, "unreadable", detail=why), digest
    why = wrong_chapter(nb, released, others)
    if why:
        return Result(s.student, s.chapter, "wrong-notebook", detail=why), digest
    notes = review_notes(nb, release, s.chapter) + ([receipt_note] if receipt_note else [])
    try:
        prepared = sanitize(nb, ws, s, released)
    except Exception as err:  # noqa: BLE001 (nbgrader refuses what it cannot read)
        return Result(s.student, s.chapter, "unreadable", detail=f"nbgrader cannot grade it: {err}"[:300]), digest
    return (s, digest, (data, receipt), prepared, notes, skipped_when_graded(prepared, release)), digest


def settle(ws: Workspace, s: Submission, prepared: nbformat.NotebookNode, outcome, data, Gradebook) -> Result:
    """One notebook's row once its judge process is done (``outcome()`` gives its ``RunOutcome``): its scores
    recorded (in this process alone, which writes the gradebook), or an ``error`` row that says what went wrong.
    Whatever goes wrong here (the judge process, its result, the writing of this notebook's files) costs this
    notebook alone, and is graded again on the next run (``step_failed``)."""
    seconds = None
    try:
        run = outcome()
        seconds = round(run.seconds, 1)
        if not run.started:
            r = Result(s.student, s.chapter, "error", detail="the notebook's kernel did not start, twice "
                       "(the machine's doing, not the notebook's: run the batch again)")
            r.log = str(ws.keep_log(s.student, s.chapter, run.log))
        else:
            with step_limit("scoring"):  # the run is over: what is left is this process's own work on it
                nb = assemble(prepared, run)
                record(ws, s, nb, cell_scores(prepared, run.verdicts), *data)
                with Gradebook(ws.db_url) as gb:
                    r = read_result(gb, ws.root, s.student, s.chapter)
                r.detail = run.incident
                if run.incident:
                    r.log = str(ws.keep_log(s.student, s.chapter, run.log))
    except JudgeFailed as err:
        r = Result(s.student, s.chapter, "error", detail=f"its judge stopped: {err}")
    except Exception as err:  # noqa: BLE001 (a bug of ours, or a result we cannot write: this notebook's row)
        r = step_failed(s, "scoring", err)
    r.seconds = seconds
    return r


def grade(submissions: list[Submission], course_root: Path, workdir: Path, *, jobs: int | None = None,
          limits: Limits = Limits(), fresh: bool = False, progress: bool = False, verbose: bool = False,
          sandboxed: bool = True, checks: list[str] = (), open_chapters: list[str] = (),
          scheduler: str | None = None) -> list[Result]:
    """Grade every submission (reusing results recorded for the same notebook, chapter and grader), and return
    a result per submission, in order. ``sandboxed=False`` runs the notebooks without a sandbox (the learner's
    code then runs with the grader's rights: every row says so). ``checks``: modules of checks of the course's own,
    imported by each notebook's judge. ``open_chapters``: chapters still open (see ``withheld_because``).
    ``scheduler``: a Dask scheduler's address, whose workers run and judge the notebooks (``autograder.cluster``);
    by default they run here, ``jobs`` at once. Meanwhile this process's log records and warnings, which may quote a
    learner's text, reach the terminal escaped (``inert.terminal_logging``)."""
    if scheduler is None and sandboxed and (why := sandbox.missing()):
        raise UsageError(f"cannot grade in a sandbox: {why}. Install it, or grade without isolation with "
                         "--no-sandbox (only for notebooks you trust)")
    cluster = None
    if scheduler is not None:  # before anything else: a cluster that cannot grade is a usage error
        from autograder.cluster import ClusterPool

        # (its workers' fork servers start loading while the class is read, as the local one does in ``_grade``)
        cluster = ClusterPool(scheduler, sandboxed,
                              shared_answers([s.chapter for s in submissions if s.path is not None]))
    try:
        with terminal_logging():
            return _grade(submissions, course_root, workdir, jobs, limits, fresh, progress, verbose, sandboxed,
                          checks, open_chapters, cluster)
    finally:
        if cluster is not None:
            cluster.close()


def _grade(submissions, course_root, workdir, jobs, limits, fresh, progress, verbose, sandboxed, checks,
           open_chapters, cluster) -> list[Result]:
    for s in submissions:
        check_student(s.student)
        if s.path is not None and s.path.is_relative_to(workdir):
            raise UsageError(f"{s.path} is inside the workspace {workdir}, where grading keeps its own files")
    chapters = sorted({s.chapter for s in submissions})
    if cluster is None and any(s.path is not None for s in submissions):
        # The fork server loads torch and the batch's checks (seconds) while nbgrader's steps and the intake
        # run: it returns at once, and the first judge waits for it (one learner's course: 42-43 s -> 38-39 s)
        fork_server(shared_answers([s.chapter for s in submissions if s.path is not None]), load=chapters)
    ws = Workspace(workdir, course_root)
    try:
        return _grade_in(ws, submissions, course_root, chapters, jobs, limits, fresh, progress, verbose, sandboxed,
                         checks, open_chapters, cluster)
    except BaseException:
        ws.close(abort=True)
        raise
    finally:
        ws.close()


def _grade_in(ws, submissions, course_root, chapters, jobs, limits, fresh, progress, verbose, sandboxed, checks,
              open_chapters, cluster) -> list[Result]:
    from nbgrader.api import Gradebook  # slow import: only once the command line is known to be good

    ws.open(chapters, fresh, verbose)
    release = {ch: ws.released(ch) for ch in chapters}  # each chapter's released notebook, read once
    released = {ch: ws.released_grade_ids(ch) for ch in chapters}
    all_ids = {ch: set(ids) for ch, ids in released.items()}
    for ch in course_chapters(course_root):
        if ch not in all_ids:
            nb = read_notebook(course_root / "solutions" / ch / f"{ch}.ipynb")
            if not isinstance(nb, str):
                all_ids[ch] = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}
    with Gradebook(ws.db_url) as gb:
        max_of = {ch: gb.find_assignment(ch).max_score for ch in chapters}

    results: dict[tuple[str, str], Result] = {}
    # (submission, digest, (its bytes, its receipt), the sanitized notebook, review notes, cells not run)
    todo: list[tuple[Submission, str, tuple[bytes, dict[str, bytes]], nbformat.NotebookNode, list[str], list[int]]] = []
    bar = Progress(len(submissions), progress)
    isolation = "sandbox" if sandboxed else "none"

    def finish(s: Submission, r: Result, digest: str | None) -> None:
        r.submission = str(s.path) if s.path else None
        if r.max_score is None:
            r.max_score = max_of[s.chapter]
        results[s.student, s.chapter] = r
        if digest is not None and not r.reused:
            payload = {"submission_sha256": digest, "source": ws.sources[s.chapter], "result": dataclasses.asdict(r)}
            atomic_write(ws.result_file(s.student, s.chapter), json.dumps(payload, indent=2) + "\n")
        bar.update(r)

    for s in submissions:
        if s.path is None:
            finish(s, Result(s.student, s.chapter, "missing", detail="no notebook handed in"), None)
            continue
        try:  # the fence of this submission's intake: whatever it raises, or a step past its time, is its row
            with step_limit("intake"):
                admitted, digest = intake(ws, s, release[s.chapter], released[s.chapter],
                                          {ch: ids for ch, ids in all_ids.items() if ch != s.chapter}, isolation)
        except Exception as err:  # noqa: BLE001
            admitted, digest = step_failed(s, "intake", err), None
        if isinstance(admitted, Result):
            finish(s, admitted, digest)
        else:
            todo.append(admitted)

    pages = FeedbackPages(ws)

    def page(s: Submission, r: Result, new: bool) -> None:
        """Its feedback page: asked for as soon as a graded notebook's scores are recorded (made while the others
        still run), withheld while an earlier chapter is open. A page that cannot be made costs that page alone."""
        try:
            r.withheld = withheld_because(r.chapter, open_chapters) if r.status == "graded" else ""
            if r.withheld:
                shutil.rmtree(feedback_path(ws.root, s.student, s.chapter).parent, ignore_errors=True)
            elif r.status == "graded" and (new or not feedback_path(ws.root, s.student, s.chapter).is_file()):
                with step_limit("feedback page"):
                    pages.ask(s)
        except Exception:  # noqa: BLE001
            warn(f"{s.student} {s.chapter}: the grader failed at its feedback page (its scores are unaffected):\n"
                 f"{traceback.format_exc()}")

    try:
        for (s, digest, data, prepared, notes, _), outcome in runs(todo, limits, sandboxed, checks, jobs, cluster):
            r = settle(ws, s, prepared, outcome, data, Gradebook)
            r.review, r.isolation = notes, isolation
            finish(s, r, digest)
            page(s, r, new=True)
    finally:
        bar.close()
    ordered = [results[s.student, s.chapter] for s in submissions]
    for s, r in zip(submissions, ordered):
        if r.reused or r.status != "graded":  # the others' pages were asked for as they were graded
            page(s, r, new=False)
    pages.wait()
    for r in ordered:
        fb = feedback_path(ws.root, r.student, r.chapter)
        r.feedback = str(fb) if r.status == "graded" and fb.is_file() else None
    write_reports(ws, workspace_results(ws, ordered))
    return ordered


def runs(todo: list, limits: Limits, sandboxed: bool, checks: list[str], jobs: int | None, cluster):
    """Run and judge each notebook of ``todo`` (items of ``intake``), here or on a Dask cluster
    (``cluster``: an ``autograder.cluster.ClusterPool``); yield each item as its run ends, with a function that gives
    its ``RunOutcome`` (or raises: ``JudgeFailed``, or what stopped the notebook from being sent)."""
    if not todo:
        return
    chapters = shared_answers([s.chapter for s, *_ in todo])
    # Later chapters first: they take longer (a course's chapter 9 takes three times chapter 1), and a batch whose
    # longest notebook starts last ends with one core idle while it runs
    todo = sorted(todo, key=lambda item: item[0].chapter, reverse=True)
    if cluster is not None:
        unsent = []
        for item in todo:
            s, prepared, skip = item[0], item[3], item[5]
            try:
                cluster.submit(item, chapters, s.chapter, nbformat.writes(prepared), dataclasses.asdict(limits),
                               sandboxed, checks, skip)
            except Exception as err:  # noqa: BLE001 (this notebook's row: settle says what it was)
                warn(f"{s.student} {s.chapter}: the grader failed to send it:\n{traceback.format_exc()}")
                failed = JudgeFailed(f"it could not be sent to the cluster ({type(err).__name__}; "
                                     "see the grader's log)")
                unsent.append((item, functools.partial(_raise, failed)))
        yield from unsent
        yield from cluster.completed()
        return
    jobs = jobs or default_jobs()
    fork_server(chapters)
    threads = max(1, default_jobs() // min(jobs, len(todo)))  # each notebook's share of the cores
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, item[0].chapter, item[3], limits, sandboxed, threads, checks, item[5]): item
                   for item in todo}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result


def _raise(err: BaseException):
    raise err


def shared_answers(chapters: list[str]) -> list[str]:
    """The chapters, among those of the notebooks about to be judged (one entry per notebook), whose checks' answers
    the fork server computes ahead for all their judges (``run.fork_server``): those with two notebooks or more. A
    chapter's only notebook gains nothing from them (its judge computes what it needs, as it needs it, beside the
    other notebooks' runs), while the fork server's answers hold back every judge of the batch until they are
    computed (a course's chapters 9 and 10: 5 s)."""
    counts = collections.Counter(chapters)
    return sorted(ch for ch, n in counts.items() if n >= 2)


def reuse(ws: Workspace, s: Submission, digest: str, isolation: str) -> Result | None:
    """The recorded result of this very notebook for this very chapter and grader, if there is one."""
    try:
        saved = json.loads(ws.result_file(s.student, s.chapter).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("submission_sha256") != digest or saved.get("source") != ws.sources[s.chapter]:
        return None
    r = Result.from_dict(saved["result"])
    if r.status == "error" or r.isolation != isolation:  # run it again: what stopped it may have been the machine
        return None
    if r.status == "graded" and not autograded_path(ws.root, s.student, s.chapter).is_file():
        return None
    r.reused, r.seconds = True, None
    return r


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="minigpt-grade",
        description="Grade minigpt notebooks with the hidden tests: each notebook runs in a sandbox, and is judged "
                    "outside it.",
    )
    parser.add_argument("notebooks", nargs="*", help="notebooks of one student, each named <NN-topic>.ipynb")
    parser.add_argument("--class", dest="class_dir", metavar="DIR",
                        help="grade DIR/<student>/<NN-topic>.ipynb or DIR/<student>/<NN-topic>/<NN-topic>.ipynb")
    parser.add_argument("--chapter", action="append", default=[], metavar="NN-topic",
                        help="with --class: only these chapters (repeatable); with one notebook: its chapter")
    parser.add_argument("--student", default="you", help="student id for loose notebooks (default: you)")
    parser.add_argument("--course-root", type=Path, default=DEFAULT_COURSE_ROOT,
                        help="course folder holding solutions/ (default: the one this tool belongs to)")
    parser.add_argument("--workdir", type=Path, help="grading workspace (default: COURSE_ROOT/.grading)")
    parser.add_argument("-j", "--jobs", type=int, default=default_jobs(),
                        help="notebooks graded at once here (default: the cores this process may use; with "
                             "--scheduler, each worker runs as many as it has threads)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds one notebook may take, start to end (default: {DEFAULT_TIMEOUT})")
    parser.add_argument("--cell-timeout", type=int, default=DEFAULT_CELL_TIMEOUT,
                        help=f"seconds one cell may take (default: {DEFAULT_CELL_TIMEOUT})")
    parser.add_argument("--memory", default=DEFAULT_MEMORY,
                        help=f"memory of one notebook's processes together, e.g. 4G (default: {DEFAULT_MEMORY})")
    parser.add_argument("--checks", action="append", default=[], metavar="MODULE",
                        help="also load the checks registered in this Python module (a course folder of your own "
                             "given with --course-root)")
    parser.add_argument("--open", dest="open_chapters", action="append", default=[], metavar="NN-topic",
                        help="a chapter whose deadline has not passed (repeatable): the feedback of later chapters, "
                             "whose sandboxes hold its reference, is withheld until you grade again without it")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="run and judge the notebooks on the workers of this Dask scheduler (tcp://HOST:PORT) "
                             "instead of here; this process alone still writes the gradebook, results and pages")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run notebooks without the sandbox (the learner's code runs with your rights: only "
                             "for notebooks you trust; every row says NOT ISOLATED)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results and grade everything again")
    parser.add_argument("--csv", type=Path, metavar="PATH", help="also copy the grade table (grades.csv) to PATH")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or progress lines")
    parser.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
    args = parser.parse_args(argv)
    if bool(args.notebooks) == bool(args.class_dir):
        parser.error("give either notebooks or --class DIR")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.cell_timeout <= 0:
        parser.error(f"--cell-timeout must be a positive number of seconds, got {args.cell_timeout}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    course_root = args.course_root.resolve()
    workdir = (args.workdir or course_root / ".grading").resolve()
    start = time.monotonic()
    try:
        limits = Limits(timeout=args.timeout, memory=parse_size(args.memory), cell_timeout=args.cell_timeout)
        known = graded_chapters(course_root)
        check_chapters(args.open_chapters, course_chapters(course_root))
        if args.class_dir:
            submissions = class_submissions(Path(args.class_dir).resolve(), args.chapter, known)
        else:
            chapter = args.chapter[0] if args.chapter else None
            if len(args.chapter) > 1:
                raise UsageError("give one --chapter with loose notebooks")
            submissions = notebook_submissions(args.notebooks, args.student, chapter, known)
        for module in args.checks:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise UsageError(f"--checks {module}: {err}") from None
        if args.no_sandbox:
            warn("--no-sandbox: the notebooks' code runs with your rights, not isolated; grade only notebooks you trust")
        results = grade(submissions, course_root, workdir, jobs=args.jobs, limits=limits, fresh=args.fresh,
                        progress=not args.quiet, verbose=args.verbose, sandboxed=not args.no_sandbox,
                        checks=args.checks, open_chapters=args.open_chapters, scheduler=args.scheduler)
    except UsageError as e:
        warn(str(e))
        return 2
    except NbgraderFailed as e:
        warn(f"{e}\n(full log: {workdir / 'logs' / 'nbgrader.log'})")
        return 1

    print(format_table(results))
    ran = [r for r in results if r.seconds is not None]
    reused = sum(r.reused for r in results)
    elapsed = time.monotonic() - start
    print(f"\n{len(ran)} notebooks graded in {elapsed:.0f} s"
          + (f" ({60 * len(ran) / elapsed:.1f} per minute, "
             + (f"on the workers of {args.scheduler})" if args.scheduler else f"{args.jobs} at once)") if ran else "")
          + (f"; {reused} unchanged since an earlier run, not graded again" if reused else ""))
    print(f"grade table: {workdir / 'grades.csv'}; feedback: {workdir / 'feedback'}/<student>/index.html")
    if args.csv:
        shutil.copyfile(workdir / "grades.csv", args.csv)
    if args.json:
        payload = {
            "course_root": str(course_root),
            "workdir": str(workdir),
            "results": [dataclasses.asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
