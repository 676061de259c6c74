"""What a hidden test cell runs: ``check("test_pre_split", pre_split)``. It never judges anything.

Graded by ``minigpt-grade``, a notebook runs in a sandbox, and ``check`` only serves: it connects to the judge
outside (the Unix socket named by ``MINIGPT_JUDGE``), which runs the checks of that test cell and asks for
calls of the learner's objects ("call pre_split with this text", "next item of this generator"); each answer
goes back as plain data (``autograder.sandboxed.wire``). The expected answers, the checks and the verdict stay outside,
where no learner code runs. While the learner's code answers a request, a module whose weights are the judge's (a
layer of a model the judge had built here: ``ask_judge``) asks the judge for its output, on the same connection:
the judge computes it and counts the call.

Run anywhere else (plain ``nbgrader autograde``, the course's own tests) there is no judge to connect to, and
the judge runs in this process instead: a trusted setting. The wall is the same plain data, so the verdicts
are the same; only the isolation is missing.

A hidden test leaves the learner's state as it found it: random generators (torch, ``random``, numpy) and
torch's thread count.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import random
import socket
import sys

from autograder.sandboxed import wire

JUDGE_ENV = "MINIGPT_JUDGE"
# torch's threads while a hidden test runs: one (the course's tensors are small: a second thread only waits); the
# course's tests set another to run the checks on another kernel path (tests/kernel_paths.py)
CHECK_THREADS_ENV = "MINIGPT_CHECK_THREADS"
MAX_OBJECTS = 100_000  # objects one session may hold in the sandbox


def check(grade_id: str, *objects) -> None:
    """The hidden tests of the test cell ``grade_id``, on the learner's ``objects``."""
    address = os.environ.get(JUDGE_ENV)
    with untouched():
        if address:
            serve(address, grade_id, objects)
        else:
            from autograder.trusted import judge_here  # the trusted setting: the judge in this process

            judge_here(grade_id, objects)


@contextlib.contextmanager
def untouched():
    """Give back the learner's random state and torch's thread count, whatever the block does (torch's only if the
    notebook has imported torch: a chapter without it does not pay for importing it here)."""
    state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        with torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext():
            if torch is not None:
                torch.set_num_threads(int(os.environ.get(CHECK_THREADS_ENV, "1")))
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(threads)
        random.setstate(state)
        if np_state is not None:
            np.random.set_state(np_state)


