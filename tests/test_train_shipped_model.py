"""training/train_shipped_model.py on a tiny shape: a run stopped and resumed ends with the very weights of a run
that was never stopped, and the model folder it writes is complete and loads in minigpt and Hugging Face."""
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minigpt.transformer import GPT, GPTConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
import train_shipped_model as script  # noqa: E402

pytestmark = pytest.mark.slow

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32)
HP = dataclasses.replace(script.Hyper(), steps=4, batch_size=2, warmup_steps=1, eval_every=2, eval_windows=2)


@pytest.fixture(autouse=True)
def keep_thread_count():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus_once():
    """The corpus tokenized once for the module, cut short so that the final measures take seconds."""
    train_ids, heldout_ids, works = script.corpus()
    ids = train_ids[:20_000], heldout_ids[:3_000], works
    original = script.corpus
    script.corpus = lambda: ids
    yield ids
    script.corpus = original


def test_a_resumed_run_ends_where_an_unbroken_one_does(tmp_path, monkeypatch, corpus_once):
    unbroken = script.run(tmp_path / "a", tmp_path / "a-run", HP, seed=3, threads=1, resume=False, shape=TINY)

    calls = {"n": 0}
    real_samples = script.samples

    def stop_at_the_third_measurement(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # evaluate(0) and evaluate(2) saved their checkpoints; stop inside evaluate(4)
            raise KeyboardInterrupt
        return real_samples(*args, **kwargs)

    monkeypatch.setattr(script, "samples", stop_at_the_third_measurement)
    with pytest.raises(KeyboardInterrupt):
        script.run(tmp_path / "b", tmp_path / "b-run", HP, seed=3, threads=1, resume=False, shape=TINY)
    assert torch.load(tmp_path / "b-run" / "checkpoint.pt", weights_only=False)["state"]["done"] == 2
    monkeypatch.setattr(script, "samples", real_samples)
    resumed = script.run(tmp_path / "b", tmp_path / "b-run", HP, seed=3, threads=1, resume=True, shape=TINY)

    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["curve"] == unbroken["curve"] and resumed["final"] == unbroken["final"]
    assert [p["step"] for p in unbroken["curve"]] == [0, 2, 4]

    for name in ("config.json", "model.safetensors", "training_log.json", "loss_curve.png", "README.md"):
        assert (tmp_path / "a" / name).is_file(), name
    log = json.loads((tmp_path / "a" / "training_log.json").read_text())
    assert log["config"] == dataclasses.asdict(TINY) and log["steps"] == 4 and log["seed"] == 3
    card = (tmp_path / "a" / "README.md").read_text()
    assert f"**{log['final']['heldout_loss_hf_first_30k']:.2f} nats" in card
    assert GPT.from_pretrained(tmp_path / "a").config.n_embd == 16


def test_resuming_another_runs_checkpoint_is_refused(tmp_path, corpus_once):
    script.run(tmp_path / "a", tmp_path / "run", dataclasses.replace(HP, steps=2, eval_every=2), seed=0, threads=1,
               resume=False, shape=TINY)
    with pytest.raises(SystemExit, match="of another run"):
        script.run(tmp_path / "a", tmp_path / "run", HP, seed=0, threads=1, resume=True, shape=TINY)
