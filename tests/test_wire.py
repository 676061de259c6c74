"""autograder/sandboxed/wire.py against a hostile sender: every reply the judge reads is bounded in time and memory
before anything is computed from it, only ``WireError`` (or ``TimeoutError``, ``EOFError``) comes out of the reader, a
reply has one deadline however it is dripped, and its strings are valid Unicode. What crosses and what stays
behind is tested in test_judge.py; here, what a learner could send to hurt the grader."""
from __future__ import annotations

import base64
import collections
import contextlib
import json
import math
import socket
import struct
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from autograder import judge
from autograder.sandboxed import wire

FAST = 1.0  # seconds: what refusing any one message may take, on a busy machine
HASH_MODULUS = 2 ** 61 - 1  # int k and k + HASH_MODULUS share their hash (sys.hash_info.modulus)


@contextlib.contextmanager
def within(seconds: float = FAST):
    start = time.perf_counter()
    yield
    assert time.perf_counter() - start < seconds


def refused(data, match: str | None = None) -> None:
    with within(), pytest.raises(wire.WireError, match=match):
        wire.decode(data)


@contextlib.contextmanager
def sender(chunks, pause: float = 0.0):
    """A socket whose other end sends ``chunks`` from a thread, ``pause`` seconds apart, then closes its side (and
    gives up quietly when the reader has stopped reading)."""
    ours, theirs = socket.socketpair()

    def send():
        with contextlib.suppress(OSError):
            for chunk in chunks:
                theirs.sendall(chunk)
                time.sleep(pause)
            theirs.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield ours
    finally:
        ours.close()
        thread.join()
        theirs.close()


def nested(depth: int) -> list:
    value = []
    for _ in range(depth):
        value = [value]
    return value


def framed(raw: bytes) -> bytes:
    return struct.pack(">Q", len(raw)) + raw


def received(raw: bytes):
    with sender([framed(raw)]) as sock:
        return wire.receive(sock, time.monotonic() + 30)


# ---------------------------------------------------------------- sizes checked before arithmetic


def test_a_shape_of_800_000_dimensions_is_refused_at_once():
    """math.prod of this shape held the GIL for 8.7 s; its JSON is 2.3 MB."""
    message = {"value": {"$": "tensor", "dtype": "float32", "shape": [2] * 800_000 + [0], "data": ""}}
    refused(message["value"], "800,001 dimensions")
    raw = json.dumps(message).encode()
    with within():
        value = received(raw)["value"]
        with pytest.raises(wire.WireError, match="dimensions"):
            wire.decode(value)


