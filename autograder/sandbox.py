"""The sandbox a learner's notebook runs in while ``minigpt-grade`` grades it (bubblewrap, Debian's ``bubblewrap``).

What the notebook sees, read-only: the system's programs and libraries (``/usr``), a few files of ``/etc``,
Python and the course's environment, and of the course only ``src/coursekit``, the reference modules of the
chapters *before* the one graded, and the sandbox's side of the autograder (``autograder/sandboxed``: ``hidden``,
``wire``, ``execute``, ``helpers``). Not there at all: ``solutions/``, the rest of ``autograder/`` (the checks, the
judge), ``.git``, the grading workspace, gradebooks, other submissions, the reference of the graded chapter and
later ones (their modules are stubs that refuse to import), anything else on the machine.

What it may write: a home folder and ``/tmp``, both in memory and limited in size; nothing on the host's disk.
It has no network, its own process namespace (it cannot see or signal the grader, or other notebooks), an
unprivileged user that cannot make user namespaces of its own (no ``unshare -Ur``: kernel surface a notebook does
not need), and limits on its total memory and number of processes (a cgroup per run; where no cgroup can be made, a
watchdog that sums the memory of its processes) and on each process's address space. It dies with the grader. Its
only way out is the judge's socket: hidden test cells serve the judge's requests there, and the executor hands over
the executed notebook there.

Nothing of the grader's environment is in view: the notebook's environment is made, not inherited, and bubblewrap,
which is the sandbox's pid 1 (its ``/proc/1/environ`` is readable inside), is started with an empty one. Grading
from a JupyterLab terminal would otherwise hand every learner the hub's API token.

The setuid and setgid programs of ``/usr`` are in view but run without privileges: bubblewrap mounts every bind
``nosuid``, sets no_new_privs and drops every capability, each enough alone. Hiding them as well would mean a walk of
``/usr`` and a bind per file for every notebook, to guard against nothing those three leave open.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SANDBOXED = PACKAGE_DIR / "sandboxed"  # the autograder's side in the sandbox: nothing in it imports the rest
SANDBOX_SIDE = ("__init__.py", SANDBOXED.name)  # of autograder/, in the sandbox (__init__.py: empty, for the package)
INSIDE = Path("/grading")  # where the run's own read-only files appear
HOME = Path("/home/learner")
UID = 1000
# bubblewrap's namespaces and user, as every sandbox has them (`missing` tries them): --disable-userns needs a user
# namespace of bubblewrap's own, which --unshare-all only tries to make
ISOLATION = ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--uid", str(UID),
             "--gid", str(UID))
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "hosts", "host.conf",
             "resolv.conf", "ssl", "ca-certificates", "fonts", "mime.types", "alternatives")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "minigpt-grade"
OUTPUT_KEEP = 1_000_000  # bytes of the sandbox's own stdout/stderr kept for the log (the notebook's output is not here)


@dataclasses.dataclass(frozen=True)
class Limits:
    memory: int  # bytes: all processes together (cgroup), and each one's address space
    processes: int = 64
    tmp_size: int = 1 << 30  # bytes of /tmp and of the home folder, each (in memory: counted in `memory`)
    timeout: float = 900.0  # seconds for the whole notebook
    cpus: float | None = None  # cores' worth of CPU time for all its processes together (cgroup); None: no cap


def bwrap() -> str | None:
    return shutil.which("bwrap")


def missing() -> str | None:
    """Why notebooks cannot be sandboxed on this machine, or None if they can."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux (this is {sys.platform})"
    path = bwrap()
    if path is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    proc = subprocess.run([path, *ISOLATION, "--ro-bind", "/", "/", "true"], capture_output=True, text=True, env={})
    if proc.returncode != 0:
        return f"bubblewrap cannot make a sandbox here: {proc.stderr.strip()[:300]}"
    return None


def _stub(module: str, chapter: str) -> str:
    return (f'raise ImportError("{module} is the course\'s reference solution, which is not available while '
            f'{chapter} is graded: write it yourself in the notebook")\n')


