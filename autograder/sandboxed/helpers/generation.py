"""Helpers of chapter 5 (the generation loop), built next to the learner's code from plain recipes: a small GPT-2
with seeded weights, a model that is not a torch.nn.Module (as chapter 7's cached model is not), a copy of a list
(to see afterwards whether the learner's code changed it), a generator of ids, a chooser that records what it was
given, a chooser that writes a script, a model that writes a script whatever its context, and ``drain``, which reads
a learner's generator in one request. No answers here: the judge computes those (Hugging Face's GPT-2 on the same
seeded weights, tiktoken).

This runs where ``minigpt.generation`` and later chapters cannot be imported: torch, the standard library, the
course's reference of chapter 4 (``minigpt.transformer``) and the learner's objects only. Hugging Face's
transformers is not imported here (slow): the weights are a plain state dict in its layout.
"""
from __future__ import annotations

import math

import torch

__all__ = ["seeded_gpt", "served_gpt", "NotAModule", "listed", "generator_of", "drain", "Lowest", "Writer", "Scripted"]


def gpt2_weights(vocab_size: int, block_size: int, n_layer: int, n_embd: int, seed: int,
                 init_range: float) -> dict:
    """A GPT-2's tensors in Hugging Face's ``GPT2LMHeadModel`` layout (Conv1D weights (in, out), no
    ``lm_head.weight``: it is tied to ``wte``), drawn as its initializer draws them, with a generator seeded by
    ``seed``: N(0, init_range) matrices and embeddings, the layers that write into the residual stream scaled by
    1/sqrt(2 n_layer), zero biases, LayerNorms at 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    C = n_embd

    def normal(*shape, std=init_range):
        return torch.randn(*shape, generator=g) * std

    out = {"transformer.wte.weight": normal(vocab_size, C), "transformer.wpe.weight": normal(block_size, C)}
    proj = init_range / math.sqrt(2 * n_layer)
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        out[p + "ln_1.weight"], out[p + "ln_1.bias"] = torch.ones(C), torch.zeros(C)
        out[p + "attn.c_attn.weight"], out[p + "attn.c_attn.bias"] = normal(C, 3 * C), torch.zeros(3 * C)
        out[p + "attn.c_proj.weight"], out[p + "attn.c_proj.bias"] = normal(C, C, std=proj), torch.zeros(C)
        out[p + "ln_2.weight"], out[p + "ln_2.bias"] = torch.ones(C), torch.zeros(C)
        out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = normal(C, 4 * C), torch.zeros(4 * C)
        out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = normal(4 * C, C, std=proj), torch.zeros(C)
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = torch.ones(C), torch.zeros(C)
    return out


def seeded_gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, seed: int,
               init_range: float):
    """The course's reference GPT (chapter 4) holding ``gpt2_weights(...)``, in eval mode."""
    from minigpt.transformer import GPT, GPTConfig, state_dict_from_hf

    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                          n_embd=n_embd))
    model.load_state_dict(state_dict_from_hf(gpt2_weights(vocab_size, block_size, n_layer, n_embd, seed,
                                                          init_range)))
    return model.eval()


def served_gpt(service: int, module: str, **recipe):
    """``seeded_gpt(**recipe)`` with its module ``module`` (a Linear: "h.0.attn.c_attn") served by the judge: every
    forward pass of the model is a request the judge answers and counts (``kv_cache.serve_in``)."""
    from autograder.sandboxed.helpers.kv_cache import serve_in

    return serve_in(seeded_gpt(**recipe), service, module)


class NotAModule:
    """``model`` behind a plain callable with ``.config`` and nothing else (no ``parameters()``, ``eval()``,
    ``device`` or ``forward``), as chapter 7's cached model is. Like that cache, it gives scores only for the
    positions it has not seen: after a call on some ids, a call on those ids and one more returns (1, 1, V)."""

    def __init__(self, model):
        self.config, self._model, self._seen = model.config, model, None

    def __call__(self, idx):
        logits = self._model(idx)  # a wrong input fails here as it would in the GPT
        ids = idx[0].tolist()
        new = 1 if self._seen is not None and ids[:-1] == self._seen else len(ids)
        self._seen = ids
        return logits[:, -new:]


def listed(items) -> list:
    """A list of ``items`` that stays on this side: pass it to the learner's code, read it back afterwards."""
    return list(items)


def generator_of(items):
    """A generator of ``items``: an iterable that can be read only once."""
    return (i for i in list(items))


def drain(iterable, limit: int) -> tuple[list, bool]:
    """(up to ``limit`` items of ``iterable``, whether it ended), read here in one request. On its way out of a
    generator, a StopIteration becomes "RuntimeError: generator raised StopIteration" (PEP 479), which names no
    line of the learner's code that raised it: that error is raised again as the StopIteration it was, with its
    traceback (the learner's line)."""
    items: list = []
    try:
        iterator = iter(iterable)
        while len(items) < limit:
            items.append(next(iterator))
    except StopIteration:
        return items, True
    except RuntimeError as err:
        cause = err.__cause__
        if isinstance(cause, StopIteration) and str(err).endswith("raised StopIteration"):
            raise cause from None
        raise
    return items, False


class Lowest:
    """A chooser that picks the LOWEST score, and records what it was given in ``seen``: (the ids as ints, the
    logits, a copy if a tensor) for each call."""

    def __init__(self):
        self.seen: list[tuple] = []

    def __call__(self, logits, ids) -> int:
        record = logits.detach().clone() if isinstance(logits, torch.Tensor) else logits
        self.seen.append(([int(i) for i in ids], record))
        return int(torch.argmin(logits))


class Writer:
    """A chooser that writes ``script`` whatever the logits: after the prompt (``prompt_len`` ids) and k new ids,
    ``script[k]``."""

    def __init__(self, prompt_len: int, script: list[int]):
        self.prompt_len, self.script = prompt_len, list(script)

    def __call__(self, logits, ids) -> int:
        return self.script[len(ids) - self.prompt_len]


class Scripted(torch.nn.Module):
    """A model that writes a script: after the prompt and k tokens, its logits put ``script[k]`` on top (and at
    earlier positions the token that followed them in the script), whatever the context says."""

    FILLER = 30  # "?": what it predicts after the prompt's earlier positions

    def __init__(self, prompt_len: int, script: list[int], vocab_size: int = 50257, block_size: int = 1024):
        from minigpt.transformer import GPTConfig

        super().__init__()
        self.config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=1, n_head=1, n_embd=1)
        self.prompt_len, self.script = prompt_len, list(script)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        batch, t = idx.shape
        logits = torch.zeros(batch, t, self.config.vocab_size)
        for pos in range(t):
            k = pos + 1 - self.prompt_len
            logits[:, pos, self.script[k] if 0 <= k < len(self.script) else self.FILLER] = 10.0
        return logits
