"""Helpers of chapter 2 (embeddings), run next to the learner's code: a call that reports whether it changed its
tensor arguments in place (the caller's tensors are on that side), a forward and backward pass whose gradients
are computed there, and the names of the notebook's functions that a learner's function or class calls. No
answers here: the judge computes those.

This runs where ``minigpt.embeddings`` cannot be imported: torch and the learner's objects only.
"""
from __future__ import annotations

__all__ = ["run", "gradients", "uses"]


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [how fn changed args[i] in place: "" where it did not, else what changed])``; an
    argument that is not a tensor counts as unchanged."""
    import torch

    before = [(a.clone(), a.shape, a.dtype) if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args, **kwargs)
    changed = []
    for a, b in zip(args, before):
        if b is None:
            changed.append("")
        elif a.shape != b[1]:
            changed.append(f"its shape {tuple(b[1])} became {tuple(a.shape)}")
        elif a.dtype != b[2]:
            changed.append(f"its dtype {b[2]} became {a.dtype}")
        elif not torch.equal(a, b[0]):
            changed.append("its values changed")
        else:
            changed.append("")
    return out, changed


def gradients(fn, args: list, weight, table: int | None = None, kwargs=None) -> dict:
    """A forward and backward pass as training runs them, with gradients on (whatever the notebook set):
    ``out = fn(*args, **kwargs)``, then the gradients of ``(out * weight).sum()`` by ``torch.autograd.grad``
    (nothing accumulates in ``.grad``) with respect to ``args[table]`` (made a leaf that requires grad) where
    ``table`` is given, else to ``fn``'s parameters (a module's).

    {"requires_grad": whether out carries a gradient, "table": the gradient of args[table] or None,
    "params": {name: gradient or None}}; {"output": out} alone when ``out`` is not a tensor of ``weight``'s shape
    (the judge says what is wrong with it)."""
    import torch

    kwargs = kwargs or {}
    with torch.enable_grad():
        args = list(args)
        if table is not None:
            args[table] = args[table].detach().clone().requires_grad_(True)
        out = fn(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.shape != weight.shape:
            return {"output": out}
        named = list(fn.named_parameters()) if isinstance(fn, torch.nn.Module) else []
        answer = {"requires_grad": out.requires_grad, "table": None, "params": {name: None for name, _ in named}}
        wrt = [args[table]] if table is not None else [p for _, p in named if p.requires_grad]
        if not out.requires_grad or not wrt:
            return answer
        grads = torch.autograd.grad((out * weight.to(out.dtype)).sum(), wrt, allow_unused=True)
    if table is not None:
        answer["table"] = grads[0]
    else:
        for (name, _), grad in zip([(n, p) for n, p in named if p.requires_grad], grads):
            answer["params"][name] = grad
    return answer


def uses(obj, names: list[str]) -> list[str]:
    """Which of ``names`` (functions of the notebook) the code of ``obj`` (a function, or a class's methods)
    refers to, directly or through other functions and classes of the same notebook."""
    import types

    wanted, found, seen = set(names), set(), set()
    todo = [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        functions = [item] if isinstance(item, types.FunctionType) else \
            [f for f in vars(item).values() if isinstance(f, types.FunctionType)] if isinstance(item, type) else []
        for fn in functions:
            codes = [fn.__code__]
            while codes:
                code = codes.pop()
                codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
                for name in code.co_names:
                    if name in wanted:
                        found.add(name)
                    target = fn.__globals__.get(name)
                    # only what the notebook itself defines: functions and classes sharing its globals
                    if isinstance(target, types.FunctionType) and target.__globals__ is fn.__globals__:
                        todo.append(target)
                    elif isinstance(target, type) and any(
                            isinstance(f, types.FunctionType) and f.__globals__ is fn.__globals__
                            for f in vars(target).values()):
                        todo.append(target)
    return sorted(found)
