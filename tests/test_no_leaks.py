"""Nothing learners see holds solutions or hidden tests (DESIGN.md, invariant 4).

Scans the book sources, the learner notebooks and, when it has been built, the website for nbgrader's
solution and hidden-test markers and for imports of ``autograder``.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
# The website is scanned when it has been built (make book, or the slow site tests).
SCANNED = ["book", "notebooks"] + (["_build/html"] if HTML.is_dir() else [])
LEAKS = re.compile(
    r"BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN TESTS|END HIDDEN TESTS"
    r"|\bfrom\s+autograder\b|\bimport\s+autograder\b"
)


def text_files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # images, fonts


@pytest.mark.parametrize("folder", SCANNED)
def test_no_solution_or_hidden_test_markers(folder):
    where = ROOT / folder
    assert where.is_dir(), f"{folder}/ is missing"
    leaks = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for path, text in text_files(where)
        for match in LEAKS.finditer(text)
    ]
    assert not leaks, "learner-visible files leak solutions or grading code:\n" + "\n".join(leaks)


def test_site_has_no_pages_from_solutions():
    pages = HTML.rglob("*") if HTML.is_dir() else []
    assert not [p for p in pages if "solutions" in p.relative_to(HTML).parts]
