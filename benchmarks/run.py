"""Benchmarks that print numbers: python benchmarks/run.py [NAME ...] [--quick]   (make bench runs them all)

Each benchmark measures the course's reference code next to the real thing in one run, on this machine,
and prints a markdown table. These are measurements, not tests: the tests check equality, this prints speed.
Each checks that what it times gives the same answer both ways before it prints a number.

The model benchmarks run on the course's small trained model and on a model of GPT-2 small's shape (124M
parameters, random weights: speed does not depend on the values), float32 on both sides, batch 1 (the batching
benchmark: batches of 1 to 16), with torch's default number of threads. Where two sides are compared, they take
turns within each round (interleaved) and the tables print the median round and the spread, with the machine's
load average: a shared machine is slower at times, and a fair comparison slows both sides alike. Figures computed
rather than measured say "estimated".
``--quick`` runs them on a tiny random model instead (bpe: on a smaller text), in seconds: a smoke test of the code,
not a measurement.
"""
from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "src/coursekit/data/tiktoken"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def best_of(fn, repeat: int = 3, budget_s: float | None = None) -> tuple[float, object]:
    """Fastest wall time of ``repeat`` runs, and the last result; with ``budget_s``, no new run starts once the
    runs so far took that long (a slow measurement is then the best of fewer runs)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        if budget_s is not None and sum(times) >= budget_s:
            break
    return min(times), result


def interleaved(contenders: dict, rounds: int, budget_s: float | None = None) -> dict[str, tuple[list[float], object]]:
    """{name: (seconds of each round, the last result)}. The contenders take turns within each round, so that a
    stretch of time in which the machine is slower (other work on a shared machine) slows all of them alike. A
    contender is a function that prepares one run, untimed (a new tokenizer, say), and returns it. With
    ``budget_s``, no new round starts once the rounds so far took that long (fewer rounds, at least one)."""
    times = {name: [] for name in contenders}
    results = {}
    for _ in range(rounds):
        if budget_s is not None and sum(map(sum, times.values())) >= budget_s:
            break
        for name, prepare in contenders.items():
            run = prepare()
            start = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in contenders}


def median_spread(values: list[float], digits: int = 3) -> str:
    """Two table cells: the median of ``values``, and their min-max."""
    import statistics

    return f"{statistics.median(values):.{digits}f} | {min(values):.{digits}f}-{max(values):.{digits}f}"


def load_average() -> str:
    """The machine's load (1, 5, 15 minutes): how busy it was while a table was measured."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


def _random_letters(n: int) -> str:
    import random
    import string

    rng = random.Random(0)
    return "".join(rng.choice(string.ascii_letters) for _ in range(n))


BPE_QUICK = (("sonnets",), 100_000, 20_000)  # --quick: the works encoded, the bytes of the two single pieces


