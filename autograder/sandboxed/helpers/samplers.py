"""Helpers of chapter 6 (samplers), built next to the learner's code from plain recipes: a seeded random generator
to hand to a sampler, a small random GPT-2 for beam search, end-of-text ids that can be read only once (a
generator), and a call that reports whether it changed its arguments in place (the caller's tensors are on this
side). No answers here: the judge computes those (Hugging Face's processors and ``generate`` on the same recipe,
``torch.multinomial`` with a generator of the same seed).

This runs where ``minigpt.samplers`` and later chapters cannot be imported: torch, the course's reference of chapter
4 (``minigpt.transformer``) and the learner's objects. Not transformers, whose GPT-2 costs a notebook 2.7 s of CPU
to import: the judge, which builds the random GPT-2 (``random_gpt2``), sends its weights, and ``gpt`` puts them in
the course's GPT here.
"""
from __future__ import annotations

import torch

__all__ = ["generator", "gpt", "run", "one_pass"]


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``, as a learner's sampler is given one."""
    return torch.Generator().manual_seed(seed)


def run(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), [whether the call changed args[i] in place])``: each tensor and list argument is
    compared with a copy taken before the call (other arguments, a model or a generator, count as unchanged)."""
    before = [a.clone() if isinstance(a, torch.Tensor) else list(a) if isinstance(a, list) else None for a in args]
    out = fn(*args, **kwargs)
    return out, [_changed(a, b) for a, b in zip(args, before)]


def _changed(now, before) -> bool:
    if before is None:
        return False
    if isinstance(before, torch.Tensor):
        return not torch.equal(now, before)
    try:
        return bool(now != before)
    except Exception:  # noqa: BLE001 (a list whose items no longer compare: it changed)
        return True


def one_pass(items: list):
    """The ``items`` as a generator: an iterable that can be read only once, as ``eos_ids`` may be."""
    return (item for item in items)


def random_gpt2(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, seed: int,
                weight_std: float):
    """Hugging Face's ``GPT2LMHeadModel`` of this shape, built with torch's generator seeded by ``seed``, every
    matrix then redrawn from N(0, weight_std) (peaked next-token distributions, as a trained model's are); biases
    0, LayerNorms at 1 and 0. Uses torch's global generator (forked: given back as it was)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from coursekit.testing import quiet_transformers

    config = GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_layer=n_layer, n_head=n_head,
                        n_embd=n_embd, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]), torch.no_grad(), quiet_transformers():
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(config).eval()
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, weight_std)
    return hf


def gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, weights: dict):
    """The course's reference GPT (chapter 4) of this shape holding ``weights``, a Hugging Face GPT-2's tensors
    (``hf_weights``), in eval mode."""
    from minigpt.transformer import GPT, GPTConfig, state_dict_from_hf

    with torch.random.fork_rng(devices=[]):  # GPT's own initializer draws before the weights are loaded
        model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                              n_embd=n_embd))
    model.load_state_dict(state_dict_from_hf(dict(weights)))
    return model.eval()


def hf_weights(hf) -> dict:
    """The tensors of a Hugging Face GPT-2 that ``gpt`` needs (no LM head: it is tied to the token table)."""
    return {name: tensor.detach().clone() for name, tensor in hf.state_dict().items()
            if name != "lm_head.weight" and not name.endswith((".attn.bias", ".attn.masked_bias"))}


def random_gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, seed: int,
               weight_std: float):
    """The course's reference GPT (chapter 4) holding the weights of ``random_gpt2(...)``, in eval mode (the judge's
    side: it imports transformers)."""
    hf = random_gpt2(vocab_size, block_size, n_layer, n_head, n_embd, seed, weight_std)
    return gpt(vocab_size, block_size, n_layer, n_head, n_embd, hf_weights(hf))