@pytest.mark.parametrize("data, why", [
    ({"$": "tensor", "dtype": "float32", "shape": [1] * 71, "data": "AAAAAA=="}, "71 dimensions"),
    ({"$": "ndarray", "dtype": "<f4", "shape": [1] * 71, "data": "AAAAAA=="}, "71 dimensions"),
    ({"$": "tensor", "dtype": "float32", "shape": [2 ** 70], "data": ""}, "not a list of sizes"),
    ({"$": "tensor", "dtype": "float32", "shape": [2 ** 20, 2 ** 20], "data": ""}, "more than"),
    ({"$": "tensor", "dtype": "float32", "shape": [-1], "data": ""}, "not a list of sizes"),
    ({"$": "tensor", "dtype": "float32", "shape": [True], "data": "AAAAAA=="}, "not a list of sizes"),
    ({"$": "tensor", "dtype": "float32", "shape": [1], "data": "AAAAAA"}, "bytes of data"),
    ({"$": "tensor", "dtype": "float32", "shape": [1], "data": "AAAAAAA="}, "5 bytes of data, not 4"),
    ({"$": "tensor", "dtype": "float32", "shape": [1], "data": "éééé"}, "bytes of data|base64"),
    ({"$": "tensor", "dtype": ["float32"], "shape": [1], "data": "AAAAAA=="}, "unknown dtype"),
    ({"$": "size", "v": [2 ** 70]}, "torch.Size"),
    ({"$": "size", "v": [1] * 71}, "torch.Size"),
    ({"$": "ndarray", "dtype": "(2,)i4", "shape": [1], "data": "AAAAAAAAAAA="}, "unknown dtype"),
    ({"$": "ndarray", "dtype": "f99", "shape": [1], "data": "AAAAAA=="}, "unknown dtype"),
    ({"$": "ndarray", "dtype": "<f3", "shape": [1], "data": "AAAA"}, "unknown dtype"),
    ({"$": "npscalar", "dtype": "<f4", "shape": [2], "data": "AAAAAAAAAAA="}, "numpy scalar of shape"),
    ({"$": "int", "v": "1" * 5000}, "malformed int"),
    ({"$": "int", "v": "١٢"}, "malformed int"),  # digits of another script, which int() reads
    ({"$": "int", "v": " 1_000"}, "malformed int"),
    ({"$": "bytes", "v": "é"}, "base64"),
    ({"$": "set", "v": [[1], [2]]}, "set element that cannot be a key: list"),
    ({"$": "frozenset", "v": [{"$": "tuple", "v": [[1]]}]}, "cannot be a key: tuple"),
    ({"$": "device", "v": "cuda:99999999999999999999"}, "unknown device"),
    ({"$": "device", "v": "cpu:-1"}, "unknown device"),
    ({"$": "x" * 100_000}, "unknown tag 'xxx"),
    (nested(wire.MAX_DEPTH + 1), "nested more than"),
])
def test_malformed_values_raise_the_wires_error_only(data, why):
    """Each of these once raised ValueError, TypeError, OverflowError or RuntimeError (numpy's, torch's or
    Python's), which the judge reported as its own fault."""
    refused(data, why)


def test_a_big_int_is_bounded_on_both_sides():
    largest = 10 ** wire.MAX_INT_DIGITS - 1
    assert wire.decode(json.loads(json.dumps(wire.encode(-largest)))) == -largest
    refused({"$": "int", "v": "1" + "0" * wire.MAX_INT_DIGITS}, "malformed int")
    with pytest.raises(wire.Unsendable, match="digits"):
        wire.encode(largest + 1)
    with pytest.raises(wire.Unsendable, match="digits"):
        wire.encode(10 ** 5000)  # str() of it would raise ValueError
    with pytest.raises(wire.WireError, match="not JSON"):
        received(b'{"value": 1' + b"0" * 5000 + b"}")  # a plain JSON number past Python's 4300 digits


