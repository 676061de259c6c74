"""Plain data across the sandbox's wall, both ways: what the judge sends in, what the learner's code gives back.

A value crosses as JSON: numbers, strings and lists as themselves, everything else as a tagged object
(``{"$": "bytes", ...}``, ``{"$": "tensor", ...}``). No pickle, and no object of the learner's classes ever
reaches the judge: containers are read with the base class's own methods (a ``list`` subclass whose ``__eq__``
is always true arrives as a plain list), and an object that is not plain data stays in the sandbox and crosses
as a reference (``{"$": "ref", "id": 3, "type": "Tokenizer"}``) that the judge can only ask questions of.

The reading side trusts nothing it reads: sizes, depths and dtypes are checked, and a message that breaks a rule
is refused whole (``WireError``).

Messages on a socket are framed as an 8-byte length and that many bytes of UTF-8 JSON.
"""
from __future__ import annotations

import base64
import collections
import functools
import json
import math
import socket
import struct

MAX_MESSAGE = 64 * 1024 * 1024  # bytes of one message
MAX_DEPTH = 40
MAX_ITEMS = 2_000_000  # values in one message, nested ones included
MAX_REPR = 200
TENSOR_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "complex64", "complex128")
NUMPY_KINDS = "biufc"  # bool, int, unsigned, float, complex: the numpy dtypes that are plain numbers


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
    def __init__(self):
        self.items = 0

    def spend(self, depth: int) -> None:
        self.items += 1
        if self.items > MAX_ITEMS:
            raise Unsendable(f"a value with more than {MAX_ITEMS:,} parts")
        if depth > MAX_DEPTH:
            raise Unsendable(f"a value nested more than {MAX_DEPTH} deep")


# ---------------------------------------------------------------------------------------------------
# Encoding (both sides)


def encode(value, refer=None):
    """``value`` as JSON-able data. ``refer(obj) -> dict`` turns an object that is not plain data into a
    reference; without it such an object is an error."""
    return _encode(value, refer, _Budget(), 0)


def _encode(x, refer, budget: _Budget, depth: int):
    budget.spend(depth)
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return x if abs(x) < 2 ** 63 else {"$": "int", "v": str(x)}
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
        return {"$": "bytes" if isinstance(x, bytes) else "bytearray", "v": base64.b64encode(raw).decode()}
    if isinstance(x, list):
        return [_encode(list.__getitem__(x, i), refer, budget, depth + 1) for i in range(list.__len__(x))]
    if isinstance(x, tuple):
        items = [_encode(tuple.__getitem__(x, i), refer, budget, depth + 1) for i in range(tuple.__len__(x))]
        out = {"$": "tuple", "v": items}
        fields = getattr(t, "_fields", None)  # a namedtuple keeps its field names
        if isinstance(fields, tuple) and all(type(f) is str for f in fields) and len(fields) == len(items):
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
        budget.items += array.size
        if budget.items > MAX_ITEMS * 8:
            raise Unsendable(f"an array of {array.size:,} numbers")
        array = np.ascontiguousarray(array)
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
        budget.items += T.numel(data)
        if budget.items > MAX_ITEMS * 8:
            raise Unsendable(f"a tensor of {T.numel(data):,} numbers")
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
    return _decode(data, resolve, _Budget(), 0)