def command(*, chapter: str, blocked: list[str], run_dir: Path, notebook_name: str, cell_timeout: int,
            limits: Limits, threads: int = 1, program: list[str] | None = None) -> list[str]:
    """The command line that runs ``python -m autograder.sandboxed.execute`` on the notebook in ``run_dir/in``: bwrap,
    started by ``env -i`` (see the module's docstring). ``blocked``: the reference modules (``minigpt.tokens``, ...)
    the notebook may not import; ``threads``: its share of the cores; ``program``: other arguments for the
    sandbox's python than the executor's."""
    import coursekit
    import minigpt

    venv, base = Path(sys.prefix), Path(sys.base_prefix)
    args = ["env", "-i", bwrap(), *ISOLATION, "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL",
            "--tmpfs", "/", "--dev", "/dev", "--proc", "/proc",
            # the writable folders first: what is bound below stays in view inside them (a course under /tmp)
            "--size", str(limits.tmp_size), "--tmpfs", "/tmp", "--size", str(limits.tmp_size), "--tmpfs", str(HOME),
            "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        host = Path("/") / top
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for name in ("passwd", "group"):
        args += ["--ro-bind", str(run_dir / "etc" / name), f"/etc/{name}"]
    for folder in sorted({base, venv}):
        args += ["--ro-bind", str(folder), str(folder)]
    # The course's packages, where this environment installed them: coursekit whole, minigpt with the graded
    # chapter and later ones replaced by stubs, the sandbox's side of the autograder.
    kit, reference = Path(coursekit.__file__).resolve().parent, Path(minigpt.__file__).resolve().parent
    args += ["--ro-bind", str(kit), str(kit), "--ro-bind", str(reference), str(reference)]
    if (reference / "__pycache__").is_dir():
        args += ["--tmpfs", str(reference / "__pycache__")]
    for module in blocked:
        target = reference / (module.split(".", 1)[1] + ".py")
        if target.exists():
            args += ["--ro-bind", str(run_dir / "stubs" / f"{module}.py"), str(target)]
    autograder = PACKAGE_DIR
    args += ["--dir", str(autograder)]
    for name in SANDBOX_SIDE:
        args += ["--ro-bind", str(autograder / name), str(autograder / name)]
    for pycache in (autograder / "__pycache__", *sorted(SANDBOXED.rglob("__pycache__"))):
        if pycache.is_dir():
            args += ["--tmpfs", str(pycache)]
    work = HOME / chapter
    args += ["--dir", str(work),
             "--ro-bind", str(run_dir / "in"), str(INSIDE / "in"),
             "--ro-bind", str(run_dir / "sock"), str(INSIDE / "sock"),
             "--remount-ro", "/",  # the folders made above for the binds: read-only too
             "--chdir", str(work), "--clearenv"]
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(HOME), "USER": "learner",
        "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/tmp/hf",
        "TIKTOKEN_CACHE_DIR": str(kit / "data" / "tiktoken"),
        "MPLCONFIGDIR": "/tmp/matplotlib", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
        "IPYTHONDIR": "/tmp/ipython", "MINIGPT_JUDGE": str(INSIDE / "sock" / "judge"),
        "OMP_NUM_THREADS": str(threads),  # notebooks graded at once share the cores
        "NBGRADER_EXECUTION": "autograde",  # as nbgrader autograde sets it: a notebook may skip its slow demos
    }
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += [str(venv / "bin" / "python")] + (program or [
        "-m", "autograder.sandboxed.execute", str(INSIDE / "in" / notebook_name), "--timeout", str(cell_timeout)])
    return args