def test_the_budget_is_for_the_whole_message():
    """Two tensors, each within bounds: the second is refused by the total before its data is looked at."""
    n = wire.MAX_NUMBERS // 2 + 1
    half = {"$": "tensor", "dtype": "bool", "shape": [n], "data": base64.b64encode(bytes(n)).decode()}
    refused([half, {**half, "data": ""}], "numbers")
    third = "AAAA" * (wire.MAX_BYTES // 9 + 1)
    refused([{"$": "bytes", "v": third}] * 3, "bytes of data")


def test_a_namedtuple_flood_is_refused_and_leaves_nothing_behind():
    """100,000 field sets in one 4.8 MB reply added 660 MB to the grader for good (one class each, cached)."""
    flood = [{"$": "tuple", "v": [1], "fields": [f"f{i}"]} for i in range(100_000)]
    tracemalloc.start()
    try:
        refused(flood, "kinds of namedtuple")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2 ** 20
    for i in range(3):  # message after message: the classes kept stay few
        wire.decode(flood[i * 30:(i + 1) * 30])
    assert wire._namedtuple.cache_info().currsize <= wire._namedtuple.cache_info().maxsize <= 256


@pytest.mark.parametrize("fields", [["class", "x"], ["a", "a"], ["ﬁ", "fi"], ["_a", "b"], ["a" * 100, "b"]])
def test_fields_that_cannot_name_a_namedtuple_give_a_plain_tuple(fields):
    """A learner's tuple subclass may carry any _fields; "ﬁ" and "fi" are one identifier to Python."""
    got = wire.decode({"$": "tuple", "v": [1, 2], "fields": fields})
    assert type(got) is tuple and got == (1, 2)


def test_keys_forged_to_share_one_hash_are_refused():
    """20,000 ints of one hash in a set cost 200 million comparisons to build."""
    same_hash = [k * HASH_MODULUS for k in range(20_000)]
    assert len({hash(k) for k in same_hash}) == 1
    refused({"$": "set", "v": same_hash}, "same hash")
    refused({"$": "dict", "v": [[k, 0] for k in same_hash]}, "same hash")
    assert wire.decode({"$": "set", "v": [0, -1, -2, HASH_MODULUS]}) == {0, -1, -2, HASH_MODULUS}


def test_json_that_would_cost_far_more_than_its_size_is_refused_unparsed():
    """8 million empty lists in 24 MB: json.loads would build them for seconds and a gigabyte."""
    with within():
        with pytest.raises(wire.WireError, match="values"):
            received(b'{"v": [' + b"[]," * 8_000_000 + b"0]}")
        with pytest.raises(wire.WireError, match="not JSON.*RecursionError"):
            received(b'{"v": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


# ---------------------------------------------------------------- one deadline per message


def test_a_dripping_sender_misses_the_messages_deadline():
    """A byte every 50 ms keeps every recv under the socket's timeout of 1 s: only the deadline stops it."""
    message = framed(b'{"value": "' + b"x" * 200 + b'"}')
    with sender([message[i:i + 1] for i in range(len(message))], pause=0.05) as sock:
        sock.settimeout(1.0)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            wire.receive(sock, start + 0.5)
        assert 0.45 < time.monotonic() - start < 1.5
        assert sock.gettimeout() == 1.0  # the socket's own timeout is given back


def test_a_message_in_pieces_within_its_deadline_arrives_whole():
    message = framed(json.dumps({"value": "naïve 🤖"}).encode())
    with sender([message[:3], message[3:11], message[11:]], pause=0.05) as sock:
        assert wire.receive(sock, time.monotonic() + 10) == {"value": "naïve 🤖"}


def test_a_closed_connection_is_an_eof_not_a_timeout():
    with sender([framed(b'{"value": 1}')[:6]]) as sock:
        with pytest.raises(EOFError):
            wire.receive(sock, time.monotonic() + 10)


def test_the_judge_gives_a_dripped_answer_the_cells_time_only():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        session = judge.SocketSession(ours, time.monotonic() + 0.5, {})
        theirs.sendall(struct.pack(">Q", 100))

        def drip():
            with contextlib.suppress(OSError):
                for _ in range(100):
                    theirs.sendall(b" ")
                    time.sleep(0.05)

        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        with within(2.0), pytest.raises(judge.SessionLost, match="did not answer before the cell's time limit"):
            session.exchange({"op": "len"})
        theirs.shutdown(socket.SHUT_RDWR)
        thread.join()


def test_a_dripped_hello_is_dropped_after_the_hello_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(judge, "HELLO_TIMEOUT", 0.5)
    path = tmp_path / "judge"
    with judge.RunJudge(path, ["test_x"], {}, cell_timeout=10) as run:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(path))
            sock.sendall(struct.pack(">Q", 100))
            start = time.monotonic()
            with pytest.raises(OSError):  # the judge hangs up: a broken pipe, or a reset
                for _ in range(100):
                    sock.sendall(b" ")
                    time.sleep(0.05)
            assert time.monotonic() - start < 3
    assert run.verdicts == {} and run.executed is None


# ---------------------------------------------------------------- valid Unicode only


def test_lone_surrogates_in_a_message_become_replacement_characters():
    raw = (b'{"text": "a\\ud800b", "\\uDC00key": ["\\udfff", {"deep": "\\uD83D"}], "pair": "\\ud83d\\udc4b", '
           b'"escaped": "\\\\ud800", "value": {"$": "tuple", "v": ["x\\ud9ffy"]}}')
    message = received(raw)
    assert message == {"text": "a\ufffdb", "\ufffdkey": ["\ufffd", {"deep": "\ufffd"}], "pair": "👋",
                       "escaped": "\\ud800", "value": {"$": "tuple", "v": ["x\ufffdy"]}}
    assert wire.decode(message["value"]) == ("x\ufffdy",)
    json.dumps(message, ensure_ascii=False).encode("utf-8")  # what nbformat.write or a CSV would do


def test_text_that_only_looks_like_a_surrogate_escape_is_left_as_it_came():
    raw = json.dumps({"text": "naïve 🤖 \\ud800", "n": [1, 2.5, None]}, ensure_ascii=False).encode()
    assert received(raw) == {"text": "naïve 🤖 \\ud800", "n": [1, 2.5, None]}


# ---------------------------------------------------------------- properties


NUMPY_DTYPE_TEXTS = ["<f4", "|b1", ">i8", "<c16", "|u1", "=u2", "<f2", "f8"]
TAGS = ["tuple", "size", "set", "frozenset", "dict", "bytes", "bytearray", "int", "float", "tensor", "ndarray",
        "npscalar", "dtype", "device", "ref"]


def itemsize(tag: str, dtype) -> int | None:
    try:
        return getattr(torch, dtype).itemsize if tag == "tensor" else np.dtype(dtype).itemsize
    except (AttributeError, TypeError, ValueError, SyntaxError):
        return None


@st.composite
def tagged(draw, children):
    """A tagged object of the wire format, mostly well-formed, with something wrong now and then: its tag, a
    dtype, a shape, its data, its fields; a part may be any value at all (``children``)."""
    def pick(good, bad=children):
        return draw(good if draw(st.integers(0, 5)) else bad)

    tag = pick(st.sampled_from(TAGS), st.text(max_size=6))
    out = {"$": tag}
    if tag in ("tensor", "ndarray", "npscalar"):
        names = wire.TENSOR_DTYPES if tag == "tensor" else NUMPY_DTYPE_TEXTS
        out["dtype"] = pick(st.sampled_from(names), st.one_of(st.text(max_size=8), children))
        sizes = st.one_of(st.integers(-3, 2 ** 70), st.booleans(), st.floats(), st.text(max_size=2))
        out["shape"] = pick(st.lists(st.integers(0, 3), max_size=0 if tag == "npscalar" else 3),
                            st.one_of(st.lists(sizes, max_size=80), children))
        size = itemsize(tag, out["dtype"])
        if size is not None and isinstance(out["shape"], list) and all(type(n) is int for n in out["shape"]):
            size *= math.prod(n for n in out["shape"] if 0 <= n < 2 ** 8)
        size = max(0, (size or 0) + draw(st.sampled_from([0, 0, 0, 1, -1])))
        out["data"] = pick(st.binary(min_size=size, max_size=size).map(lambda b: base64.b64encode(b).decode()),
                           st.one_of(st.text(max_size=12), children))
        if draw(st.booleans()):
            out["requires_grad"] = pick(st.booleans())
    elif tag in ("tuple", "size", "set", "frozenset"):
        out["v"] = pick(st.lists(children, max_size=4))
        if tag == "tuple" and draw(st.booleans()):
            n = len(out["v"]) if isinstance(out["v"], list) else 0
            out["fields"] = pick(st.lists(st.sampled_from(["a", "b", "x", "count", "class", "_c", "ﬁ", "fi"]),
                                          min_size=n, max_size=n))
    elif tag == "dict":
        out["v"] = pick(st.lists(st.one_of(st.tuples(children, children).map(list), children), max_size=4))
    else:
        out["v"] = pick({"bytes": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
                         "int": st.from_regex(r"-?[0-9]{1,30}", fullmatch=True),
                         "float": st.sampled_from(["nan", "inf", "-inf"]),
                         "dtype": st.sampled_from(wire.TENSOR_DTYPES),
                         "device": st.sampled_from(["cpu", "meta", "cuda:1", "cpu:0"])}.get(tag, children))
    return out


JSON_LIKE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10),
              st.dictionaries(st.sampled_from(["$", "v"]) | st.text(max_size=3), st.integers(), max_size=2),
              st.deferred(lambda: PLAIN).map(wire.encode)),  # well-formed values too, to be nested in malformed ones
    lambda children: st.one_of(st.lists(children, max_size=5), tagged(children)),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(JSON_LIKE)