def _decode(d, resolve, budget: _Budget, depth: int):
    try:
        budget.spend(depth)
    except Unsendable as err:
        raise WireError(str(err)) from None
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
            if isinstance(fields, list) and len(fields) == len(items) and all(
                    isinstance(f, str) and f.isidentifier() and not f.startswith("_") for f in fields):
                return _namedtuple(tuple(fields))(*items)
            return tuple(items)
        if tag == "size":
            import torch
            return torch.Size(_ints(items))
        return set(items) if tag == "set" else frozenset(items)
    if tag == "dict":
        out = {}
        for pair in _list(d, "v"):
            if not isinstance(pair, list) or len(pair) != 2:
                raise WireError("a dict entry that is not a pair")
            key = _decode(pair[0], resolve, budget, depth + 1)
            try:
                out[key] = _decode(pair[1], resolve, budget, depth + 1)
            except TypeError:
                raise WireError(f"a dict key that cannot be a key: {type(key).__name__}") from None
        return out
    if tag in ("bytes", "bytearray"):
        raw = _b64(d)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "int":
        text = d.get("v")
        if not isinstance(text, str) or len(text) > 10_000:
            raise WireError("a malformed big int")
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
            raise WireError(f"an unknown dtype {d.get('v')!r}")
        return getattr(torch, d["v"])
    if tag == "device":
        import torch
        text = d.get("v")
        if not isinstance(text, str) or len(text) > 40:
            raise WireError("a malformed device")
        try:
            return torch.device(text)
        except (RuntimeError, TypeError):
            raise WireError(f"an unknown device {text!r}") from None
    if tag == "ref":
        if resolve is None:
            raise WireError("a reference where only plain data may come")
        return resolve(d)
    raise WireError(f"an unknown tag {tag!r}")


@functools.cache
def _namedtuple(fields: tuple[str, ...]):
    return collections.namedtuple("Record", fields)


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    if not isinstance(v, list):
        raise WireError(f"{d.get('$')}: {key} is not a list")
    return v


def _ints(values) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise WireError("a shape that is not a list of sizes")
    return list(values)


def _b64(d: dict) -> bytes:
    v = d.get("data", d.get("v"))
    if not isinstance(v, str):
        raise WireError(f"{d.get('$')}: no data")
    try:
        return base64.b64decode(v, validate=True)
    except ValueError:
        raise WireError(f"{d.get('$')}: data that is not base64") from None


def _decode_tensor(d: dict, budget: _Budget):
    import numpy as np
    import torch

    name = d.get("dtype")
    if name not in TENSOR_DTYPES:
        raise WireError(f"a tensor of unknown dtype {name!r}")
    shape = _ints(_list(d, "shape"))
    raw = _b64(d)
    numel = math.prod(shape)
    budget.items += numel
    if budget.items > MAX_ITEMS * 8:
        raise WireError(f"a tensor of {numel:,} numbers")
    dtype = getattr(torch, name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise WireError(f"a tensor of shape {shape} with {len(raw)} bytes of data")
    if name == "bfloat16":
        t = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.frombuffer(raw, dtype=torch.empty((), dtype=dtype).numpy().dtype).copy())
    t = t.reshape(shape)
    if d.get("requires_grad") is True and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _decode_ndarray(d: dict, budget: _Budget):
    import numpy as np

    text = d.get("dtype")
    try:
        dtype = np.dtype(text) if isinstance(text, str) and len(text) < 8 else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in NUMPY_KINDS:
        raise WireError(f"an array of unknown dtype {text!r}")
    shape = _ints(_list(d, "shape"))
    raw = _b64(d)
    numel = math.prod(shape)
    budget.items += numel
    if budget.items > MAX_ITEMS * 8 or len(raw) != numel * dtype.itemsize:
        raise WireError(f"an array of shape {shape} with {len(raw)} bytes of data")
    array = np.frombuffer(raw, dtype=dtype).copy().reshape(shape)
    return array if d["$"] == "ndarray" else array[()]


# ---------------------------------------------------------------------------------------------------
# Messages on a socket


def send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("ascii")
    if len(data) > MAX_MESSAGE:
        raise Unsendable(f"a message of {len(data):,} bytes (the limit is {MAX_MESSAGE:,})")
    sock.sendall(struct.pack(">Q", len(data)) + data)


def receive(sock: socket.socket) -> dict:
    """The next message; ``EOFError`` when the other side has closed, ``WireError`` for a malformed one."""
    size = struct.unpack(">Q", _exactly(sock, 8))[0]
    if size > MAX_MESSAGE:
        raise WireError(f"a message of {size:,} bytes (the limit is {MAX_MESSAGE:,})")
    try:
        message = json.loads(_exactly(sock, size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise WireError(f"a message that is not JSON ({err})") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not an object")
    return message


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
