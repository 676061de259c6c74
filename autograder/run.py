"""One notebook's run: its sandbox and its judge, in a process of their own.

``minigpt-grade`` never judges a notebook in its own process. For each notebook it forks a judge process from a
warm parent (a multiprocessing fork server that imported torch, transformers and every chapter's checks once,
``autograder.warm``); that process starts the notebook's sandbox, serves its hidden cells on a Unix socket
(``autograder.judge.RunJudge``), reads what the executor reports, and sends back one JSON message of plain data:
the verdicts, the outputs worth showing (text and pictures, cut to size) and what stopped the run. So whatever a
submission makes the judge do (a reply that is slow to decode, a check that runs out of memory, a crash), it
happens in that notebook's process, under its own time and memory caps, and becomes that notebook's ``error``
row: no other notebook's judging waits on it or shares its memory.

    grader (one process)            judge process (one per notebook)          sandbox (bubblewrap)
    intake, gradebook, reports  <-- verdicts, outputs (JSON) --  RunJudge, checks  <-- plain data --  learner cells
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import hashlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import nbformat

from autograder import sandbox
from autograder.inert import terminal_logging
from autograder.sandboxed.wire import valid_text

# A block of hidden tests: from a line that starts `### BEGIN HIDDEN TESTS` to the next that starts `### END HIDDEN
# TESTS`, both included (``hidden_blocks``)
HIDDEN_BEGIN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS", re.M)
HIDDEN_END = re.compile(r"^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.M)
# What a notebook may show in the autograded copy and the feedback: text and pictures, never HTML or scripts
# (they would run in the instructor's formgrader and the learner's feedback page).
SHOWN_MIMETYPES = ("text/plain", "image/png", "image/jpeg")
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
OUTPUT_MAX_CHARS = 100_000  # per output of the autograded notebook kept in the workspace
OUTPUTS_PER_CELL = 200
OUTPUTS_MAX_TOTAL = 8_000_000  # characters of all the outputs of one notebook that are kept
JUDGE_MEMORY = 4 << 30  # bytes a judge process may add to the fork server's address space
REPLY_MAX = 64 << 20  # bytes of a judge process's one message back
GRACE = 60  # seconds a judge process gets past its notebook's time limit (to start, to report)


@dataclasses.dataclass
class RunOutcome:
    verdicts: dict  # {grade_id: judge.Verdict}
    outputs: dict  # {cell index: (outputs, execution count)}: what the run showed, checked and cut
    seconds: float
    incident: str = ""  # what stopped the notebook before its end, in a learner's terms
    log: str = ""
    started: bool = True  # False: the kernel never answered (the machine's doing: run it again)


class JudgeFailed(Exception):
    """A notebook's judge process ended without a result (killed at its limits, crashed, sent garbage)."""


def hidden_blocks(source: str) -> list[tuple[int, int]]:
    """The (start, end) of each block of hidden tests in a cell's source, in one pass: each BEGIN line is paired with
    the first END line after it. (One regular expression, BEGIN, then anything up to an END, tried at every BEGIN
    line of a cell that has no END, reads the rest of the cell each time: a cell of many such lines cost the grader
    the square of its length.)"""
    spans, pos = [], 0
    while (begin := HIDDEN_BEGIN.search(source, pos)) is not None:
        end = HIDDEN_END.search(source, begin.end())
        if end is None:  # no END after this BEGIN: none after any later one either
            break
        spans.append((begin.start(), end.end()))
        pos = end.end()
    return spans


def cut_hidden_tests(source: str, note: str) -> str:
    """``source`` with each block of hidden tests replaced by ``note``."""
    kept, pos = [], 0
    for start, end in hidden_blocks(source):
        kept += [source[pos:start], note]
        pos = end
    return "".join(kept) + source[pos:]


def judged_cells(nb: nbformat.NotebookNode) -> list[str]:
    """The test cells whose hidden tests call the judge."""
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade") and hidden_blocks(c.source)]


