"""The rules of a whole run (tests/conftest.py), kept by pytest-xdist's controller as `make test` runs the suite:
a run past its time budget fails and names its slowest tests; the mutants and variants graded are counted."""
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SUITE = textwrap.dedent('''
    import time

    def test_slow():
        time.sleep(1.5)

    def test_quick():
        pass

    def test_a_mutant(count_graded):
        count_graded("99-demo", "mutant", "off-by-one")

    def test_a_variant(count_graded):
        count_graded("99-demo", "variant", "by-hand")
''')


def run_suite(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """A small suite with this suite's conftest as its plugin, on two xdist workers as `make test` runs."""
    (folder / "test_small.py").write_text(SUITE)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "--dist", "loadfile",
                           "-p", "no:cacheprovider", "-q", "test_small.py", *options],
                          cwd=folder, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(TESTS)}, capture_output=True,
                          text=True, timeout=120)


def test_a_run_past_its_budget_fails_and_names_its_slowest_tests(tmp_path):
    result = run_suite(tmp_path, "--time-budget", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "4 passed" in result.stdout
    report = result.stdout[result.stdout.index("FAILED: a rule of the whole run"):]
    assert "past its budget of 1 s (--time-budget); the slowest tests:" in report
    lines = report.splitlines()[2:6]
    assert lines[0].endswith("test_small.py::test_slow") and float(lines[0].split()[0]) >= 1.5, report


def test_a_run_within_its_budget_passes_and_counts_what_it_graded(tmp_path):
    result = run_suite(tmp_path, "--time-budget", "600")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "past its budget" not in result.stdout
    assert "mutants + variants graded: 99-demo 1 + 1; 1 mutants and 1 variants in all" in result.stdout


def test_the_longest_files_are_handed_out_first():
    """``LONGEST_FIRST`` and ``LAST`` name test files that exist, and `make test` keeps the collection's order (xdist would
    otherwise order files by their number of tests)."""
    import conftest

    named = conftest.LONGEST_FIRST + conftest.LAST
    assert len(set(named)) == len(named)
    assert set(named) <= {p.name for p in TESTS.glob("test_*.py")}
    make_test = (TESTS.parent / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "--dist loadfile --no-loadscope-reorder" in make_test, make_test

    class Item:
        def __init__(self, name):
            self.path, self.name = TESTS / name, name

    items = [Item(conftest.LAST[0]), Item("test_tokens.py"), Item(conftest.LONGEST_FIRST[1]), Item("test_tokens.py"),
             Item(conftest.LONGEST_FIRST[0])]
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [i.name for i in items] == [*conftest.LONGEST_FIRST[:2], "test_tokens.py", "test_tokens.py",
                                       conftest.LAST[0]]
