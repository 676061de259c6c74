"""Parameter coverage, measured (issue 46): which arguments the hidden checks give each function the learner writes,
and with which kinds of values, over the checks' run on the reference answer.

The judge knows every argument it sends: while the chapter's tests grade the reference (``grading.chapter_tests``:
the run they make anyway), a ``Recorder`` set as ``autograder.judge.RECORDER`` is told of each test cell judged (its
stand-ins, named as the hidden cell's ``check("test_x", fn, Cls)`` names them) and of each request its checks make,
with the answer. From those it follows the learner's objects: a graded function or class, an instance of a graded
class (a stand-in of that type), a method read from one. A call of any of them is bound to the signature of the
reference (``minigpt.<module>``, exported from the chapter's solution notebook), so each parameter is known as left
out, given its default, or given another value, and by the kinds of values it got.

What is graded: the functions and classes a hidden cell hands to ``check``, where the learner writes them (a solution
region of the solution notebook inside the function, or inside one of the class's methods); of a class, its
``__init__`` and each method holding a solution region. Given code handed to ``check`` (``GPTConfig``,
``compile_regex``) is not the learner's and is left out.

The rules (``findings``), for each graded callable:
- it is called where the judge sees it (a callable with parameters that no hidden case calls is not tested);
- each parameter with a default is given another value in some call, and left out in some call (the learner's
  default is only tested where it is used); ``**kwargs``: given a key, and given none;
- each kind named in a parameter's union annotation (``str | list[int]``: a string and a list) is given once.

What it cannot see:
- calls the learner's side makes itself. A helper that calls a learner's function with the arguments the check gave
  (``samplers.run(fn, *args, **kwargs)``: ``CALLS_THROUGH``) counts as the check's call; a helper that calls it with
  arguments of its own (``kv_cache.stream`` running a ``CachedModel``) is named in the report, its calls unseen.
- whether a pass-through argument (a generator, a device, end ids, stop strings, samplers' settings) reaches the
  function it must be handed to: the tool asks that it is given another value than its default at least once, which
  is what lets a check tell; that the check then compares what depends on it is the check's own business.
- the values inside a stand-in (a generator's seed, a model's weights): they count by their type.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import importlib
import inspect
import math
import re

import nbformat

from . import ROOT, hidden_tests

SOLUTION_BEGIN = "### BEGIN SOLUTION"


def _spread(fn, *args, **kwargs):
    return fn, args, kwargs


def _listed(fn, args, weight, *_, kwargs=None, **__):
    return fn, tuple(args), dict(kwargs or {})


# Helpers of the learner's side (``autograder.sandboxed.helpers``) that call their first argument with the check's
# arguments, and how: {kind: (helper's args and kwargs) -> (the callable, its args, its kwargs)}.
CALLS_THROUGH = {
    **{f"{module}.run": _spread for module in ("attention", "embeddings", "samplers", "training", "batching")},
    "attention.devices": _spread,  # fn(*args, **kwargs), noting the devices torch is given
    "batching.generations": _spread,  # fn(*args, **kwargs), its Generations as plain data
    "kv_cache.watched": _spread,  # fn(*args)
    "attention.gradients": _listed,  # (fn, args, weight, pick, kwargs): fn(*args, **kwargs), then a backward pass
    "embeddings.gradients": _listed,  # (fn, args, weight, table=, kwargs=)
    "transformer.run": lambda fn, x, transpose=None: (fn, (x,), {}),  # fn(x), x transposed where asked
    "transformer.gradients": lambda fn, x, weight: (fn, (x,), {}),
    "training.gradient_norms": lambda fn, logits, targets: (fn, (logits, targets), {}),
    # fn(x, *args) for each x of the inputs, in turn: the first call stands for them all (the same kinds of values)
    "tokens.answers": lambda fn, inputs, *args: (fn, (inputs[0], *args), {}) if inputs else (None, (), {}),
}


@dataclasses.dataclass
class Graded:
    """A function or method the learner writes, with the reference's signature (``self`` left out)."""
    name: str  # "pre_split", "Tokenizer.encode"
    signature: inspect.Signature


@dataclasses.dataclass
class Parameter:
    """What the hidden cases gave one parameter."""
    left_out: int = 0
    other: int = 0  # given a value other than its default
    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass
