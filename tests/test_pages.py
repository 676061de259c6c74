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


def test_two_timings_are_told_apart_only_beyond_their_spread():
    """``clocks.compared``: runs whose quartiles overlap are "about as fast as" each other, however their middles
    differ; runs further apart get the ratio of their middles, either way round."""
    from coursekit.clocks import apart, compared, spread

    assert spread([5, 1, 4, 2, 3, 9, 7, 8, 6]) == (3, 5, 7)
    assert spread([2.0, 1.0]) == (1.0, 2.0, 2.0)  # fewer than 4: the least and the most
    slow, close = [86, 88, 89, 90, 93], [83, 85, 86, 89, 91]  # ms: middles 89 and 86, quartiles overlapping
    assert not apart(slow, close) and compared(slow, close) == compared(close, slow) == "about as fast as"
    fast = [40, 42, 43, 44, 47]
    assert apart(fast, slow)
    assert compared(fast, slow) == "2.1 times as fast as"  # 89 / 43
    assert compared(slow, fast) == "slower than (it took 2.1 times as long as)"
    tight = [100, 100.1, 100.2, 100.3], [104, 104.1, 104.2, 104.3]
    assert compared(*tight) == "1.04 times as fast as"  # apart by more than their spread, however little


def test_a_figure_carries_the_size_of_its_smallest_text():
    """``coursekit.figures``: the smallest text of a figure (not an empty or a hidden one), written in the PNG that
    IPython shows, in the PNG's pixels."""
    import base64
    import io

    from matplotlib.figure import Figure
    from PIL import Image

    from coursekit import figures

    fig = Figure(figsize=figures.size(2), dpi=figures.DPI)
    ax = fig.add_subplot()
    ax.set_title("title", fontsize=12)
    ax.tick_params(labelsize=7.5)
    ax.text(0.5, 0.5, "", fontsize=4)
    ax.text(0.5, 0.5, "hidden", fontsize=4, visible=False)
    figures.png(fig)  # drawn: its ticks labelled
    assert figures.smallest_text(fig) == 7.5
    ax.text(0.5, 0.5, "smaller", fontsize=6)
    with Image.open(io.BytesIO(base64.b64decode(figures.png(fig)))) as png:
        png.load()  # reads every chunk, checking their CRCs
        assert float(png.text[figures.TEXT_KEY]) == pytest.approx(6 * figures.DPI / 72, abs=0.01)
