"""tools/build_failures.py: what `make course` says on the console when a page's notebook stops on an error."""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "build_failures.py"
# What myst-nb writes to _build/html/reports/<page>.err.log: nbclient's CellExecutionError, colours included.
REPORT = """An error occurred while executing the following cell:
------------------
_a = GPT(_cfg).double()
assert all(torch.allclose(_p, _q, rtol=0, atol=1e-10) for _p, _q in pairs), "the sketch and train_step differ"
------------------


\x1b[0;31m---------------------------------------------------------------------------\x1b[0m
\x1b[0;31mAssertionError\x1b[0m                            Traceback (most recent call last)
Cell \x1b[0;32mIn[12], line 2\x1b[0m
\x1b[1;32m      1\x1b[0m _a \x1b[38;5;241m=\x1b[39m GPT(_cfg)\x1b[38;5;241m.\x1b[39mdouble()
\x1b[0;32m----> 2\x1b[0m \x1b[38;5;28;01massert\x1b[39;00m all(...), \x1b[38;5;124m"the sketch and train_step differ"\x1b[0m

\x1b[0;31mAssertionError\x1b[0m: the sketch and train_step differ
"""


def run(html: Path, since: float) -> str:
    return subprocess.run([sys.executable, str(TOOL), "--html", str(html), "--since", str(since)],
                          capture_output=True, text=True, check=True).stderr


def test_a_failed_page_is_named_with_its_cells_line_and_its_error(tmp_path):
    report = tmp_path / "reports" / "book" / "08-training.err.log"
    report.parent.mkdir(parents=True)
    report.write_text(REPORT, encoding="utf-8")
    said = run(tmp_path, 0)
    source = (ROOT / "book" / "08-training.md").read_text(encoding="utf-8")
    line = source[:source.index("_a = GPT(_cfg).double()")].count("\n") + 1
    assert f"book/08-training.md, the cell at line {line} failed:" in said
    assert "AssertionError: the sketch and train_step differ" in said and "----> 2" in said
    assert "\x1b" not in said and "------------------" not in said


def test_reports_older_than_the_build_are_left_out(tmp_path):
    report = tmp_path / "reports" / "book" / "08-training.err.log"
    report.parent.mkdir(parents=True)
    report.write_text(REPORT, encoding="utf-8")
    old = time.time() - 3600
    os.utime(report, (old, old))
    said = run(tmp_path, time.time() - 60)
    assert "08-training" not in said and "the warnings above say why" in said