class Seen:
    """What the hidden cases did with one graded callable."""
    calls: int = 0
    parameters: dict[str, Parameter] = dataclasses.field(default_factory=lambda: collections.defaultdict(Parameter))
    handed_to: set[str] = dataclasses.field(default_factory=set)  # helpers that call it unseen
    unbound: list[str] = dataclasses.field(default_factory=list)  # calls that do not fit its signature


# ---------------------------------------------------------------------------------------------------- what is graded


def hidden_objects(chapter: str) -> dict[str, list[str]]:
    """{grade_id: the names its hidden cell hands to ``check``, in order}."""
    found = {}
    for grade_id, source in hidden_tests(chapter).items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check":
                found[grade_id] = [arg.id for arg in node.args[1:] if isinstance(arg, ast.Name)]
    return found


def _solution_definitions(chapter: str) -> dict[str, ast.AST]:
    """{name: its top-level def or class} of the solution notebook's solution cells, each node given ``regions``:
    the lines of its cell's solution regions."""
    nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        starts = [i for i, line in enumerate(cell.source.splitlines(), 1) if line.strip() == SOLUTION_BEGIN]
        for node in ast.parse(cell.source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                node.regions = starts
                found[node.name] = node
    return found


def _learners(node: ast.AST, regions: list[int]) -> bool:
    """Whether a solution region starts inside ``node`` (the learner writes some of it)."""
    return any(node.lineno <= line <= node.end_lineno for line in regions)


def graded(chapter: str) -> tuple[dict[str, Graded], dict[str, str]]:
    """({name: Graded} of the callables the learner writes that the hidden cells hand over, with each graded
    class's method run by calling an instance under "Class()"), {name handed over: why it is not graded}."""
    from minigpt import CHAPTERS

    module = importlib.import_module(f"minigpt.{CHAPTERS[chapter]}")
    definitions = _solution_definitions(chapter)
    found, given = {}, {}
    for name in dict.fromkeys(n for names in hidden_objects(chapter).values() for n in names):
        node, obj = definitions.get(name), getattr(module, name)
        if node is None or not _learners(node, node.regions):
            given[name] = "given code, not the learner's"
        elif isinstance(node, ast.FunctionDef):
            found[name] = Graded(name, inspect.signature(obj))
        else:
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)
                       and not any(getattr(d, "id", "") == "property" for d in m.decorator_list)}
            for method, m in methods.items():
                if method == "__init__" or _learners(m, node.regions):
                    found[f"{name}.{method}"] = Graded(f"{name}.{method}", _method_signature(obj, method))
            run = f"{name}.__call__" if "__call__" in methods else f"{name}.forward"
            if run in found:
                found[f"{name}()"] = found[run]
    return found, given


def _method_signature(cls: type, method: str) -> inspect.Signature:
    raw = inspect.getattr_static(cls, method)
    signature = inspect.signature(getattr(cls, method))
    if isinstance(raw, (staticmethod, classmethod)):
        return signature
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # less self


# ---------------------------------------------------------------------------------------------------- the record


