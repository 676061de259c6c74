"""Plain data across the sandbox's wall, both ways: what the judge sends in, what the learner's code gives back.

A value crosses as JSON: numbers, strings and lists as themselves, everything else as a tagged object
(``{"$": "bytes", ...}``, ``{"$": "tensor", ...}``). No pickle, and no object of the learner's classes ever
reaches the judge: containers are read with the base class's own methods (a ``list`` subclass whose ``__eq__``
is always true arrives as a plain list), and an object that is not plain data stays in the sandbox and crosses
as a reference (``{"$": "ref", "id": 3, "type": "Tokenizer"}``) that the judge can only ask questions of.

The reading side trusts nothing it reads, and one message may cost the judge neither much time nor much memory:
every number that says how big something is gets checked before any arithmetic is done with it (a tensor's
dimensions, at most ``MAX_DIMS``, and its sizes, multiplied one at a time; a big int's digits; a namedtuple's
fields), and a message has one budget for all its values, numbers and bytes of data, and namedtuple classes. A
set or dict of values forged to share one hash is refused too (building it would take quadratic time). A message
that breaks a rule is refused whole, and with ``WireError`` only, whatever numpy, torch or Python would have
raised for it: a malformed reply is the sender's fault, never the reader's.

Messages on a socket are framed as an 8-byte length and that many bytes of UTF-8 JSON. ``receive`` takes a
deadline for the whole message (not for each ``recv``: a sender that drips a byte at a time cannot stretch it),
bounds the values the JSON may hold before parsing it, and hands back only valid Unicode (JSON's escapes can
spell lone surrogates, which no UTF-8 file can hold: they become U+FFFD).
"""
from __future__ import annotations

import base64
import collections
import functools
import json
import keyword
import math
import re
import socket
import struct
import time

MAX_MESSAGE = 64 * 1024 * 1024  # bytes of one message
MAX_DEPTH = 40
MAX_ITEMS = 2_000_000  # values in one message, nested ones included
MAX_NUMBERS = 8 * MAX_ITEMS  # numbers in the tensors and arrays of one message
MAX_BYTES = MAX_MESSAGE // 4 * 3  # bytes of data (bytes, tensors, arrays) in one message: what its base64 can hold
MAX_DIMS = 32  # dimensions of one tensor or array (the course's have at most 5; torch refuses more than 64)
MAX_INT_DIGITS = 4000  # digits of one int (Python refuses to read an int of more than 4300)
MAX_FIELDS = 64  # fields of a namedtuple that crosses as one (a longer one arrives as a plain tuple)
MAX_FIELD_NAME = 64  # characters of one field name
MAX_RECORD_TYPES = 32  # namedtuple field sets in one message: each is a class to build
MAX_SAME_HASH = 8  # values of one set or dict sharing one hash
MAX_REPR = 200
TENSOR_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "complex64", "complex128")
NUMPY_KINDS = "biufc"  # bool, int, unsigned, float, complex: the numpy dtypes that are plain numbers
_INT_LIMIT = 10 ** MAX_INT_DIGITS
# Not \d, which matches every script's digits, nor int()'s spaces and underscores.
_INT_TEXT = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")
# What encode writes for a numpy dtype (its .str); np.dtype() of other text may raise TypeError, ValueError,
# SyntaxError or a warning.
_NUMPY_DTYPE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class WireError(Exception):
    """A value or a message that may not cross (too large, too deep, not plain data, malformed)."""


class Unsendable(WireError):
    """A value of the learner's that cannot be sent: its reason says why, in the learner's terms."""


def type_name(obj) -> str:
    t = type(obj)
    module = getattr(t, "__module__", "") or ""
    qualname = getattr(t, "__qualname__", t.__name__)
    return qualname if module in ("builtins", "__main__") else f"{module}.{qualname}"


