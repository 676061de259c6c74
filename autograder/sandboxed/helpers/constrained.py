"""Helpers of chapter 9 (constrained decoding), built next to the learner's code from plain recipes: GPT-2's
vocabulary as bytes and as text (too large to send for every call), and a constraint that follows a script (the
tokens allowed at each step, whatever was chosen before), so that the learner's generation loop is graded on its
own, not through the learner's masks. No answers here: the judge computes those (the `regex` package on every
token, Hugging Face's ``generate`` with the same script as its ``prefix_allowed_tokens_fn``).

This runs where ``minigpt.constrained`` cannot be imported: torch, the course's reference of earlier chapters and
the learner's objects.
"""
from __future__ import annotations

import functools

import torch

from autograder.sandboxed.helpers.common import gpt2_encoding

__all__ = ["gpt2_vocab", "gpt2_texts", "Scripted", "recording_gpt", "fed", "byte_tokenizer"]


@functools.cache
def _gpt2_vocab() -> tuple[bytes | None, ...]:
    enc = gpt2_encoding()
    specials = set(enc._special_tokens.values())
    return tuple(None if i in specials else enc.decode_single_token_bytes(i) for i in range(enc.n_vocab))


def gpt2_vocab() -> list[bytes | None]:
    """The bytes of GPT-2's 50,257 tokens (None for <|endoftext|>): a list of the learner's own."""
    return list(_gpt2_vocab())


def gpt2_texts() -> list[str | None]:
    """GPT-2's tokens as text, None where a token's bytes are not whole UTF-8 characters."""
    texts = []
    for piece in _gpt2_vocab():
        try:
            texts.append(None if piece is None else piece.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
    return texts


class Scripted:
    """A constraint with the attributes generation uses (``allowed``, ``eos_ids``, ``vocab``, ``vocab_size``,
    ``dead_end``) whose mask at step k is ``steps[k]`` (ids), and nothing after the script ends. It records the
    ids it was asked about."""

    def __init__(self, steps: list[list[int]], eos_ids: list[int], vocab: list[bytes | None]):
        self.steps, self.eos_ids, self.vocab, self.vocab_size = steps, set(eos_ids), vocab, len(vocab)
        self.asked: list[list[int]] = []

    def allowed(self, ids: list[int]) -> torch.Tensor:
        self.asked.append(list(ids))
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        if len(ids) < len(self.steps):
            mask[self.steps[len(ids)]] = True
        return mask

    def dead_end(self, ids: list[int]) -> str:
        return f"the script allows no token after {len(ids)} generated: the constraint can no longer be met"


def recording_gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, weights: dict):
    """``samplers.gpt(...)`` that records how many positions each of its runs reads (what its embedding layer is
    given: a whole sequence, or with chapter 7's cache the new token alone), for ``fed``."""
    from autograder.sandboxed.helpers.samplers import gpt

    model = gpt(vocab_size, block_size, n_layer, n_head, n_embd, weights)
    model.positions_read = []
    model.emb.register_forward_pre_hook(lambda module, args: model.positions_read.append(int(args[0].shape[-1])))
    return model


def fed(model) -> list[int]:
    """The positions each run of ``recording_gpt``'s model read since the last ``fed``, in order."""
    read, model.positions_read[:] = list(model.positions_read), []
    return read


def byte_tokenizer(vocab: list[bytes | None]):
    """Chapter 1's ``Tokenizer`` for a vocabulary of single bytes (token i writes ``vocab[i]``; None: no text): a text
    prompt becomes the ids of its bytes."""
    from minigpt.tokens import Tokenizer

    return Tokenizer({piece: i for i, piece in enumerate(vocab) if piece is not None})
