"""A class batch of chapter 1 with every kind of bad submission (tests/submissions/hostile.py), graded twice by
`minigpt-grade --class` in sandboxes: each gets a row that says what happened, none stops the batch, no trick
earns a point its code does not deserve, nothing hidden shows in any feedback, and neither the course, nor the
grader's workspace, nor any other learner's result or file is changed.

The first run grades on a Dask cluster (`--scheduler`: a real LocalCluster of two worker processes on 127.0.0.1),
one of whose workers is killed with SIGKILL while it runs a notebook; the second runs here, as `minigpt-grade`
does by default, and must reuse every result. The expectations below are those the local path has always met
(the judge's message is the same bytes either way: autograder/cluster.py), so the same outcomes on the cluster
show the two paths agree, and the kill shows that a worker lost mid-batch loses no notebook."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from autograder import base, grade, workspace
from submissions import hostile
from submissions.grading import lost_cells

pytestmark = pytest.mark.slow

CHAPTER = hostile.CHAPTER
ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_TESTS = {"test_encode_ordinary", "test_special_tokens", "test_decode", "test_matches_tiktoken"}
CHEATS = ["eq-list", "patch-helpers", "input-transformer", "ast-transformer", "meta-path", "repatch-thread",
          "frame-walk", "forge", "expect-ok", "forge-scores", "surrogate", "forged-answers"]
# Text of the checks and the judge that learners must never see (in a message, an output or a feedback page).
SECRETS = ["_MERGE_MISTAKES", "def check_bpe_merge", "HIDDEN_TEXTS", "def judge(", "_first_wrong_piece",
           "class RunJudge"]
MINIGPT_DIRS = (".venv", ".git", "__pycache__", "_build", ".grading", ".pytest_cache", ".hypothesis", "submitted",
                "autograded", "feedback")


def course_files() -> dict[str, str]:
    """sha256 of every file of the course checkout (not the environment, caches or build output)."""
    out = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in MINIGPT_DIRS]
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(ROOT))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# What each endless loop costs (the deaf one 9 s more: the executor's 4 s wait for its output, the kernel's 5 s to
# shut down). 20 s: the probes that walk the whole file system (EVERYWHERE) took past 10 s in one cell on a loaded
# run (issue 25's note: 10 s failed test_tampering_reaches_nothing_outside_the_sandbox once), and 12 s is within
# what a full suite's load makes of them.
CELL_TIMEOUT = 20
# Half of minigpt-grade's 4 GiB: the memory probe (hostile.MEMORY_FORKS) reaches the cap in half the CPU time; a
# chapter 1 kernel needs about 0.3 GiB.
MEMORY = "2G"


def grade_class(class_dir: Path, workdir: Path, *options: str) -> tuple[int, dict[str, base.Result], str]:
    out = workdir.parent / "results.json"
    with contextlib.redirect_stdout(io.StringIO()) as table:
        code = grade.main(["--class", str(class_dir), "--chapter", CHAPTER, "--workdir", str(workdir),
                           "--cell-timeout", str(CELL_TIMEOUT), "--memory", MEMORY, "--timeout", "150",
                           "--json", str(out), "--quiet", *options])
    results = {r["student"]: base.Result.from_dict(r) for r in json.loads(out.read_text())["results"]}
    return code, results, table.getvalue()


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The class graded twice into one workspace; the second run reuses every result it may."""
    class_dir = tmp_path_factory.mktemp("class")
    workdir = tmp_path_factory.mktemp("grading") / "workspace"
    server = socket.create_server(("127.0.0.1", 0))  # the network probe must not reach it
    port = server.getsockname()[1]
    stderr = workdir.parent / "stderr.log"  # the first run's: the grader's, its workers' and their judges'
    redirect = contextlib.ExitStack()
    redirect.enter_context(standard_error_to(stderr))
    cluster = contextlib.ExitStack()
    address = cluster.enter_context(cluster_of_two())
    students = hostile.write_class(class_dir, {
        "reference": hostile.reference_text(),
        "untouched": hostile.untouched_text(),
        "wrong": hostile.mutant_text(hostile.WRONG),
        "network": hostile.network_probe(port, address)(),  # and the scheduler that grades it, as a client
    })
    (class_dir / "symlink").mkdir()  # a notebook that is a link to the instructor's solution
    (class_dir / "symlink" / f"{CHAPTER}.ipynb").symlink_to(ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    (class_dir / "linked-folder").symlink_to(class_dir / "reference")  # a student folder that is a link
    (class_dir / "linked-chapter").mkdir()  # nbgrader collect's layout, whose chapter folder is the solutions'
    (class_dir / "linked-chapter" / CHAPTER).symlink_to(ROOT / "solutions" / CHAPTER)
    # nbgrader collect's layout, with a receipt whose time is the learner's word: in the year 9999
    (class_dir / "future-receipt" / CHAPTER).mkdir(parents=True)
    (class_dir / "future-receipt" / CHAPTER / f"{CHAPTER}.ipynb").write_text(hostile.reference_text())
    (class_dir / "future-receipt" / CHAPTER / "timestamp.txt").write_text(FUTURE)
    (class_dir / "future-receipt" / CHAPTER / "submission_secret.txt").write_text("ab" * 64)
    students += ["symlink", "linked-chapter", "future-receipt"]
    before = course_files()
    submitted = {s: (class_dir / s / f"{CHAPTER}.ipynb").read_bytes() for s in students
                 if s not in ("symlink", "linked-chapter", "future-receipt")}
    with redirect:
        with cluster:
            killer = WorkerKiller(address)
            first = grade_class(class_dir, workdir, "--scheduler", address)
            killer.stop()
    records = {p.parent.name: p.read_bytes() for p in workdir.glob(f"results/*/{CHAPTER}.json")}
    second = grade_class(class_dir, workdir)
    server.close()
    return {"students": students, "first": first, "second": second, "workdir": workdir, "class_dir": class_dir,
            "course_before": before, "course_after": course_files(), "submitted": submitted, "records": records,
            "killed": killer.killed, "stderr": stderr.read_text(errors="replace")}


FUTURE = "9999-12-31 23:59:59.999999 UTC"


@contextlib.contextmanager
def standard_error_to(path: Path):
    """This process's file descriptor 2 (and so that of every process it starts meanwhile: the cluster's workers,
    their fork servers and judges) written to ``path``."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def cluster_of_two():
    """A real Dask cluster on 127.0.0.1: a scheduler and two worker processes of one thread each (the two cores),
    started as the README says workers must be (not daemonic: they start the judge processes)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.worker.daemon": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                         host="127.0.0.1") as cluster:
        yield cluster.scheduler_address


class WorkerKiller(threading.Thread):
    """Kills one worker process (SIGKILL) while a notebook runs in a sandbox under it (its fork server is warm, a judge
    and the sandbox run below it): its nanny starts a new worker, and the scheduler gives the lost notebook to a worker
    again. ``killed``: the keys of the tasks the worker had (running and waiting), and its pid."""

    def __init__(self, address: str):
        super().__init__(daemon=True)
        from distributed import Client

        self.client = Client(address, set_as_default=False)
        self.pids = self.client.run(os.getpid)  # {worker: pid}
        self.killed: dict = {}
        self.done = threading.Event()
        self.start()

    def run(self):
        import psutil

        def sandboxes(pid: int) -> list[tuple[int, float]]:
            """(pid, start time) of each executor running in a sandbox below the process ``pid``."""
            found = []
            with contextlib.suppress(psutil.Error):
                for proc in psutil.Process(pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if "autograder.sandboxed.execute" in proc.cmdline():
                            found.append((proc.pid, proc.create_time()))
            return found

        while not self.done.wait(0.5):
            running = {w: keys for w, keys in self.client.processing().items() if keys and w in self.pids}
            for worker, keys in sorted(running.items()):
                if below := sandboxes(self.pids[worker]):
                    started = psutil.Process(self.pids[worker]).create_time()
                    os.kill(self.pids[worker], signal.SIGKILL)
                    self.killed = {"worker": worker, "pid": self.pids[worker], "keys": [str(k) for k in keys],
                                   "processes": [(self.pids[worker], started), *below]}
                    return

    def stop(self):
        self.done.set()
        self.join()
        self.client.close()


def outputs(batch, student: str) -> str:
    nb = nbformat.read(workspace.autograded_path(batch["workdir"], student, CHAPTER), as_version=4)
    return "\n".join("".join(o.get("text", "")) + json.dumps(o.get("data", {})) + o.get("evalue", "")
                     for c in nb.cells for o in c.get("outputs", []))


def result(batch, student: str) -> base.Result:
    return batch["first"][1][student]


# ---------------------------------------------------------------- the batch as a whole


def test_every_submission_gets_one_row_and_the_batch_succeeds(batch):
    for code, results, table in (batch["first"], batch["second"]):
        assert code == 0
        assert sorted(results) == sorted(batch["students"])  # the linked student folder is left out
        for student in batch["students"]:
            assert f"\n{student} " in "\n" + table
    rows = (batch["workdir"] / "grades.csv").read_text().splitlines()
    assert len(rows) == 1 + len(batch["students"])


def test_a_worker_killed_mid_batch_loses_nothing(batch):
    """The worker killed while it ran a notebook: that notebook was graded all the same (by a worker again), as
    every other one, and its process is gone, with the notebook's sandbox below it."""
    import psutil

    def gone(pid: int, started: float) -> bool:  # (or its number given to a new process)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            return proc.create_time() != started or proc.status() == psutil.STATUS_ZOMBIE
        return True

    killed = batch["killed"]
    assert killed, "no worker was seen running a notebook in a sandbox"
    assert all(gone(pid, started) for pid, started in killed["processes"]), killed
    lost = [key[len("judge-"):-len(f"-{CHAPTER}-0123456789ab")] for key in killed["keys"]]  # autograder.cluster's keys
    assert lost and set(lost) <= set(batch["students"]), killed
    results = batch["first"][1]
    assert [s for s in lost if results[s].status != "graded"] == [], {s: results[s].detail for s in lost}


def test_the_second_run_reuses_every_result_and_changes_none(batch):
    first, second = batch["first"][1], batch["second"][1]
    for student, r in second.items():
        assert (r.status, r.score, [lp.grade_id for lp in r.lost]) == \
            (first[student].status, first[student].score, [lp.grade_id for lp in first[student].lost]), student
        if r.status == "graded":
            assert r.reused, f"{student} was graded again"


def test_the_course_checkout_is_byte_identical_after_the_batch(batch):
    before, after = batch["course_before"], batch["course_after"]
    assert sorted(set(before) ^ set(after)) == []
    assert [f for f in before if before[f] != after[f]] == []


def test_no_submission_or_stored_result_was_changed(batch):
    for student, data in batch["submitted"].items():
        assert (batch["class_dir"] / student / f"{CHAPTER}.ipynb").read_bytes() == data, student
    for path in batch["workdir"].glob(f"results/*/{CHAPTER}.json"):
        assert path.read_bytes() == batch["records"][path.parent.name], path


def test_right_wrong_and_untouched_answers_score_as_usual(batch):
    assert result(batch, "reference").score == result(batch, "reference").max_score == 13
    assert result(batch, "untouched").score == 0
    wrong = result(batch, "wrong")
    assert 0 < wrong.score < 13 and set(lost_cells(wrong)) == {"test_bpe_merge", *TOKENIZER_TESTS} - {"test_decode"}


def test_no_process_of_a_notebook_outlives_the_batch(batch):
    """No notebook's process is left: none that the survivor started, and no executor without a grader above it
    (other test files may be grading at the same time; theirs have a living grader among their ancestors)."""
    import psutil

    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "PROBE survivor: started" in outputs(batch, "resources") and "minigpt-survivor" not in ps
    orphans = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "autograder.sandboxed.execute" in " ".join(proc.info["cmdline"] or []):
                above = [" ".join(a.cmdline()) for a in proc.parents()]
                if not any("pytest" in line or "minigpt-grade" in line for line in above):
                    orphans.append(proc.pid)
    assert orphans == []


# ---------------------------------------------------------------- no point for wrong code


@pytest.mark.parametrize("student", CHEATS)
def test_a_cheat_gets_at_most_what_its_wrong_code_deserves(batch, student):
    wrong, cheat = result(batch, "wrong"), result(batch, student)
    assert cheat.status == "graded", cheat.detail
    assert cheat.score <= wrong.score, f"{student}: {cheat.score} points, its wrong code alone gets {wrong.score}"
    assert set(lost_cells(cheat)) >= set(lost_cells(wrong)), student


@pytest.mark.parametrize("student", ["eq-list", "patch-helpers", "frame-walk", "forge", "expect-ok", "forge-scores",
                                     "forged-answers"])
def test_cheats_that_leave_the_hidden_tests_running_get_exactly_what_the_wrong_code_gets(batch, student):
    assert result(batch, student).score == result(batch, "wrong").score
    assert "returned [b'ab', b'c'], expected [b'a', b'bc']" in lost_cells(result(batch, student))["test_bpe_merge"]


@pytest.mark.parametrize("student", ["input-transformer", "ast-transformer", "meta-path", "repatch-thread"])
def test_hidden_tests_that_never_reach_the_judge_score_nothing(batch, student):
    lost = lost_cells(result(batch, student))
    assert "did not run" in lost["test_pre_split"], lost


def test_the_judge_refuses_a_second_judgement_and_a_forged_run(batch):
    assert "PROBE forge: the judge said refused" in outputs(batch, "forge")


def test_scores_come_from_the_judge_not_from_what_the_notebook_shows(batch):
    """Every test cell of these notebooks shows an execute_result (nbgrader's rule reads one as full credit)."""
    for student in ("expect-ok", "forge-scores"):
        nb = nbformat.read(workspace.autograded_path(batch["workdir"], student, CHAPTER), as_version=4)
        shown = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "execute_result"]
        assert shown == [], f"{student}: an execute_result is kept in the autograded notebook"
        assert result(batch, student).score == result(batch, "wrong").score


# ---------------------------------------------------------------- one notebook costs only its own row


@pytest.mark.parametrize("student", ["surrogate", "forge-broken", "wire-bombs"])
def test_what_a_notebook_sends_the_grader_costs_its_own_row_only(batch, student):
    for _, results, _ in (batch["first"], batch["second"]):
        r = results[student]
        assert r.status == "graded", (r.status, r.detail)
        assert not [lp for lp in r.lost if "of the grader's" in lp.message], r.lost


def test_a_message_no_writer_could_write_is_made_valid(batch):
    lost = lost_cells(result(batch, "surrogate"))
    assert "\ufffd" in lost["test_bpe_merge"], lost


def test_a_forged_broken_report_loses_nothing_the_judge_saw(batch):
    r = result(batch, "forge-broken")
    assert r.score == 13 and "kernel died" in r.detail, (r.score, r.detail)


def test_replies_that_are_costly_to_decode_are_refused_fast_and_charged_to_the_learner(batch):
    r = result(batch, "wire-bombs")
    assert r.score == 0 and r.seconds < 120, (r.score, r.seconds)
    assert r.lost and all("UnreadableValue" in lp.message for lp in r.lost), r.lost


@pytest.mark.parametrize("student", sorted(hostile.BAD_METADATA))
def test_nbgrader_metadata_of_the_wrong_type_is_that_notebooks_row(batch, student):
    """A cell whose nbgrader metadata is a string, null, a list, or has a grade id that is a list crashed the intake
    of the whole class; it is that notebook's row, and the victims' scores are right."""
    for _, results, _ in (batch["first"], batch["second"]):
        r = results[student]
        assert r.status == "unreadable", (r.status, r.detail)
        what = "has a grade_id that is not text" if student == "grade-id-list" else "is not an object"
        assert r.detail == f"the nbgrader metadata of cell 3 {what}", r.detail
        assert (results["reference"].score, results["untouched"].score) == (13, 0)


def test_text_that_is_costly_to_read_costs_its_own_row_only(batch):
    """20,000 lines `### BEGIN HIDDEN TESTS` in a cell of the learner's own (a block that never ends: the grader's
    reading of hidden tests took the square of its length) and 300 cells `# socket` before the first graded one (a
    review note each, each cell named by walking back): graded as its answers deserve, the notes bounded. (The
    grader's time on such text: tests/test_intake_linear.py.)"""
    r = result(batch, "markers-bomb")
    assert r.status == "graded" and r.score == 13, (r.status, r.detail)
    assert r.review[0].startswith("not read for oracles: "), r.review[:1]
    assert r.review[1] == "a cell before the first graded one, line 1: opens sockets: # socket", r.review[1:2]
    assert len(r.review) == 22 and r.review[-1] == "... and 280 more lines like these", r.review[-2:]
    assert result(batch, "reference").score == 13


def test_the_judges_log_reaches_the_terminal_escaped(batch):
    """A learner's side that answers the judge with terminal escapes ({"bad": ...}): the judge's error, logged with
    what came back, reaches the instructor's terminal escaped as the table is (before, Python's last resort handler
    wrote it raw: a window title, the clipboard, a cleared screen); no line on the terminal holds a control
    character."""
    text = batch["stderr"]
    assert "judge-log-owned" in text, text[-3000:]  # (the judge did log it)
    assert "\\x1b]0;judge-log-owned\\x07" in text
    assert [ch for ch in set(text) if ord(ch) < 32 and ch not in "\n\t" or 0x7f <= ord(ch) < 0xa0] == []
    r = result(batch, "bad-replies")
    assert r.status == "graded" and r.score == 0, (r.status, r.score, r.detail)


def test_a_kept_log_is_written_escaped(batch):
    """The executor's log, kept when the kernel died (its path in the table), holds what the learner's kernel wrote
    to its standard error: escaped, as the table is."""
    r = result(batch, "log-escapes")
    assert r.status == "graded" and r.score == 13 and "kernel died" in r.detail, (r.score, r.detail)
    kept = Path(r.log).read_text()
    assert "\\x1b]0;kept-log-owned\\x07" in kept, kept[-2000:]
    assert "\x1b" not in kept and "\x07" not in kept


def test_a_run_killed_by_its_own_first_cell_is_the_notebooks_error_and_is_not_run_again(batch):
    """The executor killed by the notebook's first cell: no cell ran to its end, but the kernel had answered (the
    executor tells the judge so before the first cell), so the row is the notebook's (graded: nothing earned, the
    reason said), recorded and reused by the second run, not 'the machine's doing' run again in every batch."""
    for run in ("first", "second"):
        r = batch[run][1]["kills-executor"]
        assert r.status == "graded" and r.score == 0 and "killed from inside" in r.detail, (run, r.status, r.detail)
    assert batch["second"][1]["kills-executor"].reused


def test_a_receipt_time_that_makes_no_sense_is_not_taken(batch):
    """A receipt's time is the learner's word: one in the future is noted and not taken; the gradebook has a time
    that is not in the future (the notebook file's)."""
    import datetime

    from nbgrader.api import Gradebook

    r = result(batch, "future-receipt")
    assert r.status == "graded" and r.score == 13, (r.status, r.detail)
    assert any(f"timestamp.txt: '{FUTURE}' is in the future" in note for note in r.review), r.review
    with Gradebook(f"sqlite:///{batch['workdir'] / 'gradebook.db'}") as gb:
        when = gb.find_submission(CHAPTER, "future-receipt").timestamp
    assert when < datetime.datetime.utcnow() + datetime.timedelta(minutes=1), when
    assert (batch["workdir"] / "submitted" / "future-receipt" / CHAPTER / "timestamp.txt").read_text() != FUTURE


def test_the_victims_keep_their_scores_across_both_runs(batch):
    for _, results, _ in (batch["first"], batch["second"]):
        assert (results["reference"].score, results["untouched"].score) == (13, 0)


# ---------------------------------------------------------------- what people read is inert


class _Markup(HTMLParser):
    """The elements and attributes of a page, as a browser would parse them."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]


def _active(page: str) -> list[str]:
    """What on a page could run: script, svg, frame and object elements, event handlers, javascript: addresses."""
    markup = _Markup(page)
    return ([t for t in markup.tags if t in ("script", "svg", "iframe", "object", "embed", "math")]
            + [f"{t} {n}" for t, n, _ in markup.attributes if n.startswith("on")]
            + [f"{t} {n}={v}" for t, n, v in markup.attributes
               if "javascript:" in "".join(v.split()).lower() or v.strip().lower().startswith(("data:text", "vbscript"))])


def test_learner_markup_reaches_no_page_as_script(batch):
    """The markdown of the autograded notebook (what the formgrader renders) and the feedback pages hold no more that
    could run than the reference learner's: the learner's script, handlers and javascript: link are gone (as text
    they may stay: text is inert)."""
    workdir = batch["workdir"]

    def pages(student):
        nb = nbformat.read(workspace.autograded_path(workdir, student, CHAPTER), as_version=4)
        return ["\n".join(c.source for c in nb.cells if c.cell_type == "markdown"),
                workspace.feedback_path(workdir, student, CHAPTER).read_text(),
                (workdir / "feedback" / student / "index.html").read_text()]

    for i, (page, reference) in enumerate(zip(pages("fools-readers"), pages("reference"))):
        assert _active(page) == _active(reference), i
        assert "<script>document.title" not in page and "fetch(" not in page, i
    assert _active(pages("fools-readers")[0]) == []
    assert all("My notes." in page for page in pages("fools-readers")[:2])


def test_no_spreadsheet_cell_is_a_formula(batch):
    import csv

    with open(batch["workdir"] / "grades.csv", newline="") as f:
        cells = [cell for row in csv.reader(f) for cell in row]
    assert [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")] == []
    quoted = [c for c in cells if "opens sockets: import socket" in c]
    assert quoted and not [c for c in quoted if "\x1b" in c or "\x07" in c], quoted


def test_the_table_holds_no_terminal_control_characters(batch):
    for _, _, table in (batch["first"], batch["second"]):
        assert not [ch for ch in table if ord(ch) < 32 and ch != "\n" or 0x7f <= ord(ch) < 0xa0], "control characters"
    assert "fools-readers" in batch["first"][2]


# ---------------------------------------------------------------- nothing hidden is within reach


def test_nothing_hidden_can_be_read_from_the_sandbox(batch):
    text = outputs(batch, "snoop")
    probes = [line for line in text.splitlines() if line.startswith("PROBE ")]
    assert len(probes) == 13, text
    assert [p for p in probes if "FOUND" in p] == [], probes
    assert result(batch, "snoop").score == 0


@pytest.mark.parametrize("student", ["symlink", "linked-chapter"])
def test_a_linked_notebook_or_chapter_folder_is_refused(batch, student):
    """Neither a notebook nor a chapter folder that links to the instructor's solution is read as a submission."""
    r = result(batch, student)
    assert r.status == "unreadable" and "symbolic link" in r.detail, (r.status, r.detail)


def test_the_notebook_runs_as_an_unprivileged_user_in_its_own_process_namespace(batch):
    text = outputs(batch, "environment")
    line = next(line for line in text.splitlines() if line.startswith("PROBE uid:"))
    uid, pids = line.split("uid:")[1].split("pids:")
    assert int(uid) != 0
    assert max(json.loads(pids)) < 100, "the notebook sees processes that are not its own"


def test_the_environment_names_no_other_learner_and_no_grading_folder(batch):
    text = outputs(batch, "environment")
    env = [line for line in text.splitlines() if line.startswith("ENV ")]
    assert env
    for secret in (str(batch["class_dir"]), str(batch["workdir"]), str(ROOT / "solutions")):
        assert not [line for line in env if secret in line], secret


def test_other_kernels_are_out_of_sight(batch):
    line = next(line for line in outputs(batch, "environment").splitlines() if line.startswith("PROBE kernels:"))
    found = json.loads(line.split(":", 1)[1].replace("'", '"'))
    assert len(found) <= 1 and all(p.startswith("/tmp/") for p in found), found


def test_the_network_is_out_of_reach(batch):
    text = outputs(batch, "network")
    assert text.count("PROBE network:") == 3 and "connected" not in text, text


def test_the_dask_scheduler_grading_it_is_out_of_reach(batch):
    """A notebook graded on the cluster cannot become the cluster's client (which runs code on the workers)."""
    r, text = result(batch, "network"), outputs(batch, "network")
    assert "PROBE dask: blocked" in text and "connected" not in text, text
    assert r.status == "graded" and r.score == 13, (r.score, r.detail)


@pytest.mark.parametrize("student", ["print-history", "raise-frames", "snoop", "environment"])
def test_nothing_of_the_checks_shows_in_outputs_messages_or_feedback(batch, student):
    workdir = batch["workdir"]
    shown = [outputs(batch, student), (workdir / "grades.csv").read_text(),
             (workdir / "feedback" / student / "index.html").read_text()]
    page = workspace.feedback_path(workdir, student, CHAPTER)
    if page.is_file():
        shown.append(page.read_text())
    for secret in SECRETS:
        assert not [i for i, text in enumerate(shown) if secret in text], secret
    if student != "print-history":  # (which prints the hidden cells' source itself: a check(...) call)
        assert "BEGIN HIDDEN TESTS" not in shown[-1]


# ---------------------------------------------------------------- tampering changes nothing


def test_tampering_reaches_nothing_outside_the_sandbox(batch):
    text = outputs(batch, "tamper")
    lines = [line for line in text.splitlines() if line.startswith("PROBE tamper:")]
    assert lines, f"the probe printed nothing: {text[-1500:]}"  # (it ran past the cell's time limit, once)
    line = lines[0]
    assert "wrote []" in line, line
    # the shipped model is in the sandbox's view (the demos load it), and stays unwritten
    assert "PROBE tamper-model: found 1" in text, text[-2000:]
    assert result(batch, "tamper").score == 13


def test_signals_reach_only_the_notebooks_own_processes(batch):
    r = result(batch, "signals")
    assert r.status == "graded" and r.score == 13, (r.score, r.detail)  # every hidden test ran before the signals
    assert r.detail, "the row says the run was cut short"


def test_memory_is_capped_for_all_of_a_notebooks_processes_together(batch):
    r = result(batch, "resources")
    assert r.status == "graded"
    assert "memory" in r.detail and "PROBE memory-forks: survived" not in outputs(batch, "resources"), r.detail
    assert r.score == 13  # its cells before the forks were judged


def test_a_fork_bomb_is_stopped_at_the_process_limit(batch):
    r = result(batch, "fork-bomb")
    assert r.status == "graded" and r.score == 13, r.detail
    assert "PROBE fork-bomb: stopped by" in outputs(batch, "fork-bomb")


def test_writing_files_is_limited_to_memory_that_counts_against_the_notebook(batch):
    text = outputs(batch, "resources")
    assert text.count("PROBE disk-fill:") == 2 and "wrote 10 GiB" not in text, text
    assert result(batch, "resources").score == 13


# ---------------------------------------------------------------- honest trouble


@pytest.mark.parametrize("student, status, detail", [
    ("corrupt-json", "unreadable", "not a notebook"),
    ("other-chapter", "wrong-notebook", "this is the notebook of 02-embeddings, not of this chapter"),
    ("not-the-notebook", "wrong-notebook", "no nbgrader cells"),
])
def test_what_is_not_this_chapters_notebook_is_named_and_not_run(batch, student, status, detail):
    r = result(batch, student)
    assert r.status == status and r.score is None and r.max_score == 13
    assert detail in r.detail
    assert r.seconds is None or r.seconds == 0


def test_an_endless_loop_costs_the_cells_that_needed_it(batch):
    r = result(batch, "infinite-loop")
    assert r.status == "graded" and set(lost_cells(r)) == TOKENIZER_TESTS, lost_cells(r)
    assert any("tokenizer: CellTimeoutError" in e for e in r.cell_errors), r.cell_errors


def test_a_loop_that_ignores_interrupts_is_stopped_and_says_so(batch):
    r = result(batch, "deaf-loop")
    assert r.status == "graded" and r.detail, r
    assert set(lost_cells(r)) == {"test_pre_split", "test_bpe_merge", *TOKENIZER_TESTS}, lost_cells(r)


def test_a_memory_bomb_fails_only_its_own_cell(batch):
    r = result(batch, "memory-bomb")
    assert r.status == "graded" and r.score == 13, r
    assert any("MemoryError" in e for e in r.cell_errors), r.cell_errors


def test_sys_exit_is_just_an_error_in_its_cell(batch):
    r = result(batch, "sys-exit")
    assert r.status == "graded" and r.score == 13, r


@pytest.mark.parametrize("student", ["os-exit", "segfault"])
def test_a_dead_kernel_gets_a_row_that_says_so_and_keeps_nothing_it_did_not_run(batch, student):
    r = result(batch, student)
    assert r.status == "graded" and r.score == 0 and "kernel died" in r.detail, r
    assert all("did not run" in lp.message for lp in r.lost), r.lost


def test_edited_test_cells_are_restored_and_listed_for_review(batch):
    r = result(batch, "edited-test")
    assert "test_decode" in lost_cells(r)
    assert any("test_decode: a locked cell was edited" in note for note in r.review), r.review


def test_a_deleted_test_cell_waits_for_the_instructor(batch):
    r = result(batch, "deleted-test")
    assert r.needs_manual_grade and "test_decode" in lost_cells(r)
    assert any("cells deleted: test_decode" in note for note in r.review)


def test_a_renamed_function_is_named(batch):
    lost = lost_cells(result(batch, "renamed"))
    assert "pre_split" in lost["test_pre_split"] and "NameError" in lost["test_pre_split"], lost


def test_megabytes_of_output_are_cut(batch):
    path = workspace.autograded_path(batch["workdir"], "flood", CHAPTER)
    assert path.stat().st_size < 2_000_000
    assert result(batch, "flood").score == 13


def test_importing_the_reference_is_refused_with_a_reason(batch):
    r = result(batch, "imports-reference")
    assert TOKENIZER_TESTS <= set(lost_cells(r))
    assert any("reference solution, which is not available" in e for e in r.cell_errors), r.cell_errors


def test_code_that_reaches_for_the_grader_is_listed_for_review(batch):
    for student in ("meta-path", "input-transformer", "forge", "signals", "snoop", "forged-answers"):
        assert result(batch, student).review, student
    assert result(batch, "reference").review == []