def bench_bpe(repeat: int, quick: bool = False) -> list[str]:
    """The teaching BPE (minigpt.tokens, pure Python) against tiktoken (Rust): the whole corpus, and single pieces
    of a million or 200,000 bytes, where a quadratic merge never finishes (--quick: the sonnets, and pieces of
    100,000 and 20,000 bytes)."""
    import statistics

    import coursekit
    from minigpt.tokens import GPT2_SPECIAL_TOKENS, Tokenizer, load_gpt2_ranks

    works, n_x, n_letters = BPE_QUICK if quick else (None, 1_000_000, 200_000)
    load = load_average()
    ranks = load_gpt2_ranks()
    enc = coursekit.gpt2_encoding()
    corpus = coursekit.shakespeare(works)
    what = "Shakespeare corpus" if works is None else f"Shakespeare: {', '.join(works)}"
    mb = len(corpus.encode("utf-8")) / 1e6
    warm = Tokenizer(ranks, GPT2_SPECIAL_TOKENS)
    warm.encode_ordinary(corpus)  # its piece cache filled

    def ours(text: str, tok: Tokenizer | None = None):
        """A run of encode_ordinary on a new tokenizer (cold: each distinct piece is merged once), or on ``tok``."""
        def prepare():
            t = tok or Tokenizer(ranks, GPT2_SPECIAL_TOKENS)
            return lambda: t.encode_ordinary(text)
        return prepare

    def theirs(text: str):
        return lambda: lambda: enc.encode_ordinary(text)

    # (input, text, {encoder: contender}, target for minigpt's cold run: (most seconds, most times tiktoken's))
    xs, letters = "x" * n_x, _random_letters(n_letters)
    cases = [
        (f"{what}, {mb:.2f} MB", corpus,
         {"tiktoken (Rust)": theirs(corpus), "minigpt teaching BPE, cold": ours(corpus),
          "minigpt teaching BPE, warm cache": ours(corpus, warm)}, (None, 1 / 0.8)),
        (f'"x" * {n_x:,}: one piece', xs,
         {"tiktoken (Rust)": theirs(xs), "minigpt teaching BPE, cold": ours(xs)}, (5.0, 10.0)),
        (f"{n_letters:,} random letters, no space: one piece", letters,
         {"tiktoken (Rust)": theirs(letters), "minigpt teaching BPE, cold": ours(letters)}, (5.0, 10.0)),
    ]
    rows = [f"Each time is the median of {repeat} rounds, min-max beside it; within a round the encoders take turns "
            "(interleaved), so that a slower stretch of a shared machine slows all of them. Cold: a new tokenizer for "
            "each round, whose cache of pieces starts empty.", "",
            "| input | encoder | seconds (median) | min-max | time / tiktoken | target | met |",
            "|---|---|---:|---:|---:|---|---|"]
    same = True
    for label, text, contenders, (most_s, most_ratio) in cases:
        measured = interleaved(contenders, repeat)
        want = measured["tiktoken (Rust)"][1]
        same = same and all(result == want for _, result in measured.values())
        base = statistics.median(measured["tiktoken (Rust)"][0])
        for name, (times, _) in measured.items():
            t = statistics.median(times)
            target, met = "", ""
            if name == "minigpt teaching BPE, cold":
                parts = ([f"< {most_s:.0f} s"] if most_s else []) + [
                    f"<= {most_ratio:.2f}x (speed >= 0.8x tiktoken's)" if most_ratio < 2 else f"<= {most_ratio:.0f}x"]
                target = " and ".join(parts)
                met = "yes" if (most_s is None or t < most_s) and t / base <= most_ratio else "no"
            rows.append(f"| {label} | {name} | {median_spread(times)} | {t / base:.2f}x | "
                        f"{target} | {met} |")
    if not same:
        raise SystemExit("bpe: the reference tokenizer's ids differ from tiktoken's; fix that before timing it")
    return [f"identical ids: {same} (every input, every encoder). Before: {load}; after: {load_average()}.", ""] + rows


# ---------------------------------------------------------------- the KV cache (chapter 7)

MiB = 2 ** 20
# Past these many seconds (estimated from the per-step timings), a whole generation is estimated, not run: the
# 124M model without a cache would take most of an hour for 1,024 tokens on two cores.
RUN_BUDGET_S = 20.0
STEP_BUDGET_S = 3.0  # a measurement whose runs took this long is not repeated: the best of fewer runs


@functools.cache
def _model(name: str):
    """(the model, the positions its per-step timings are taken at, new-token counts to total) by name."""
    import torch

    import coursekit
    from minigpt.transformer import GPT, GPTConfig

    torch.manual_seed(0)
    if name == "tiny":  # --quick
        return GPT(GPTConfig(vocab_size=512, block_size=48, n_layer=2, n_head=2, n_embd=32)).eval(), \
            [1, 16, 32, 47], [16, 100]
    if name == "shipped":
        model = GPT.from_pretrained(coursekit.shipped_model_dir())
        return model, [1, 64, 128, 192, 255], [256, 1024]
    return GPT(GPTConfig()).eval(), [1, 128, 256, 512, 768, 1023], [256, 1024]  # GPT-2 small's shape


def _model_names(quick: bool) -> list[str]:
    return ["tiny"] if quick else ["shipped", "gpt2-small-shape"]


def _describe(name: str) -> str:
    model = _model(name)[0]
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    size = f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params:,}"
    label = {"tiny": "tiny random GPT", "shipped": "the course's model",
             "gpt2-small-shape": "GPT-2 small's shape, random weights"}[name]
    return (f"{label} ({size} parameters: {c.n_layer} layers, {c.n_head} heads, n_embd {c.n_embd}, "
            f"block_size {c.block_size})")


