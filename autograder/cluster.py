"""Grading on a Dask cluster: ``minigpt-grade --class DIR --scheduler tcp://HOST:PORT``.

The grader stays one process that alone reads the class, writes the gradebook, the results and the feedback; only
the runs move. Each notebook's run (``run.judged``: a judge process forked from a warm fork server, the notebook's
sandbox, its hidden cells judged) happens on a Dask worker, which sends back the judge's one message: plain JSON,
read and checked here (``run._outcome``) exactly as a local run's is. So a run on the cluster and a run here give
the same verdicts by construction: the same code makes them, only the pipe differs.

    grader (minigpt-grade)                    Dask scheduler            workers (each: a fork server, judges)
    intake, gradebook, pages  --notebook-->   queues, reschedules  -->  judge process -> sandbox -> verdicts
                              <--JSON bytes--                      <--  (the judge's message, as bytes)

A worker that dies mid-batch loses nothing: the scheduler gives its notebooks to another worker (Dask's
``distributed.scheduler.allowed-failures`` times, 3 by default), and a notebook whose runs kill worker after worker
becomes that notebook's ``error`` row, graded again on the next run, like any run that gave no result.

A worker needs what a local run needs: the course installed (the same environment: ``make env``), bubblewrap, and
the right to start processes (Dask starts workers as daemonic processes, which may not: start them with
``DASK_DISTRIBUTED__WORKER__DAEMON=False``). ``check_workers`` says what is missing before anything is graded.
"""
from __future__ import annotations

import multiprocessing
import os
import uuid

from autograder import sandbox
from autograder.base import UsageError, default_jobs
from autograder.run import _failed, fork_server, judged

CONNECT_TIMEOUT = 30  # seconds to reach the scheduler


def worker_missing(sandboxed: bool) -> str:
    """Run on each worker: what it lacks to grade (empty when nothing)."""
    if multiprocessing.current_process().daemon:
        return ("it is a daemonic process, which may not start the judge processes: start the workers with "
                "DASK_DISTRIBUTED__WORKER__DAEMON=False in their environment")
    if sandboxed and (why := sandbox.missing()):
        return f"it cannot grade in a sandbox: {why}"
    return ""


def judge_on_worker(chapters: list[str], chapter: str, notebook: str, limits: dict, sandboxed: bool,
                    checks: list[str], skip: list[int]) -> bytes:
    """A Dask task: one notebook run and judged on this worker, as ``run.run_one`` does locally; returns the judge's
    message. The worker's fork server is started by its first task, warm for every chapter of the batch."""
    from distributed import get_worker

    try:
        fork_server(chapters)
        threads = max(1, default_jobs() // max(1, get_worker().state.nthreads))  # the notebook's share of the cores
    except Exception as err:  # noqa: BLE001 (this worker cannot judge: the row says why)
        return _failed(f"the worker on {os.uname().nodename} could not start its judges ({type(err).__name__}: "
                       f"{str(err)[:200]})")
    return judged(chapter, notebook, limits, sandboxed, threads, checks, skip)


class ClusterPool:
    """The notebooks' runs as tasks of a Dask cluster: ``submit`` one, ``completed`` yields each as it ends, with a
    function that gives its judge's message (or raises ``JudgeFailed``)."""

    def __init__(self, scheduler: str, sandboxed: bool):
        try:
            from distributed import Client
        except ImportError:  # pragma: no cover (a dependency of the course)
            raise UsageError("--scheduler needs Dask's distributed package: pip install distributed") from None
        try:
            self.client = Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as err:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {err}") from None
        try:
            workers = self.client.run(worker_missing, sandboxed)
            if not workers:
                raise UsageError(f"the Dask scheduler at {scheduler} has no workers")
            lacking = {address: why for address, why in workers.items() if why}
            if lacking:
                raise UsageError("Dask workers that cannot grade: "
                                 + "; ".join(f"{address}: {why}" for address, why in sorted(lacking.items())))
        except BaseException:
            self.client.close()
            raise
        self.futures = {}

    def submit(self, item, chapters: list[str], chapter: str, notebook: str, limits: dict, sandboxed: bool,
               checks: list[str], skip: list[int]) -> None:
        # A key of its own (graders sharing a scheduler, or one grading the same student again, never share a task)
        # that names the notebook for whoever watches the scheduler.
        key = f"judge-{item[0].student}-{chapter}-{uuid.uuid4().hex[:12]}"
        future = self.client.submit(judge_on_worker, chapters, chapter, notebook, limits, sandboxed, list(checks),
                                    list(skip), pure=False, key=key)
        self.futures[future] = item

    def completed(self):
        from distributed import as_completed

        for future in as_completed(list(self.futures), loop=self.client.loop):
            yield self.futures.pop(future), _result(future)

    def close(self) -> None:
        for future in self.futures:
            future.cancel()
        self.client.close()


def _result(future):
    from autograder.run import JudgeFailed, _outcome

    def outcome():
        try:
            data = future.result()
        except Exception as err:  # noqa: BLE001 (KilledWorker, a lost scheduler, ...: this notebook's row)
            name = type(err).__name__
            if name == "KilledWorker":
                raise JudgeFailed("every worker that ran it died (the cluster gave up on it; graded again on the "
                                  "next run)") from None
            raise JudgeFailed(f"the cluster gave no result ({name}: {str(err)[:200]})") from None
        if not isinstance(data, bytes):
            raise JudgeFailed("the worker sent something that is not a judge's message")
        return _outcome(data)
    return outcome
