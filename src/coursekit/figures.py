"""The book's figures: one style, sized to be read on a phone.

A figure is shown at most as wide as the page's text column: 745 px on a laptop, 343 px on a 390 px phone
(tests/layout_probe.html measures it). Shrunk to the phone's column, text of ``s`` points in a figure ``w`` inches wide
reads ``s * 343 / (72 * w)`` px high, whatever its dpi: the style draws figures ``WIDTH`` inches wide with text of
8 points and up (tick labels 9, axis labels 9.5, titles 10), 9.5 px and up on that phone, 12 px and up on a laptop.
Two panels side by side at that width would be too narrow to read: pages stack them (``plt.subplots(2, 1, ...)``).

``setup()`` (each page's first cell) sets the style and has IPython show each figure as a PNG that carries its
smallest text's height in its own pixels under the key ``TEXT_KEY``: tests/test_site.py reads it and, with the width
the browser shows the figure at, checks that no text of any figure reads under 9 px at 390 or 1366 px.
"""
from __future__ import annotations

import base64
import struct
import zlib

WIDTH = 4.0  # inches: every figure's width
DPI = 110  # pixels per inch: a figure is WIDTH * DPI = 440 px wide, shown at that size where the column allows
TEXT_KEY = "Smallest text (px)"  # the PNG's tEXt entry: its smallest text's height, in the PNG's pixels

STYLE = {
    "figure.dpi": DPI,
    "figure.figsize": (WIDTH, 2.8),
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9.5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "figure.titlesize": 10.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def size(height: float) -> tuple[float, float]:
    """The size of a figure ``height`` inches high, the book's width: ``plt.subplots(figsize=figures.size(2.8))``."""
    return (WIDTH, height)


def setup() -> None:
    """Use the book's style, and show figures as ``png`` makes them (in a notebook; elsewhere only the style)."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    # Making a figure loads the inline backend, which registers IPython's own PNG maker for figures: ours replaces it.
    plt.close(plt.figure())
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(Figure, png)


def smallest_text(fig) -> float:
    """The size in points of the smallest text ``fig`` holds (tick labels, titles, legends, annotations): each visible
    text that is not empty, the labels of ticks outside the axes' limits too, which are not drawn (they take their
    axis's size: they could only make the figure's smallest text smaller). inf if it has none."""
    from matplotlib.text import Text

    texts = fig.findobj(lambda a: isinstance(a, Text) and a.get_visible() and a.get_text().strip())
    return min((t.get_fontsize() for t in texts), default=float("inf"))


def png(fig):
    """``fig`` as IPython shows it, a PNG, with its smallest text's height in its own pixels written in it
    (``TEXT_KEY``), read once the figure is drawn and its ticks labelled."""
    from IPython.core.pylabtools import print_figure

    data = print_figure(fig, "png")
    if data is None:  # a figure with nothing in it: IPython shows nothing
        return None
    entry = TEXT_KEY.encode("latin-1") + b"\0" + f"{smallest_text(fig) * fig.dpi / 72:.2f}".encode("latin-1")
    chunk = struct.pack(">I", len(entry)) + b"tEXt" + entry + struct.pack(">I", zlib.crc32(b"tEXt" + entry))
    return base64.b64encode(data[:-12] + chunk + data[-12:]).decode("ascii")  # before IEND, the last 12 bytes