def _prompt(model, n: int) -> list[int]:
    """``n`` token ids of real text (random ids for a vocabulary smaller than GPT-2's)."""
    import torch

    import coursekit

    vocab = model.config.vocab_size
    if vocab >= 50257:
        return coursekit.gpt2_encoding().encode_ordinary(coursekit.shakespeare()[100_000:140_000])[:n]
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _step_times(model, positions: list[int], repeat: int,
               without: bool = True) -> list[tuple[int, float, float, float, float, float, float]]:
    """(position, seconds of a decode step with the cache, without it, largest logit difference, with chapter 7's
    optional StaticKVCache, with its FastGPT, with FastGPT(int8=True)) at each position: the step that computes the token after ``position`` tokens, the
    median of rounds in which the steps take turns. With the cache: one token through forward_with_cache onto a
    cache of ``position`` positions. Without: chapter 5's step, the whole window
    (``without=False``: not measured, nan)."""
    import statistics

    import torch

    from minigpt.kv_cache import FastGPT, KVCache, StaticKVCache, forward_with_cache

    ids = torch.tensor([_prompt(model, max(positions) + 1)])
    full = KVCache(model.config.n_layer)
    forward_with_cache(model, ids[:, :max(positions)], full)  # one prefill, not timed; its first p positions
    static = StaticKVCache(model.config, max(positions) + 1)  # are the cache of any p (causality)
    for layer in range(model.config.n_layer):
        static.append(layer, full.keys[layer], full.values[layer])
    fast, fast8 = FastGPT(model), FastGPT(model, int8=True)
    fast.cache = fast8.cache = static  # the same cached positions
    rows = []
    for p in positions:
        def step():
            cache = KVCache(model.config.n_layer)
            cache.keys, cache.values = [k[:, :, :p] for k in full.keys], [v[:, :, :p] for v in full.values]
            return forward_with_cache(model, ids[:, p:p + 1], cache)[0, -1]

        def plain_step():
            with torch.no_grad():
                return model(ids[:, :p + 1])[0, -1]

        def static_step():
            static.filled = [p] * model.config.n_layer  # (it writes position p again: the same keys and values)
            return forward_with_cache(model, ids[:, p:p + 1], static)[0, -1]

        def fast_step(fast=fast):
            static.filled = [p] * model.config.n_layer
            with torch.no_grad():
                return fast.forward(ids[:, p:p + 1])[0, -1]

        contenders = {"cached": lambda: step, "static": lambda: static_step, "fastgpt": lambda: fast_step,
                      "fastgpt8": lambda: lambda: fast_step(fast8)} | ({"plain": lambda: plain_step} if without else {})
        measured = interleaved(contenders, repeat, STEP_BUDGET_S)
        t_cached, cached = statistics.median(measured["cached"][0]), measured["cached"][1]
        t_plain = float("nan")
        diff = max((cached - measured[key][1]).abs().max().item() for key in ("static", "fastgpt"))
        if without:
            t_plain = statistics.median(measured["plain"][0])
            diff = max(diff, (cached - measured["plain"][1]).abs().max().item())
        rows.append((p, t_cached, t_plain, diff, statistics.median(measured["static"][0]),
                     statistics.median(measured["fastgpt"][0]), statistics.median(measured["fastgpt8"][0])))
    return rows


def _estimate(rows, n_new: int, block: int, prompt: int = 1, column: int = 1) -> tuple[float, float]:
    """Seconds to write ``n_new`` tokens after a prompt of ``prompt`` tokens, with and without the cache, from the
    per-step timings (linear between the measured positions). The first token costs both a pass over the whole
    prompt (the cache's prefill). Once the context is longer than the window, the window slides and each step of
    CachedModel is a prefill of the whole window: the cost of a step without a cache. ``column``: the rows' cached
    step times to use (1: CachedModel's, 5: FastGPT's)."""
    import numpy as np

    pos = [r[0] for r in rows]
    at = np.arange(prompt - 1, prompt - 1 + n_new)  # the position of the last token read, for each new token
    cached = np.interp(at, pos, [r[column] for r in rows])
    plain = np.interp(np.minimum(at, block - 1), pos, [r[2] for r in rows])
    cached = np.where(at >= block, plain, cached)
    cached[0] = plain[0]
    return float(cached.sum()), float(plain.sum())