def prepare(run_dir: Path, chapter: str, blocked: list[str]) -> None:
    """The run's read-only files: passwd and group of the sandbox's user, and the stubs of held-back modules."""
    (run_dir / "etc").mkdir(parents=True, exist_ok=True)
    (run_dir / "etc" / "passwd").write_text(f"learner:x:{UID}:{UID}:learner:{HOME}:/bin/sh\n"
                                            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (run_dir / "etc" / "group").write_text(f"learner:x:{UID}:\nnogroup:x:65534:\n")
    (run_dir / "stubs").mkdir(exist_ok=True)
    for module in blocked:
        (run_dir / "stubs" / f"{module}.py").write_text(_stub(module, chapter))


# ---------------------------------------------------------------------------------------------------
# Total memory and processes: a cgroup per run (v1 or v2), or a watchdog


CPU_PERIOD = 100_000  # µs: the period of a run's CPU quota


class Cgroup:
    """A cgroup of one run with memory and process limits, v2 or v1 (memory and pids controllers), and its CPU: an
    equal share beside every other run, however many processes or sessions it starts (the cpu controller's weight),
    capped at ``limits.cpus`` cores' worth (its quota), where the machine offers the cpu controller."""

    def __init__(self, name: str, limits: Limits):
        self.paths: list[Path] = []
        quota = None if limits.cpus is None else max(1000, round(limits.cpus * CPU_PERIOD))
        if (CGROUP_ROOT / "cgroup.controllers").is_file():  # v2
            parent = CGROUP_ROOT / CGROUP_PARENT
            parent.mkdir(exist_ok=True)
            for controller in ("+memory +pids", "+cpu"):
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(controller)
            path = parent / name
            path.mkdir()
            self.paths = [path]
            (path / "memory.max").write_text(str(limits.memory))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
            (path / "pids.max").write_text(str(limits.processes))
            with contextlib.suppress(OSError):  # no cpu controller here: memory and processes only
                (path / "cpu.weight").write_text("100")
                if quota is not None:
                    (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD}")
            return
        for controller, settings in (("memory", {"memory.limit_in_bytes": limits.memory,
                                                 "memory.memsw.limit_in_bytes": limits.memory}),
                                     ("pids", {"pids.max": limits.processes})):
            path = CGROUP_ROOT / controller / CGROUP_PARENT / name
            path.mkdir(parents=True)
            self.paths.append(path)
            for key, value in settings.items():
                with contextlib.suppress(FileNotFoundError, PermissionError):  # no swap accounting: no memsw
                    (path / key).write_text(str(value))
        with contextlib.suppress(OSError):  # no cpu controller here: memory and processes only
            path = CGROUP_ROOT / "cpu" / CGROUP_PARENT / name
            path.mkdir(parents=True)
            self.paths.append(path)
            (path / "cpu.shares").write_text("1024")
            if quota is not None:
                (path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD))
                (path / "cpu.cfs_quota_us").write_text(str(quota))

    @classmethod
    def make(cls, limits: Limits) -> "Cgroup | None":
        """A new cgroup named after this process (so that a later grader can tell it is left over), or None
        where none can be made."""
        cls.sweep()
        try:
            return cls(f"{os.getpid()}-{uuid.uuid4().hex[:12]}", limits)
        except OSError:
            return None

    @staticmethod
    def sweep() -> None:
        """Remove the cgroups that graders no longer running left behind (killed before they could)."""
        for parent in (CGROUP_ROOT / CGROUP_PARENT, CGROUP_ROOT / "memory" / CGROUP_PARENT,
                       CGROUP_ROOT / "pids" / CGROUP_PARENT, CGROUP_ROOT / "cpu" / CGROUP_PARENT):
            for path in parent.glob("*-*") if parent.is_dir() else ():
                owner = path.name.split("-", 1)[0]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    with contextlib.suppress(OSError):
                        path.rmdir()  # only an empty cgroup can be removed: its processes died with the grader

    def enter(self) -> None:
        """In the child, before exec: this process and all it starts belong to the run's cgroup."""
        for path in self.paths:
            (path / "cgroup.procs").write_text(str(os.getpid()))

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the run for memory (v1: memory.oom_control, v2: memory.events)."""
        for path in self.paths:
            for key in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError, ValueError):
                    counts = dict(line.split() for line in (path / key).read_text().splitlines() if " " in line)
                    if int(counts.get("oom_kill", 0)) > 0:
                        return True
        return False

    def remove(self) -> None:
        """Kill whatever is left in the cgroup, then remove it."""
        for _ in range(50):
            pids = set()
            for path in self.paths:
                with contextlib.suppress(OSError):
                    pids |= {int(p) for p in (path / "cgroup.procs").read_text().split()}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()


def _watchdog(proc: subprocess.Popen, limits: Limits, stop: threading.Event, tripped: list[str]) -> None:
    """Without a cgroup: kill the run when its processes together hold more memory, or are more, than allowed."""
    import psutil

    while not stop.wait(0.2):
        try:
            family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
            rss = sum(p.memory_info().rss for p in family if p.is_running())
        except psutil.Error:
            continue
        if rss > limits.memory or len(family) > limits.processes:
            tripped.append(f"{rss / 2**30:.1f} GiB in {len(family)} processes")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return


# ---------------------------------------------------------------------------------------------------
# One run


@dataclasses.dataclass
class Outcome:
    returncode: int | None
    timed_out: bool
    seconds: float
    log: str  # the sandbox's own stdout and stderr (bwrap, the executor), cut to OUTPUT_KEEP bytes
    isolation: str  # how total memory and processes were limited: "cgroup", "watchdog" or "none"
    memory_exceeded: bool = False


def run(args: list[str], limits: Limits, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Outcome:
    """Run ``args`` (a bwrap command, or the bare executor) under the limits, and wait."""
    cgroup = Cgroup.make(limits)
    memory = limits.memory

    def preexec() -> None:
        os.setsid()
        if cgroup is not None:
            cgroup.enter()
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, AttributeError):
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the grader

    start = time.monotonic()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=preexec, env=env, cwd=cwd)
    kept: list[bytes] = []
    reader = threading.Thread(target=_keep_output, args=(proc.stdout, kept), daemon=True)
    reader.start()
    stop, tripped = threading.Event(), []
    watchdog = None
    if cgroup is None:
        watchdog = threading.Thread(target=_watchdog, args=(proc, limits, stop, tripped), daemon=True)
        watchdog.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_family(proc)
        stop.set()
        exceeded = bool(tripped) or (cgroup is not None and cgroup.out_of_memory())
        if cgroup is not None:
            cgroup.remove()
        reader.join(timeout=5)
    isolation = "cgroup" if cgroup is not None else "watchdog"
    return Outcome(None if timed_out else proc.returncode, timed_out, time.monotonic() - start,
                   b"".join(kept).decode("utf-8", "replace"), isolation, exceeded)


def _kill_family(proc: subprocess.Popen) -> None:
    """Kill a run and everything it started: its process group, and the descendants that left it (a kernel
    starts in a session of its own); in a sandbox, killing bwrap ends its whole process namespace too."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    proc.wait()


def _keep_output(stream, kept: list[bytes]) -> None:
    """Read a pipe to its end, keeping the first OUTPUT_KEEP bytes: a flood of output fills no disk and no memory."""
    size = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        if size < OUTPUT_KEEP:
            kept.append(chunk[: OUTPUT_KEEP - size])
        size += len(chunk)
