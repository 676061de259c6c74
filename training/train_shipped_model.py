"""Train the small GPT the course ships, with the course's own code: chapter 4's GPT, chapter 8's training loop
(``minigpt.training``), GPT-2's tokenizer, and 40 works of Shakespeare.

    python training/train_shipped_model.py                       # the shipped model (make model), from the seed
    python training/train_shipped_model.py --resume              # go on from the last checkpoint of that run
    python training/train_shipped_model.py --steps 300 --out /tmp/m --run /tmp/m-run    # a short variant
    python training/train_shipped_model.py --sample "ROMEO:"     # continue a prompt with the shipped model
    python training/train_shipped_model.py --card                # write the model card again from its log

The two plays in HELD_OUT are never trained on: the loss on them measures what the model learned about
Shakespeare, not what it memorised. A unigram model (each token's frequency in the training text, nothing else)
is the baseline that loss has to beat.

Everything the loop does is chapter 8's: ``get_batch``, ``lr_at``, ``train_step``, ``estimate_loss`` and
``train``. This script adds what a long run needs around it: a fixed number of steps from a fixed seed (the run
repeats exactly on the same number of threads), dropout during training (forward hooks, so the saved model is a
plain GPT-2), matrix products in bfloat16 (2-3x faster on CPUs that have it; the weights, the optimizer and the
loss stay float32), a checkpoint at every measurement to resume from, samples of the same prompts as it learns,
and the files of the model folder: weights, log, loss curve, model card.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import coursekit
from minigpt.generation import generate
from minigpt.samplers import Sampler
from minigpt.training import estimate_loss, make_optimizer, spread, train
from minigpt.transformer import GPT, GPTConfig

HERE = Path(__file__).resolve().parent
HELD_OUT = ("julius_caesar", "twelfth_night")  # a tragedy and a comedy, about 5% of the tokens
EOT = 50256  # GPT-2's <|endoftext|>: written after every work, so the model learns where a text ends
SHAPE = GPTConfig(n_layer=6, n_head=8, n_embd=256, block_size=256)
PROMPTS = ("ROMEO:\n", "First Citizen:\nBefore we proceed any further, hear me speak.\n\n")
HF_MEASURE_TOKENS = 30_000  # the held-out measure of the model card: the first tokens of the held-out plays


@dataclasses.dataclass(frozen=True)
class Hyper:
    steps: int = 1300
    batch_size: int = 8            # windows of block_size tokens per step
    max_lr: float = 2e-3           # reached at the end of the warm-up
    min_lr: float = 1e-4           # where the cosine ends, at the last step
    warmup_steps: int = 100
    weight_decay: float = 0.1      # on matrices and embeddings only
    beta1: float = 0.9
    beta2: float = 0.95
    max_grad_norm: float = 1.0
    dropout: float = 0.0           # about two passes over the text: no overfitting for dropout to cure (see README)
    bf16: bool = False             # bfloat16 matrix products: 2-3x faster where the CPU has them, far slower without
    eval_every: int = 100          # steps between two measurements (and checkpoints)
    eval_windows: int = 24         # windows of block_size tokens per measurement, training text and held out each


def tokenize(works: dict[str, str]) -> torch.Tensor:
    """All works as one stream of GPT-2 token ids, each work followed by <|endoftext|>."""
    enc = coursekit.gpt2_encoding()
    return torch.tensor([i for text in works.values() for i in enc.encode_ordinary(text) + [EOT]])


def corpus() -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(training ids, held-out ids, the training works' names)."""
    texts = coursekit.corpus_texts()
    train_works = [w for w in texts if w not in HELD_OUT]
    return tokenize({w: texts[w] for w in train_works}), tokenize({w: texts[w] for w in HELD_OUT}), train_works


def unigram_loss(train_ids: torch.Tensor, heldout: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats per token) on ``heldout`` of token frequencies in ``train_ids``, add-one smoothed."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    return -(counts / counts.sum()).log()[heldout].mean().item()


class BFloat16(torch.nn.Module):
    """A model whose forward runs its matrix products in bfloat16 (torch.autocast) and returns float32 logits;
    ``train_step`` sees an ordinary model with a ``config``."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(idx).float()


def add_dropout(model: GPT, p: float) -> None:
    """Dropout on the outputs of the embeddings and of every block's attention and MLP, in training mode only:
    forward hooks, so that the model's parameters, its file and its use at inference stay a plain GPT-2."""
    def drop(module, inputs, output):
        return F.dropout(output, p, module.training)

    for module in [model.emb] + [m for block in model.h for m in (block.attn, block.mlp)]:
        module.register_forward_hook(drop)


