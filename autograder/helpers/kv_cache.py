"""Helpers of chapter 7 (the KV cache), built next to the learner's code from plain recipes: a small GPT-2 and an
attention layer with seeded random weights, a ``GPTConfig``, a cache that answers with the keys and values the
judge scripted (to try the learner's attention with a cache known to be right), and runs that must happen where
the model is: a call with the positions the model computed counted, the reference generation loops of chapters 5
and 6, the bytes of tensors an object holds. No answers here: the judge computes those, from the same recipes.

This runs where ``minigpt.kv_cache`` cannot be imported: torch, the standard library, the course's reference of
chapters 3 to 6 (``minigpt.attention``, ``transformer``, ``generation``, ``samplers``) and the learner's objects
only.
"""
from __future__ import annotations

import torch

__all__ = ["seeded_gpt", "attention_case", "gpt_config", "ScriptedCache", "watched", "counted", "stream", "beams",
           "held_bytes"]


def randomise(model, init_range: float):
    """Random values for every parameter, LayerNorms and biases included, from torch's generator: LayerNorm
    weights in [0.5, 1.5], biases N(0, 0.1), matrices and embeddings N(0, init_range)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1 if p.dim() == 1 else init_range)
    return model.eval()


def seeded_gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, seed: int,
               init_range: float, dtype: torch.dtype = torch.float32):
    """The course's reference GPT (chapter 4) of this shape, built and ``randomise``d after
    ``torch.manual_seed(seed)`` (the caller's random state is given back), in eval mode, then cast to ``dtype``."""
    from minigpt.transformer import GPT, GPTConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                              n_embd=n_embd))
        return randomise(model, init_range).to(dtype)


def attention_case(n_embd: int, n_head: int, batch: int, length: int, seed: int, scale: float = 1.0,
                   dtype: torch.dtype = torch.float32):
    """(a chapter 3 ``CausalSelfAttention`` with N(0, 0.5) weights, inputs x (batch, length, n_embd) times
    ``scale``), drawn in that order after ``torch.manual_seed(seed)`` (the caller's random state is given back),
    then both cast to ``dtype``."""
    from minigpt.attention import CausalSelfAttention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        attn = CausalSelfAttention(n_embd, n_head).eval()
        with torch.no_grad():
            for p in attn.parameters():
                p.normal_(0.0, 0.5)
        x = torch.randn(batch, length, n_embd) * scale
        return attn.to(dtype), x.to(dtype)


def gpt_config(**fields):
    """``minigpt.transformer.GPTConfig(**fields)``."""
    from minigpt.transformer import GPTConfig

    return GPTConfig(**fields)


class ScriptedCache:
    """A cache with the notebook's interface (``keys``, ``values``, ``length``, ``append``) whose n-th ``append``
    returns the n-th pair of ``answers`` (the keys and values the judge computed for that call) whatever it is
    given, and records in ``given`` what it was given: (layer, k, v)."""

    def __init__(self, answers: list, n_layer: int = 1):
        self.answers = list(answers)
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.given: list[tuple] = []

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer, k, v):
        self.given.append((layer, _copy(k), _copy(v)))
        if len(self.given) > len(self.answers):
            raise IndexError(f"append was called {len(self.given)} times, more than once per call of the test")
        k, v = (t.clone() for t in self.answers[len(self.given) - 1])
        self.keys[layer], self.values[layer] = k, v
        return k, v


def _copy(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def watched(fn, *args):
    """``(fn(*args), whether fn changed one of its tensor arguments in place)``."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    out = fn(*args)
    changed = any(b is not None and not (a.shape == b.shape and torch.equal(a, b)) for a, b in zip(args, before))
    return out, changed


def counted(fn, model, *args):
    """``(fn(*args), the positions model computed meanwhile)``: the new positions of every forward pass reach the
    token embedding, block 0's ``ln_1`` and its attention's ``c_attn``, and ``lm_head``; each of those modules
    counts the positions it saw, and the answer is the largest count (0 when none of them was called: code that
    uses their weights without calling them cannot be counted)."""
    seen = {}

    def counter(name):
        def count(module, inputs, output):
            seen[name] = seen.get(name, 0) + inputs[0].shape[-1 if name == "wte" else -2]
        return count

    modules = {"wte": model.emb.wte, "ln_1": model.h[0].ln_1, "c_attn": model.h[0].attn.c_attn,
               "lm_head": model.lm_head}
    handles = [m.register_forward_hook(counter(name)) for name, m in modules.items()]
    try:
        out = fn(*args)
    finally:
        for handle in handles:
            handle.remove()
    return out, max(seen.values(), default=0)


def _unwrapped(run):
    """``run()``; a StopIteration of the learner's code that a generator of the course turned into "RuntimeError:
    generator raised StopIteration" is raised as it was, so that its report names the learner's line."""
    try:
        return run()
    except RuntimeError as err:
        if isinstance(err.__cause__, StopIteration):
            raise err.__cause__ from None
        raise


def stream(model, prompt: list[int], max_new_tokens: int, sampler: dict | None = None) -> list[int]:
    """The ids of chapter 5's ``token_stream`` with ``model``: greedy, or with chapter 6's ``Sampler(**sampler)``."""
    from minigpt.generation import token_stream
    from minigpt.samplers import Sampler

    kwargs = {} if sampler is None else {"choose": Sampler(**sampler)}
    return _unwrapped(lambda: list(token_stream(model, list(prompt), max_new_tokens, **kwargs)))


def beams(model, prompt: list[int], max_new_tokens: int, num_beams: int) -> list[int]:
    """Chapter 6's ``beam_search`` with ``model``."""
    from minigpt.samplers import beam_search

    return _unwrapped(lambda: beam_search(model, list(prompt), max_new_tokens, num_beams=num_beams))


def held_bytes(root) -> int:
    """Bytes of the tensor storage an object holds (through attributes, dicts, lists, tuples and sets; not through
    a torch module, such as the model), each storage counted once."""
    seen, storages, stack = set(), {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (torch.nn.Module, type, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not callable(obj) or obj is root:
            stack.extend(vars(obj).values())
    return sum(storages.values())
