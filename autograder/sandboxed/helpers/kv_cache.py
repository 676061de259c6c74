"""Helpers of chapter 7 (the KV cache), built next to the learner's code from plain recipes: a small GPT-2 and an
attention layer with seeded random weights, the same GPT with one module served by the judge (its weights only
there: ``served_gpt``), a ``GPTConfig``, a cache that answers with the keys and values the judge scripted (to try
the learner's attention with a cache known to be right), and runs that must happen where the model is: the
reference generation loops of chapters 5 and 6, the bytes of tensors an object holds. No answers here: the judge
computes those, from the same recipes.

This runs where ``minigpt.kv_cache`` cannot be imported: torch, the standard library, the course's reference of
chapters 3 to 6 (``minigpt.attention``, ``transformer``, ``generation``, ``samplers``) and the learner's objects
only.
"""
from __future__ import annotations

import torch

__all__ = ["seeded_gpt", "served_gpt", "attention_case", "gpt_config", "ScriptedCache", "watched", "stream", "beams",
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
               init_range: float, dtype: torch.dtype = torch.float32, head_seed: int | None = None):
    """The course's reference GPT (chapter 4) of this shape, built and ``randomise``d after
    ``torch.manual_seed(seed)`` (the caller's random state is given back), in eval mode, then cast to ``dtype``.
    ``head_seed``: the language-model head untied from the token embedding, its own N(0, init_range) weights drawn
    after ``torch.manual_seed(head_seed)`` (so that a head the judge serves cannot be read off the embedding)."""
    from minigpt.transformer import GPT, GPTConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                              n_embd=n_embd))
        randomise(model, init_range)
        if head_seed is not None:
            torch.manual_seed(head_seed)
            model.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)
            with torch.no_grad():
                model.lm_head.weight.normal_(0.0, init_range)
        return model.eval().to(dtype)


class Served(torch.nn.Module):
    """A stand-in of a ``torch.nn.Linear`` whose weights are only on the judge's side (``judge.serve``): its
    forward sends the input to the judge, which computes the output and counts the call."""

    def __init__(self, service: int, in_features: int, out_features: int):
        super().__init__()
        self.service, self.in_features, self.out_features = service, in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from autograder.sandboxed.hidden import ask_judge

        return ask_judge(self.service, x)

    def __getattr__(self, name: str):
        if name in ("weight", "bias"):
            raise AttributeError(f"this module's {name} is on the grader's side, not here: call the module "
                                 "(module(x)) instead of reading its weights")
        return super().__getattr__(name)


def served_gpt(service: int, module: str, **recipe):
    """``seeded_gpt(**recipe)`` with its module ``module`` ("lm_head", "h.0.attn.c_attn") served (``serve_in``)."""
    return serve_in(seeded_gpt(**recipe), service, module)


def serve_in(model, service: int, module: str):
    """``model`` with its module ``module``, a Linear, replaced by a stand-in whose forward the judge computes
    (``Served``): its weights are not on this side."""
    owner_name, _, name = module.rpartition(".")
    owner = model.get_submodule(owner_name)
    linear = getattr(owner, name)
    setattr(owner, name, Served(service, linear.in_features, linear.out_features))
    return model


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