def skipped_when_graded(nb: nbformat.NotebookNode, release: nbformat.NotebookNode) -> list[int]:
    """The cells of ``nb`` a graded run does not run: the chapter's closing demos, that is, code cells after the last
    judged test cell with no nbgrader metadata whose code is, to the character, a cell of the same kind in the
    chapter's released notebook ``release``. No verdict can depend on them (every judged cell has run before them)
    and they cost seconds (a model loaded, text generated, a plot drawn). A cell the learner wrote or changed runs."""
    def demo(cell) -> bool:
        return cell.cell_type == "code" and not cell.metadata.get("nbgrader") and bool(cell.source.strip())

    judged = set(judged_cells(nb))
    last = max((i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") in judged),
               default=len(nb.cells))
    given = {c.source for c in release.cells if demo(c)}
    return [i for i, c in enumerate(nb.cells) if i > last and demo(c) and c.source in given]


def solution_cell_names(nb: nbformat.NotebookNode) -> dict[str, str]:
    """{sha1 of a cell's source: its grade id}, to name the cell of a line where the learner's code failed."""
    names = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade_id"):
            digest = hashlib.sha1(cell.source.rstrip("\n").encode("utf-8", "surrogatepass")).hexdigest()
            names[digest] = meta["grade_id"]
    return names


def blocked_modules(chapter: str) -> list[str]:
    """The reference modules a notebook of ``chapter`` may not import: its own chapter's and later ones'. A
    chapter without a module of its own (the capstone) may import every chapter before it."""
    from minigpt import CHAPTERS

    return sorted(f"minigpt.{module}" for folder, module in CHAPTERS.items() if folder[:2] >= chapter[:2])


# ---------------------------------------------------------------------------------------------------
# The grader's side: fork a judge process per notebook, take back plain data


_context = None
_starting = threading.Lock()  # (a cluster worker's threads, and its warm-up, may ask for it at once)
WARM_ENV = "MINIGPT_WARM_CHAPTERS"  # the chapters whose checks' answers the fork server computes ahead (warm.py)
LOAD_ENV = "MINIGPT_LOAD_CHAPTERS"  # the chapters whose checks it loads (warm.py): unset, every chapter's


def fork_server(chapters=(), load=None):
    """The fork server's context, started once per grader process (the first batch starts it; later batches in the
    same process reuse it), with the answers that the checks of ``chapters`` compare every notebook with already
    computed, so that no judge process computes them (``warm.py``). ``load``: the chapters whose checks it loads
    (the batch's: chapter 1's never need Hugging Face's transformers, 4 s of imports); None, every chapter's (a
    cluster's worker grades one batch after another). A judge loads what its fork server lacks (``load_checks``)."""
    global _context
    with _starting:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["autograder.warm"])
            # the fork server's own environment; the judges get the grader's
            added = {WARM_ENV: ",".join(chapters), **({} if load is None else {LOAD_ENV: ",".join(load)})}
            os.environ.update(added)
            try:
                multiprocessing.forkserver.ensure_running()
            finally:
                for name in added:
                    del os.environ[name]
            _context = context
    return _context


def _checks_modules(chapters) -> list:
    """The modules of the checks of ``chapters`` (those of the course), imported."""
    from autograder import judge
    from minigpt import CHAPTERS

    found = []
    for chapter in chapters:
        if chapter in CHAPTERS:
            judge.checks(chapter)
            found.append(sys.modules[f"autograder.checks.{CHAPTERS[chapter]}"])
    return found


def load_checks(chapters) -> None:
    """Import the checks of ``chapters``, and Hugging Face's models if any of their modules mention transformers: at
    once, here, since its lazy imports race in a judge's threads (loaded already in a fork server that needed it)."""
    modules = _checks_modules(chapters)
    loaded = "transformers.models.gpt2.modeling_gpt2" in sys.modules
    if not loaded and any("transformers" in Path(module.__file__).read_text() for module in modules):
        import transformers

        transformers.GPT2LMHeadModel  # noqa: B018 (it loads its parts lazily: load the ones the checks use)


def warm_ups(chapters) -> list:
    """The ``warm_up`` of each of ``chapters`` whose checks have one, for the fork server (``warm.py``): the chapter's
    own module's, not that of every module ``judge.checks`` lists (the cells of every chapter loaded so far, whose
    warm-ups, 23 s for chapters 9 and 10, a batch of other chapters never uses)."""
    return [module.warm_up for module in _checks_modules(chapters) if hasattr(module, "warm_up")]


