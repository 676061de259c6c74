"""Helpers of chapter 8 (training), run next to the learner's code: seeded tiny GPTs, a model that records the mode
and gradient switch it was called in, an AdamW that records the learning rate of each step, a callback that
records when it was called, and a look at a model's parameters. No answers: the judge computes those with the
reference training code from the same recipes.

This runs where ``minigpt.training`` cannot be imported: torch, chapter 4's GPT and the standard library only.
"""
from __future__ import annotations

import torch

__all__ = ["generator", "tiny_gpt", "Watched", "adamw", "sgd", "Evaluate", "parameters", "gradient_norms", "run"]


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny_gpt(seed: int, vocab_size: int = 97, block_size: int = 16, n_layer: int = 2, n_head: int = 2,
             n_embd: int = 24, dtype: str = "float32"):
    """A small GPT of chapter 4 with weights drawn from ``seed`` (the caller's random state is left as it was), its
    parameters in ``dtype`` ("float32" or "float64")."""
    from minigpt.transformer import GPT, GPTConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                             n_embd=n_embd)).to({"float32": torch.float32, "float64": torch.float64}[dtype])


def Watched(model):
    """``model`` wrapped to record, at each forward pass, whether it was in training mode and whether gradients
    were on (``.calls``: a list of (training, grad_enabled)); ``.config`` and the parameters are the model's."""

    class WatchedModel(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model, self.config, self.calls = inner, inner.config, []

        def forward(self, idx):
            self.calls.append((self.model.training, torch.is_grad_enabled()))
            return self.model(idx)

    return WatchedModel(model)


def sgd(model, lr: float = 1e-2):
    """Plain SGD, recording the learning rate of every group at each step in ``.lrs``. Its step follows the
    gradient's size, so clipping shows in the losses; AdamW's hardly changes when every gradient is scaled alike."""

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            self.lrs.append([group["lr"] for group in self.param_groups])
            return super().step(closure)

    optimizer = RecordingSGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    optimizer.lrs = []
    return optimizer


def adamw(model, lr: float = 1e-3, weight_decay: float = 0.1, betas=(0.9, 0.95)):
    """AdamW with the chapter's parameter groups (decay on 2-D and up), recording the learning rate of every group
    at each step in ``.lrs``."""

    class RecordingAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            self.lrs.append([group["lr"] for group in self.param_groups])
            return super().step(closure)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = RecordingAdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                               lr=lr, betas=betas)
    optimizer.lrs = []
    return optimizer


class Evaluate:
    """An ``evaluate`` callback whose every call the judge answers and records (``judge.serve_function``, given
    ``service``): what it returns comes from there."""

    def __init__(self, service: int):
        self.service = service

    def __call__(self, done):
        from autograder.sandboxed.hidden import ask_judge

        return ask_judge(self.service, done)


class Recorder:
    """An ``evaluate`` callback: records the steps it was called with and returns them."""

    def __init__(self):
        self.calls = []

    def __call__(self, done):
        self.calls.append(done)
        return done


def parameters(model) -> dict:
    """{name: a copy of the tensor} of the model's parameters."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def gradient_norms(fn, logits, targets) -> dict:
    """``fn(logits, targets)`` with ``logits`` requiring gradients, then backward: {"loss": the value,
    "grad": the gradient of the logits (None when none reached them)}."""
    logits = logits.clone().requires_grad_(True)
    loss = fn(logits, targets)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return {"loss": loss.detach() if isinstance(loss, torch.Tensor) else loss, "grad": None}
    loss.backward()
    return {"loss": loss.detach(), "grad": None if logits.grad is None else logits.grad.detach()}


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [whether each tensor argument was changed in place])``."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args, **kwargs)
    return out, [b is not None and not torch.equal(a, b) for a, b in zip(args, before)]