def safe_repr(obj, limit: int = MAX_REPR) -> str:
    """A short repr of a learner's object; never raises (a hostile __repr__ may), never long."""
    try:
        text = repr(obj)
        if not isinstance(text, str):
            raise TypeError
        text = str.__add__("", text)
    except BaseException:  # noqa: BLE001 (KeyboardInterrupt included: this is a repr, not a computation)
        return f"<{type_name(obj)} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Budget:
    """What one message has spent so far; past a limit, ``error`` (``Unsendable`` when the learner's side encodes,
    ``WireError`` when the judge decodes)."""

    def __init__(self, error: type[WireError]):
        self.error = error
        self.items = self.numbers = self.bytes = 0
        self.records: set[tuple[str, ...]] = set()

    def spend(self, depth: int) -> None:
        self.items += 1
        if self.items > MAX_ITEMS:
            raise self.error(f"a value with more than {MAX_ITEMS:,} parts")
        if depth > MAX_DEPTH:
            raise self.error(f"a value nested more than {MAX_DEPTH} deep")

    def data(self, numbers: int, nbytes: int) -> None:
        self.numbers += numbers
        self.bytes += nbytes
        if self.numbers > MAX_NUMBERS:
            raise self.error(f"a value with more than {MAX_NUMBERS:,} numbers in its tensors and arrays")
        if self.bytes > MAX_BYTES:
            raise self.error(f"a value with more than {MAX_BYTES:,} bytes of data")

    def record(self, fields: tuple[str, ...]) -> None:
        self.records.add(fields)
        if len(self.records) > MAX_RECORD_TYPES:
            raise self.error(f"a value with more than {MAX_RECORD_TYPES} kinds of namedtuple")


# ---------------------------------------------------------------------------------------------------
# Encoding (both sides)


def encode(value, refer=None):
    """``value`` as JSON-able data. ``refer(obj) -> dict`` turns an object that is not plain data into a
    reference; without it such an object is an error."""
    return _encode(value, refer, _Budget(Unsendable), 0)


def _encode(x, refer, budget: _Budget, depth: int):
    budget.spend(depth)
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        if abs(x) < 2 ** 63:
            return x
        if not -_INT_LIMIT < x < _INT_LIMIT:  # before str(x), which raises past 4300 digits
            raise Unsendable(f"an int of more than {MAX_INT_DIGITS:,} digits")
        return {"$": "int", "v": str(x)}
    if t is float:
        return x if math.isfinite(x) else {"$": "float", "v": repr(x)}
    if t is list:
        return [_encode(list.__getitem__(x, i), refer, budget, depth + 1) for i in range(list.__len__(x))]
    # Subclasses of the plain types cross as their base value; what a subclass overrides stays behind.
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return _encode(int.__int__(x), refer, budget, depth)
    if isinstance(x, float):
        return _encode(float.__float__(x), refer, budget, depth)
    if isinstance(x, str):
        return str.__add__("", x)
    if isinstance(x, (bytes, bytearray)):
        raw = bytes.__add__(b"", x) if isinstance(x, bytes) else bytes(bytearray.__iter__(x))
        budget.data(0, len(raw))
        return {"$": "bytes" if isinstance(x, bytes) else "bytearray", "v": base64.b64encode(raw).decode()}
    if isinstance(x, list):
        return [_encode(list.__getitem__(x, i), refer, budget, depth + 1) for i in range(list.__len__(x))]
    if isinstance(x, tuple):
        items = [_encode(tuple.__getitem__(x, i), refer, budget, depth + 1) for i in range(tuple.__len__(x))]
        out = {"$": "tuple", "v": items}
        fields = getattr(t, "_fields", None)  # a namedtuple keeps its field names
        if isinstance(fields, tuple) and all(type(f) is str for f in fields) and len(fields) == len(items):
            budget.record(fields)
            out["fields"] = list(fields)
        if type_name(x) == "torch.Size":
            out = {"$": "size", "v": items}
        return out
    if isinstance(x, dict):
        return {"$": "dict", "v": [[_encode(k, refer, budget, depth + 1), _encode(v, refer, budget, depth + 1)]
                                   for k, v in dict.items(x)]}
    if isinstance(x, (set, frozenset)):
        base = set if isinstance(x, set) else frozenset
        return {"$": base.__name__, "v": [_encode(v, refer, budget, depth + 1) for v in base.__iter__(x)]}
    encoded = _encode_array(x, budget)
    if encoded is not None:
        return encoded
    if refer is None:
        raise Unsendable(f"a {type_name(x)} object, which is not plain data")
    return refer(x)


