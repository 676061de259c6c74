"""Small display helpers for the book and the notebooks: how a text falls into tokens, drawn as HTML."""
from __future__ import annotations

import html

_COLOURS = ["#cfe8ff", "#ffe0b3", "#d7f5d0", "#f9d0e4", "#e6dcff"]


def tokens_html(pieces: list[str] | list[bytes], ids: list[int] | None = None, unit: str = "tokens"):
    """Show each piece on its own coloured background, with spaces and newlines made visible.

    Pass ``ids`` to show each token's id when the mouse rests on it. Bytes that are not whole UTF-8
    characters are shown as escapes such as ``\\xf0``. ``unit``: what the count under the strip calls the pieces
    ("pieces" for a pre-split text, which is not tokens yet).
    """
    from IPython.display import HTML

    spans = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, bytes):
            piece = piece.decode("utf-8", errors="backslashreplace")
        shown = html.escape(piece).replace(" ", "&middot;").replace("\n", "&crarr;<br>").replace("\t", "&rarr;")
        title = f' title="id {ids[i]}"' if ids is not None else ""
        spans.append(f'<span style="background:{_COLOURS[i % len(_COLOURS)]};padding:1px 0;'
                     f'border-radius:3px"{title}>{shown}</span>')
    # A dot replaces each space, so the line has no break of its own: <wbr> lets it wrap between tokens, and
    # overflow-wrap inside a token longer than the line.
    return HTML('<div class="token-strip" style="font-family:monospace;line-height:1.9;white-space:pre-wrap;overflow-wrap:anywhere">'
                + "<wbr>".join(spans) + f'</div><div style="font-size:85%;color:#555">{len(pieces)} {html.escape(unit)}</div>')
