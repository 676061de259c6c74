"""The small GPT the course ships: present, small, the same model to minigpt and to Hugging Face, and trained.

Its training is recorded in ``training_log.json`` by training/train_shipped_model.py; these tests recompute
what they can (logits, a held-out loss) instead of trusting the log.
"""
import json

import pytest
import torch
from transformers import GPT2LMHeadModel

import coursekit
from minigpt.transformer import GPT

EOT = 50256
REQUIRED = ("config.json", "model.safetensors", "training_log.json", "loss_curve.png", "README.md")


@pytest.fixture(scope="module")
def folder():
    return coursekit.shipped_model_dir()


@pytest.fixture(scope="module")
def log(folder):
    return json.loads((folder / "training_log.json").read_text())


@pytest.fixture(scope="module")
def model(folder):
    return GPT.from_pretrained(folder)


def test_folder_holds_the_model_its_log_and_its_card(folder):
    missing = [name for name in REQUIRED if not (folder / name).is_file()]
    assert not missing, f"{folder} lacks {missing} (training/README.md says how each is made)"


def test_weights_are_at_most_20_mb(folder):
    size = (folder / "model.safetensors").stat().st_size
    assert size <= 20_000_000, f"model.safetensors is {size / 1e6:.1f} MB; the course keeps it under 20 MB"


def test_minigpt_and_hugging_face_give_equal_float32_logits_on_shakespeare(folder, model):
    """The float16 file loads into float32 in both, and both compute the same function of a real passage."""
    hamlet = coursekit.corpus_texts()["hamlet"]
    passage = hamlet[hamlet.index("To be, or not to be"):][:800]
    ids = torch.tensor([coursekit.gpt2_encoding().encode_ordinary(passage)[:model.config.block_size]])
    assert ids.shape[1] > 150
    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    assert {p.dtype for p in model.parameters()} == {p.dtype for p in hf.parameters()} == {torch.float32}
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.shape == theirs.shape == (1, ids.shape[1], 50257)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_held_out_loss_is_well_below_the_unigram_baseline(log, model):
    """The loss on 4096 tokens of the plays it never saw, recomputed here, beats token frequencies by > 1 nat."""
    texts = coursekit.corpus_texts()
    held_out = log["held_out_works"]
    assert len(held_out) >= 2 and set(held_out) <= set(texts) and not set(held_out) & set(log["train_works"])
    enc, T = coursekit.gpt2_encoding(), model.config.block_size
    losses = []
    for work in held_out:
        ids = torch.tensor(enc.encode_ordinary(texts[work]) + [EOT])
        starts = torch.linspace(0, len(ids) - T - 1, 16 // len(held_out)).long()  # spread over the whole play
        rows = ids[starts[:, None] + torch.arange(T + 1)]  # (N, T + 1)
        with torch.no_grad():
            logits = model(rows[:, :-1])
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()))
    loss = torch.stack(losses).mean().item()
    baseline = log["unigram_baseline"]
    assert 6.0 < baseline < 7.0, f"a unigram model of Shakespeare scores about 6.4 nats a token, not {baseline}"
    assert loss < baseline - 1.0, f"held-out loss {loss:.3f} is not clearly below the unigram baseline {baseline:.3f}"
    assert abs(loss - log["final"]["heldout_loss"]) < 0.3, "the log's held-out loss does not describe this model"


def test_log_records_a_seeded_run_within_20_minutes(log):
    assert log["budget_minutes"] <= 20 and log["core_minutes"] <= log["budget_minutes"]
    assert not log["steps_fixed_by_hand"], "the shipped model is the one the time budget chose"
    assert isinstance(log["seed"], int) and log["torch"] and log["threads"] == 2
    steps = [p["step"] for p in log["curve"]]
    assert steps[0] == 0 and steps[-1] == log["steps"] and steps == sorted(steps)
    assert log["final"]["train_loss"] < log["curve"][0]["train_loss"] - 3