def run_one(chapter: str, nb: nbformat.NotebookNode, limits, sandboxed: bool, threads: int = 1,
            checks: list[str] = (), skip: list[int] = ()) -> RunOutcome:
    """Run and judge a sanitized notebook in a judge process of its own; ``JudgeFailed`` if that process gives no
    result within twice (a run that never started is run once more) the notebook's time limit and a grace.
    ``checks``: modules of a course's own checks, imported by the judge process. ``skip``: the cells not to run
    (``skipped_when_graded``)."""
    return _outcome(judged(chapter, nbformat.writes(nb), dataclasses.asdict(limits), sandboxed, threads, checks, skip))


def judged(chapter: str, notebook: str, limits: dict, sandboxed: bool, threads: int, checks=(), skip=()) -> bytes:
    """The judge process's one message (JSON) about ``notebook`` (nbformat's text): what ``run_one`` reads, here or,
    on a cluster, what a worker sends back (``autograder.cluster``). A judge process that gives none says so in a
    message of the same shape (``{"failed": why}``)."""
    ctx = fork_server()
    receiver, sender = ctx.Pipe(duplex=False)
    # The fork server started with this process's path and environment of that moment: the judge gets today's.
    grader = {"path": list(sys.path), "environ": dict(os.environ), "checks": list(checks), "skip": list(skip)}
    proc = ctx.Process(target=_judge_process, name=f"judge {chapter}", daemon=True,
                       args=(sender, chapter, notebook, limits, sandboxed, threads, grader))
    proc.start()
    sender.close()
    wait = 2 * (limits["timeout"] + GRACE)
    try:
        if not receiver.poll(wait):
            return _failed(f"no result within {wait:g} s")
        try:
            return receiver.recv_bytes(REPLY_MAX)
        except EOFError:
            return _failed(_death(proc))
        except OSError as err:
            return _failed(f"a result that could not be read ({err})")
    finally:
        receiver.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _failed(why: str) -> bytes:
    return json.dumps({"failed": why}).encode("ascii")


def _death(proc) -> str:
    proc.join(5)
    code = proc.exitcode
    if code is not None and code < 0:
        return f"the judge process was killed (signal {-code})"
    return f"the judge process ended without a result (exit {code})"


def _outcome(data: bytes) -> RunOutcome:
    """The judge process's message, checked: plain data of the expected shape, or ``JudgeFailed``."""
    from autograder.judge import Verdict

    try:
        d = json.loads(data)
        if "failed" in d:
            raise JudgeFailed(str(d["failed"])[:500])
        verdicts = {gid: Verdict.from_dict(v) for gid, v in d["verdicts"].items()}
        outputs = {int(i): ([nbformat.from_dict(o) for o in outs], count)
                   for i, (outs, count) in d["outputs"].items()}
        return RunOutcome(verdicts, outputs, float(d["seconds"]), str(d["incident"]), str(d["log"]),
                          bool(d["started"]))
    except JudgeFailed:
        raise
    except Exception as err:  # noqa: BLE001 (whatever is wrong with it, it is this notebook's trouble alone)
        raise JudgeFailed(f"a result that is not one ({type(err).__name__})") from None


# ---------------------------------------------------------------------------------------------------
# The judge process


