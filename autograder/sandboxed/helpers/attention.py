"""Helpers of chapter 3 (masked attention), run next to the learner's code: a call that reports whether it changed
its tensor arguments in place (the caller's tensors are on that side), a call that reports the devices it gave torch,
and a forward and backward pass whose gradients are computed there. No answers here: the judge computes those.

This runs where ``minigpt.attention`` cannot be imported: torch and the learner's objects only.
"""
from __future__ import annotations

__all__ = ["run", "devices", "gradients"]


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [whether fn changed args[i] in place, for each positional argument])``; an argument
    that is not a tensor counts as unchanged."""
    import torch

    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args, **kwargs)
    changed = [b is not None and not torch.equal(a, b) for a, b in zip(args, before)]
    return out, changed


def devices(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [the devices torch's functions were given while fn ran, as text, sorted])``: the
    ``device=`` of a factory (``torch.ones(..., device=d)``) and the device of a ``.to(d)``. On a machine with only a
    CPU the result is on the CPU whether or not fn passed its device on; what fn gave torch shows it."""
    import torch
    from torch.overrides import TorchFunctionMode

    seen: set[str] = set()

    def note(value) -> None:
        if isinstance(value, torch.device):
            seen.add(str(value))
        elif isinstance(value, str):
            try:
                seen.add(str(torch.device(value)))
            except RuntimeError:  # a string that names no device (an einsum's equation)
                pass

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            note(kwargs.get("device"))
            if func is torch.Tensor.to:
                for value in args[1:]:
                    note(value)
            return func(*args, **kwargs)

    with Watch():
        out = fn(*args, **kwargs)
    return out, sorted(seen)


def gradients(fn, args: list, weight, pick=None, kwargs=None) -> dict:
    """A forward and backward pass as training runs them: every floating-point tensor of ``args`` requires grad,
    ``out = fn(*args, **kwargs)`` runs with gradients on (whatever the notebook set), ``out[pick]`` when ``pick``
    is given (attention returns a pair), then the gradients of ``(out * weight).sum()`` with respect to those
    arguments and to ``fn``'s parameters (a module's), by ``torch.autograd.grad``: nothing accumulates in ``.grad``.

    {"output": out (detached), "requires_grad": whether out carries a gradient, "inputs": [each argument's
    gradient, or None], "params": {name: gradient or None}}; only "output" when ``out`` is not a tensor of
    ``weight``'s shape (the judge says what is wrong with it)."""
    import torch

    kwargs = kwargs or {}
    with torch.enable_grad():
        args = [a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a for a in args]
        out = fn(*args, **kwargs)
        if pick is not None:
            if not isinstance(out, (tuple, list)) or len(out) <= pick:
                return {"output": out}
            out = out[pick]
        if not isinstance(out, torch.Tensor) or out.shape != weight.shape:
            return {"output": out}
        named = list(fn.named_parameters()) if isinstance(fn, torch.nn.Module) else []
        answer = {"output": out.detach(), "requires_grad": out.requires_grad,
                  "inputs": [None] * len(args), "params": {name: None for name, _ in named}}
        wrt_args = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        wrt_params = [(name, p) for name, p in named if p.requires_grad]
        if not out.requires_grad or not (wrt_args or wrt_params):
            return answer
        grads = torch.autograd.grad((out * weight).sum(), [args[i] for i in wrt_args] + [p for _, p in wrt_params],
                                    allow_unused=True)
    for i, grad in zip(wrt_args, grads):
        answer["inputs"][i] = grad
    for (name, _), grad in zip(wrt_params, grads[len(wrt_args):]):
        answer["params"][name] = grad
    return answer
