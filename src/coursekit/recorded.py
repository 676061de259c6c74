"""Hugging Face's answers to the learners' own tests, recorded, so that a notebook checks itself without importing
transformers: ``from transformers import GPT2LMHeadModel`` alone costs 2.7 s of CPU, more than the tests of most
chapters, in every run of the notebook and in every graded copy of it.

``recorded(chapter)`` gives a chapter's answers, a dict of tensors, id lists and numbers read from
``data/recorded/<chapter>.pt``; ``tiny_gpt(chapter)`` builds the small seeded GPT they were computed with, and
``hf_gpt2_dir()`` is the random Hugging Face GPT-2 of chapter 4 (``config.json``, ``model.safetensors``).

Every answer is computed by a function below, with transformers, from the same inputs the notebook uses:
``python -m coursekit.recorded`` computes and writes them all again (the course's Makefile: make recorded), and the
course's test suite (tests/test_recorded.py) checks that the shipped files hold what transformers gives today.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch

RECORDED_DIR = Path(__file__).resolve().parent / "data" / "recorded"
HF_GPT2 = "04-transformer-gpt2"  # chapter 4's random Hugging Face GPT-2, a folder of RECORDED_DIR

# The small GPTs the answers of chapters 5, 6 and 9 were computed with: torch.manual_seed(seed), then GPT(config).
TINY = {
    "05-generation": (0, dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)),
    "06-samplers": (0, dict(vocab_size=60, block_size=32, n_layer=2, n_head=2, n_embd=16)),
    "09-constrained": (0, dict(vocab_size=50257, block_size=64, n_layer=1, n_head=2, n_embd=16)),
}
MIN_MARGIN = 1e-4  # a greedy choice recorded must win by this much: no other machine's rounding can turn it


def recorded(chapter: str) -> dict:
    """The recorded answers of ``chapter``'s tests (``data/recorded/<chapter>.pt``)."""
    path = RECORDED_DIR / f"{chapter}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no recorded answers for {chapter!r} in {RECORDED_DIR} "
                                f"(chapters with some: {sorted(RECORDERS)})")
    return torch.load(path, weights_only=True)


def tiny_gpt(chapter: str):
    """The small random GPT (chapter 4's ``minigpt.transformer.GPT``, seeded) of ``chapter``'s recorded answers,
    in eval mode."""
    from minigpt.transformer import GPT, GPTConfig

    seed, config = TINY[chapter]
    torch.manual_seed(seed)
    return GPT(GPTConfig(**config)).eval()


def hf_gpt2_dir() -> Path:
    """Chapter 4's random Hugging Face GPT-2 (2 layers, 4 heads, 32 wide, 100 tokens, 64 positions), as
    ``save_pretrained`` wrote it: the folder holds ``config.json`` and ``model.safetensors``."""
    return RECORDED_DIR / HF_GPT2


# ---------------------------------------------------------------------------------------------------
# How each answer was computed (with transformers: the oracle)


def _as_hf(model):
    """Hugging Face's GPT2LMHeadModel with the weights of a minigpt GPT."""
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return GPT2LMHeadModel.from_pretrained(folder).eval()


def _greedy(hf, prompt: list[int], n: int, **options) -> list[int]:
    """hf.generate's greedy new ids, after checking that each step's choice won by at least MIN_MARGIN."""
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, output_scores=True,
                      return_dict_in_generate=True, **options)
    for step, scores in enumerate(out.scores):
        top = scores[0].topk(2).values
        if torch.isfinite(top[1]) and top[0] - top[1] < MIN_MARGIN:
            raise AssertionError(f"greedy step {step} of {prompt} is a near tie ({float(top[0] - top[1]):.2e}): "
                                 "its answer could differ on another machine; record another case")
    return out.sequences[0, len(prompt):].tolist()


def _transformer(folder: Path | None = None) -> dict:
    """Chapter 4: the logits of a random GPT2LMHeadModel (written to ``folder``) on random ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=100,
                        bos_token_id=None, eos_token_id=None)  # no <|endoftext|> in 100 tokens
    hf = GPT2LMHeadModel(config).eval()
    idx = torch.randint(0, 100, (2, 10))
    with torch.no_grad():
        logits = hf(idx).logits
    if folder is not None:
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            for name in ("config.json", "model.safetensors"):
                shutil.copyfile(Path(tmp) / name, folder / name)
    return {"idx": idx, "logits": logits, "weights": {k: v.clone() for k, v in hf.state_dict().items()}}


def _generation() -> dict:
    """Chapter 5: greedy generation with Hugging Face's generate on the tiny GPT."""
    hf = _as_hf(tiny_gpt("05-generation"))
    prompt = [5, 17, 42]
    return {"prompt": prompt, "greedy": _greedy(hf, prompt, 8, pad_token_id=0)}