def _judge_process(sender, chapter: str, notebook: str, limits: dict, sandboxed: bool, threads: int,
                   grader: dict) -> None:
    """Forked from the fork server: cap this process, run and judge the notebook, send the plain result. Its log
    (the judge's ``log.exception`` can quote what the learner's side sent) reaches the grader's terminal escaped."""
    import importlib

    from autograder.base import Limits

    with terminal_logging():
        try:
            # Die with the fork server, which ends when the process it serves ends: a grader or a cluster worker killed
            # mid-batch leaves no judge (and so, ``--die-with-parent``, no sandbox) running on.
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() == 1:
                raise JudgeFailed("the process that forked it had already ended")
            sys.path[:] = grader["path"]
            os.environ.clear()
            os.environ.update(grader["environ"])
            for module in grader["checks"]:
                importlib.import_module(module)
            load_checks([chapter])  # what its fork server did not load (a later batch's chapter), before any thread
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = _address_space() + JUDGE_MEMORY
            if hard == resource.RLIM_INFINITY or cap < hard:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))  # the sandbox sets its own, lower, below it
            import torch

            torch.set_num_threads(1)  # checks are small; notebooks judged at once share the cores
            nb = nbformat.reads(notebook, as_version=4)
            outcome = _run_twice(chapter, nb, Limits(**limits), sandboxed, threads, grader.get("skip", []))
            payload = json.dumps({
                "verdicts": {gid: v.to_dict() for gid, v in outcome.verdicts.items()},
                "outputs": {str(i): (outs, count) for i, (outs, count) in outcome.outputs.items()},
                "seconds": outcome.seconds, "incident": outcome.incident, "log": outcome.log,
                "started": outcome.started,
            }, ensure_ascii=True)
        except BaseException as err:  # noqa: BLE001 (anything at all: say it, so the row says what happened)
            payload = json.dumps({"failed": f"{type(err).__name__}: {valid_text(str(err))[:300]}"})
    with contextlib.suppress(OSError):
        sender.send_bytes(payload.encode("ascii"))
    sender.close()


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _run_twice(chapter: str, nb: nbformat.NotebookNode, limits, sandboxed: bool, threads: int,
               skip: list[int] = ()) -> RunOutcome:
    """Run a notebook; a run whose kernel never started (no cell ran) is run once more."""
    outcome = _run_once(chapter, nb, limits, sandboxed, threads, skip)
    if not outcome.started:
        first = outcome.seconds
        outcome = _run_once(chapter, nb, limits, sandboxed, threads, skip)
        outcome.seconds += first
    return outcome


def _run_once(chapter: str, nb: nbformat.NotebookNode, limits, sandboxed: bool, threads: int,
              skip: list[int] = ()) -> RunOutcome:
    from autograder.judge import RunJudge

    run_dir = Path(tempfile.mkdtemp(prefix="minigpt-run-"))  # short: a socket's path has at most 107 bytes
    try:
        name = f"{chapter}.ipynb"
        (run_dir / "in").mkdir()
        (run_dir / "sock").mkdir()
        sent = copy.deepcopy(nb)
        for i in skip:
            sent.cells[i].source = ""  # nbgrader's executor sends no empty cell to the kernel
        nbformat.write(sent, run_dir / "in" / name)
        blocked = blocked_modules(chapter)
        sandbox.prepare(run_dir, chapter, blocked)
        # CPU: the notebook's threads, and half a core for the executor and the kernel's own threads (sandbox.Cgroup)
        box = sandbox.Limits(memory=limits.memory, processes=limits.processes, timeout=limits.timeout,
                             cpus=threads + 0.5)
        with RunJudge(run_dir / "sock" / "judge", judged_cells(nb), solution_cell_names(nb),
                      cell_timeout=limits.cell_timeout + 15) as judge:
            if sandboxed:
                args = sandbox.command(chapter=chapter, blocked=blocked, run_dir=run_dir, notebook_name=name,
                                       cell_timeout=limits.cell_timeout, limits=box, threads=threads)
                outcome = sandbox.run(args, box)
            else:
                work = run_dir / "work"
                work.mkdir()
                shutil.copyfile(run_dir / "in" / name, work / name)
                from autograder.workspace import nbgrader_env

                env = {**nbgrader_env(), "MINIGPT_JUDGE": str(run_dir / "sock" / "judge"),
                       "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": str(threads),
                       "NBGRADER_EXECUTION": "autograde"}
                outcome = sandbox.run([sys.executable, "-m", "autograder.sandboxed.execute", str(work / name),
                                       "--timeout", str(limits.cell_timeout)], box, env=env, cwd=work)
        report = judge.executed if isinstance(judge.executed, dict) else None
        outputs, ran = executed_outputs(report, nb)
        incident = ""
        if outcome.timed_out:
            incident = f"stopped at the time limit for the whole notebook ({limits.timeout:g} s)"
        elif outcome.memory_exceeded:
            incident = (f"stopped: the notebook's processes together used more than the memory limit "
                        f"({limits.memory / 2**30:.1f} GiB)")
        elif report is None:
            incident = "the notebook stopped before its end (its run was killed from inside)"
        elif report.get("status") != "ran":
            lines = valid_text(str(report.get("detail") or "")).strip().splitlines()
            detail = lines[0][:200] if lines else ""
            incident = ("a cell ran past its time limit and did not stop when interrupted" if "Timeout" in detail
                        else "the notebook's kernel died before the end") + (f" ({detail})" if detail else "")
        return RunOutcome(judge.verdicts, outputs, outcome.seconds, incident,
                          log=outcome.log + "".join(f"\nrefused: {why}" for why in judge.refused),
                          started=ran > 0 or outcome.timed_out or bool(judge.verdicts) or judge.kernel_started)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def executed_outputs(report: dict | None, nb: nbformat.NotebookNode) -> tuple[dict[int, tuple[list, int | None]], int]:
    """({cell index: (outputs, execution count)}, how many cells ran) from what the executor sent: nothing if it
    does not match the notebook cell for cell (a forged or broken report shows nothing). Read as untrusted data:
    any way of not being a notebook gives ({}, 0)."""
    try:
        ran = json.loads(report["executed"])
        cells = ran["cells"]
        if not isinstance(cells, list) or len(cells) != len(nb.cells):
            return {}, 0
        out, budget, count_run = {}, [OUTPUTS_MAX_TOTAL], 0
        for i, (cell, theirs) in enumerate(zip(nb.cells, cells)):
            if cell.cell_type != "code" or not isinstance(theirs, dict) or theirs.get("id") != cell.get("id"):
                if cell.cell_type == "code":
                    return {}, 0
                continue
            count = theirs.get("execution_count")
            count = count if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 2**31 else None
            count_run += count is not None
            outputs = theirs.get("outputs") if isinstance(theirs.get("outputs"), list) else []
            cleaned = [o for o in (_clean_output(o, budget) for o in outputs[:OUTPUTS_PER_CELL]) if o is not None]
            out[i] = (cleaned, count)
        return out, count_run
    except Exception:  # noqa: BLE001 (TypeError, KeyError, ValueError, RecursionError, ...: not a report)
        return {}, 0