def test_decode_returns_or_refuses_quickly_and_in_little_memory(data):
    """deadline=None: the time bound is asserted on decode itself, not on tracemalloc's bookkeeping around it."""
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with contextlib.suppress(wire.WireError):
            wire.decode(data)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < FAST and peak < 64 * 2 ** 20


Point = collections.namedtuple("Point", "x y")
Triple = collections.namedtuple("Triple", ["first", "second", "third"])


@st.composite
def tensors(draw):
    name = draw(st.sampled_from(wire.TENSOR_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    if name == "bfloat16":
        t = torch.from_numpy(draw(hnp.arrays(np.float32, shape))).to(torch.bfloat16)
    else:
        t = torch.from_numpy(draw(hnp.arrays(np.dtype(name), shape)))
    if draw(st.booleans()):
        t = t.transpose(0, -1) if t.dim() else t  # not contiguous: crosses as its values
    if (t.is_floating_point() or t.is_complex()) and draw(st.booleans()):
        t = t.clone().requires_grad_(True)
    return t


NUMPY_DTYPES = st.one_of(hnp.boolean_dtypes(), hnp.integer_dtypes(endianness="?"),
                         hnp.unsigned_integer_dtypes(endianness="?"), hnp.floating_dtypes(endianness="?"),
                         hnp.complex_number_dtypes(endianness="?"))
HASHABLE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
              st.binary(max_size=8)),
    lambda children: st.one_of(st.tuples(children, children), st.frozensets(children, max_size=3)),
    max_leaves=6,
)
PLAIN = st.recursive(
    st.one_of(HASHABLE, st.floats(), st.builds(bytearray, st.binary(max_size=8)), tensors(),
              hnp.arrays(NUMPY_DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)),
              NUMPY_DTYPES.flatmap(lambda dtype: hnp.from_dtype(dtype))),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.tuples(children), st.builds(Point, children, children),
        st.builds(Triple, children, children, children), st.dictionaries(HASHABLE, children, max_size=3),
        st.sets(HASHABLE, max_size=3), st.frozensets(HASHABLE, max_size=3)),
    max_leaves=12,
)


def assert_same(got, want) -> None:
    """``got`` is ``want``'s value and type (a namedtuple: its fields; a float: nan is nan)."""
    if isinstance(want, float):  # numpy's float64 too, a float subclass: it crosses as its base
        assert type(got) is float and (got == want or math.isnan(got) and math.isnan(want))
    elif isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor and got.requires_grad == want.requires_grad
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=0, equal_nan=True)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert type(got) is type(want) and got.dtype == want.dtype and np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want, strict=True)
    elif isinstance(want, tuple) and hasattr(type(want), "_fields"):
        assert type(got)._fields == type(want)._fields
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
    elif isinstance(want, dict):
        assert type(got) is dict and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    else:
        assert type(got) is type(want) and got == want


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PLAIN)
def test_plain_values_cross_and_come_back_equal(value):
    """Through the socket's own path: encode, JSON, the framing, receive, decode."""
    message = json.dumps({"value": wire.encode(value)}, allow_nan=False).encode()
    assert_same(wire.decode(received(message)["value"]), value)