def _samplers() -> dict:
    """Chapter 6: Hugging Face's logits processors on random logits, and its beam search on the tiny GPT."""
    from transformers import (MinPLogitsWarper, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    torch.manual_seed(0)
    z = torch.randn(3, 10)
    temperature = {"z": z, "0.7": TemperatureLogitsWarper(0.7)(None, z.clone())}

    torch.manual_seed(0)
    z = torch.randn(4, 50)
    far = 3 * z + 1e4  # e^10000 is inf in float32
    filters = {"z": z, "top_k 5": TopKLogitsWarper(5)(None, z.clone()),
               "top_p 0.9": TopPLogitsWarper(0.9)(None, z.clone()), "min_p 0.2": MinPLogitsWarper(0.2)(None, z.clone()),
               "top_p 0.9, 3z + 1e4": TopPLogitsWarper(0.9)(None, far.clone()),
               "min_p 0.2, 3z - 1e4": MinPLogitsWarper(0.2)(None, far - 2e4)}

    torch.manual_seed(0)
    z = torch.randn(2, 20)
    ids = torch.tensor([[1, 2, 3, 1, 2], [4, 4, 5, 6, 4]])
    last = torch.tensor([[1, 2, 2]])
    penalties = {"z": z, "ids": ids, "repetition 1.3": RepetitionPenaltyLogitsProcessor(1.3)(ids, z.clone()),
                 "no repeat 2": NoRepeatNGramLogitsProcessor(2)(ids, z.clone()),
                 "last": last, "no repeat 2, last": NoRepeatNGramLogitsProcessor(2)(last, z[:1].clone())}

    z = torch.tensor([[3.0, 1.0, 0.5, 0.0, -1.0]])
    top_p_options = TopPLogitsWarper(0.5, filter_value=-1e4, min_tokens_to_keep=3)(None, z.clone())

    hf = _as_hf(tiny_gpt("06-samplers"))
    prompt = [5, 17, 42]

    def beams(num_beams, eos=(), length_penalty=1.0):
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=10, num_beams=num_beams, do_sample=False,
                          length_penalty=length_penalty, eos_token_id=list(eos) or None,
                          pad_token_id=0)[0, len(prompt):].tolist()
        return next((out[:i + 1] for i, t in enumerate(out) if t in eos), out)

    beam = {"prompt": prompt, "2": beams(2), "4": beams(4), "1": _greedy(hf, prompt, 10, pad_token_id=0),
            "3": beams(3)}
    beam["2, eos"] = beams(2, [beam["2"][2]])  # a token the model writes: as end-of-text it ends the best early
    beam["3, eos, length_penalty 0"] = beams(3, [beam["3"][2]], 0.0)
    beam["2, eos of the first three"] = beams(2, sorted(set(beam["2"][:3])))
    return {"temperature": temperature, "filters": filters, "penalties": penalties,
            "top_p, min_tokens_to_keep 3": top_p_options, "beam_search": beam}


def _constrained() -> dict:
    """Chapter 9: Hugging Face's generate with ``prefix_allowed_tokens_fn`` on the tiny GPT: one to three digit
    tokens, then end-of-text."""
    import coursekit
    from minigpt.constrained import vocabulary

    enc = coursekit.gpt2_encoding()
    end = 50256
    digit_ids = [i for i, piece in enumerate(vocabulary(enc, 50257)) if piece and piece.isdigit()]
    steps = [digit_ids, digit_ids + [end], digit_ids + [end], [end]]
    hf = _as_hf(tiny_gpt("09-constrained"))
    prompt = enc.encode("How many? ")

    def run(prompt_ids, **sampling):
        def allowed(_, ids):
            return steps[len(ids) - len(prompt_ids)] if len(ids) - len(prompt_ids) < len(steps) else []
        options = dict(prefix_allowed_tokens_fn=allowed, eos_token_id=end, pad_token_id=end, **sampling)
        if sampling.get("do_sample"):
            return hf.generate(torch.tensor([prompt_ids]), max_new_tokens=12, **options)[0, len(prompt_ids):].tolist()
        return _greedy(hf, prompt_ids, 12, **options)

    greedy = run(prompt)
    torch.manual_seed(3)
    sampled = run(prompt, do_sample=True, top_k=0)
    counted = prompt + [t for t in greedy if t != end]
    return {"prompt": prompt, "greedy": greedy, "sampled, seed 3": sampled,
            "greedy, repetition_penalty 5": run(counted, repetition_penalty=5.0)}


RECORDERS = {"04-transformer": _transformer, "05-generation": _generation, "06-samplers": _samplers,
             "09-constrained": _constrained}


def compute(chapter: str) -> dict:
    """``chapter``'s answers, computed now with transformers (what ``recorded`` reads back)."""
    return RECORDERS[chapter]()


def write(chapters=None) -> None:
    """Compute and write the answers of ``chapters`` (all by default), and chapter 4's model folder."""
    RECORDED_DIR.mkdir(parents=True, exist_ok=True)
    for chapter in chapters or RECORDERS:
        answers = _transformer(RECORDED_DIR / HF_GPT2) if chapter == "04-transformer" else compute(chapter)
        answers.pop("weights", None)  # chapter 4's are in its model folder
        torch.save(answers, RECORDED_DIR / f"{chapter}.pt")
        print(f"wrote {RECORDED_DIR / f'{chapter}.pt'}")


if __name__ == "__main__":
    write(sys.argv[1:] or None)
