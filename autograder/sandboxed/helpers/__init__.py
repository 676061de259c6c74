"""Inputs that the judge asks the sandbox to build: a GPT with seeded weights, GPT-2's merge table, a model that
counts its calls, a chooser that writes a script. Plain recipes, no answers: the sandbox builds them next to the
learner's code (``make("common.gpt2_ranks")``), and the judge builds the same from the same recipe to compute
what the learner's code should give. A helper module may use the course's reference of earlier chapters only:
it runs in the sandbox of the chapter it helps, where that chapter and the later ones are not available.

``make("module.Name", ...)`` calls ``Name`` from ``autograder.sandboxed.helpers.module``, a name its ``__all__`` lists.
"""
from __future__ import annotations

import importlib
import re

_KIND = re.compile(r"[a-z][a-z0-9_]*\.[A-Za-z][A-Za-z0-9_]*")


def make(kind: str, *args, **kwargs):
    if not _KIND.fullmatch(kind):
        raise ValueError(f"no helper {kind!r}: name one as module.Name")
    module_name, name = kind.split(".")
    module = importlib.import_module(f"{__name__}.{module_name}")
    if name not in getattr(module, "__all__", ()):
        raise ValueError(f"no helper {kind!r}")
    return getattr(module, name)(*args, **kwargs)


def named_type(dotted: str) -> type:
    """The type named ``dotted`` ("torch.nn.Linear"), imported where this runs: the judge names types, and each side
    checks its own objects against them."""
    if not isinstance(dotted, str) or len(dotted) > 200 or "." not in dotted:
        raise ValueError(f"not a type's dotted name: {str(dotted)[:80]!r}")
    module, _, name = dotted.rpartition(".")
    obj = importlib.import_module(module)
    for attr in name.split("."):
        obj = getattr(obj, attr)
    if not isinstance(obj, type):
        raise ValueError(f"{dotted} is not a type")
    return obj
