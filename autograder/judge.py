"""The judge: runs the checks of a test cell on the learner's objects, which stay where the learner's code runs.

The checks (``autograder.checks``) are written as if they held the learner's functions; what they hold are
``Remote`` stand-ins. Calling one, reading an attribute or iterating it sends a request to the other side
(``sandboxed.hidden.Server``), which runs the learner's code and answers with plain data (``sandboxed.wire``).
So nothing the learner's code does can reach the check's comparisons, its expected values or its messages: the
learner's code runs in another process (a sandbox, when ``minigpt-grade`` grades), and what comes back is only
numbers, strings, lists, tensors, or an error described by its type, message and line.

The judge is the one that asks, with one exception: while it waits for the answer to one of its requests, the
learner's side may call a module whose weights only the judge holds (``serve``: a layer of a model handed to the
learner's code, where a check scores how that model is run). Such a call is a ``{"serve": n, "input": tensor}``
message in place of the answer; the judge computes the output, records the call, answers and goes on waiting, so
the counts a score depends on are the judge's own. Calls are bounded in number and size, and a malformed one fails
the request as the learner's error.

Two ways to move the requests:

- ``RunJudge``: for one notebook graded in a sandbox, a Unix socket the hidden cells connect to, one test cell
  after the other; the verdicts stay in this process (``minigpt-grade``).
- ``autograder.trusted.judge_here``: in the same process as the learner's code (plain ``nbgrader autograde``, the
  course's tests): a trusted setting, through the same plain data.

Checks must not share state between threads (several notebooks are judged at once): randomness comes from
explicit generators or from ``seeded`` (which holds a lock), never from torch's global generator unlocked.
"""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import importlib
import logging
import select
import socket
import sys
import threading
import time
from pathlib import Path

from autograder.sandboxed import wire

log = logging.getLogger("minigpt.judge")

HELLO_TIMEOUT = 10.0  # seconds for a connection to say which test cell it serves
MAX_SESSIONS_PER_CELL = 3  # connections one notebook may open, per graded cell
MAX_SERVES = 10_000  # calls of the judge's served modules while one request runs (a beam search of the checks: ~100)
MAX_SERVE_NUMBERS = 1 << 18  # numbers in the input of one such call (the checks' models send a few hundred)
# The course's tests only: told of each test cell judged (``judging``) and of each request its checks make, with the
# answer (``requested``), to measure which arguments the checks give (tests/submissions/coverage.py). None in grading.
RECORDER = None


class LearnerError(Exception):
    """An exception of the learner's code, as the sandbox described it. Its class also derives from the
    builtin type the learner's exception derives from (``ValueError``, ``NotImplementedError``, ...), so that
    a check's ``except ValueError`` works as it would in process."""

    type_name = "Exception"
    where: dict | None = None
    not_written: str | None = None
    cell_name: str | None = None

    def __str__(self) -> str:
        return self.args[0] if self.args else ""  # the learner's message as it was (KeyError would quote it)


_ERROR_CLASSES: dict[str, type] = {}
_BUILTIN_BASES = ("NotImplementedError", "KeyError", "IndexError", "ValueError", "TypeError",
                  "AttributeError", "ZeroDivisionError", "OverflowError", "RecursionError", "MemoryError",
                  "RuntimeError", "ArithmeticError", "LookupError", "UnicodeError", "ImportError", "OSError")


def learner_error(data: dict, cell_names: dict[str, str] | None = None) -> LearnerError:
    bases = data.get("bases") if isinstance(data.get("bases"), list) else []
    builtin = next((b for b in bases if b in _BUILTIN_BASES), None)
    cls = _ERROR_CLASSES.get(builtin or "")
    if cls is None:
        parents = (LearnerError, getattr(builtins, builtin)) if builtin else (LearnerError,)
        cls = _ERROR_CLASSES[builtin or ""] = type(f"Learner{builtin or 'Error'}", parents, {})
    err = cls(_text(data.get("message"), 2000))
    err.type_name = _text(data.get("type"), 200) or "Exception"
    where = data.get("where")
    if isinstance(where, dict) and isinstance(where.get("line"), int):
        err.where = {"function": _text(where.get("function"), 200), "line": where["line"],
                     "text": _text(where.get("text"), 160), "file": _text(where.get("file"), 300) or None,
                     "cell": _text(where.get("cell"), 64) or None}
        err.cell_name = (cell_names or {}).get(err.where["cell"] or "")
    if isinstance(data.get("not_written"), str):
        err.not_written = _text(data["not_written"], 200)
    return err


