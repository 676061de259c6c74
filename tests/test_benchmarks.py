"""The benchmark entry point runs and checks equality before it times anything (speed is printed, not tested)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bpe_benchmark_prints_a_table():
    out = subprocess.run([sys.executable, "benchmarks/run.py", "bpe", "--repeat", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "identical ids: True" in out.stdout
    assert "| tiktoken (Rust) |" in out.stdout and "minigpt teaching BPE, cold" in out.stdout


def test_unknown_benchmark_is_a_clear_error():
    out = subprocess.run([sys.executable, "benchmarks/run.py", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "unknown benchmarks ['nope']" in out.stderr
