"""Readable checks for the tests learners run and the autograder calls.

A failed check says what was called, what came back, what was expected and, where we can tell, why:
"pre_split(\"I'll\") returned ['I', \"'\", 'll'], expected ['I', \"'ll\"]" rather than a bare AssertionError.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import linecache
import os
import re
import reprlib
import sysconfig
import threading
import warnings

_short = reprlib.Repr()
_short.maxstring = 80
_short.maxother = 80
_short.maxlist = 12
_short.maxdict = 6
_short.maxlevel = 3


_ADDRESS = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def show(value) -> str:
    """A repr short enough for one line of feedback; a tensor by its dtype and shape (and values, when few)."""
    if isinstance(value, dict) and len(value) > _short.maxdict:
        return f"<dict of {len(value)} entries>"  # reprlib would sort all of them first: slow on 50,000 ranks
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        shape = tuple(value.shape)
        if value.numel() <= 6 and value.dim() <= 2:
            return f"tensor({_short.repr(value.tolist())}, dtype={str(value.dtype).removeprefix('torch.')})"
        return f"<{str(value.dtype).removeprefix('torch.')} tensor of shape {shape}>"
    text = _short.repr(value)
    # an object shown by its address (`<torch._C.Generator object at 0x7f...>`) by its type alone: a message must
    # not change from one run, or one process, to the next
    return _ADDRESS.sub(lambda m: f"<a {m[1].rsplit('.', 1)[-1]}>", text)


def describe_call(name: str, args=(), kwargs=None) -> str:
    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in (kwargs or {}).items()]
    return f"{name}({', '.join(parts)})"


def describe(fn, args=(), kwargs=None, name: str | None = None) -> str:
    """How a message names the call ``fn(*args, **kwargs)``: ``name`` and the arguments where a name is given; a
    lambda by the expression it returns, as the test cell wrote it, its parameters replaced by the values passed
    (``left_pad([[4], [5, 6]], 50256)[0].tolist()``, not ``<lambda>()``); any other function by its name."""
    if name is None and getattr(fn, "__name__", None) == "<lambda>":
        written = _lambda_expression(fn, args, kwargs or {})
        if written:
            return written
    return describe_call(name or getattr(fn, "__qualname__", repr(fn)), args, kwargs)


MAX_EXPRESSION_BYTES = 400  # a test's expression is a line or two; a longer lambda is named as before


def _lambda_expression(fn, args, kwargs) -> str | None:
    """The source of the expression a lambda returns, from the positions its code records (a notebook cell's source
    is in linecache), with each parameter replaced by its value; None where the source cannot be read."""
    code = fn.__code__
    spans = [(line, col, end_line, end_col) for line, end_line, col, end_col in code.co_positions()
             if line is not None and col is not None and (line, col) != (end_line, end_col)]
    lines = linecache.getlines(code.co_filename)
    if not spans or not lines:
        return None
    (first, start), (last, end) = min(s[:2] for s in spans), max(s[2:] for s in spans)
    chunk = [line.encode("utf-8") for line in lines[first - 1:last]]  # positions count UTF-8 bytes
    if len(chunk) != last - first + 1:
        return None
    chunk[-1] = chunk[-1][:end]
    chunk[0] = chunk[0][start:]
    source = b"".join(chunk)
    if len(source) > MAX_EXPRESSION_BYTES:
        return None
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        tree = ast.parse(source.decode("utf-8"), mode="eval")
    except (TypeError, SyntaxError, UnicodeDecodeError):
        return None
    bound.apply_defaults()
    starts = [0]  # the byte offset of each line of the expression
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offsets(node):
        return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset

    values = bound.arguments
    varargs = {p.name for p in bound.signature.parameters.values() if p.kind is p.VAR_POSITIONAL}
    swaps, inside_starred = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Starred) and isinstance(node.value, ast.Name) and node.value.id in varargs:
            swaps.append((*offsets(node), ", ".join(show(v) for v in values[node.value.id])))
            inside_starred.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in values and id(node) not in inside_starred:
            swaps.append((*offsets(node), show(values[node.id])))
    for begin, finish, text in sorted(swaps, reverse=True):
        source = source[:begin] + text.encode("utf-8") + source[finish:]
    return re.sub(r"\s*\n\s*", " ", source.decode("utf-8"))


# ---------------------------------------------------------------- where an error came from



def _tooling() -> tuple[str, ...]:
    """The folders of the course's tools (this package, and the autograder where it is installed)."""
    import importlib.util

    folders = [os.path.dirname(__file__)]
    try:
        spec = importlib.util.find_spec("autograder")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        folders += list(spec.submodule_search_locations)
    return tuple(os.path.realpath(f) + os.sep for f in folders)


