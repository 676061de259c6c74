"""coursekit.recorded: the shipped answers of the learners' tests are what transformers gives today.

The notebooks of chapters 4, 5, 6 and 9 check themselves against Hugging Face's answers read from
src/coursekit/data/recorded/ instead of importing transformers (2.7 s of CPU a run). Each answer is computed
here again, with transformers, and compared with the shipped one: ids exactly, tensors within float32 rounding (so
a machine with other vector instructions agrees). After a change of torch, transformers or chapter 4's GPT,
`make recorded` writes them again.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from coursekit import recorded as rec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def same(got, want, where: str) -> None:
    """``got`` (shipped) equals ``want`` (computed now): the same keys, ids and numbers, tensors to rounding."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape, where
        # float32 values up to about 1e4 (logits, and random inputs drawn again: torch's randn rounds differently
        # without AVX2, 9e-7 at 3.4 measured), a few roundings each; shipped ids and -inf positions match exactly
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got} != {want}"


@pytest.mark.parametrize("chapter", sorted(rec.RECORDERS))
def test_shipped_answers_are_what_transformers_gives(chapter):
    now = rec.compute(chapter)
    weights = now.pop("weights", None)
    same(rec.recorded(chapter), now, chapter)
    if weights is not None:  # chapter 4: the model folder holds the same random GPT-2
        from safetensors.torch import load_file

        shipped = load_file(rec.hf_gpt2_dir() / "model.safetensors")
        for name, tensor in shipped.items():
            # torch draws normal weights with a vectorised log and cos where the CPU has AVX2, scalar ones elsewhere
            # (ATEN_CPU_CAPABILITY=default): the same seed gives values a few float32 ulps apart (2.6e-8 measured at
            # 0.09); another seed or std would be off by the weights' own size, 0.02
            torch.testing.assert_close(tensor, weights[name], atol=1e-7, rtol=1e-5, msg=name)
        assert set(weights) - set(shipped) <= {"lm_head.weight"}  # tied to wte: saved once
        config = json.loads((rec.hf_gpt2_dir() / "config.json").read_text())
        assert (config["n_layer"], config["n_head"], config["n_embd"], config["vocab_size"]) == (2, 4, 32, 100)


def test_the_notebooks_use_no_transformers():
    """The point of the recording: no learner notebook (their tests included) imports transformers."""
    from pathlib import Path

    notebooks = sorted((Path(__file__).resolve().parents[1] / "solutions").glob("*/*.ipynb"))
    assert len(notebooks) >= 11
    for path in notebooks:
        code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert not [c for c in code if re.search(r"^\s*(import|from) transformers\b", c, re.M)], path.name


def test_tiny_gpts_are_seeded():
    a, b = rec.tiny_gpt("05-generation"), rec.tiny_gpt("05-generation")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not a.training


def test_unknown_chapter_is_named():
    with pytest.raises(FileNotFoundError, match="01-tokens"):
        rec.recorded("01-tokens")


def test_a_near_tie_is_refused():
    """A greedy answer that hangs on a near tie would differ from machine to machine: the recorder refuses it."""
    class Flat:  # every token equally likely: step 0 is a tie
        def generate(self, ids, **options):
            from types import SimpleNamespace

            return SimpleNamespace(scores=[torch.zeros(1, 5)], sequences=torch.cat([ids, ids[:, :1]], 1))

    with pytest.raises(AssertionError, match="near tie"):
        rec._greedy(Flat(), [1, 2], 1)
