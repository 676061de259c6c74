"""The benchmark entry point runs and checks equality before it times anything (speed is printed, not tested)."""
import re
import subprocess
import sys

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["bpe", "kv-cache", "generate", "bandwidth", "batching", "constrained"]


@pytest.fixture(scope="module")
def quick() -> dict[str, str]:
    """Every benchmark with --quick, in one run (torch and transformers imported once, not once a benchmark): {name:
    its section of the output, from its "## name:" title}. --quick: a smoke test of the code that `make bench` runs
    on the real models and the whole corpus; the numbers are not looked at."""
    out = subprocess.run([sys.executable, "benchmarks/run.py", *QUICK, "--quick", "--repeat", "1", "--threads", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    titles = list(re.finditer(r"^## ([\w-]+): ", out.stdout, re.M))
    assert [t[1] for t in titles] == QUICK, out.stdout
    ends = [t.start() for t in titles[1:]] + [len(out.stdout)]
    return {t[1]: out.stdout[t.start():end] for t, end in zip(titles, ends)}


def test_bpe_benchmark_prints_a_table(quick):
    text = quick["bpe"]
    assert "identical ids: True" in text
    assert "| tiktoken (Rust) |" in text and "minigpt teaching BPE, cold" in text


def test_kv_cache_benchmarks_print_tables_with_equal_outputs_on_a_tiny_model(quick):
    """The KV-cache, generate and bandwidth benchmarks on a tiny random model."""
    text = quick["kv-cache"] + quick["generate"] + quick["bandwidth"]
    for title in ("## kv-cache:", "## generate:", "## bandwidth:"):
        assert text.count(title) == 1, title
    assert "| position | with cache (ms) | without (ms) | without / with | with StaticKVCache (ms) |" in text
    assert "| new tokens | with cache (s) | without (s) | speedup | how | identical ids |" in text
    generations = [line for line in text.splitlines() if "measured (token_stream" in line]
    assert len(generations) == 2 and all(line.endswith("| True |") for line in generations)
    hf_row = next(line for line in text.splitlines() if line.startswith("| tiny random GPT") and "| 32 |" in line)
    cells = [c.strip() for c in hf_row.strip("|").split("|")]
    assert cells[-4] == "True"  # minigpt's greedy ids, cached and not, equal Hugging Face generate's
    assert 0 <= int(cells[-1]) <= 32 and cells[-3].endswith("x")  # FastGPT int8's: ids as float32's, speed to HF's
    assert "Memory bandwidth, measured:" in text and text.count("| tiny random GPT |") == 2
    # fair comparisons: both sides float32, turns within rounds, the spread and the machine's load printed
    assert "both in float32" in text and "(interleaved" in text and "take turns" in text
    assert ("| minigpt + FastCachedModel (tok/s) | min-max | minigpt FastGPT (tok/s) | min-max | "
            "minigpt FastGPT int8 (tok/s) | min-max | HF generate" in text and text.count("load average") >= 3)
    assert hf_row.count("|") == 20  # a cell in each column, FastGPT's and its int8's ms per token among them
    bandwidth = [line for line in text.splitlines() if line.startswith("| tiny random GPT |")]
    assert all(line.count("|") == 13 for line in bandwidth)  # the int8 step, its bytes and its share too


def test_batching_benchmark_prints_a_table_with_equal_ids_on_a_tiny_model(quick):
    """Chapter 10's generate_batch against Hugging Face's generate, batches of 1 and 2 of a tiny random model (`make
    bench` runs batches of 1 to 16 of the real models)."""
    text = quick["batching"]
    assert text.count("## batching:") == 1 and "### tiny random GPT" in text
    assert "both in float32" in text and "(interleaved" in text and "take turns" in text
    assert text.count("load average") == 2
    assert ("| B | minigpt generate_batch (tok/s) | min-max | HF generate (tok/s) | min-max | minigpt's time / HF's |"
            in text)
    table = [line for line in text.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [line.split(" | ")[0] for line in table] == ["| 1", "| 2"]
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 15 and cells[-1] == "True"  # the same greedy ids as Hugging Face's, every row
        assert cells[5].endswith("x") and float(cells[11]) > 0 and float(cells[12]) > 0  # a ratio, ms, MiB


def test_unknown_benchmark_is_a_clear_error():
    out = subprocess.run([sys.executable, "benchmarks/run.py", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "unknown benchmarks ['nope']" in out.stderr


@pytest.mark.slow
def test_class_grading_benchmark_prints_a_row_for_each_way():
    """benchmarks/grade_class.py --workers 1 on a class of 2: graded here, then on a Dask cluster of one worker (`make
    bench-grading` grades 50 here, then 24 here and on 1 and 2 workers). The grading itself is tested elsewhere
    (tests/test_hostile_grading.py grades a class on a Dask cluster): here, the benchmark's own path."""
    out = subprocess.run([sys.executable, "benchmarks/grade_class.py", "--count", "2", "--cell-timeout", "20",
                          "--workers", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "## grading on a Dask cluster: a class of 2 chapter-1 submissions" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| here", "| Dask"))]
    # a right and a wrong one: both went through nbgrader, either way
    assert [row.split(" | ")[1:4] for row in rows] == [["2", "2", "none"]] * 2, rows
    assert "Dask, 1 worker of one notebook at a time" in rows[1]


def test_constrained_benchmark_checks_the_masks_equal_and_prints_a_table(quick):
    """The decode step of a tiny random model; the masks are GPT-2's whole vocabulary either way."""
    text = quick["constrained"]
    header = "| state | allowed tokens | plain: regex per token (ms) | trie walk (ms) | a step: looked up (ms) |"
    assert header in text
    assert "The masks of all 523 states at once (all_masks, part of the build)" in text
    assert "| strict (inside an enum) | 2 |" in text and "| free (inside the string) |" in text
