"""The chapter pages' MyST sources, read without building the book (the build itself is tested in test_site.py)."""
import re
from pathlib import Path

import pytest

from minigpt import CHAPTERS as FOLDERS

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book").glob("*.md"))
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
HIDING = ("remove-cell", "remove-input", "hide-input")  # tags that keep a cell's code off the page


def shown_cells(text: str, hiding: tuple[str, ...] = HIDING) -> list[tuple[int, str]]:
    """(line, source) of each code cell whose code the reader sees (with ``hiding``'s tags left out)."""
    cells = []
    for m in CELL.finditer(text):
        tags = " ".join(re.findall(r"^:?tags:\s*\[(.*?)\]", m.group(1), re.M))  # `:tags:` or a YAML block's
        if not any(tag in tags for tag in hiding):
            cells.append((text[:m.start()].count("\n") + 1, m.group(1)))
    return cells


def test_the_pages_have_code_cells_that_the_reader_sees():
    assert len(PAGES) >= 10 and all(shown_cells(p.read_text()) for p in PAGES if p.stem != "intro")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_glue_and_the_build_time_asserts_are_in_hidden_cells(page):
    """A page's numbers are glued and its claims asserted at build (a page shows what it says), in cells the
    reader does not see: the code on the page is the demo, not its bookkeeping."""
    shown = [(line, statement.strip()[:70]) for line, source in shown_cells(page.read_text())
             for statement in source.splitlines() if re.match(r"(glue\(|assert )", statement)]
    assert not shown, f"{page.name}: move these lines into a cell tagged remove-cell: {shown}"


CHAPTERS = [p for p in PAGES if p.stem in FOLDERS]  # the chapters that build a piece of minigpt
SKETCH = re.compile(r"^(?:def|class) (\w*(?:_sketch|Sketch)\w*)\b", re.M)


def hidden_cells(text: str) -> list[str]:
    shown = {source for _, source in shown_cells(text)}
    return [m.group(1) for m in CELL.finditer(text) if m.group(1) not in shown]


@pytest.mark.parametrize("page", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_each_chapter_shows_the_code_of_its_idea_checked_against_the_reference(page):
    """The page shows a short version of what the chapter builds (a `..._sketch`), and a hidden cell asserts it
    agrees with the reference package, so the sketch cannot drift from it."""
    text = page.read_text()
    sketches = {name: source for _, source in shown_cells(text) for name in SKETCH.findall(source)}
    assert sketches, f"{page.name}: no cell the reader sees defines a ..._sketch (or ...Sketch class)"
    for name, source in sketches.items():
        checks = [cell for cell in hidden_cells(text) if "assert" in cell and re.search(rf"\b{name}\b", cell)]
        assert checks, f"{page.name}: no hidden cell asserts that {name} agrees with the reference"


COLUMN = 82  # characters of code that fit the narrowest text column at 1366 px (723 px) (tests/layout_probe.html measures the page)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_code_a_reader_can_open_fits_the_text_column(page):
    """Code cells shown on the page, or behind its "show code" buttons (hide-input), wrap within COLUMN characters:
    at a laptop's width they need no sideways scrolling (the browser test checks the built page, outputs too)."""
    text = page.read_text()
    openable = shown_cells(text, hiding=("remove-cell", "remove-input"))
    wide = [(line + 1 + n, code.strip()[:60]) for line, source in openable
            for n, code in enumerate(source.splitlines()) if len(code) > COLUMN]
    assert not wide, f"{page.name}: lines longer than {COLUMN} characters in cells the reader can open: {wide}"


def test_the_clocks_of_a_numbers_only_run_take_one_round_and_assert_no_time(monkeypatch):
    from coursekit import clocks

    monkeypatch.delenv(clocks.ENV, raising=False)
    assert clocks.rounds(15) == 15 and clocks.timed(True) and not clocks.timed(False)
    monkeypatch.setenv(clocks.ENV, "off")
    assert clocks.rounds(15) == 1 and clocks.timed(False)