def _text(value, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


class SessionLost(Exception):
    """The other side stopped answering: the cell's time limit, a dead kernel, or a closed connection."""

    grader_side = True  # coursekit.testing.call lets it through: not an error of the learner's code


class GraderError(Exception):
    """A mistake of the grader's own (a check that sent what cannot be sent, a request the sandbox could not
    read): never the learner's fault."""

    grader_side = True


# ---------------------------------------------------------------------------------------------------
# What checks hold: stand-ins for the learner's objects


class Remote:
    """An object that lives on the learner's side. Calls, attributes, iteration, len and indexing become
    requests; the answers are plain data, or more stand-ins. It compares equal only to itself."""

    __slots__ = ("_session", "_id", "_type", "_repr", "_callable")

    def __init__(self, session: "Session", ref: dict):
        self._session, self._id = session, ref["id"]
        self._type = _text(ref.get("type"), 200) or "object"
        self._repr = _text(ref.get("repr"), wire.MAX_REPR) or f"<{self._type} object>"
        self._callable = bool(ref.get("callable"))

    def __call__(self, *args, **kwargs):
        return self._session.request("call", self, args=args, kwargs=kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # Python's own protocol lookups stay on this side
        return self._session.request("getattr", self, name=name)

    def __iter__(self):
        return self._session.request("iter", self)

    def __next__(self):
        return self._session.request("next", self)

    def __len__(self):
        return self._session.request("len", self)

    def __getitem__(self, key):
        return self._session.request("getitem", self, args=(key,))

    def __repr__(self) -> str:
        return self._repr

    def __eq__(self, other) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        return True


def type_of(obj) -> str:
    """The type name of a learner's object, on whichever side it is."""
    return obj._type if isinstance(obj, Remote) else wire.type_name(obj)


def is_instance(obj, *type_names: str) -> bool:
    """isinstance(obj, one of the types named "module.Name"), asked where the object lives."""
    if isinstance(obj, Remote):
        return bool(obj._session.request("isinstance", obj, types=list(type_names)))
    from autograder.sandboxed.helpers import named_type

    return isinstance(obj, tuple(named_type(n) for n in type_names))


def set_attr(obj, name: str, value) -> None:
    if isinstance(obj, Remote):
        obj._session.request("setattr", obj, name=name, args=(value,))
    else:
        setattr(obj, name, value)


def collect(obj, limit: int = 10_000) -> tuple[list, bool]:
    """(the items of an iterable, whether it ended), in one request: ``limit`` items, and the one after them if
    there is one (taken to tell whether it ended; nothing taken is dropped)."""
    if isinstance(obj, Remote):
        return obj._session.request("collect", obj, limit=limit)
    import itertools

    items = list(itertools.islice(iter(obj), limit + 1))
    return items, len(items) <= limit


def make(kind: str, *args, **kwargs) -> Remote:
    """A helper object (``sandboxed.helpers``, "module.Name") built on the learner's side for the test being
    judged: always a stand-in, however plain the object (GPT-2's merge table stays there)."""
    return _current().session.request("make", None, kind=kind, args=args, kwargs=kwargs)


def ask(kind: str, *args, **kwargs):
    """What a helper function (``sandboxed.helpers``, "module.name") returns when run on the learner's side, e.g.
    the bytes a learner's cache holds: plain data, or a stand-in for what is not."""
    return _current().session.request("ask", None, kind=kind, args=args, kwargs=kwargs)


_options = threading.local()


@contextlib.contextmanager
def learner_side(**options):
    """What the learner's side holds while this block's requests run: ``no_grad=True``, ``seed=N`` (torch's
    and ``random``'s generators seeded just before each request), ``forbid=["torch.softmax"]``."""
    before = getattr(_options, "value", {})
    _options.value = {**before, **options}
    try:
        yield
    finally:
        _options.value = before


_SEED_LOCK = threading.RLock()


@contextlib.contextmanager
def seeded(seed: int):
    """torch's global generator seeded for this block, and given back after; one block at a time in this process
    (the judge runs several notebooks' checks in threads)."""
    import torch

    with _SEED_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# ---------------------------------------------------------------------------------------------------
# Sessions: one test cell's conversation with the learner's side


class Served:
    """A module of the judge's (``serve``) that the learner's side calls through a stand-in of it, the weights
    staying here: every call is computed here, from what the learner's side sent, and recorded (``shapes``)."""

    def __init__(self, module, number: int):
        import torch

        self.module, self.id = module, number
        weight = module.weight
        self.in_features, self.dtype = int(weight.shape[-1]), weight.dtype
        self.shapes: list[tuple[int, ...]] = []  # the shape of each input, in order
        self._torch = torch

    def __call__(self, x):
        torch = self._torch
        if not isinstance(x, torch.Tensor):
            raise wire.WireError(f"an input that is {wire.type_name(x)}, not a tensor")
        dtype = str(self.dtype).removeprefix("torch.")
        if x.dtype != self.dtype or not 1 <= x.dim() <= 4 or x.shape[-1] != self.in_features:
            raise wire.WireError(f"an input of shape {tuple(x.shape)} and dtype {str(x.dtype).removeprefix('torch.')}"
                                 f", where the module takes (..., {self.in_features}) {dtype}")
        if x.numel() > MAX_SERVE_NUMBERS:
            raise wire.WireError(f"an input of {x.numel():,} numbers (the limit is {MAX_SERVE_NUMBERS:,})")
        with torch.no_grad():
            out = self.module(x.detach())
        self.shapes.append(tuple(x.shape))
        return out

    def take(self) -> list[tuple[int, ...]]:
        """The input shapes of the calls since the last ``take`` (then forgotten)."""
        shapes, self.shapes = self.shapes, []
        return shapes


def serve(module) -> Served:
    """Serve ``module`` (a ``torch.nn.Linear`` of the judge's) to the learner's side of the test cell being judged:
    a helper there puts a stand-in in its place (``kv_cache.served_gpt``, given ``.id``), whose every forward
    asks this process for the output. The learner's side never holds the weights, so it cannot compute what the
    module computes without this process seeing it: the returned object records every call (``take``), the
    count a check scores."""
    session = _current().session
    served = Served(module, len(session.services))
    session.services.append(served)
    return served


class Answered:
    """A function of the judge's that the learner's side calls through a stand-in (``serve_function``): every call
    is a request this process answers, its argument recorded (``calls``), the count a check scores."""

    def __init__(self, fn, number: int):
        self.fn, self.id = fn, number
        self.calls: list = []  # the argument of each call, in order

    def __call__(self, x):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise wire.WireError(f"an argument that is {wire.type_name(x)}, not a number")
        self.calls.append(x)
        return self.fn(x)


def serve_function(fn) -> Answered:
    """Serve ``fn`` (a function of one number, e.g. chapter 8's ``evaluate(steps_done)``) to the learner's side of
    the test cell being judged, as ``serve`` serves a module: a helper there calls it through ``ask_judge`` (given
    ``.id``), so each call is one this process answers and records, whatever the learner's side says of it."""
    session = _current().session
    served = Answered(fn, len(session.services))
    session.services.append(served)
    return served


class _Pending:
    """What the learner's side asked of the served modules while one request ran."""

    def __init__(self):
        self.calls = 0
        self.refused: str | None = None  # why a call was refused: the request then fails, as the learner's error


class Session:
    def __init__(self, cell_names: dict[str, str] | None = None):
        self.cell_names = cell_names or {}
        self.services: list[Served | Answered] = []
        self._pending: _Pending | None = None

    def exchange(self, message: dict) -> dict:
        raise NotImplementedError

    def remote(self, ref: dict) -> Remote:
        if not isinstance(ref, dict) or not isinstance(ref.get("id"), int):
            raise wire.WireError("a malformed reference")
        return Remote(self, ref)

    def request(self, op: str, target: Remote | None = None, *, args=(), kwargs=None, **fields):
        value = None
        try:
            value = self._request(op, target, args, kwargs, fields)
            return value
        finally:
            if RECORDER is not None:
                RECORDER.requested(self, op, target, args, kwargs or {}, fields, value)

    def _request(self, op: str, target: Remote | None, args, kwargs, fields: dict):
        message = {"op": op, **fields}
        if target is not None:
            if target._session is not self:
                raise GraderError("a stand-in of another test cell")
            message["target"] = target._id
        try:
            message["args"] = wire.encode(list(args), _refer)
            message["kwargs"] = wire.encode(dict(kwargs or {}), _refer)
        except wire.Unsendable as err:
            raise GraderError(f"the check tried to send {err}") from None
        options = getattr(_options, "value", None)
        if options:
            message["options"] = options
        self._pending = pending = _Pending()
        try:
            reply = self.exchange(message)
            while isinstance(reply, dict) and "serve" in reply:  # a served module's forward, asked meanwhile
                if pending.calls > MAX_SERVES + 100:
                    raise SessionLost("the notebook's side went on calling the grader's modules after they refused")
                reply = self.exchange(self.serve(reply))
        finally:
            self._pending = None
        if pending.refused is not None:
            raise learner_error({"type": "WireError", "bases": ["Exception"],
                                 "message": f"the notebook's side sent the grader {pending.refused}"})
        if "value" in reply:
            try:
                value = wire.decode(reply["value"], self.remote)
            except wire.WireError as err:
                raise learner_error({"type": "UnreadableValue", "bases": ["Exception"],
                                     "message": f"returned {err}"}) from None
            return (value, bool(reply.get("exhausted"))) if op == "collect" else value
        if reply.get("stop") is True:
            raise StopIteration
        if isinstance(reply.get("error"), dict):
            raise learner_error(reply["error"], self.cell_names)
        if "bad" in reply:
            raise GraderError(f"the learner's side could not read a request: {_text(reply['bad'], 500)}")
        raise SessionLost("an answer that is not one")

    def serve(self, message: dict) -> dict:
        """The answer to the learner's side's call of a served module (``serve``) while a request runs:
        {"served": its output} or {"refused": why}. Whatever is wrong with the call (no request pending, too many
        or too large calls, a malformed input) is refused, and the pending request then fails as the learner's
        error (a ``WireError``); nothing of it can raise here."""
        pending = self._pending
        if pending is None:
            return {"refused": "a call of a served module while no request is pending"}
        pending.calls += 1
        if pending.refused is None:
            try:
                number = message.get("serve")
                if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < len(self.services):
                    raise wire.WireError(f"a call of no module the grader serves ({_text(repr(number), 40)})")
                if pending.calls > MAX_SERVES:
                    raise wire.WireError(f"more than {MAX_SERVES:,} calls of its modules in one request")
                out = self.services[number](wire.decode(message.get("input")))
                return {"served": wire.encode(out)}
            except wire.WireError as err:
                pending.refused = f"a call it refuses: {err}"
            except Exception as err:  # noqa: BLE001 (an input the module cannot take is the sender's)
                why = _text(str(err), 300)
                pending.refused = f"a call its module could not compute ({type(err).__name__}: {why})"
        return {"refused": pending.refused}


def _refer(obj) -> dict:
    if isinstance(obj, Remote):
        return {"$": "ref", "id": obj._id}
    raise wire.Unsendable(f"a {type(obj).__name__} of the grader's (only plain data and stand-ins can be sent)")


class SocketSession(Session):
    def __init__(self, sock: socket.socket, deadline: float, cell_names: dict[str, str]):
        super().__init__(cell_names)
        self.sock, self.deadline = sock, deadline

    def exchange(self, message: dict) -> dict:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SessionLost("the test cell ran past its time limit")
        self.sock.settimeout(left)
        try:
            wire.send(self.sock, message)
            return wire.receive(self.sock, self.deadline)
        except (OSError, EOFError, wire.WireError) as err:  # socket.timeout is an OSError
            raise SessionLost(_lost_reason(err)) from None


def _lost_reason(err: Exception) -> str:
    if isinstance(err, TimeoutError):
        return "the learner's code did not answer before the cell's time limit"
    if isinstance(err, EOFError):
        return "the notebook stopped this test before it finished (the cell's time limit, or the kernel died)"
    return f"the connection to the notebook broke ({type(err).__name__}: {err})"


# ---------------------------------------------------------------------------------------------------
# Checks, by test cell


_CELLS: dict[str, object] = {}
_LOADED = threading.Lock()


WHOLE = "the whole cell"  # the one part of a cell that declares none


def cell(grade_id: str, parts: dict[str, float] | None = None):
    """Decorator: this function checks the test cell ``grade_id`` (its arguments: what the hidden test passes).

    ``parts``: the cell's checks by name and weight, e.g. ``{"values": 3, "int16 ids": 1}``; the cell's points are
    shared among them by weight, and each passes or fails on its own (``with part("values"): ...``), so one edge
    case costs its share, not the whole cell. Without ``parts`` the cell is one check."""
    declared = dict(parts or {WHOLE: 1})
    if not declared or not all(isinstance(w, (int, float)) and w > 0 for w in declared.values()):
        raise ValueError(f"{grade_id}: parts need positive weights, got {declared}")

    def register(fn):
        if grade_id in _CELLS and _CELLS[grade_id] is not fn:
            raise ValueError(f"two checks for the test cell {grade_id}")
        fn.parts = declared
        _CELLS[grade_id] = fn
        return fn
    return register


def parts_of(grade_id: str) -> dict[str, float]:
    """{part: weight} of a test cell's checks (loaded as judging loads them); {} for a cell without checks."""
    if grade_id not in _CELLS and grade_id in _modules_by_cell():
        _load(_modules_by_cell()[grade_id])
    fn = _CELLS.get(grade_id)
    return dict(fn.parts) if fn is not None else {}


@contextlib.contextmanager
def part(name: str):
    """One weighted part of the test cell being judged (declared in its ``@cell(..., parts=...)``): an assertion
    that fails inside, or an error of the learner's code, fails this part and the check goes on with the next.
    A part entered several times (in a loop) passes only if it passes every time; its first failure is kept."""
    ctx = _current()
    if name not in ctx.declared:
        raise GraderError(f"a part {name!r} that the cell does not declare ({', '.join(ctx.declared)})")
    from coursekit.testing import describe_error

    try:
        yield
    except (AssertionError, LearnerError) as err:
        if ctx.parts.get(name) is None:  # its first failure, even after a pass in an earlier turn of a loop
            ctx.parts[name] = (str(err) or "failed") if isinstance(err, AssertionError) else describe_error(err)
    else:
        ctx.parts.setdefault(name, None)


def checks(chapter: str) -> dict[str, object]:
    """{grade_id: check} once the checks of ``chapter`` (its module in ``autograder.checks``, named as in
    ``minigpt.CHAPTERS``) are imported."""
    from minigpt import CHAPTERS

    if chapter in CHAPTERS:
        _load(CHAPTERS[chapter])
    return _CELLS


def _load(module: str) -> None:
    import autograder.checks as package

    with _LOADED:
        importlib.import_module(f"{package.__name__}.{module}")


@functools.cache
def _modules_by_cell() -> dict[str, str]:
    """{grade_id: check module} read from the modules' source (``@cell("...")``), so that judging one test cell
    imports only its own chapter's checks."""
    import ast

    import autograder.checks as package

    found = {}
    for folder in package.__path__:
        for path in sorted(Path(folder).glob("[!_]*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "cell" and node.args and \
                        isinstance(node.args[0], ast.Constant):
                    found[node.args[0].value] = path.stem
    return found


@dataclasses.dataclass
class Part:
    """One weighted part of a test cell's checks, and what it found (``message`` is empty when it passed)."""
    name: str
    weight: float
    passed: bool
    message: str = ""


@dataclasses.dataclass
class Verdict:
    grade_id: str
    status: str  # passed | failed | unfinished (the test did not end) | grader-error
    message: str = ""
    seconds: float = 0.0
    parts: list[Part] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def fraction(self) -> float:
        """The share of the cell's points earned: the weights of the parts that passed over all the weights.
        A grader error earns nothing here (the instructor is told; the learner is not charged by the message)."""
        if self.status == "passed":
            return 1.0
        if self.status == "grader-error" or not self.parts:
            return 0.0
        return sum(p.weight for p in self.parts if p.passed) / sum(p.weight for p in self.parts)

    def score(self, points: float) -> float:
        """The cell's score out of its ``points``: what every grader records (``minigpt-grade``, plain nbgrader)."""
        return round(points * self.fraction, 2)

    @property
    def ename(self) -> str:
        """The name a failed verdict is shown under, as an error of the cell."""
        return {"failed": "AssertionError", "unfinished": "Unfinished"}.get(self.status, "GraderError")

    def parts_report(self) -> str:
        """A line for each part of a cell of several, its weight and whether it passed; "" for a cell of one part."""
        if len(self.parts) < 2:
            return ""
        total = sum(p.weight for p in self.parts)
        return "".join(f"{'passed' if p.passed else 'FAILED'}: {p.name} ({p.weight:g} of {total:g} of this cell's "
                       f"points)\n" for p in self.parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(**{**d, "parts": [Part(**p) for p in d.get("parts", [])]})


class _Context(threading.local):
    session: Session | None = None
    verdicts: dict[str, Verdict] | None = None
    declared: dict[str, float] = {}
    parts: dict[str, str | None] = {}  # part -> its first failure, None when it passed


_context = _Context()


def _current() -> _Context:
    if _context.session is None:
        raise GraderError("no test is being judged in this thread")
    return _context


def earlier(grade_id: str) -> Verdict | None:
    """The verdict of an earlier test cell of the notebook being judged (to say where a loss comes from)."""
    return (_current().verdicts or {}).get(grade_id)


def because_of(**uses: str) -> str:
    """A note for a failure of code that calls the learner's functions of earlier test cells: which of them fail
    their own tests, so the learner fixes that first. ``because_of(softmax="test_softmax")`` gives "it uses your
    softmax, which fails its own test (test_softmax): fix that first", or "" when they pass (or did not run)."""
    broken = [(name, cell) for name, cell in uses.items()
              if (v := earlier(cell)) is not None and v.status == "failed"]
    if not broken:
        return ""
    names = " and ".join(name for name, _ in broken)
    cells = ", ".join(cell for _, cell in broken)
    verb = "fails its own test" if len(broken) == 1 else "fail their own tests"
    return f"it uses your {names}, which {verb} ({cells}): fix that first, this may be the same mistake"


def judge(session: Session, grade_id: str, objects: list, verdicts: dict[str, Verdict]) -> Verdict:
    """Run the checks of ``grade_id`` on the stand-ins ``objects``: the verdict, never an exception."""
    from coursekit.testing import describe_error

    start = time.monotonic()
    try:
        declared = parts_of(grade_id)
    except Exception:  # noqa: BLE001 (a check module that does not import)
        log.exception("the checks of %s could not be loaded", grade_id)
        declared = {}
    if not declared:
        return Verdict(grade_id, "grader-error", f"no checks for the test cell {grade_id}")
    ctx = _context
    ctx.session, ctx.verdicts, ctx.declared, ctx.parts = session, verdicts, declared, {}
    if RECORDER is not None:
        RECORDER.judging(session, grade_id, objects)
    status, stopped = "passed", ""  # stopped: why the check ended before its end
    try:
        _CELLS[grade_id](*objects)
    except AssertionError as err:
        stopped = str(err) or "failed"
    except LearnerError as err:  # an error of the learner's code that the check did not expect
        stopped = describe_error(err)
    except SessionLost as err:
        status, stopped = "unfinished", f"the hidden tests did not finish: {err}"
    except Exception:  # noqa: BLE001 (a bug of the grader's; its traceback goes to the instructor's log only)
        log.exception("the checks of %s failed", grade_id)
        status, stopped = "grader-error", \
            "the grader could not check this cell (an error of the grader's, reported to the instructor)"
    finally:
        found = ctx.parts
        ctx.session = ctx.verdicts = None
        ctx.declared, ctx.parts = {}, {}
    parts = []
    for name, weight in declared.items():
        if name in found:
            message = found[name] or ""
        elif stopped:  # not reached: what stopped the check (for a cell of one part, its failure)
            message = stopped
        else:  # the check ended without entering it: a check that never tests a part it declares fails it
            message = "" if name == WHOLE else "not checked (the check never reached this part)"
        parts.append(Part(name, weight, not message, message))
    failed = [p for p in parts if not p.passed]
    if status == "passed" and failed:
        status = "failed"
    if status == "grader-error" or (stopped and not failed):
        message = stopped
    elif len(parts) == 1 or not failed:
        message = failed[0].message if failed else ""
    else:
        total = sum(p.weight for p in parts)
        message = "\n".join(f"[{p.name}: {p.weight:g} of {total:g}] {p.message}" for p in failed)
    return Verdict(grade_id, status, message, time.monotonic() - start, parts)


# ---------------------------------------------------------------------------------------------------
# A sandboxed notebook: its hidden cells connect to a socket


class RunJudge:
    """The judge of one notebook run: listens on ``path``; each connection is one hidden test cell saying which
    (``hello``), then answering the checks' requests. Connections are served one at a time, each test cell at
    most once, and only the chapter's own test cells; the verdicts stay here (``verdicts``)."""

    def __init__(self, path: Path, grade_ids: list[str], cell_names: dict[str, str], cell_timeout: float):
        self.path, self.grade_ids, self.cell_names = Path(path), list(grade_ids), dict(cell_names)
        self.cell_timeout = cell_timeout
        self.verdicts: dict[str, Verdict] = {}
        self.executed: dict | None = None  # the executor's report of the run (untrusted: only shown)
        self.kernel_started = False  # the executor said its kernel answered, before the first cell (execute.py)
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._sessions = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(4)
        self._listener.settimeout(0.2)
        # __exit__ wakes the serving thread through this pair at once (a timeout on accept cost each run 0.1 s)
        self._wake, self._woken = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name=f"judge {self.path.parent.name}", daemon=True)

    def __enter__(self) -> "RunJudge":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """After the run: serve what is still waiting (the executor's report may come in its last moment)."""
        self._stop.set()
        self._wake.send(b"x")
        self._thread.join()
        self._wake.close()
        self._woken.close()
        self._listener.settimeout(0)
        with contextlib.suppress(OSError):
            while self._sessions < self._max_sessions:
                self._accept_one()
        self._listener.close()
        self.path.unlink(missing_ok=True)

    @property
    def _max_sessions(self) -> int:
        return MAX_SESSIONS_PER_CELL * max(1, len(self.grade_ids)) + 3  # + the executor's "started", its report

    def _serve(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None:  # this thread's OpenMP team as the process set it (run.py: one thread), not one
            torch.set_num_threads(torch.get_num_threads())  # per core, whose spinning costs ms a served call
        while not self._stop.is_set() and self._sessions < self._max_sessions:
            if self._woken in select.select([self._listener, self._woken], [], [])[0]:
                return  # __exit__ serves what is still waiting
            try:
                self._accept_one()
            except TimeoutError:
                continue
            except OSError:
                return

    def _accept_one(self) -> None:
        conn, _ = self._listener.accept()
        self._sessions += 1
        with conn:
            try:
                self._session(conn)
            except Exception:  # noqa: BLE001 (one broken connection must not end the others)
                log.exception("a judge session of %s broke", self.path)

    def _session(self, conn: socket.socket) -> None:
        conn.settimeout(HELLO_TIMEOUT)
        try:
            hello = wire.receive(conn, time.monotonic() + HELLO_TIMEOUT)
        except (OSError, EOFError, wire.WireError):
            return
        if "executed" in hello:
            self.executed = hello
            return
        if hello.get("started") is True:
            self.kernel_started = True
            return
        grade_id, objects = hello.get("hello"), hello.get("objects")
        why = None
        if not isinstance(grade_id, str) or grade_id not in self.grade_ids:
            why = f"{str(grade_id)[:80]!r} is not a test cell of this notebook"
        elif grade_id in self.verdicts:
            why = f"{grade_id} was already judged in this run"
        elif not isinstance(objects, list) or len(objects) > 16:
            why = "a malformed hello"
        if why:
            self.refused.append(why)
            with contextlib.suppress(OSError, wire.WireError):
                wire.send(conn, {"op": "refused", "why": why})
            return
        session = SocketSession(conn, time.monotonic() + self.cell_timeout, self.cell_names)
        try:
            stand_ins = [session.remote(ref) for ref in objects]
        except wire.WireError:
            return
        self.verdicts[grade_id] = judge(session, grade_id, stand_ins, self.verdicts)
        with contextlib.suppress(OSError, wire.WireError):
            conn.settimeout(5)
            wire.send(conn, {"op": "done"})