class Recorder:
    """Told by the judge (``autograder.judge.RECORDER``) of each test cell it judges and each request its checks
    make; keeps, for each graded callable of ``chapter``, what its parameters were given (``seen``)."""

    def __init__(self, chapter: str):
        from minigpt import CHAPTERS

        self.chapter, self.module = chapter, f"minigpt.{CHAPTERS[chapter]}"
        self.callables, self.given = graded(chapter)
        self.classes = {name.partition(".")[0] for name in self.callables if "." in name}
        self.objects = hidden_objects(chapter)
        self.seen: dict[str, Seen] = collections.defaultdict(Seen)
        self._roles: dict[object, dict[int, str]] = {}  # session -> {stand-in id: what it is}

    def judging(self, session, grade_id: str, objects: list) -> None:
        self._roles[session] = {obj._id: name for obj, name in zip(objects, self.objects.get(grade_id, []))}

    def requested(self, session, op: str, target, args, kwargs: dict, fields: dict, value) -> None:
        from autograder.judge import Remote

        if op == "call":
            self._called(session, target, args, kwargs)
        elif op == "getattr" and isinstance(value, Remote) and value._callable:
            owner = self._role(session, target).removesuffix("()")
            if owner in self.classes:
                self._roles[session][value._id] = f"{owner}.{fields['name']}"
        elif op in ("ask", "make"):
            through = CALLS_THROUGH.get(fields.get("kind"))
            if through is not None and args:
                fn, args, kwargs = through(*args, **kwargs)
                self._called(session, fn, args, kwargs)
            else:  # a learner's callable handed to a helper that calls it with arguments of its own: unseen
                for item in [*args, *kwargs.values()]:
                    role = self._role(session, item)
                    if role in self.callables:
                        self.seen[self.callables[role].name].handed_to.add(fields.get("kind", op))

    def _role(self, session, obj) -> str:
        """What a stand-in is: a graded name ("pre_split", "Tokenizer", "Tokenizer.encode"), "Tokenizer()" for an
        instance of a graded class, or ""."""
        from autograder.judge import Remote

        if not isinstance(obj, Remote):
            return ""
        role = self._roles.get(session, {}).get(obj._id, "")
        # the learner's class is the notebook's (no module), or the reference's where its own objects are judged
        name = obj._type.removeprefix(f"{self.module}.")
        if not role and name in self.classes:
            role = f"{name}()"
        return role

    def _called(self, session, target, args, kwargs: dict) -> None:
        role = self._role(session, target)
        name = f"{role}.__init__" if role in self.classes else role
        if name not in self.callables:
            return  # not the learner's callable (a helper's, or a method the class inherits: nn.Module.to)
        key = self.callables[name].name
        seen, signature = self.seen[key], self.callables[name].signature
        seen.calls += 1
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError as err:
            seen.unbound.append(str(err))
            return
        for p in signature.parameters.values():
            given = seen.parameters[p.name]
            if p.name not in bound:
                given.left_out += 1
                continue
            value = bound[p.name]
            if p.kind is p.VAR_KEYWORD:
                given.kinds.update(f"{k}=" for k in value)
                given.other += bool(value)
                given.left_out += not value
            elif p.kind is p.VAR_POSITIONAL:
                given.kinds.update(kind(v) for v in value)
                given.other += bool(value)
                given.left_out += not value
            else:
                given.kinds[kind(value)] += 1
                given.other += p.default is p.empty or not is_default(value, p.default)


@contextlib.contextmanager
def recording(chapter: str):
    """A ``Recorder`` of ``chapter``, set as the judge's while the block runs."""
    from autograder import judge

    recorder = Recorder(chapter)
    before, judge.RECORDER = judge.RECORDER, recorder
    try:
        yield recorder
    finally:
        judge.RECORDER = before


def kind(value) -> str:
    """The kind of a value a check sends, as the report names it: its type, and whether it is an edge (0, empty)."""
    import torch

    from autograder.judge import Remote

    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, Remote):
        return f"<{value._type}>"
    if isinstance(value, int):
        return "int 0" if value == 0 else "int < 0" if value < 0 else "int"
    if isinstance(value, float):
        return "float inf" if math.isinf(value) else "float nan" if math.isnan(value) else \
            "float 0" if value == 0 else "float"
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')}" + (" (empty)" if value.numel() == 0 else "")
    if isinstance(value, torch.dtype):
        return "dtype"
    name = type(value).__name__
    try:
        return f"{name} (empty)" if len(value) == 0 else name
    except TypeError:
        return name


_COLLECTIONS = (list, tuple, set, frozenset)


def is_default(value, default) -> bool:
    """Whether ``value`` is the parameter's ``default`` as the function sees it (an empty list for ``()``)."""
    if default is None or value is None:
        return value is default
    if isinstance(default, _COLLECTIONS) and isinstance(value, _COLLECTIONS):
        return sorted(map(repr, value)) == sorted(map(repr, default))
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return value == default
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # noqa: BLE001 (a tensor's ==: never a default here)
        return False


# ---------------------------------------------------------------------------------------------------- the verdicts


# Annotation kinds the tool recognises in a union, and the kinds of values (``kind``) that count as one of them.
_ALTERNATIVES = {
    "str": ("str",), "bytes": ("bytes",), "int": ("int",), "float": ("float",), "dict": ("dict",),
    "Tensor": ("tensor",),
    **{c: ("list", "tuple", "set", "frozenset", "<generator>", "<list_iterator>")
       for c in ("list", "tuple", "set", "frozenset", "Iterable", "Collection", "Sequence")},
}


