"""How many of each chapter's mutants the learner's own visible tests catch (issue 28): a learner's first signal.

Each mutant of tests/submissions/chNN_*.py is run as the learner has it (the released notebook with the mistake
written into its exercise cells, no hidden tests) in the chapter's warm kernel (tests/submissions/grading.py), and
counts as caught when a test cell raises. The correct variants are run the same way: a visible test that fails one
of them is a visible test that fails a correct answer. Not part of `make test` (every case runs once more, about
ten minutes on two cores); run it after changing a chapter's visible tests:

    .venv/bin/python tools/visible_catch.py [NN ...]      # e.g. 08 09; all chapters by default
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT / "src" / "coursekit" / "data" / "tiktoken"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(ROOT / "tests"))

from minigpt import CHAPTERS  # noqa: E402
from submissions.grading import submission, warm_kernel  # noqa: E402


def test_cells_that_raise(kernel, nb) -> list[str]:
    """The grade ids of the test cells of ``nb`` that raised when it ran in ``kernel``."""
    outcome = kernel.run(nb)
    raised = []
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        outputs, _ = outcome.outputs.get(i, ([], None))
        if meta.get("grade") and any(o.get("output_type") == "error" for o in outputs):
            raised.append(meta["grade_id"])
    return raised


def chapter(folder: str) -> tuple[int, int, list[str], list[str]]:
    """(mutants, caught, the keys of the mutants not caught, the variants a visible test fails) of one chapter."""
    ch = importlib.import_module(f"submissions.ch{folder[:2]}_{CHAPTERS[folder]}")
    missed, failed = [], []
    with warm_kernel(ch.CHAPTER) as kernel:
        assert not test_cells_that_raise(kernel, submission(ch, "reference")), f"{folder}: the reference fails"
        for m in ch.MUTANTS:
            if not test_cells_that_raise(kernel, submission(ch, m)):
                missed.append(m.key)
        for v in ch.VARIANTS:
            if test_cells_that_raise(kernel, submission(ch, v)):
                failed.append(v.key)
    return len(ch.MUTANTS), len(ch.MUTANTS) - len(missed), missed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: every graded chapter)")
    args = parser.parse_args(argv)
    folders = [f for f in CHAPTERS if not args.chapters or f[:2] in args.chapters]
    print(f"{'chapter':16} {'mutants':>7} {'caught by visible tests':>24}   not caught / variants failed")
    for folder in folders:
        n, caught, missed, failed = chapter(folder)
        print(f"{folder:16} {n:7d} {caught:16d} ({caught / n:4.0%})   {', '.join(missed) or '-'}"
              + (f" / VARIANTS FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