def serve(address: str, grade_id: str, objects: tuple) -> None:
    """Answer the judge's requests about ``objects`` until it is done with this test cell."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        server = Server(objects, lambda message: (wire.send(sock, message), wire.receive(sock))[1])
        wire.send(sock, {"hello": grade_id, "objects": [server.describe(i) for i in range(len(objects))]})
        while True:
            message = wire.receive(sock)
            op = message.get("op")
            if op == "done":
                return
            if op == "refused":
                raise RuntimeError(f"the grader refused this test cell: {message.get('why')}")
            wire.send(sock, server.answer(message))


class Server:
    """The sandbox's side of one test cell: the objects the judge may use, by number, and the answer to each of
    its requests. Whatever the learner's code returns goes back as plain data; what is not plain data stays
    here and goes back as a reference, a number the judge can ask about."""

    def __init__(self, objects, channel=None):
        self.objects = dict(enumerate(objects))
        self.counter = itertools.count(len(objects))
        self.channel = channel  # a message to the judge -> its answer, while one of its requests runs

    def describe(self, i: int) -> dict:
        obj = self.objects[i]
        return {"$": "ref", "id": i, "type": wire.type_name(obj), "repr": wire.safe_repr(obj),
                "callable": callable(obj)}

    def refer(self, obj) -> dict:
        if len(self.objects) >= MAX_OBJECTS:
            raise wire.Unsendable(f"more than {MAX_OBJECTS:,} objects in one test")
        i = next(self.counter)
        self.objects[i] = obj
        return self.describe(i)

    def resolve(self, ref: dict):
        try:
            return self.objects[ref["id"]]
        except (KeyError, TypeError):
            raise wire.WireError(f"no object {ref.get('id')!r} in this test") from None

    def answer(self, message: dict) -> dict:
        """The reply to one request: {"value": ...}, {"stop": true}, {"error": ...}, or {"bad": ...} for a
        request this side cannot read (a bug of the grader's, never the learner's)."""
        try:
            op = message["op"]
            target = self.resolve({"id": message["target"]}) if "target" in message else None
            args = wire.decode(message.get("args", []), self.resolve)
            kwargs = wire.decode(message.get("kwargs", {"$": "dict", "v": []}), self.resolve)
            options = message.get("options") or {}
            if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(options, dict):
                raise wire.WireError("malformed arguments")
        except (KeyError, TypeError, wire.WireError) as err:
            return {"bad": f"{type(err).__name__}: {err}"}
        try:
            with _options(options), _talking(self.channel):
                if op == "next":
                    try:
                        value = next(target)
                    except StopIteration:
                        return {"stop": True}
                elif op == "collect":  # up to `limit` items of an iterable, in one reply
                    limit = int(message.get("limit", 10_000))
                    iterator = iter(target)
                    value = list(itertools.islice(iterator, limit))
                    try:
                        extra = next(iterator)
                    except StopIteration:
                        return {"value": wire.encode(value, self.refer), "exhausted": True}
                    value.append(extra)
                    return {"value": wire.encode(value, self.refer), "exhausted": False}
                elif op == "make":  # a helper object stays on this side, however plain: the judge holds a reference
                    from autograder.sandboxed import helpers

                    return {"value": self.refer(helpers.make(_name(message, "kind"), *args, **kwargs))}
                elif op == "ask":  # a helper function's answer (plain data, or a reference)
                    from autograder.sandboxed import helpers

                    value = helpers.make(_name(message, "kind"), *args, **kwargs)
                else:
                    value = self._run(op, target, args, kwargs, message)
        except KeyboardInterrupt:
            raise  # the cell's time limit: this test ends here
        except BaseException as err:  # noqa: BLE001 (SystemExit in the learner's code is an answer too)
            return {"error": error_data(err)}
        try:
            return {"value": wire.encode(value, self.refer)}
        except wire.Unsendable as err:
            return {"error": {"type": "UnsendableValue", "bases": ["Exception"],
                              "message": f"returned {err}, which the grader cannot read"}}

    def _run(self, op, target, args, kwargs, message):
        if op == "call":
            return target(*args, **kwargs)
        if op == "getattr":
            return getattr(target, _name(message))
        if op == "setattr":
            setattr(target, _name(message), args[0])
            return None
        if op == "iter":
            return iter(target)
        if op == "len":
            return len(target)
        if op == "getitem":
            return target[args[0]]
        if op == "isinstance":
            from autograder.sandboxed.helpers import named_type

            return isinstance(target, tuple(named_type(name) for name in message["types"]))
        if op == "release":
            for i in args:
                self.objects.pop(i, None)
            return None
        raise wire.WireError(f"unknown request {op!r}")


_channel = None  # the Server's way to the judge while it answers one of its requests


@contextlib.contextmanager
def _talking(channel):
    global _channel
    before, _channel = _channel, channel
    try:
        yield
    finally:
        _channel = before


class Refused(BaseException):
    """The judge refused a call of one of its served modules (too many, too large, malformed): the request ends
    (a BaseException, so that the learner's ``except Exception`` lets it through), and the judge fails it."""


def ask_judge(service: int, x):
    """The output of the module ``service`` that the judge serves (``judge.serve``: its weights are only there) on
    the tensor ``x``, asked while the judge waits for the answer to one of its requests, which is the only time the
    judge reads this side."""
    if _channel is None:
        raise RuntimeError("this module runs on the grader's side: it answers only while a hidden test runs")
    reply = _channel({"serve": service, "input": wire.encode(x)})
    if isinstance(reply, dict) and "served" in reply:
        return wire.decode(reply["served"])
    raise Refused(str(reply.get("refused") if isinstance(reply, dict) else "no answer")[:500])


def _name(message: dict, key: str = "name") -> str:
    name = message.get(key)
    if not isinstance(name, str) or len(name) > 200:
        raise wire.WireError(f"a {key} that is not a short string")
    return name


@contextlib.contextmanager
def _options(options: dict):
    """What the judge asks to hold while a request runs: ``seed`` (torch's generator seeded just before, so that
    a sampler's draws can be compared), ``no_grad``, ``forbid`` (functions that raise if the learner's code
    calls them, e.g. ["torch.softmax"] to tell whether a softmax was written or borrowed)."""
    with contextlib.ExitStack() as stack:
        if options.get("no_grad"):
            import torch

            stack.enter_context(torch.no_grad())
        for dotted in options.get("forbid", []):
            stack.enter_context(_forbidden(dotted))
        seed = options.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            import torch

            torch.manual_seed(seed)
            random.seed(seed)
        yield


@contextlib.contextmanager
def _forbidden(dotted: str):
    import importlib

    module_name, _, attr = _name({"name": dotted}).rpartition(".")
    try:
        owner = importlib.import_module(module_name)
    except ImportError:  # a method: "torch.Tensor.softmax"
        outer, _, cls = module_name.rpartition(".")
        owner = getattr(importlib.import_module(outer), cls)
    original = getattr(owner, attr)

    def refuse(*args, **kwargs):
        raise Forbidden(f"{dotted} is not available here")

    setattr(owner, attr, refuse)
    try:
        yield
    finally:
        setattr(owner, attr, original)


class Forbidden(RuntimeError):
    """Raised by a function the judge took away for one request."""


def error_data(err: BaseException) -> dict:
    """An exception of the learner's code as plain data: its type and bases, message, where in the learner's
    code it was raised, and for a stub, which function still raises NotImplementedError."""
    from coursekit.testing import innermost_function, learner_frame

    try:
        message = str.__add__("", str(err))
    except BaseException:  # noqa: BLE001 (a hostile __str__)
        message = f"<{wire.type_name(err)} whose message could not be read>"
    data = {"type": wire.type_name(err), "message": message[:2000],
            "bases": [t.__name__ for t in type(err).__mro__ if t.__module__ == "builtins"]}
    try:
        data["where"] = learner_frame(err.__traceback__)
        if isinstance(err.__cause__, StopIteration):  # "generator raised StopIteration": the line is the cause's
            data["where"] = learner_frame(err.__cause__.__traceback__) or data["where"]
        if isinstance(err, NotImplementedError):
            data["not_written"] = innermost_function(err.__traceback__)
    except Exception:  # noqa: BLE001 (a frame we cannot read is a place we do not name)
        pass
    return data