def _encode_array(x, budget: _Budget):
    """Tensors, numpy arrays and scalars, dtypes and devices; None if ``x`` is none of them."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(x, torch.Tensor):
            return _encode_tensor(torch, x, budget)
        if isinstance(x, torch.dtype):
            return {"$": "dtype", "v": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"$": "device", "v": str(x)}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, (np.ndarray, np.generic)):
        array = np.asarray(x)
        if array.dtype.kind not in NUMPY_KINDS:
            raise Unsendable(f"a numpy array of dtype {array.dtype}, which is not plain numbers")
        budget.data(array.size, array.nbytes)
        return {"$": "ndarray" if isinstance(x, np.ndarray) else "npscalar", "dtype": array.dtype.str,
                "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}
    return None


def _encode_tensor(torch, x, budget: _Budget):
    T = torch.Tensor
    try:
        layout, device, dtype = T.layout.__get__(x), T.device.__get__(x), T.dtype.__get__(x)
        if layout != torch.strided:
            raise Unsendable(f"a tensor with layout {layout} (send a dense tensor)")
        name = str(dtype).removeprefix("torch.")
        if name not in TENSOR_DTYPES:
            raise Unsendable(f"a tensor of dtype {dtype}")
        if device.type == "meta":
            raise Unsendable("a tensor on the meta device, which holds no numbers")
        requires_grad = bool(T.requires_grad.__get__(x))
        grad_fn = T.grad_fn.__get__(x)
        data = T.contiguous(T.cpu(T.detach(x)))
        budget.data(T.numel(data), T.numel(data) * T.element_size(data))
        shape = [int(s) for s in T.size(data)]
        raw = T.numpy(T.view(data, torch.int16)).tobytes() if name == "bfloat16" else T.numpy(data).tobytes()
    except Unsendable:
        raise
    except Exception as err:  # noqa: BLE001 (a tensor subclass may break any of these)
        raise Unsendable(f"a tensor that could not be read ({type(err).__name__}: {err})") from None
    out = {"$": "tensor", "dtype": name, "shape": shape, "data": base64.b64encode(raw).decode(),
           "requires_grad": requires_grad, "grad_fn": None if grad_fn is None else type(grad_fn).__name__}
    if type(x) is not T:
        out["type"] = type_name(x)
    return out


# ---------------------------------------------------------------------------------------------------
# Decoding (both sides): plain data in, Python values out; refs through ``resolve``


def decode(data, resolve=None):
    """The value that ``data`` (JSON, as ``encode`` wrote it) stands for. ``resolve(tagged) -> object`` gives
    the object of a reference; without it a reference is an error."""
    return _decode(data, resolve, _Budget(WireError), 0)


def _decode(d, resolve, budget: _Budget, depth: int):
    budget.spend(depth)
    if d is None or isinstance(d, (bool, int, float, str)):
        return d
    if isinstance(d, list):
        return [_decode(v, resolve, budget, depth + 1) for v in d]
    if not isinstance(d, dict) or not isinstance(d.get("$"), str):
        raise WireError(f"not a value of the wire format: {type(d).__name__}")
    tag = d["$"]
    if tag in ("tuple", "size", "set", "frozenset"):
        items = [_decode(v, resolve, budget, depth + 1) for v in _list(d, "v")]
        if tag == "tuple":
            fields = d.get("fields")
            if not _record_fields(fields, len(items)):
                return tuple(items)
            budget.record(tuple(fields))
            return _namedtuple(tuple(fields))(*items)
        if tag == "size":
            return _size(items)
        return _hashed(set if tag == "set" else frozenset, items, f"{tag} element")
    if tag == "dict":
        pairs = []
        for pair in _list(d, "v"):
            if not isinstance(pair, list) or len(pair) != 2:
                raise WireError("a dict entry that is not a pair")
            pairs.append((_decode(pair[0], resolve, budget, depth + 1), _decode(pair[1], resolve, budget, depth + 1)))
        return _hashed(dict, pairs, "dict key", key=lambda pair: pair[0])
    if tag in ("bytes", "bytearray"):
        raw = _b64(d, "v", None, budget)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "int":
        text = d.get("v")
        if not isinstance(text, str) or len(text) > MAX_INT_DIGITS + 1 or not _INT_TEXT.fullmatch(text):
            raise WireError(f"a malformed int (at most {MAX_INT_DIGITS:,} digits)")
        return int(text)
    if tag == "float":
        if d.get("v") not in ("nan", "inf", "-inf"):
            raise WireError("a malformed float")
        return float(d["v"])
    if tag == "tensor":
        return _decode_tensor(d, budget)
    if tag in ("ndarray", "npscalar"):
        return _decode_ndarray(d, budget)
    if tag == "dtype":
        import torch
        if d.get("v") not in TENSOR_DTYPES:
            raise WireError(f"an unknown dtype {_short(d.get('v'))}")
        return getattr(torch, d["v"])
    if tag == "device":
        import torch
        text = d.get("v")
        if not isinstance(text, str) or len(text) > 40:
            raise WireError("a malformed device")
        try:
            return torch.device(text)
        except (RuntimeError, TypeError, ValueError):
            raise WireError(f"an unknown device {text!r}") from None
    if tag == "ref":
        if resolve is None:
            raise WireError("a reference where only plain data may come")
        return resolve(d)
    raise WireError(f"an unknown tag {_short(tag)}")


def _short(value) -> str:
    """A piece of a malformed message, for an error message: never long."""
    return safe_repr(value, 60)


def _record_fields(fields, n: int) -> bool:
    """Whether ``fields`` can name the ``n`` items of a namedtuple; a tuple subclass of the learner's may carry
    any ``_fields``, and such a tuple crosses as a plain one."""
    return (isinstance(fields, list) and len(fields) == n <= MAX_FIELDS
            and all(isinstance(f, str) and len(f) <= MAX_FIELD_NAME and f.isascii() and f.isidentifier()
                    and not f.startswith("_") and not keyword.iskeyword(f) for f in fields)
            and len(set(fields)) == n)


@functools.lru_cache(maxsize=4 * MAX_RECORD_TYPES)  # bounded: each field set a message brings is a new class
def _namedtuple(fields: tuple[str, ...]):
    return collections.namedtuple("Record", fields)


def _hashed(build, items: list, noun: str, key=lambda item: item):
    """``build(items)`` (a set, frozenset or dict) once its keys are known to hash, and not to have been forged to
    share one hash: n such keys would cost n² comparisons to build."""
    counts = collections.Counter()
    for item in items:
        try:
            counts[hash(key(item))] += 1
        except TypeError:
            raise WireError(f"a {noun} that cannot be a key: {type(key(item)).__name__}") from None
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise WireError(f"more than {MAX_SAME_HASH} {noun}s with the same hash")
    try:
        return build(items)
    except (TypeError, ValueError, RuntimeError) as err:  # keys of one hash are compared, and a tensor may refuse
        raise WireError(f"{noun}s that cannot be compared ({type(err).__name__})") from None


def _size(items: list):
    import torch

    if len(items) > MAX_DIMS or not all(type(v) is int and 0 <= v < 2 ** 63 for v in items):
        raise WireError(f"a torch.Size that is not a list of at most {MAX_DIMS} sizes")
    return torch.Size(items)


_WHAT = {"tensor": "a tensor", "ndarray": "an array", "npscalar": "a numpy scalar", "bytes": "a bytes",
         "bytearray": "a bytearray"}


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    if not isinstance(v, list):
        raise WireError(f"{d.get('$')}: {key} is not a list")
    return v


def _shape(d: dict) -> tuple[list[int], int]:
    """A tensor's or array's shape and number of elements, each size checked before any arithmetic: a list of
    800,000 sizes would hold the GIL for seconds in math.prod."""
    shape = _list(d, "shape")
    if len(shape) > MAX_DIMS:
        raise WireError(f"{_WHAT[d['$']]} of {len(shape):,} dimensions (at most {MAX_DIMS})")
    if not all(type(s) is int and 0 <= s <= MAX_NUMBERS for s in shape):
        raise WireError(f"{_WHAT[d['$']]} whose shape is not a list of sizes")
    if 0 in shape:
        return shape, 0
    numel = 1
    for s in shape:
        numel *= s
        if numel > MAX_NUMBERS:
            raise WireError(f"{_WHAT[d['$']]} of shape {shape}: more than {MAX_NUMBERS:,} numbers")
    return shape, numel


def _b64(d: dict, key: str, size: int | None, budget: _Budget) -> bytes:
    """The bytes that ``d[key]`` holds in base64, ``size`` of them if given: their number checked, and charged to
    the message's budget, before they are decoded."""
    text = d.get(key)
    if not isinstance(text, str):
        raise WireError(f"{_WHAT[d['$']]} without data")
    if size is not None and len(text) != 4 * -(-size // 3):
        raise WireError(f"{_WHAT[d['$']]} of shape {d['shape']} without its {size:,} bytes of data")
    budget.data(0, len(text) // 4 * 3)
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise WireError(f"{_WHAT[d['$']]} whose data is not base64") from None
    except MemoryError:
        raise WireError(f"{_WHAT[d['$']]} of {len(text):,} characters of base64, more than this machine can hold "
                        "now") from None
    if size is not None and len(raw) != size:
        raise WireError(f"{_WHAT[d['$']]} of shape {d['shape']} with {len(raw):,} bytes of data, not {size:,}")
    return raw


def _array(raw: bytes, dtype, shape: list[int]):
    """A writable numpy array of ``shape`` over a copy of ``raw``."""
    import numpy as np

    try:
        return np.frombuffer(raw, dtype=dtype).copy().reshape(shape)
    except MemoryError:
        raise WireError(f"an array of {len(raw):,} bytes, more than this machine can hold now") from None


def _decode_tensor(d: dict, budget: _Budget):
    import torch

    name = d.get("dtype")
    if name not in TENSOR_DTYPES:
        raise WireError(f"a tensor of unknown dtype {_short(name)}")
    dtype = getattr(torch, name)
    shape, numel = _shape(d)
    budget.data(numel, 0)
    raw = _b64(d, "data", numel * dtype.itemsize, budget)
    if name == "bfloat16":  # numpy has no bfloat16: its bits cross as int16
        t = torch.from_numpy(_array(raw, "int16", shape)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(_array(raw, name, shape))
    if d.get("requires_grad") is True and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _decode_ndarray(d: dict, budget: _Budget):
    import numpy as np

    text = d.get("dtype")
    if not isinstance(text, str) or not _NUMPY_DTYPE.fullmatch(text):
        raise WireError(f"an array of unknown dtype {_short(text)}")
    try:
        dtype = np.dtype(text)
    except TypeError:  # "<f3", "|c1": the pattern's spelling, no dtype's
        raise WireError(f"an array of unknown dtype {text!r}") from None
    shape, numel = _shape(d)
    if d["$"] == "npscalar" and shape:
        raise WireError(f"a numpy scalar of shape {shape}")
    budget.data(numel, 0)
    array = _array(_b64(d, "data", numel * dtype.itemsize, budget), dtype, shape)
    return array if d["$"] == "ndarray" else array[()]


# ---------------------------------------------------------------------------------------------------
# Messages on a socket


def send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("ascii")
    if len(data) > MAX_MESSAGE:
        raise Unsendable(f"a message of {len(data):,} bytes (the limit is {MAX_MESSAGE:,})")
    sock.sendall(struct.pack(">Q", len(data)) + data)


def receive(sock: socket.socket, deadline: float | None = None) -> dict:
    """The next message; ``EOFError`` when the other side has closed, ``WireError`` for a malformed one.
    ``deadline``: the ``time.monotonic()`` instant by which the whole message must have come (``TimeoutError``
    after it), where without one each ``recv`` waits as long as the socket's timeout says."""
    timeout = sock.gettimeout()
    try:
        size = struct.unpack(">Q", _exactly(sock, 8, deadline))[0]
        if size > MAX_MESSAGE:
            raise WireError(f"a message of {size:,} bytes (the limit is {MAX_MESSAGE:,})")
        data = _exactly(sock, size, deadline)
    finally:
        if deadline is not None:
            sock.settimeout(timeout)
    return _parse(data)


def _exactly(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    data = bytearray(n)  # one buffer: a reply dripped a byte per recv costs no object per byte
    view, got = memoryview(data), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the message did not come in time")
            sock.settimeout(left)
        count = sock.recv_into(view[got:])
        if not count:
            raise EOFError("the other side closed the connection")
        got += count
    return data


def _parse(data: bytearray) -> dict:
    """A message's JSON, its cost bounded before json.loads builds it: 64 MB of ``[],`` would be 21 million lists
    (1.5 GB and 10 s, the GIL held). Each list and object opens with a bracket, and each value after the first of
    its container follows a comma: counting them (a fast scan; those inside strings count too, which only errs
    on the safe side) bounds what json.loads can build."""
    if data.count(b"[") + data.count(b"{") > MAX_ITEMS or data.count(b",") > 2 * MAX_ITEMS:
        raise WireError(f"a message of more than {MAX_ITEMS:,} lists and objects or {2 * MAX_ITEMS:,} values (its "
                        "brackets and commas, counted in its strings too)")
    try:
        message = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as err:  # UnicodeDecodeError is a ValueError
        raise WireError(f"a message that is not JSON, or too deep or large ({type(err).__name__}: "
                        f"{str(err)[:200]})") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not an object")
    if _SURROGATE_ESCAPE.search(data):
        make_valid(message)
    return message


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate (JSON's escapes can spell one; no UTF-8 writer can write it) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def make_valid(data: dict | list) -> None:
    """Each lone surrogate in the strings and keys of parsed JSON (json joins the pairs it meets) becomes U+FFFD,
    in place. Without recursion: json may have parsed a thousand levels."""
    todo = [data]
    while todo:
        node = todo.pop()
        for key, value in list(node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(value, str):
                node[key] = valid_text(value)
            elif isinstance(value, (list, dict)):
                todo.append(value)
        if isinstance(node, dict) and any(_SURROGATE.search(key) for key in node):
            fixed = {valid_text(key): value for key, value in node.items()}
            node.clear()
            node.update(fixed)