def alternatives(annotation) -> list[str]:
    """The kinds a union annotation names that the tool recognises (``"str | list[int]"`` -> ["str", "list"]);
    [] for an annotation that is not a union, or names one the tool does not know."""
    if not isinstance(annotation, str) or "|" not in annotation:
        return []
    depth, parts, part = 0, [], ""
    for char in annotation:
        depth += char == "["
        depth -= char == "]"
        if char == "|" and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += char
    if not parts:
        return []  # a union only inside brackets: dict[str, int | None]
    names = [re.sub(r"\[.*", "", p.strip()).rpartition(".")[2] for p in [*parts, part]]
    names = [n for n in names if n != "None"]
    return names if all(n in _ALTERNATIVES for n in names) else []


def _has_kind(kinds, alternative: str) -> bool:
    return any(k.startswith(prefix) for k in kinds for prefix in _ALTERNATIVES[alternative])


def findings(recorder: Recorder) -> dict[str, str]:
    """{key: what is missing} of every rule broken; keys are "name" (the callable) or "name(parameter)", the keys
    of a test file's allow-list."""
    found = {}
    for name, graded_, seen in _each(recorder):
        parameters = graded_.signature.parameters
        if not parameters:
            continue
        if seen.calls == 0:
            via = f" (handed to {', '.join(sorted(seen.handed_to))}, which call it unseen)" if seen.handed_to else ""
            found[name] = f"{name} is never called by a hidden case where the judge sees it{via}"
            continue
        for p in parameters.values():
            given = seen.parameters.get(p.name, Parameter())
            missing = []
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                if not given.other:
                    missing.append("never given any")
                if not given.left_out:
                    missing.append("never left out")
            elif p.default is not p.empty:
                if not given.other:
                    missing.append(f"never given a value other than its default {p.default!r}")
                if not given.left_out:
                    missing.append(f"never left out (its default {p.default!r} is never used)")
            kinds = [*given.kinds, *([kind(p.default)] if given.left_out else [])]
            lacking = [a for a in alternatives(p.annotation) if not _has_kind(kinds, a)]
            if lacking:
                missing.append(f"never given a {' or a '.join(lacking)} (annotated {p.annotation})")
            if missing:
                star = "**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else ""
                found[f"{name}({p.name})"] = f"{name}({star}{p.name}): {'; '.join(missing)} " \
                                              f"in {seen.calls} calls (given: {_kinds(given)})"
    return found


def _each(recorder: Recorder):
    """(name, Graded, Seen) of each graded callable, by name (an instance's call is its method's)."""
    for name, graded_ in sorted(recorder.callables.items()):
        if not name.endswith("()"):
            yield name, graded_, recorder.seen.get(name, Seen())


def _kinds(given: Parameter) -> str:
    kinds = [f"{k} x{n}" for k, n in sorted(given.kinds.items())]
    return ", ".join(kinds + ([f"left out x{given.left_out}"] if given.left_out else [])) or "nothing"


def report(recorder: Recorder) -> str:
    """Every graded callable of the chapter, its calls and what each parameter got, one line each."""
    lines = [f"{recorder.chapter}:"]
    for name, why in recorder.given.items():
        lines.append(f"  {name}: not graded ({why})")
    for name, graded_, seen in _each(recorder):
        via = f", handed to {', '.join(sorted(seen.handed_to))} (calls unseen)" if seen.handed_to else ""
        lines.append(f"  {name}: {seen.calls} calls{via}" + (f", {len(seen.unbound)} unbound" if seen.unbound else ""))
        for p in graded_.signature.parameters.values():
            default = "" if p.default is p.empty else f"={p.default!r}"
            lines.append(f"    {p.name}{default}: {_kinds(seen.parameters.get(p.name, Parameter()))}")
    return "\n".join(lines)


def check(recorder: Recorder, allowed: dict[str, str]) -> None:
    """Fail with every rule broken that ``allowed`` ({key: why}) does not excuse, and every excuse not needed."""
    found = findings(recorder)
    unexcused = [text for key, text in found.items() if key not in allowed]
    stale = [f"{key} (excused: {why})" for key, why in allowed.items() if key not in found]
    said = []
    if unexcused:
        said.append("parameters the hidden cases do not cover (add a case, or excuse one with its reason in the "
                    "chapter's test file):\n  " + "\n  ".join(unexcused))
    if stale:
        said.append("excused but covered now (take them off the list):\n  " + "\n  ".join(stale))
    assert not said, f"{recorder.chapter}: " + "\n".join(said) + "\n\nWhat the hidden cases gave:\n" + report(recorder)