def _clip(text, budget: list[int]) -> str:
    if isinstance(text, list):
        text = "".join(t for t in text if isinstance(t, str))
    if not isinstance(text, str):
        return ""
    limit = max(0, min(OUTPUT_MAX_CHARS, budget[0]))
    cut = len(text) - limit
    text = valid_text(text[:limit])
    budget[0] -= len(text)
    return text + (f"\n... [{cut:,} more characters cut by the grader]\n" if cut > 0 else "")


def _clean_output(o, budget: list[int]) -> dict | None:
    """One output as the grader keeps it: stdout/stderr text, plain text, PNG/JPEG pictures, errors; ``budget``
    the characters the notebook may still show."""
    if not isinstance(o, dict) or budget[0] <= 0:
        return None
    kind = o.get("output_type")
    if kind == "stream":
        name = o.get("name") if o.get("name") in ("stdout", "stderr") else "stdout"
        return nbformat.v4.new_output("stream", name=name, text=_clip(o.get("text"), budget))
    if kind == "error":
        tb = o.get("traceback") if isinstance(o.get("traceback"), list) else []
        return nbformat.v4.new_output("error", ename=_clip(o.get("ename"), budget)[:200] or "Error",
                                      evalue=_clip(o.get("evalue"), budget)[:4000],
                                      traceback=[_clip(line, budget)[:2000] for line in tb[:100]])
    if kind in ("display_data", "execute_result"):
        data = o.get("data") if isinstance(o.get("data"), dict) else {}
        kept = {}
        for mime in SHOWN_MIMETYPES:
            if mime not in data:
                continue
            value = data.get(mime)
            if mime != "text/plain" and not (isinstance(value, str) and len(value) < min(OUTPUT_MAX_CHARS, budget[0])
                                             and BASE64.fullmatch(value)):
                continue
            value = _clip(value, budget)
            if value:
                kept[mime] = value
        # An execute_result is shown as what it is, a value on display: as display data it can never be read as
        # a score (nbgrader's determine_grade takes a test cell's first execute_result for its grade).
        return nbformat.v4.new_output("display_data", data=kept) if kept else None
    return None
