"""Benchmarks that print numbers: python benchmarks/run.py [NAME ...]   (make bench runs them all)

Each benchmark measures the course's reference code next to the real thing in one run, on this machine,
and prints a markdown table. These are measurements, not tests: the tests check equality, this prints speed.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "src/coursekit/data/tiktoken"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    """Fastest wall time of ``repeat`` runs, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def bench_bpe(repeat: int) -> list[str]:
    """The teaching BPE (minigpt.tokens, pure Python) against tiktoken (Rust) on the whole corpus."""
    import coursekit
    from minigpt.tokens import gpt2_tokenizer

    text = coursekit.shakespeare()
    mb = len(text.encode("utf-8")) / 1e6
    enc = coursekit.gpt2_encoding()
    t_tik, want = best_of(lambda: enc.encode_ordinary(text), repeat)
    # Cold: a new tokenizer, so every distinct piece is merged once. Warm: its piece cache is filled.
    t_cold, got_cold = best_of(lambda: gpt2_tokenizer().encode_ordinary(text), repeat)
    tok = gpt2_tokenizer()
    tok.encode_ordinary(text)
    t_warm, got_warm = best_of(lambda: tok.encode_ordinary(text), repeat)
    same = got_cold == want and got_warm == want
    if not same:
        raise SystemExit("bpe: the reference tokenizer's ids differ from tiktoken's; fix that before timing it")
    rows = [
        f"Corpus: Shakespeare, {mb:.2f} MB, {len(want):,} tokens; identical ids: {same}; best of {repeat}.",
        "",
        "| encoder | seconds | MB/s | time / tiktoken |",
        "|---|---:|---:|---:|",
        f"| tiktoken (Rust) | {t_tik:.3f} | {mb / t_tik:.2f} | 1.00x |",
        f"| minigpt teaching BPE, cold | {t_cold:.3f} | {mb / t_cold:.2f} | {t_cold / t_tik:.2f}x |",
        f"| minigpt teaching BPE, warm cache | {t_warm:.3f} | {mb / t_warm:.2f} | {t_warm / t_tik:.2f}x |",
    ]
    return rows


BENCHMARKS = {"bpe": bench_bpe}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, from {sorted(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the fastest counts")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {sorted(BENCHMARKS)}")
    print(f"# minigpt benchmarks\n\nMachine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}.\n")
    for name in args.names or BENCHMARKS:
        print(f"## {name}: {BENCHMARKS[name].__doc__}\n")
        print("\n".join(BENCHMARKS[name](args.repeat)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
