"""The sandbox a graded notebook runs in (autograder/sandbox.py), seen from inside: a Python program run where
the executor would run, for the chapter 01-tokens, reports what it can see and do."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from autograder import run, sandbox

pytestmark = pytest.mark.skipif(sandbox.missing() is not None, reason=f"no sandbox here: {sandbox.missing()}")
ROOT = Path(__file__).resolve().parents[1]

REPORT = r'''
import ctypes, json, os, socket, stat, subprocess, sys, threading
report = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
def visible(path):
    return os.path.exists(path)
report["visible"] = {p: visible(p) for p in sys.argv[1:]}
try:
    import minigpt.tokens
    report["import_tokens"] = "imported"
except ImportError as err:
    report["import_tokens"] = str(err)
import minigpt, coursekit, autograder.sandboxed.hidden, autograder.sandboxed.helpers.common
report["import_ok"] = True
try:
    import autograder.judge
    report["import_judge"] = "imported"
except ImportError:
    report["import_judge"] = "missing"
writes = {}
for path in ("/work", os.path.dirname(coursekit.__file__), "/usr/x", "./here", "/tmp/here"):
    try:
        with open(os.path.join(path, "f") if not path.startswith(("./", "/tmp/", "/usr/x")) else path, "w") as f:
            f.write("x")
        writes[path] = "written"
    except OSError as err:
        writes[path] = type(err).__name__
report["writes"] = writes
try:
    socket.create_connection(("127.0.0.1", int(os.environ["PORT_TO_TRY"])), timeout=2)
    report["network"] = "connected"
except (OSError, KeyError) as err:
    report["network"] = type(err).__name__
report["env"] = dict(os.environ)
readable = {}
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    for name in ("environ", "cmdline"):
        try:
            readable[f"{pid}/{name}"] = open(f"/proc/{pid}/{name}", "rb").read().decode("utf-8", "replace")
        except OSError:
            pass
report["proc"] = readable
# Each setuid or setgid program run: the loader shows the auxiliary vector (LD_SHOW_AUXV) unless the exec gave the
# program privileges (AT_SECURE), when it keeps quiet.
secure = {}
for folder, _, files in os.walk("/usr"):
    for path in (os.path.join(folder, name) for name in files):
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID) and os.access(path, os.X_OK):
            proc = subprocess.Popen([path, "--help"], env={"LD_SHOW_AUXV": "1"}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            timer = threading.Timer(10, proc.kill)  # a program that says nothing is not waited for
            timer.start()
            secure[path] = next((line.split()[1] for line in proc.stdout if line.startswith("AT_SECURE:")), "silent")
            timer.cancel()
            proc.kill()
            proc.wait()
report["setuid"] = secure
report["unshare -Ur"] = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True).returncode
# last, as it would move this process into a namespace of its own (os.unshare is Python 3.12's)
report["unshare(CLONE_NEWUSER)"] = ctypes.CDLL(None).unshare(0x10000000) or "made"
print("REPORT" + json.dumps(report))
'''
CANARY = f"canary-{os.urandom(8).hex()}"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "in").mkdir()
    (run_dir / "sock").mkdir()
    blocked = run.blocked_modules("01-tokens")
    sandbox.prepare(run_dir, "01-tokens", blocked)
    server = socket.create_server(("127.0.0.1", 0))
    secrets = [str(ROOT / "solutions"), str(ROOT / ".git"), str(ROOT / "tests"), "/etc/shadow", str(run_dir),
               str(tmp_path_factory.getbasetemp())]
    # every part of the grader's side: the judge, the checks, intake, scoring, reports, the workspace's code
    secrets += [str(p) for p in (ROOT / "autograder").iterdir() if p.name not in sandbox.SANDBOX_SIDE + ("__pycache__",)]
    # the home folder's files (this machine's Python may live under it: only that is in view)
    secrets += [str(p) for p in Path.home().iterdir() if not str(sys.base_prefix).startswith(str(p))]
    limits = sandbox.Limits(memory=2 << 30, timeout=120)
    with pytest.MonkeyPatch.context() as grader:  # as when an instructor grades from a JupyterLab terminal
        grader.setenv("JUPYTERHUB_API_TOKEN", CANARY)
        args = sandbox.command(chapter="01-tokens", blocked=blocked, run_dir=run_dir, notebook_name="x.ipynb",
                               cell_timeout=10, limits=limits, program=["-c", REPORT, *secrets])
        args[-len(secrets) - 3:-len(secrets) - 3] = ["--setenv", "PORT_TO_TRY", str(server.getsockname()[1])]
        outcome = sandbox.run(args, limits)
    server.close()
    line = next((line for line in outcome.log.splitlines() if line.startswith("REPORT")), None)
    assert line, outcome.log
    return json.loads(line[len("REPORT"):]), secrets, outcome


def test_nothing_of_the_grading_side_is_in_view(report):
    got, secrets, _ = report
    assert {p: seen for p, seen in got["visible"].items() if seen} == {}


def test_the_graded_chapters_reference_does_not_import_and_says_why(report):
    got, _, _ = report
    assert "minigpt.tokens is the course's reference solution, which is not available while 01-tokens is graded" \
        in got["import_tokens"]
    assert got["import_ok"] and got["import_judge"] == "missing"


def test_it_writes_only_to_its_own_memory_folders(report):
    got, _, _ = report
    writes = got["writes"]
    assert writes["./here"] == "written" and writes["/tmp/here"] == "written"
    assert {p: w for p, w in writes.items() if p not in ("./here", "/tmp/here") and w == "written"} == {}


def test_an_unprivileged_user_alone_in_its_process_namespace_without_network(report):
    got, _, _ = report
    assert got["uid"] == sandbox.UID != 0
    assert max(got["pids"]) < 20
    assert got["network"] != "connected"


def test_its_environment_is_made_not_inherited(report):
    got, _, _ = report
    assert set(got["env"]) <= {"PATH", "HOME", "USER", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
                               "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "TIKTOKEN_CACHE_DIR",
                               "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MINIGPT_JUDGE",
                               "OMP_NUM_THREADS", "PORT_TO_TRY", "PWD", "LC_CTYPE", "NBGRADER_EXECUTION"}, got["env"]
    assert got["env"]["NBGRADER_EXECUTION"] == "autograde"


def test_nothing_of_the_graders_environment_is_in_view(report):
    """bubblewrap is the sandbox's pid 1, and a process there may read its environment: it starts with none."""
    got, _, _ = report
    assert {"1/environ", "1/cmdline"} <= set(got["proc"]), sorted(got["proc"])  # looked where it leaked
    assert CANARY not in got["env"].values()
    assert [where for where, text in got["proc"].items() if CANARY in text] == []  # where, not what: no secrets in logs


