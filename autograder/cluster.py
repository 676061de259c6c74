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
``DASK_DISTRIBUTED__WORKER__DAEMON=False``). ``worker_state`` says what is missing before anything is graded. A
host's cores are shared among the notebooks its workers run at once (``threads_per_host``), as ``-j`` shares them
here.

A scheduler runs any task a client sends it, and the workers hold the checks and their answers: a scheduler the
learners can reach lets them read or forge grades. It belongs on a network they cannot reach, with TLS and
certificates (``tls://``); ``secure`` tells a plain ``tcp://`` address beyond this machine, which gets a warning.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import uuid

from autograder import sandbox
from autograder.base import UsageError, default_jobs, warn
from autograder.run import _failed, fork_server, judged

CONNECT_TIMEOUT = 30  # seconds to reach the scheduler


def worker_state(sandboxed: bool, dask_worker=None) -> dict:
    """Run on each worker (``Client.run``, which passes it as ``dask_worker``): what it lacks to grade (``missing``,
    empty when nothing), its host, the cores it may use and how many notebooks it runs at once (its threads)."""
    from distributed.comm import get_address_host

    worker = dask_worker
    missing = ""
    if multiprocessing.current_process().daemon:
        missing = ("it is a daemonic process, which may not start the judge processes: start the workers with "
                   "DASK_DISTRIBUTED__WORKER__DAEMON=False in their environment")
    elif sandboxed and (why := sandbox.missing()):
        missing = f"it cannot grade in a sandbox: {why}"
    return {"missing": missing, "host": get_address_host(worker.address), "cores": default_jobs(),
            "nthreads": worker.state.nthreads}


def threads_per_host(states: dict) -> dict[str, int]:
    """{host: torch threads for each notebook there}: a host's cores shared among all the notebooks its workers run
    at once (two workers of one thread on two cores: one thread each, as ``minigpt-grade -j 2`` gives here)."""
    hosts: dict[str, list[dict]] = {}
    for state in states.values():
        hosts.setdefault(state["host"], []).append(state)
    return {host: max(1, min(s["cores"] for s in same) // max(1, sum(s["nthreads"] for s in same)))
            for host, same in hosts.items()}


def judge_on_worker(chapters: list[str], chapter: str, notebook: str, limits: dict, sandboxed: bool,
                    checks: list[str], skip: list[int], threads: dict[str, int]) -> bytes:
    """A Dask task: one notebook run and judged on this worker, as ``run.run_one`` does locally; returns the judge's
    message. The worker's fork server is started by its first task, warm for every chapter of the batch.
    ``threads``: ``threads_per_host`` (a host that joined later: its cores shared among this worker's threads)."""
    from distributed import get_worker
    from distributed.comm import get_address_host

    try:
        fork_server(chapters)
        worker = get_worker()
        share = threads.get(get_address_host(worker.address)) or default_jobs() // max(1, worker.state.nthreads)
    except Exception as err:  # noqa: BLE001 (this worker cannot judge: the row says why)
        return _failed(f"the worker on {os.uname().nodename} could not start its judges ({type(err).__name__}: "
                       f"{str(err)[:200]})")
    return judged(chapter, notebook, limits, sandboxed, max(1, share), checks, skip)


def warm_worker(chapters: list[str]) -> None:
    """Run on each worker as the grader connects (``Client.run``): its fork server starts loading torch, transformers
    and the checks (about 10 s) while the grader still reads the class, as ``grade`` starts its own. What goes wrong
    here is said by the worker's first notebook (``judge_on_worker``)."""
    with contextlib.suppress(Exception):
        fork_server(chapters)


class ClusterPool:
    """The notebooks' runs as tasks of a Dask cluster: ``submit`` one, ``completed`` yields each as it ends, with a
    function that gives its judge's message (or raises ``JudgeFailed``). ``chapters``: those whose checks' answers
    each worker's fork server computes ahead (``grade.shared_answers``)."""

    def __init__(self, scheduler: str, sandboxed: bool, chapters: list[str] = ()):
        try:
            from distributed import Client
        except ImportError:  # pragma: no cover (a dependency of the course)
            raise UsageError("--scheduler needs Dask's distributed package: pip install distributed") from None
        try:
            self.client = Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as err:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {err}") from None
        try:
            states = self.client.run(worker_state, sandboxed)
            if not states:
                raise UsageError(f"the Dask scheduler at {scheduler} has no workers")
            lacking = {address: state["missing"] for address, state in states.items() if state["missing"]}
            if lacking:
                raise UsageError("Dask workers that cannot grade: "
                                 + "; ".join(f"{address}: {why}" for address, why in sorted(lacking.items())))
        except BaseException:
            self.client.close()
            raise
        self.threads = threads_per_host(states)
        self.client.run(warm_worker, list(chapters))  # (it starts the fork server, which loads on its own)
        self.futures = {}
        if not secure(scheduler):
            warn(f"the Dask scheduler at {scheduler} is reached over plain TCP: whoever can reach it can run code on "
                 "its workers, which hold the checks and their answers. Use tls:// with certificates (Dask's "
                 "distributed.comm.tls settings) on a network the learners' servers cannot reach")

    def submit(self, item, chapters: list[str], chapter: str, notebook: str, limits: dict, sandboxed: bool,
               checks: list[str], skip: list[int]) -> None:
        # A key of its own (graders sharing a scheduler, or one grading the same student again, never share a task)
        # that names the notebook for whoever watches the scheduler.
        key = f"judge-{item[0].student}-{chapter}-{uuid.uuid4().hex[:12]}"
        future = self.client.submit(judge_on_worker, chapters, chapter, notebook, limits, sandboxed, list(checks),
                                    list(skip), self.threads, pure=False, key=key)
        self.futures[future] = item

    def completed(self):
        from distributed import as_completed

        for future in as_completed(list(self.futures), loop=self.client.loop):
            yield self.futures.pop(future), _result(future)

    def close(self) -> None:
        for future in self.futures:
            future.cancel()
        self.client.close()


def secure(scheduler: str) -> bool:
    """Whether the scheduler's address is one only this machine (loopback) or a certificate (tls://) lets in."""
    import ipaddress

    from distributed.comm import get_address_host, parse_address

    scheme, _ = parse_address(scheduler)
    if scheme in ("tls", "inproc"):
        return True
    host = get_address_host(scheduler)
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _result(future):
    from distributed import KilledWorker

    from autograder.run import JudgeFailed, _outcome

    def outcome():
        try:
            data = future.result()
        except KilledWorker:
            raise JudgeFailed("every worker that ran it died (the cluster gave up on it; graded again on the next "
                              "run)") from None
        except Exception as err:  # noqa: BLE001 (a lost scheduler, ...: this notebook's row)
            raise JudgeFailed(f"the cluster gave no result ({type(err).__name__}: {str(err)[:200]})") from None
        if not isinstance(data, bytes):
            raise JudgeFailed("the worker sent something that is not a judge's message")
        return _outcome(data)
    return outcome