def _timed_generation(model, prompt: list[int], n_new: int) -> tuple[float, float, bool]:
    """Seconds of chapter 5's token_stream with CachedModel and with the plain model; whether the ids agree."""
    from minigpt.generation import token_stream
    from minigpt.kv_cache import CachedModel

    t_cached, with_cache = best_of(lambda: list(token_stream(CachedModel(model), prompt, n_new)), 1)
    t_plain, without = best_of(lambda: list(token_stream(model, prompt, n_new)), 1)
    return t_cached, t_plain, with_cache == without


def bench_kv_cache(repeat: int, quick: bool = False) -> list[str]:
    """Decode steps with and without the KV cache, against position; whole generations."""
    import torch

    rows = [f"torch threads: {torch.get_num_threads()}; float32, batch 1; each step the median of {repeat} rounds "
            f"(fewer once they took {STEP_BUDGET_S:.0f} s) in which the steps (cache, none, StaticKVCache, FastGPT) take turns; "
            f"{load_average()} before. A step "
            "\"at position p\" computes the token after p tokens: with the cache, one new token through "
            "forward_with_cache; without, chapter 5's forward pass over the whole window.", ""]
    for name in _model_names(quick):
        model, positions, totals = _model(name)
        block = model.config.block_size
        steps = _step_times(model, positions, repeat)
        worst = max(r[3] for r in steps)
        if worst > 1e-3:
            raise SystemExit(f"kv-cache: the cached step's logits differ from the uncached one's by {worst:.1e}")
        rows += [f"### {_describe(name)}", "",
                 f"Decode step against position (largest logit difference, cache vs none: {worst:.1e}).", "",
                 "| position | with cache (ms) | without (ms) | without / with | with StaticKVCache (ms) | "
                 "FastGPT (ms) | without / FastGPT |",
                 "|---:|---:|---:|---:|---:|---:|---:|"]
        rows += [f"| {p} | {c * 1e3:.2f} | {n * 1e3:.2f} | {n / c:.1f}x | {st * 1e3:.2f} | {f * 1e3:.2f} | {n / f:.1f}x |"
                 for p, c, n, _, st, f, _ in steps]
        rows += ["", f"Writing N new tokens after a one-token prompt (window {block}: past it, every step of "
                     "CachedModel prefills the slid window).", "",
                 "| new tokens | with cache (s) | without (s) | speedup | how | identical ids |",
                 "|---:|---:|---:|---:|---|---|"]
        for n_new in totals:
            est_cached, est_plain = _estimate(steps, n_new, block)
            if est_cached + est_plain <= RUN_BUDGET_S:
                t_cached, t_plain, same = _timed_generation(model, _prompt(model, 1), n_new)
                if not same:
                    raise SystemExit(f"kv-cache: {name}: the ids with the cache differ from those without it")
                how = "measured (token_stream, one run)"
            else:
                t_cached, t_plain, same = est_cached, est_plain, None
                how = (f"estimated: the sum of per-step times, linear between the {len(positions)} positions "
                       "above (a whole run is too long)")
            rows.append(f"| {n_new} | {t_cached:.2f} | {t_plain:.2f} | {t_plain / t_cached:.1f}x | {how} | "
                        f"{'-' if same is None else same} |")
        if not quick:  # the case: 256 new tokens after a prompt of 128
            for label, column in (("CachedModel", 1), ("FastGPT", 5)):
                est_cached, est_plain = _estimate(steps, 256, block, prompt=128, column=column)
                rows.append(f"| 256 after a prompt of 128, {label} | {est_cached:.2f} | {est_plain:.2f} | "
                            f"{est_plain / est_cached:.1f}x | estimated as above, the prompt's prefill (without "
                            "a cache) included | - |")
        rows.append("")
    return rows[:-1]