def test_no_user_namespace_can_be_made_inside(report):
    got, _, _ = report
    assert got["unshare -Ur"] != 0
    assert got["unshare(CLONE_NEWUSER)"] == -1


def test_setuid_and_setgid_programs_run_without_privileges(report):
    """They are in view (bubblewrap's binds are nosuid, no_new_privs is set): each one run says AT_SECURE 0."""
    got, _, _ = report
    assert got["setuid"], "no setuid program found under /usr: su and mount are on every Debian"
    assert {path: secure for path, secure in got["setuid"].items() if secure != "0"} == {}


def test_limits_are_applied_per_run(report):
    _, _, outcome = report
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.isolation in ("cgroup", "watchdog")


def test_a_run_past_its_time_is_killed_with_everything_it_started(tmp_path):
    limits = sandbox.Limits(memory=1 << 30, timeout=3)
    script = ("import os, subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # sandbox-orphan'],"
              " start_new_session=True)\n"
              "time.sleep(600)\n")
    outcome = sandbox.run([sys.executable, "-c", script], limits)
    assert outcome.timed_out and outcome.seconds < 30
    import subprocess
    assert "sandbox-orphan" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_the_output_kept_is_capped(tmp_path):
    limits = sandbox.Limits(memory=1 << 30, timeout=60)
    outcome = sandbox.run([sys.executable, "-c", "import sys\nfor _ in range(200): sys.stdout.write('x' * 100_000)"],
                          limits)
    assert len(outcome.log) == sandbox.OUTPUT_KEEP


def test_the_course_stays_in_view_wherever_it_lies(tmp_path):
    """The writable /tmp and home folder are mounted before the course's folders are bound, so a checkout under
    /tmp (as a CI runner may clone it) is not hidden by the sandbox's own /tmp."""
    args = sandbox.command(chapter="01-tokens", blocked=[], run_dir=tmp_path, notebook_name="x.ipynb",
                           cell_timeout=10, limits=sandbox.Limits(memory=1 << 30))
    first_bind = args.index("--ro-bind")
    assert args.index("/tmp") < first_bind and args.index(str(sandbox.HOME)) < first_bind


SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"
SPINNERS = """\
import os, time
for _ in range(40):  # each in a process session of its own, as a notebook's children may be
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
time.sleep(60)
"""


def test_a_run_that_spins_up_many_sessions_gets_no_more_cpu_than_the_run_beside_it(tmp_path):
    """Issue 43: 40 spinning processes, each in its own session, beside a run that needs 1.5 s of CPU: the other
    run's time stays within 2x of its time alone (each run's cgroup has an equal share of the CPU, capped at its
    cores' worth)."""
    import concurrent.futures

    def victim() -> float:
        return sandbox.run([sys.executable, "-c", SPIN.format(seconds=1.5)],
                           sandbox.Limits(memory=1 << 30, timeout=60, cpus=1.5)).seconds

    alone = min(victim() for _ in range(2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        spinners = pool.submit(sandbox.run, [sys.executable, "-c", SPINNERS],
                               sandbox.Limits(memory=1 << 30, timeout=8, cpus=1.5))
        time.sleep(1.5)  # the spinners are running
        beside = victim()
        outcome = spinners.result()
    assert outcome.isolation == "cgroup" and outcome.timed_out
    assert beside < 2 * alone, f"{beside:.1f} s beside 40 spinning sessions, {alone:.1f} s alone"