_TOOLING = _tooling()
_LIBRARY = tuple(sorted({os.path.realpath(p) + os.sep for k, p in sysconfig.get_paths().items()
                         if k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _in_a_cell(filename: str) -> bool:
    """Code typed in a notebook: IPython keeps a cell's source in linecache with no file time; a cell run by
    ``exec(compile(source, "<name>", "exec"))`` has a name in angle brackets."""
    entry = linecache.cache.get(filename)
    if entry is not None and len(entry) > 1 and entry[1] is None:
        return True
    return filename.startswith("<") and not filename.startswith(("<frozen", "<string>"))


def learner_frame(tb) -> dict | None:
    """The innermost frame of the learner's own code in a traceback: in a notebook cell if any, else outside
    the standard library, installed packages and the course's tools. {function, line, text, cell, file}:
    ``cell`` is the sha1 of the whole cell's source (to find the cell in the notebook), ``text`` the line."""
    cell = other = None
    while tb is not None:
        code, line = tb.tb_frame.f_code, tb.tb_lineno
        filename = os.path.realpath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename
        if _in_a_cell(code.co_filename):
            cell = (code, line)
        elif not filename.startswith(_LIBRARY + _TOOLING):
            other = (code, line)
        tb = tb.tb_next
    found = cell or other
    if found is None:
        return None
    code, line = found
    text = linecache.getline(code.co_filename, line).strip()
    lines = linecache.cache.get(code.co_filename, (None, None, None))[2]
    digest = hashlib.sha1("".join(lines).rstrip("\n").encode("utf-8", "surrogatepass")).hexdigest() \
        if cell and lines else None
    function = re.sub(r"\.<(locals|genexpr|listcomp|dictcomp|setcomp|lambda)>", "", code.co_qualname)
    return {"function": function, "line": line, "text": text[:160], "cell": digest,
            "file": None if cell else code.co_filename}


def innermost_function(tb) -> str:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_qualname if tb is not None else "it"


def describe_where(where: dict | None, cell_name: str | None = None) -> str:
    """' (cell bpe_merge, line 7, in bpe_merge: `parts[i:i + 2] = ...`)', or '' when the learner's code is not on
    the stack."""
    if not where:
        return ""
    if cell_name:
        place = f"cell {cell_name}, line {where['line']}, in {where['function']}"
    else:
        place = f"line {where['line']} of your {where['function']}"
        if where.get("file") and not where["file"].startswith("<"):
            place += f" in {os.path.basename(where['file'])}"
    return f" ({place}: `{where['text']}`)" if where.get("text") else f" ({place})"


def describe_error(err: BaseException) -> str:
    """'KeyError: 42 (line 7 of your bpe_merge: `...`)': an error of the learner's code, and where it was raised.
    An error the grader received from a sandbox carries its learner's type name and place with it."""
    name = getattr(err, "type_name", None) or type(err).__name__
    where = getattr(err, "where", None) if hasattr(err, "type_name") else learner_frame(err.__traceback__)
    message = str(err)
    return f"{name}: {message}{describe_where(where, getattr(err, 'cell_name', None))}" if message else \
        f"{name}{describe_where(where, getattr(err, 'cell_name', None))}"


def not_written(label: str, err: NotImplementedError) -> AssertionError:
    """The failure for a call that reached a stub: "not written yet", naming the function that still raises (a
    method may be written and a helper it calls not)."""
    where = getattr(err, "not_written", None) or innermost_function(err.__traceback__)
    return AssertionError(f"{label}: not written yet ({where} still raises NotImplementedError)")


def call(fn, *args, name: str | None = None, label: str | None = None, hint: str = "", **kwargs):
    """Call a learner's function; turn "not written yet" and crashes into messages that name the call.

    The call is described from ``name`` and the arguments, or by ``label`` where the caller has a better
    description (tensors by their shapes, models by their size); ``hint`` is added to a crash's message."""
    label = label or describe(fn, args, kwargs, name)
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except Exception as err:  # the learner's bug, reported with the call that triggered it and its line
        if getattr(err, "grader_side", False):  # the grader's own trouble (a lost connection) is not the learner's
            raise
        raise AssertionError(f"{label} raised {describe_error(err)}" + (f"\nHint: {hint}" if hint else "")) \
            from err


def expect(fn, *args, want, hint: str = "", name: str | None = None, **kwargs) -> None:
    """Check ``fn(*args, **kwargs) == want``; on failure say what came back and, if given, a hint.

    Returns None on purpose: nbgrader reads a number left as a test cell's last value as partial credit.
    """
    label = describe(fn, args, kwargs, name)  # before fn can change them
    got = call(fn, *args, label=label, hint=hint, **kwargs)
    if got != want:
        fail(f"{label} returned {show(got)}, expected {show(want)}", hint)


# The default tolerance of expect_close and close: float32 values of magnitude up to about 10 from a few chained
# layers of short sums (tens of terms), each rounding by about sqrt(terms) * magnitude * 6e-8; the differences
# between correct ways and between CPUs' kernels measured stay under a fifth of it (2.2e-6 at 6.8), and the mistakes
# the tests must catch are off by 1e-3 or more. A comparison outside that regime (larger values, more terms, float64,
# exact results) gives its own.
DEFAULT_ATOL = DEFAULT_RTOL = 1e-5


def expect_close(fn, *args, want, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL, hint: str = "",
                 name: str | None = None, **kwargs) -> None:
    """Check that ``fn(*args, **kwargs)`` is a tensor of ``want``'s shape and dtype, equal to it within
    ``atol + rtol * |want|`` everywhere; on failure say where it differs most, by how much, and the hint."""
    import torch

    label = describe(fn, args, kwargs, name)
    got = call(fn, *args, label=label, hint=hint, **kwargs)
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {show(got)}, expected a tensor of shape {tuple(want.shape)}", hint)
    if tuple(got.shape) != tuple(want.shape):
        fail(f"{label} returned a tensor of shape {tuple(got.shape)}, expected {tuple(want.shape)}", hint)
    if got.dtype != want.dtype:
        name_got = str(got.dtype).removeprefix("torch.")
        fail(f"{label} returned {'an' if name_got[0] in 'aeiou' else 'a'} {name_got} tensor, expected "
             f"{str(want.dtype).removeprefix('torch.')}", hint or "keep the input's dtype")
    got64, want64 = got.detach().double(), want.detach().double()
    bad = ~torch.isclose(got64, want64, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        at = f" at index {where}" if where else ""
        fail(f"{label} differs from the expected values{at}: got {got64[where].item():.6g}, expected "
             f"{want64[where].item():.6g} ({int(bad.sum())} of {bad.numel()} values differ by more than "
             f"{atol:g} + {rtol:g} * |expected|)", hint)


def close(got, want, *, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> bool:
    """Whether ``got`` equals ``want`` within ``atol + rtol * |want|`` everywhere: numbers, tensors, arrays or lists
    of numbers, of the same shape. NaN and infinities match only where ``want`` holds the same value in the same
    place. Every comparison with NaN is false, so a test written ``abs(got - want) > tol`` passes a NaN: checks
    compare values with this helper, never with a hand-written difference."""
    import torch

    def wide(x):  # Python numbers as float64 (torch would read them as float32: e ** 100 would be inf)
        if isinstance(x, torch.Tensor):
            return x.detach()
        try:
            return torch.as_tensor(x, dtype=torch.float64)
        except (TypeError, RuntimeError):  # complex numbers, or arrays of their own dtype
            return torch.as_tensor(x)

    try:
        g, w = wide(got), wide(want)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return False
    if g.shape != w.shape:
        return False
    wide = torch.complex128 if g.is_complex() or w.is_complex() else torch.float64
    return bool(torch.isclose(g.to(wide), w.to(wide), atol=atol, rtol=rtol, equal_nan=True).all())


def expect_raises(exc_type, fn, *args, match: str = "", hint: str = "", name: str | None = None, **kwargs):
    """Check that ``fn(*args, **kwargs)`` raises ``exc_type`` (with ``match`` in its message)."""
    label = describe(fn, args, kwargs, name)
    try:
        got = fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except exc_type as err:
        if getattr(err, "grader_side", False):
            raise
        if match and match not in str(err):
            fail(f"{label} raised {describe_error(err)}, whose message should mention {match!r}", hint)
        return None
    except Exception as err:
        if getattr(err, "grader_side", False):
            raise
        fail(f"{label} raised {describe_error(err)}; expected {exc_type.__name__}", hint)
    fail(f"{label} returned {show(got)}; expected it to raise {exc_type.__name__}", hint)


def fail(message: str, hint: str = ""):
    raise AssertionError(message + (f"\nHint: {hint}" if hint else ""))


@contextlib.contextmanager
def isolated(threads: int = 1):
    """Run a check (``@isolated()``) or a block (``with isolated():``) on one CPU thread (or ``threads``), with torch's
    random generator forked: afterwards the caller's thread setting and random state are as they were. A check runs
    in the learner's kernel, between the learner's cells, and must change nothing they compute next; and the
    course's tensors are small: on a busy machine, torch's threads mostly wait on each other."""
    import torch

    own = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(own)


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: tuple = ()


@contextlib.contextmanager
def quiet_transformers():
    """No logs, warnings or progress bars from Hugging Face transformers while the block runs. Those switches
    (and Python's warning filters) are the process's: with several threads in such blocks at once, the first to
    enter turns them off and the last to leave puts them back."""
    global _quiet_depth, _quiet_saved
    from transformers.utils import logging as hf_logging

    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_saved = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), warnings.filters[:])
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            warnings.simplefilter("ignore")
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                verbosity, bars, filters = _quiet_saved
                hf_logging.set_verbosity(verbosity)
                if bars:
                    hf_logging.enable_progress_bar()
                warnings.filters[:] = filters
                warnings._filters_mutated()
