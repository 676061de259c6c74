"""Train the small GPT the course ships: minigpt's own GPT, GPT-2's tokenizer, 40 works of Shakespeare.

    python training/train_shipped_model.py                      # train for 20 minutes of 2 CPU cores
    python training/train_shipped_model.py --sample "Romeo."    # let the shipped model continue a prompt

The two plays in HELD_OUT are never trained on: the loss on them measures what the model learned about
Shakespeare, not what it memorised. A unigram model (each token's frequency in the training text, nothing
else) is the baseline that loss has to beat.

The time budget is counted in CPU time divided by the number of threads, i.e. in minutes of that many
dedicated cores: on a busy machine the run takes longer by the clock but trains about as many steps. The
learning rate follows the fraction of the budget used, so the run ends, its rate decayed, when the budget
does; ``--steps N`` follows the fraction of N steps instead, to repeat a run exactly. See training/README.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import coursekit
from minigpt.transformer import GPT, GPTConfig

HELD_OUT = ("julius_caesar", "twelfth_night")  # a tragedy and a comedy, about 5% of the tokens
EOT = 50256  # GPT-2's <|endoftext|>: written after every work, so the model learns where a text ends
SHAPE = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256)


@dataclasses.dataclass
class Hyper:
    batch_size: int = 8            # sequences of block_size tokens per step
    lr: float = 3e-3               # peak learning rate, reached after the warmup
    min_lr: float = 3e-4           # where the cosine decay ends
    warmup_steps: int = 30
    weight_decay: float = 0.1      # on matrices and embeddings only, not on biases and LayerNorm
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 50           # steps between two loss measurements
    eval_windows: int = 16         # windows of block_size tokens per measurement (train and held-out each)


def tokenize(works: dict[str, str]) -> torch.Tensor:
    """All works as one stream of GPT-2 token ids, each work followed by <|endoftext|>."""
    enc = coursekit.gpt2_encoding()
    return torch.tensor([i for text in works.values() for i in enc.encode_ordinary(text) + [EOT]])


def unigram_loss(train: torch.Tensor, heldout: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats per token) on ``heldout`` of token frequencies in ``train``, add-one smoothed."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    return -(counts / counts.sum()).log()[heldout].mean().item()


def windows(ids: torch.Tensor, block_size: int, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, both (len(starts), block_size), read from ``ids`` at ``starts``."""
    rows = ids[starts[:, None] + torch.arange(block_size + 1)]  # (N, block_size + 1)
    return rows[:, :-1], rows[:, 1:]


def spread(ids: torch.Tensor, block_size: int, n: int | None = None) -> torch.Tensor:
    """Starts of ``n`` windows evenly spread over ``ids`` (all non-overlapping windows when n is None)."""
    last = len(ids) - block_size - 1
    n = last // block_size + 1 if n is None else n
    return torch.linspace(0, last, n).long()


@torch.no_grad()
def mean_loss(model: GPT, ids: torch.Tensor, starts: torch.Tensor, batch_size: int) -> float:
    """The model's mean next-token cross-entropy (nats) over the windows of ``ids`` at ``starts``."""
    model.eval()
    total = 0.0
    for chunk in starts.split(batch_size):
        x, y = windows(ids, model.config.block_size, chunk)
        total += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    model.train()
    return total / (len(starts) * model.config.block_size)


def learning_rate(step: int, progress: float, hp: Hyper) -> float:
    """A cosine from hp.lr down to hp.min_lr as ``progress`` goes from 0 to 1, ramped up over the first steps."""
    cosine = hp.min_lr + 0.5 * (hp.lr - hp.min_lr) * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return cosine * min(1.0, (step + 1) / hp.warmup_steps)


def make_optimizer(model: GPT, hp: Hyper) -> torch.optim.AdamW:
    params = list(model.parameters())  # the tied wte / lm_head table appears once
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=hp.lr, betas=(hp.beta1, hp.beta2))


@torch.no_grad()
def sample(model: GPT, prompt: str, max_new_tokens: int = 120, temperature: float = 0.8, seed: int = 0) -> str:
    """The prompt and its continuation, drawing each token from softmax(logits / temperature)."""
    enc = coursekit.gpt2_encoding()
    ids = enc.encode(prompt, allowed_special={"<|endoftext|>"})
    generator = torch.Generator().manual_seed(seed)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids[-model.config.block_size:]]))[0, -1]
        ids.append(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator).item())
    return enc.decode(ids)


