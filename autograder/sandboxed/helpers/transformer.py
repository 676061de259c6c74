"""Helpers of chapter 4 (the transformer), run next to the learner's code: a call that reports whether it changed
its input, a forward and backward pass whose gradients are computed there, a Hugging Face checkpoint written there
for ``GPT.from_pretrained``, the files ``GPT.save_pretrained`` writes, and whether a model's LM head is its token
table. No answers here: the judge computes those.

This runs where ``minigpt.transformer`` cannot be imported: torch, the standard library and the learner's objects
only.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["run", "gradients", "from_pretrained", "saved_files", "head_is_token_table"]

CHECKPOINT_FILES = ("config.json", "model.safetensors")
MAX_SAVED_BYTES = 32 * 1024 * 1024  # what the judge reads back of a saved model, all files together


def run(fn, x, transpose=None):
    """``(fn(x), whether fn changed x in place)``. With ``transpose`` (two dims), ``fn`` gets ``x.transpose(*dims)``,
    a view that is not contiguous (a tensor crosses to this side contiguous)."""
    import torch

    if transpose is not None:
        x = x.transpose(*transpose)
    before = x.clone()
    out = fn(x)
    return out, not torch.equal(x, before)


def gradients(fn, x, weight) -> dict:
    """A forward and backward pass as training runs them: ``out = fn(x)`` with gradients on (whatever the
    notebook set), then the gradients of ``(out * weight).sum()`` with respect to ``x`` (a float ``x``) and to
    ``fn``'s parameters (a module's), by ``torch.autograd.grad``: nothing is accumulated into ``.grad``.
    {"output": out (detached), "requires_grad": whether out carries a gradient, "input": x's gradient or None,
    "params": {name: gradient or None}}; only "output" when ``out`` is not a tensor, and no gradients when it
    has another shape than ``weight``."""
    import torch

    with torch.enable_grad():
        if x.is_floating_point():
            x.requires_grad_(True)
        out = fn(x)
        if not isinstance(out, torch.Tensor):
            return {"output": out}
        named = list(fn.named_parameters()) if isinstance(fn, torch.nn.Module) else []
        answer = {"output": out.detach(), "requires_grad": out.requires_grad, "input": None,
                  "params": {name: None for name, _ in named}}
        wrt = ([x] if x.requires_grad else []) + [p for _, p in named if p.requires_grad]
        if not out.requires_grad or not wrt or out.shape != weight.shape:
            return answer  # the judge says what is wrong with the output first
        grads = torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)
    grads = list(grads)
    if x.requires_grad:
        answer["input"] = grads.pop(0)
    for name, p in named:
        if p.requires_grad:
            answer["params"][name] = grads.pop(0)
    return answer


def from_pretrained(GPT, files: dict):
    """``GPT.from_pretrained(folder)`` for a folder holding ``files`` ({name: bytes}, a Hugging Face checkpoint the
    judge wrote), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="minigpt-checkpoint-"))
    try:
        for name, data in files.items():
            if name not in CHECKPOINT_FILES:
                raise ValueError(f"not a checkpoint file: {name!r}")
            (folder / name).write_bytes(data)
        return GPT.from_pretrained(str(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def saved_files(model) -> dict:
    """{name: bytes} of the checkpoint files that ``model.save_pretrained(folder)`` writes in an empty folder."""
    folder = Path(tempfile.mkdtemp(prefix="minigpt-saved-"))
    try:
        model.save_pretrained(str(folder))
        out, total = {}, 0
        for name in CHECKPOINT_FILES:
            path = folder / name
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
                if total > MAX_SAVED_BYTES:
                    raise ValueError(f"save_pretrained wrote more than {MAX_SAVED_BYTES:,} bytes")
                out[name] = path.read_bytes()
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def head_is_token_table(model):
    """Whether ``model.lm_head.weight`` is the very tensor ``model.emb.wte.weight``; None without an ``lm_head``."""
    table = model.emb.wte.weight
    head = getattr(model, "lm_head", None)
    if head is None:
        return None
    return getattr(head, "weight", None) is table