def bench_generate(repeat: int, quick: bool = False) -> list[str]:
    """The reference's generation with its KV cache against Hugging Face generate (greedy, use_cache=True)."""
    import statistics

    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    from minigpt.generation import token_stream
    from minigpt.kv_cache import CachedModel, FastCachedModel, FastGPT

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    rows = [f"Greedy, the same weights, both in float32 (Hugging Face loaded with dtype=torch.float32, each "
            f"parameter checked), a prompt of 16 tokens (128 on GPT-2 small's shape), batch 1, torch threads: "
            f"{torch.get_num_threads()}. FastGPT (chapter 7): a StaticKVCache as FastCachedModel's, plus the LM head on "
            f"the last position only, torch's fused kernels and widening weights stored transposed; FastGPT int8: "
            f"FastGPT(int8=True), its decode steps' products on int8 weights and the row rounded to int8 "
            f"(torch._int_mm; its ids are compared with float32 FastGPT's, not required equal). {repeat} rounds in which the five take turns (interleaved, so that a slower stretch of a shared "
            f"machine slows all alike; fewer once they took {RUN_BUDGET_S:.0f} s); tokens/s of the median round, "
            f"min-max of the rounds beside it. Without the cache: one run. Before: {load_average()}.", "",
            "| model | new tokens | minigpt, no cache (tok/s) | minigpt + CachedModel (tok/s) | min-max | "
            "minigpt + FastCachedModel (tok/s) | min-max | minigpt FastGPT (tok/s) | min-max | "
            "minigpt FastGPT int8 (tok/s) | min-max | "
            "HF generate, use_cache=True (tok/s) | min-max | minigpt's time / HF's (CachedModel, Fast, FastGPT) | "
            "FastGPT ms/token | identical ids | FastGPT int8: HF's time / its time | int8 ms/token | "
            "int8 ids equal to float32's (of the new tokens) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name in _model_names(quick):
        model = _model(name)[0]
        n_new = {"tiny": 32, "shipped": 200, "gpt2-small-shape": 64}[name]
        prompt = _prompt(model, 128 if name == "gpt2-small-shape" else 16)
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
        dtypes = {p.dtype for p in [*hf.parameters(), *model.parameters()]}
        if dtypes != {torch.float32}:
            raise SystemExit(f"generate: {name}: the two models are not both float32 ({sorted(map(str, dtypes))})")
        idx = torch.tensor([prompt])

        def hf_run():
            with torch.no_grad():
                out = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n_new, min_new_tokens=n_new,
                                  do_sample=False, num_beams=1, use_cache=True, pad_token_id=0, eos_token_id=None)
            return out[0, len(prompt):].tolist()

        measured = interleaved({
            "hf": lambda: hf_run,
            "cached": lambda: lambda: list(token_stream(CachedModel(model), prompt, n_new)),
            "fast": lambda: lambda: list(token_stream(FastCachedModel(model), prompt, n_new)),
            "fastgpt": lambda: (lambda m: lambda: list(token_stream(m, prompt, n_new)))(FastGPT(model)),
            "fastgpt8": lambda: (lambda m: lambda: list(token_stream(m, prompt, n_new)))(FastGPT(model, int8=True))},
            repeat, RUN_BUDGET_S)
        t_plain, plain = best_of(lambda: list(token_stream(model, prompt, n_new)), 1)
        same = all(ids == plain for key, (_, ids) in measured.items() if key != "fastgpt8")
        int8_same = sum(a == b for a, b in zip(measured["fastgpt8"][1], measured["fastgpt"][1]))
        if not same:
            raise SystemExit(f"generate: {name}: minigpt's greedy ids differ from Hugging Face's")
        speeds = {key: [n_new / t for t in times] for key, (times, _) in measured.items()}
        cells = [median_spread(speeds[key], 1) for key in ("cached", "fast", "fastgpt", "fastgpt8", "hf")]
        hf_time = statistics.median(measured["hf"][0])
        ratios = ", ".join(f"{statistics.median(measured[key][0]) / hf_time:.2f}x"
                           for key in ("cached", "fast", "fastgpt"))
        per_token = statistics.median(measured["fastgpt"][0]) / n_new * 1e3
        t8 = statistics.median(measured["fastgpt8"][0])
        rows.append(f"| {_describe(name)} | {n_new} | {n_new / t_plain:.1f} | {' | '.join(cells)} | {ratios} | "
                    f"{per_token:.2f} | {same} | {hf_time / t8:.2f}x | {t8 / n_new * 1e3:.2f} | {int8_same} |")
    return rows + ["", f"After: {load_average()}."]