def hf_heldout_loss(folder: Path, heldout: torch.Tensor, tokens: int = HF_MEASURE_TOKENS) -> float:
    """The model card's measure: Hugging Face's GPT2LMHeadModel in float32, on the first ``tokens`` held-out tokens
    in consecutive windows of block_size (each window predicts its tokens after the first)."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    T = hf.config.n_positions
    ids = heldout[:tokens]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, T):
            window = ids[start:start + T + 1]
            if len(window) < 2:
                break
            logits = hf(window[None, :-1]).logits[0]
            total += F.cross_entropy(logits, window[1:], reduction="sum").item()
            count += len(window) - 1
    return total / count


def samples(model: GPT, temperatures=(0.8,), tokens: int = 60, seed: int = 0) -> list[dict]:
    """The model's continuation of each prompt at each temperature (seeded: the same every time)."""
    enc = coursekit.gpt2_encoding()
    out = []
    for prompt in PROMPTS:
        for temperature in temperatures:
            text = generate(model, enc, prompt, tokens, choose=Sampler(do_sample=True, temperature=temperature,
                                                                       seed=seed)).text
            out.append({"prompt": prompt, "temperature": temperature, "text": text})
    return out


def run(out: Path, run_dir: Path, hp: Hyper, seed: int, threads: int, resume: bool,
        shape: GPTConfig = SHAPE) -> dict:
    """Train (or go on training) and write the model folder; returns the log."""
    torch.set_num_threads(threads)
    train_ids, heldout_ids, train_works = corpus()
    T = shape.block_size
    probes = {"train": spread(train_ids, T, hp.eval_windows), "heldout": spread(heldout_ids, T, hp.eval_windows)}
    data = {"train": train_ids, "heldout": heldout_ids}
    checkpoint = run_dir / "checkpoint.pt"

    torch.manual_seed(seed)
    model = GPT(shape)
    optimizer = make_optimizer(model, hp.max_lr, hp.weight_decay, (hp.beta1, hp.beta2))
    generator = torch.Generator().manual_seed(seed)
    state = {"curve": [], "samples": [], "seconds": 0.0, "done": 0}
    if resume:
        saved = torch.load(checkpoint, weights_only=False)
        if (saved["hyper"], saved["shape"], saved["seed"], saved["threads"]) != \
                (dataclasses.asdict(hp), dataclasses.asdict(shape), seed, threads):
            raise SystemExit(f"{checkpoint} is of another run (its settings differ from these): start it again "
                             "without --resume, or give the same settings")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        state = saved["state"]
        print(f"resuming {checkpoint} after step {state['done']}")
    add_dropout(model, hp.dropout)
    trainee = BFloat16(model) if hp.bf16 else model
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters; {len(train_ids):,} training tokens, {len(heldout_ids):,} held out "
          f"({', '.join(HELD_OUT)}); {hp.steps} steps of {hp.batch_size} x {T} tokens")

    started, before = time.perf_counter(), state["seconds"]  # (a resumed run adds to the time before)

    def evaluate(done: int) -> dict:
        point = {"step": done, "tokens": done * hp.batch_size * T,
                 "lr": optimizer.param_groups[0]["lr"],
                 **{f"{k}_loss": round(estimate_loss(model, data[k], probes[k], T), 4) for k in data}}
        state["curve"].append(point)
        model.eval()
        state["samples"].append({"step": done, "texts": samples(model, tokens=40)})
        model.train()
        state["seconds"], state["done"] = before + time.perf_counter() - started, done
        run_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(), "torch_rng": torch.get_rng_state(), "state": state,
                    "hyper": dataclasses.asdict(hp), "shape": dataclasses.asdict(shape), "seed": seed,
                    "threads": threads}, checkpoint.with_suffix(".tmp"))
        os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        return point

    if state["done"] == 0:
        evaluate(0)
    train(trainee, optimizer, train_ids, steps=hp.steps, batch_size=hp.batch_size, generator=generator,
          schedule=dict(max_lr=hp.max_lr, min_lr=hp.min_lr, warmup_steps=hp.warmup_steps, max_steps=hp.steps),
          max_grad_norm=hp.max_grad_norm, eval_every=hp.eval_every, evaluate=evaluate, start_step=state["done"])

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, dtype=torch.float16)  # halves the file; both loaders give float32 back
    shipped = GPT.from_pretrained(out).eval()
    final = {"train_loss": estimate_loss(shipped, train_ids, spread(train_ids, T, len(spread(heldout_ids, T))), T),
             "heldout_loss": estimate_loss(shipped, heldout_ids, spread(heldout_ids, T), T),
             "heldout_loss_hf_first_30k": hf_heldout_loss(out, heldout_ids)}
    log = {
        "model": "shakespeare-gpt", "config": dataclasses.asdict(shape), "parameters": n_params,
        "hyperparameters": dataclasses.asdict(hp), "seed": seed, "threads": threads,
        "steps": hp.steps, "tokens_seen": hp.steps * hp.batch_size * T,
        "passes_over_the_training_text": round(hp.steps * hp.batch_size * T / len(train_ids), 2),
        "training_hours": round(state["seconds"] / 3600, 2),
        "held_out_works": list(HELD_OUT), "train_works": train_works,
        "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids),
        "unigram_baseline": round(unigram_loss(train_ids, heldout_ids, shape.vocab_size), 4),
        "unigram_smoothing": "add-one over the vocabulary",
        "final": {k: round(v, 4) for k, v in final.items()},
        "curve": state["curve"], "samples_while_training": state["samples"],
        "samples": samples(shipped, temperatures=(0.5, 0.8, 1.1), tokens=80),
        "file_bytes": (out / "model.safetensors").stat().st_size,
        "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=1, ensure_ascii=False) + "\n")
    plot(log, out / "loss_curve.png")
    write_card(log, out / "README.md")
    return log


def plot(log: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["step"] for p in log["curve"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [p["train_loss"] for p in log["curve"]], label="training text")
    ax.plot(steps, [p["heldout_loss"] for p in log["curve"]], label="held out (" + ", ".join(HELD_OUT) + ")")
    ax.axhline(log["unigram_baseline"], color="grey", linestyle="--", label="unigram baseline")
    ax.set(xlabel="step", ylabel="cross-entropy (nats per token)", ylim=(0, None),
           title=f"shakespeare-gpt: {log['parameters'] / 1e6:.1f}M parameters, "
                 f"{log['tokens_seen'] / 1e6:.1f}M training tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_card(log: dict, path: Path) -> None:
    """The model card, every number from the log (tests/test_shipped_model.py recomputes the ones it can)."""
    c, hp, final = log["config"], log["hyperparameters"], log["final"]
    fence = "```"
    dropout = (f"dropout {hp['dropout']:g} on the outputs of the embeddings and of every block's attention and MLP"
               if hp["dropout"] else "no dropout (too few passes over the text to memorise it)")
    precision = ("matrix products in bfloat16 (torch.autocast), the rest in float32" if hp["bf16"]
                 else "everything in float32")
    shown = "\n\n".join(f"temperature {s['temperature']}, prompt {s['prompt']!r}:\n{fence}\n{s['prompt']}{s['text']}\n"
                        f"{fence}" for s in log["samples"] if s["prompt"] == PROMPTS[0])
    path.write_text(f"""\
# shakespeare-gpt: the course's small model

A {log['parameters'] / 1e6:.1f}M-parameter GPT-2-shaped model ({c['n_layer']} layers, {c['n_head']} heads,
{c['n_embd']} channels, a window of {c['block_size']} tokens, GPT-2's {c['vocab_size']:,}-token vocabulary), trained with
the course's own code (chapter 4's `minigpt.transformer.GPT`, chapter 8's `minigpt.training`) on the Shakespeare
corpus that ships with `coursekit`. Every demo in the book loads it, offline:

{fence}python
import coursekit
from minigpt.transformer import GPT
model = GPT.from_pretrained(coursekit.shipped_model_dir())
# or: transformers.GPT2LMHeadModel.from_pretrained(coursekit.shipped_model_dir(), dtype=torch.float32)
{fence}

**Files.** `config.json` and `model.safetensors` in Hugging Face's GPT-2 format (weights stored in float16,
{log['file_bytes'] / 1e6:.1f} MB; minigpt and `transformers` both load them into float32 and give the same logits),
`training_log.json` (every setting, the loss curve, samples while it trained, the final losses, versions) and
`loss_curve.png`.

**Data.** {len(log['train_works'])} works, {log['train_tokens']:,} GPT-2 tokens, each work followed by
`<|endoftext|>`. *Julius Caesar* and *Twelfth Night* ({log['heldout_tokens']:,} tokens) are held out: never trained
on.

**Training.** `training/train_shipped_model.py` with its defaults (`make model`), seed {log['seed']},
{log['threads']} threads: {log['steps']:,} steps of {hp['batch_size']} windows of {c['block_size']} tokens
({log['tokens_seen'] / 1e6:.1f}M tokens, {log['passes_over_the_training_text']} passes over the training text); AdamW
(betas {hp['beta1']}, {hp['beta2']}, weight decay {hp['weight_decay']} on matrices and embeddings), gradients clipped
at norm {hp['max_grad_norm']}, the learning rate warmed up over {hp['warmup_steps']} steps to {hp['max_lr']:g} and
decayed on a cosine to {hp['min_lr']:g}; {dropout}; {precision}. It took
{log['training_hours']} hours on the 2 CPU cores of a shared machine (torch {log['torch'].split('+')[0]},
Python {log['python']}). The same command on the same number of threads repeats it; `--resume` goes on from the last
checkpoint.

**How good it is.** Cross-entropy on the held-out plays, measured with Hugging Face's `GPT2LMHeadModel` in float32
on their first {HF_MEASURE_TOKENS:,} tokens in windows of {c['block_size']}: **{final['heldout_loss_hf_first_30k']:.2f} nats
per token** (perplexity {math.exp(final['heldout_loss_hf_first_30k']):.0f}); on all their windows
{final['heldout_loss']:.2f}, and {final['train_loss']:.2f} on as many windows of the training text. A unigram model
(each token's frequency in the training text) scores **{log['unigram_baseline']:.2f}** on the same plays.

It has learned the shape of a play (speaker names in capitals, verse lines, stage directions in brackets),
Shakespeare's vocabulary and much of his grammar at the scale of a phrase. It has not learned sense: a speech
wanders from subject to subject, characters appear from other plays, and nothing carries over from one line to
the next for long. Greedy decoding soon repeats itself (chapter 6). Samples of seed 0:

{shown}

**Licence.** The weights are released under the MIT licence, like the course's code. The training text is in
the public domain (see `../../shakespeare/README.md`).
""", encoding="utf-8")


# glibc hands every block over 32 MB straight back to the kernel when it is freed, and the kernel zeroes each page
# again at the next step: with logits of 16 x 256 x 50,257 floats (batches of 16), a third of a step went to clearing pages. With
# these settings malloc keeps what it has freed (measured: 3.0 s per step instead of 4.3-6.8 s, 7.4 GB at most).
MALLOC_SETTINGS = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def keep_freed_memory(argv: list[str]) -> None:
    """Start this script again with MALLOC_SETTINGS (malloc reads them only when a process starts)."""
    if platform.system() == "Linux" and any(os.environ.get(k) != v for k, v in MALLOC_SETTINGS.items()):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, __file__, *argv], {**os.environ, **MALLOC_SETTINGS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=coursekit.data.SHIPPED_MODEL_DIR, help="the model folder")
    parser.add_argument("--run", type=Path, default=HERE / "run", help="where checkpoints go (default training/run)")
    parser.add_argument("--resume", action="store_true", help="go on from the last checkpoint in --run")
    parser.add_argument("--steps", type=int, default=Hyper.steps, help=f"training steps (default {Hyper.steps})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2; a run repeats only on as many)")
    parser.add_argument("--sample", metavar="PROMPT", help="do not train: continue PROMPT with the model in --out")
    parser.add_argument("--temperature", type=float, default=0.8, help="for --sample")
    parser.add_argument("--tokens", type=int, default=120, help="for --sample: how many new tokens")
    parser.add_argument("--card", action="store_true", help="do not train: write the model card from the log in --out")
    args = parser.parse_args(argv)
    if args.sample is not None:
        torch.set_num_threads(args.threads)
        model = GPT.from_pretrained(args.out).eval()
        print(args.sample + generate(model, coursekit.gpt2_encoding(), args.sample, args.tokens,
                                     choose=Sampler(do_sample=True, temperature=args.temperature,
                                                    seed=args.seed)).text)
        return 0
    if args.card:
        write_card(json.loads((args.out / "training_log.json").read_text()), args.out / "README.md")
        return 0
    if args.steps < 2:
        raise SystemExit(f"--steps must be at least 2, got {args.steps}")
    if argv is None:  # run as a script, not called from a test
        keep_freed_memory(sys.argv[1:])
    defaults = Hyper()
    hp = dataclasses.replace(defaults, steps=args.steps,
                             warmup_steps=min(defaults.warmup_steps, args.steps // 10),
                             eval_every=min(defaults.eval_every, max(1, args.steps // 4)))
    log = run(args.out, args.run, hp, args.seed, args.threads, args.resume)
    f = log["final"]
    print(f"{log['steps']} steps in {log['training_hours']} h; train {f['train_loss']:.3f}, held out "
          f"{f['heldout_loss']:.3f} (Hugging Face, first {HF_MEASURE_TOKENS:,} tokens: {f['heldout_loss_hf_first_30k']:.3f}), "
          f"unigram {log['unigram_baseline']:.3f}. Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