def plot(log: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in log["curve"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [p["train_loss"] for p in log["curve"]], label="train")
    ax.plot(steps, [p["heldout_loss"] for p in log["curve"]], label="held out (" + ", ".join(HELD_OUT) + ")")
    ax.axhline(log["unigram_baseline"], color="grey", linestyle="--", label="unigram baseline")
    ax.set(xlabel="step", ylabel="cross-entropy (nats per token)", ylim=(0, None),
           title=f"shakespeare-gpt: {log['parameters'] / 1e6:.1f}M parameters, "
                 f"{log['tokens_seen'] / 1e6:.2f}M training tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def train(out: Path, minutes: float, seed: int, threads: int, steps: int | None, hp: Hyper) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    def clock() -> float:
        """Seconds of `threads` dedicated cores: CPU time is not stolen by other programs, wall time is."""
        return time.process_time() / threads

    wall_start, start = time.perf_counter(), clock()

    texts = coursekit.corpus_texts()
    train_ids = tokenize({w: t for w, t in texts.items() if w not in HELD_OUT})
    heldout_ids = tokenize({w: texts[w] for w in HELD_OUT})
    baseline = unigram_loss(train_ids, heldout_ids, SHAPE.vocab_size)
    T, B = SHAPE.block_size, hp.batch_size
    generator = torch.Generator().manual_seed(seed)
    probe = {"train": torch.randint(0, len(train_ids) - T - 1, (hp.eval_windows,), generator=generator),
             "heldout": spread(heldout_ids, T, hp.eval_windows)}
    data = {"train": train_ids, "heldout": heldout_ids}

    model = GPT(SHAPE)
    optimizer = make_optimizer(model, hp)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters; {len(train_ids):,} training tokens, {len(heldout_ids):,} held out "
          f"({', '.join(HELD_OUT)}); unigram baseline {baseline:.3f}")

    curve = []

    def measure(step: int, lr: float) -> None:
        losses = {f"{k}_loss": round(mean_loss(model, data[k], probe[k], B), 4) for k in data}
        curve.append({"step": step, "tokens": step * B * T, "lr": lr, **losses,
                      "minutes": round((clock() - start) / 60, 2)})

    t0 = clock()
    measure(0, 0.0)
    # What is left of the budget after the final evaluation (every held-out window), with room to spare.
    final_cost = 1.5 * (clock() - t0) * len(spread(heldout_ids, T)) / hp.eval_windows + 15
    train_start, train_budget = clock(), minutes * 60 - (clock() - start) - final_cost
    if not steps and train_budget < 60:
        raise SystemExit(f"--minutes {minutes:g} leaves {train_budget:.0f} s for training after the evaluations")

    def progress(step: int) -> float:
        return step / steps if steps else (clock() - train_start) / train_budget

    bar = tqdm(total=steps, desc="training", unit="step", dynamic_ncols=True)
    step, step_seconds = 0, 0.0
    while progress(step) < 1:
        t0 = clock()
        lr = learning_rate(step, progress(step), hp)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = windows(train_ids, T, torch.randint(0, len(train_ids) - T - 1, (B,), generator=generator))
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
        optimizer.step()
        step, step_seconds = step + 1, step_seconds + clock() - t0
        if not steps:
            bar.total = max(step, round(step / progress(step)))  # the steps the budget will allow, so far
        bar.update()
        if step % hp.eval_every == 0:
            measure(step, lr)
            bar.set_postfix(train=curve[-1]["train_loss"], heldout=curve[-1]["heldout_loss"])
    bar.close()
    if curve[-1]["step"] != step:
        measure(step, lr)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, dtype=torch.float16)  # halves the file; the test checks float32 logits agree
    shipped = GPT.from_pretrained(out)
    everywhere = spread(heldout_ids, T)  # the final numbers: every held-out window, as many training ones
    final = {"train_loss": mean_loss(shipped, train_ids, spread(train_ids, T, len(everywhere)), B),
             "heldout_loss": mean_loss(shipped, heldout_ids, everywhere, B)}
    prompt = "Romeo.\n"
    log = {
        "model": "shakespeare-gpt", "config": dataclasses.asdict(SHAPE), "parameters": n_params,
        "hyperparameters": dataclasses.asdict(hp), "seed": seed, "threads": threads,
        "budget_minutes": minutes, "steps": step, "steps_fixed_by_hand": bool(steps),
        "tokens_seen": step * B * T, "tokens_per_second": round(step * B * T / step_seconds),
        "core_minutes": round((clock() - start) / 60, 2),
        "wall_minutes": round((time.perf_counter() - wall_start) / 60, 2),
        "held_out_works": list(HELD_OUT), "train_works": [w for w in texts if w not in HELD_OUT],
        "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids),
        "unigram_baseline": round(baseline, 4), "unigram_smoothing": "add-one over the vocabulary",
        "final": {k: round(v, 4) for k, v in final.items()},
        "final_windows": len(everywhere), "curve": curve,
        "sample": {"prompt": prompt, "temperature": 0.8, "seed": 0, "text": sample(shipped, prompt)},
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.processor() or
        platform.machine(),
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    plot(log, out / "loss_curve.png")
    return log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=coursekit.data.SHIPPED_MODEL_DIR, help="the model folder")
    parser.add_argument("--minutes", type=float, default=20.0, help="time budget, in minutes of --threads cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="train exactly this many steps (ignores --minutes)")
    parser.add_argument("--sample", metavar="PROMPT", help="do not train: continue PROMPT with the model in --out")
    parser.add_argument("--temperature", type=float, default=0.8, help="for --sample")
    parser.add_argument("--tokens", type=int, default=120, help="for --sample: how many new tokens")
    args = parser.parse_args(argv)
    if args.sample is not None:
        torch.set_num_threads(args.threads)
        model = GPT.from_pretrained(args.out)
        print(sample(model, args.sample, args.tokens, args.temperature, args.seed))
        return 0
    log = train(args.out, args.minutes, args.seed, args.threads, args.steps, Hyper())
    print(f"{log['steps']} steps in {log['core_minutes']} core-minutes ({log['wall_minutes']} by the clock); "
          f"train {log['final']['train_loss']:.3f}, held out {log['final']['heldout_loss']:.3f}, "
          f"unigram {log['unigram_baseline']:.3f}. Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