def _copy_bandwidth(repeat: int, nbytes: int) -> float:
    """Bytes per second of a large tensor copy (each byte read once and written once)."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    t, _ = best_of(lambda: dst.copy_(src), repeat)
    return 2 * nbytes / t


def _weight_bytes(model) -> tuple[int, int]:
    """Bytes of weights a decode step reads: (float32 FastGPT, FastGPT(int8=True)): every parameter once (the tied
    token table once, as the LM head), with the linear layers and the head as int8 and their scales for int8."""
    from minigpt.kv_cache import FastGPT

    params = sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())
    fast8 = FastGPT(model, int8=True)
    linear = [lin.weight for b in model.h for lin in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    as_int8 = sum(q.nbytes + s.nbytes for block in fast8.weights8 for q, s in block) + sum(t.nbytes for t in fast8.head8)
    return params, params - sum(w.nbytes for w in linear) - model.lm_head.weight.nbytes + as_int8


def bench_bandwidth(repeat: int, quick: bool = False) -> list[str]:
    """A decode step reads every weight and the whole cache: its speed as a share of the memory bandwidth."""
    import torch

    from minigpt.kv_cache import kv_cache_bytes

    size = (32 if quick else 512) * MiB
    bandwidth = _copy_bandwidth(repeat, size)
    rows = [f"Memory bandwidth, measured: {bandwidth / 1e9:.1f} GB/s (torch copy of {size // MiB} MiB, read + "
            f"write, best of {repeat}). Bytes a decode step reads: the parameters (the tied token table once) and "
            "the KV cache at that position; with FastGPT(int8=True), the linear layers and the LM head as int8 "
            f"with their scales. Torch threads: {torch.get_num_threads()}.", "",
            "| model | position | step (ms, median) | bytes read (MiB) | achieved (GB/s) | share of bandwidth | "
            "FastGPT step (ms) | FastGPT's share | FastGPT int8 step (ms) | int8 bytes read (MiB) | int8's share | "
            "int8 / float32 FastGPT step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in _model_names(quick):
        model, positions, _ = _model(name)
        params, params8 = _weight_bytes(model)
        for p, t_cached, _, _, _, t_fast, t_fast8 in _step_times(model, [positions[0], positions[-1]], repeat,
                                                                 without=False):
            cache = kv_cache_bytes(model.config, p)
            read, read8 = params + cache, params8 + cache
            rows.append(f"| {_describe(name).split(' (')[0]} | {p} | {t_cached * 1e3:.2f} | {read / MiB:.1f} | "
                        f"{read / t_cached / 1e9:.2f} | {read / t_cached / bandwidth:.0%} | {t_fast * 1e3:.2f} | "
                        f"{read / t_fast / bandwidth:.0%} | {t_fast8 * 1e3:.2f} | {read8 / MiB:.1f} | "
                        f"{read8 / t_fast8 / bandwidth:.0%} | {t_fast8 / t_fast:.2f} |")
    return rows


CONSTRAINED_SCHEMA = {"type": "object", "properties": {"speaker": {"enum": ["ROMEO", "JULIET", "NURSE"]},
                                                       "line": {"type": "string", "maxLength": 24},
                                                       "mood": {"enum": ["happy", "sad"]}}}


def bench_constrained(repeat: int, quick: bool = False) -> list[str]:
    """One step's mask over GPT-2's 50,257 tokens, the plain way and the fast way, next to one decode step."""
    import torch

    import coursekit
    from minigpt.constrained import Constraint, all_masks, dfa_mask, regex_mask_plain, schema_regex, token_texts
    from minigpt.kv_cache import KVCache, forward_with_cache

    enc = coursekit.gpt2_encoding()
    start = time.perf_counter()
    constraint = Constraint.json(CONSTRAINED_SCHEMA, enc)
    build = time.perf_counter() - start
    pattern, dfa, trie, end = schema_regex(CONSTRAINED_SCHEMA), constraint.dfa, constraint.trie, {50256}
    texts = token_texts(constraint.vocab)
    is_text = torch.tensor([t is not None for t in texts])
    states = {"strict (inside an enum)": '{"speaker": "JU',
              "free (inside the string)": '{"speaker": "JULIET", "line": "O'}
    name = "tiny" if quick else "shipped"
    model = _model(name)[0]
    prompt = torch.tensor([_prompt(model, 33)])
    cache = KVCache(model.config.n_layer)
    forward_with_cache(model, prompt[:, :32], cache)

    def decode_step():
        branch = KVCache(model.config.n_layer)
        branch.keys, branch.values = list(cache.keys), list(cache.values)
        return forward_with_cache(model, prompt[:, 32:], branch)

    t_step, _ = best_of(decode_step, max(repeat, 5), STEP_BUDGET_S)
    t_all, masks = best_of(lambda: all_masks(dfa, constraint.levels, end), repeat)  # what the build did
    if not torch.equal(masks, torch.stack([constraint.masks[s] for s in range(len(dfa.table))])):
        raise SystemExit("constrained: all_masks differs from the masks the constraint holds")
    n = len(dfa.table)
    rows = [f"The pattern of a three-field JSON schema ({n:,} DFA states), GPT-2's vocabulary; constraint "
            f"built in {build:.1f} s (DFA, token trie and the masks of all states, once). Each time the best of "
            f"{repeat} runs; the masks are checked equal (on the tokens that are text) before they are timed. Decode "
            f"step: {_describe(name)}, one token after 32 with the KV cache, {t_step * 1e3:.2f} ms. The masks of all "
            f"{n:,} states at once (all_masks, part of the build): {t_all:.2f} s, {t_all / n * 1e3:.2f} ms a state.",
            "", "| state | allowed tokens | plain: regex per token (ms) | trie walk (ms) | a step: looked up (ms) "
            "| trie walk / decode step | looked up / decode step |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for label, written in states.items():
        state = dfa.walk(dfa.start, written.encode())
        t_plain, plain = best_of(lambda: regex_mask_plain(pattern, written, texts, end), repeat, STEP_BUDGET_S)
        t_fast, fast = best_of(lambda: dfa_mask(dfa, state, trie, len(texts), end), repeat)
        if not torch.equal(plain & is_text, fast & is_text):
            raise SystemExit(f"constrained: the plain and fast masks differ after {written!r}")
        ids = enc.encode(written)
        t_lookup, looked_up = best_of(lambda: constraint.allowed(ids), max(repeat, 5))
        assert torch.equal(looked_up, fast)
        rows.append(f"| {label} | {int(fast.sum()):,} | {t_plain * 1e3:.0f} | {t_fast * 1e3:.2f} "
                    f"| {t_lookup * 1e3:.3f} | {t_fast / t_step:.0%} | {t_lookup / t_step:.1%} |")
    rows += ["", "Target: the mask at most 20% of a decode step. A step looks its state's mask up; the trie walk of "
             "one state (a free-text state costs more than a decode step) is done for all states together by "
             "all_masks when the constraint is built."]
    return rows


# ---------------------------------------------------------------- batching (chapter 10)

BATCH_SIZES = [1, 2, 4, 8, 16]
BATCH_PROMPT, BATCH_NEW = 32, 32  # tokens in each prompt, new tokens each row writes
BATCH_QUICK = ([1, 2], 16, 16)  # --quick: batch sizes, prompt, new tokens (the tiny model's window is 48)


def bench_batching(repeat: int, quick: bool = False) -> list[str]:
    """Chapter 10's generate_batch against Hugging Face generate on the same left-padded batch, by batch size."""
    import statistics

    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    import coursekit
    from minigpt.batching import forward_padded, generate_batch, left_pad
    from minigpt.kv_cache import KVCache, kv_cache_bytes

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    sizes, n_prompt, n_new = BATCH_QUICK if quick else (BATCH_SIZES, BATCH_PROMPT, BATCH_NEW)
    enc = coursekit.gpt2_encoding()
    rows = [f"Greedy, the same weights, both in float32 (Hugging Face loaded with dtype=torch.float32, each parameter "
            f"checked); B different prompts of {n_prompt} tokens each, left-padded into one batch by left_pad (the "
            f"same ids and attention_mask go to Hugging Face's generate), {n_new} new tokens a row on both sides (no "
            f"end-of-text id; HF with min_new_tokens), torch threads: {torch.get_num_threads()}. minigpt: "
            "generate_batch (forward_padded through a growing KVCache, a Sampler per row); HF: "
            "generate(use_cache=True). "
            f"{repeat} rounds in which the two, and minigpt's prefill alone, take turns (interleaved; fewer once a "
            f"batch size's rounds took {RUN_BUDGET_S:.0f} s); tok/s (B x {n_new} new tokens / seconds) of the median "
            "round, min-max beside it. minigpt's prefill: forward_padded of the B prompts into an empty cache; its "
            "decode step: (run - prefill) / (new tokens - 1). Bytes a decode step reads: every parameter once (the "
            f"tied token table once) and the KV cache of the B rows at the middle step ({n_prompt + n_new // 2} "
            f"positions each), float32; achieved: those bytes / the decode step. Before: {load_average()}.", ""]
    for name in _model_names(quick):
        model = _model(name)[0]
        cfg = model.config
        text = _prompt(model, n_prompt * max(sizes))
        prompts = [text[b * n_prompt:(b + 1) * n_prompt] for b in range(max(sizes))]
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
        dtypes = {p.dtype for p in [*hf.parameters(), *model.parameters()]}
        if dtypes != {torch.float32}:
            raise SystemExit(f"batching: {name}: the two models are not both float32 ({sorted(map(str, dtypes))})")
        weights = _weight_bytes(model)[0]
        rows += [f"### {_describe(name)}", "",
                 "| B | minigpt generate_batch (tok/s) | min-max | HF generate (tok/s) | min-max | "
                 "minigpt's time / HF's | minigpt tok/s / its B=1 | HF tok/s / its B=1 | minigpt ms/run | HF ms/run | "
                 "minigpt prefill (ms) | minigpt decode step (ms) | bytes a step reads (MiB) | achieved (GB/s) | "
                 "identical ids |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        base = {}
        for B in sizes:
            batch = prompts[:B]
            ids, mask = left_pad(batch, pad_id=0)

            def hf_run(ids=ids, mask=mask):
                with torch.no_grad():
                    out = hf.generate(ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                                      do_sample=False, num_beams=1, use_cache=True, pad_token_id=0, eos_token_id=None)
                return out[:, ids.shape[1]:].tolist()

            def ours(batch=batch):
                return [g.ids for g in generate_batch(model, enc, batch, n_new, eos_ids=[])]

            def prefill(ids=ids, mask=mask):
                return forward_padded(model, ids, mask, KVCache(cfg.n_layer))[:, -1]

            if B == sizes[0]:  # one untimed run of each: first calls set things up
                ours()
                hf_run()
            measured = interleaved({"minigpt": lambda: ours, "hf": lambda: hf_run, "prefill": lambda: prefill},
                                   repeat, RUN_BUDGET_S)
            same = measured["minigpt"][1] == measured["hf"][1]
            if not same or any(len(r) != n_new for r in measured["minigpt"][1]):
                raise SystemExit(f"batching: {name}, B={B}: minigpt's greedy ids differ from Hugging Face's")
            t_ours, t_hf = (statistics.median(measured[k][0]) for k in ("minigpt", "hf"))
            t_prefill = statistics.median(measured["prefill"][0])
            step = (t_ours - t_prefill) / max(n_new - 1, 1)
            read = weights + kv_cache_bytes(cfg, B * (n_prompt + n_new // 2))
            speeds = {k: [B * n_new / t for t in measured[k][0]] for k in ("minigpt", "hf")}
            base.setdefault("minigpt", B * n_new / t_ours)
            base.setdefault("hf", B * n_new / t_hf)
            rows.append(f"| {B} | {median_spread(speeds['minigpt'], 1)} | {median_spread(speeds['hf'], 1)} | "
                        f"{t_ours / t_hf:.2f}x | {B * n_new / t_ours / base['minigpt']:.2f}x | "
                        f"{B * n_new / t_hf / base['hf']:.2f}x | {t_ours * 1e3:.0f} | {t_hf * 1e3:.0f} | "
                        f"{t_prefill * 1e3:.1f} | {step * 1e3:.2f} | {read / MiB:.1f} | {read / step / 1e9:.2f} | "
                        f"{same} |")
        rows.append("")
    return rows + [f"After: {load_average()}."]


BENCHMARKS = {"bpe": bench_bpe, "kv-cache": bench_kv_cache, "generate": bench_generate,
              "bandwidth": bench_bandwidth, "constrained": bench_constrained, "batching": bench_batching}
QUICK = {"bpe", "kv-cache", "generate", "bandwidth", "constrained", "batching"}  # the benchmarks --quick shrinks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, from {sorted(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per measurement; the fastest counts (bpe: rounds, interleaved; the median counts)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true",
                        help=f"run {sorted(QUICK)} on a tiny random model (bpe: on a smaller text): a smoke test, "
                             "not a measurement")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {sorted(BENCHMARKS)}")
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    print(f"# minigpt benchmarks\n\nMachine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}.\n")
    for name in args.names or BENCHMARKS:
        print(f"## {name}: {BENCHMARKS[name].__doc__}\n")
        options = {"quick": args.quick} if name in QUICK else {}
        print("\n".join(BENCHMARKS[name](args.repeat, **options)) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
