"""What people read is inert: learner text on its way to an HTML page, a terminal or a CSV file.

Everything a learner hands in is text the grader passes on to someone: markdown to the pages the instructor opens in
nbgrader's formgrader and the learner's feedback page, messages, grade ids and file names to the instructor's
terminal, review notes to the grade table a spreadsheet opens. One function per destination makes that text data
for its reader, never instructions:

- ``notebook(nb)``, for the pages nbgrader makes of a notebook. nbgrader's formgrader and feedback templates render a
  markdown cell with ``markdown2html`` and keep its raw HTML (no ``sanitize_html``), and nbconvert's renderer keeps
  ``javascript:`` links: a learner's ``<svg onload=...>`` or ``[x](javascript:...)`` runs in the instructor's
  Jupyter origin, with the instructor's rights. So each markdown cell is rendered here the way those templates
  render it (nbconvert's own renderer and math parser, pictures from the cell's attachments), and the HTML is
  cleaned with an allow-list sanitizer (``nh3``): plain markup, links to http, https and mailto, pictures only from
  the cell's own PNG, JPEG or GIF attachments (a page that fetches what a learner names would tell the learner when
  the instructor opens it), no script, event handler, style, form, frame, object or SVG. The clean HTML becomes the
  cell's source, on one line: a line that starts with ``<div>`` is one raw HTML block to a markdown renderer, which
  passes it on untouched, so the page shows exactly the cleaned HTML (a blank line would end the block, and the rest
  would be read as markdown again, where text the first rendering kept as text could turn into a link). Inline math
  stays text for MathJax (loaded by those templates in its Safe mode). Rendering first and cleaning the result,
  rather than escaping raw HTML in the markdown, means no guess about where markdown keeps a ``<`` as code and where
  it makes a tag: the sanitizer sees the very markup a browser would get. A cell already cleaned comes out the same.
  Rendering and cleaning are not linear in what a learner can write (nh3 takes the square of the depth of nested
  tags; nbconvert's markdown renderer reads 100 KB of brackets a second): a cell longer than ``RENDERED_CELL_MAX``, or
  past ``RENDERED_NOTEBOOK_MAX`` characters of one notebook, is shown as escaped text instead.
  The rest of what those templates show is escaped by nbconvert (code, outputs as text, tracebacks, cell ids and
  tags) or is numbers; the exception is a grade id, written into the page as is: one that is not plain text loses
  its nbgrader marks (nbgrader's OverwriteCells already drops grade ids that are not the instructor's).
- ``terminal(text)``: every control character but the newline, and the Unicode controls that reorder text, shown as
  ``\\x1b``-style text, so nothing a learner wrote moves the cursor, clears or rewrites a line, sets the window title
  or the clipboard, or switches screens: a row shows its true score.
  The same goes for logging (``terminal_logging``): a record no handler takes, which Python's last resort would
  write raw to standard error (a judge's ``log.exception`` with a learner's message in its traceback), and every
  warning are written escaped.
- ``csv_cell(value)``: a text cell that a spreadsheet would read as a formula (OWASP's CSV injection rule: it starts
  with ``= + - @``, a tab or a carriage return) gets a leading single quote; numbers stay numbers.
"""
from __future__ import annotations

import contextlib
import copy
from html import escape as escape_html
import logging
import re
import sys
import warnings

import nh3
import nbformat
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbformat.v4.nbbase import random_cell_id
from pygments.token import STANDARD_TYPES

# Ids of a learner's headings get this prefix (and links to them follow), so that none can take the id of an element
# of the page around it: the formgrader finds a cell's score field by the grade id.
ID_PREFIX = "md-"
ATTACHED_PICTURE = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/]+={0,2}")
PICTURE_TYPES = ("image/png", "image/jpeg", "image/gif")
# Elements whose content is not prose: dropped with it, so that a script or a frame's document does not surface as
# stray text.
DROPPED_WITH_CONTENT = {"script", "style", "iframe", "noscript", "template", "textarea", "title", "object", "embed",
                        "svg", "math", "select", "xmp", "noembed", "noframes", "plaintext"}
ATTRIBUTES = {
    **{tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()},
    "*": {"title", "lang"},
    **{f"h{level}": {"id"} for level in range(1, 7)},
    "th": nh3.ALLOWED_ATTRIBUTES.get("th", set()) | {"style"},  # a table column's alignment, and nothing else
    "td": nh3.ALLOWED_ATTRIBUTES.get("td", set()) | {"style"},
}
# The classes nbconvert's renderer gives: a heading's anchor link, highlighted code (pygments).
CLASSES = {"a": {"anchor-link"}, "div": {"highlight"}, "span": set(STANDARD_TYPES.values()) - {""}}
GRADE_ID_IN_PAGE = re.compile(r"[^<>&\"']+")
CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # nbformat 4.5's schema
URL_ATTRIBUTES = {"href", "src", "cite"}  # those of the allowed elements
C0_AND_SPACE = "".join(map(chr, range(0x21)))
SURROGATE = re.compile("[\ud800-\udfff]")  # JSON lets a notebook carry a lone one; UTF-8 (and nh3) cannot
# C0 (the newline aside), DEL, C1, lone surrogates (a terminal cannot even be sent them) and the characters that
# reorder what is shown (bidi embeddings, overrides, isolates and marks)
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
# Characters of markdown and raw cells rendered and cleaned: per cell (the course's longest is 2,537) and per notebook
# (the course's longest notebook has 12,249). What is past them is shown as escaped text.
RENDERED_CELL_MAX = 20_000
RENDERED_NOTEBOOK_MAX = 200_000
AS_TEXT = re.compile(r"<div><p><em>\(\d[\d,]* characters, shown as written\)</em></p><pre>[^<>]*</pre></div>")


# ---------------------------------------------------------------------------------------------------
# HTML pages


def notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of the notebook that nbgrader's formgrader and feedback pages show as text and markup only: every
    markdown cell's source replaced by its cleaned HTML (see ``markdown``), every raw cell's source cleaned, and
    grade ids that would not be text in those pages taken off their cell. A cell id that is not nbformat's (nbconvert
    refuses to make a page of the notebook then) is replaced by a new one. Cells past ``RENDERED_CELL_MAX`` or
    ``RENDERED_NOTEBOOK_MAX`` are shown as escaped text (``as_text``)."""
    nb = copy.deepcopy(nb)
    budget = RENDERED_NOTEBOOK_MAX
    for cell in nb.cells:
        if "id" in cell and not (isinstance(cell.id, str) and CELL_ID.fullmatch(cell.id)):
            cell.id = random_cell_id()
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and not GRADE_ID_IN_PAGE.fullmatch(str(grade_id)):
            del cell.metadata["nbgrader"]
        if cell.cell_type not in ("markdown", "raw"):
            continue
        attachments = cell.pop("attachments", None)
        if AS_TEXT.fullmatch(cell.source):  # (made inert already: a cell of the autograded notebook)
            continue
        if len(cell.source) > min(budget, RENDERED_CELL_MAX):
            cell.source = as_text(cell.source)
        else:
            budget -= len(cell.source)
            cell.source = markdown(cell.source, attachments) if cell.cell_type == "markdown" else \
                clean_html(cell.source)
    return nb


def as_text(source: str) -> str:
    """A cell's source as escaped text on one line of HTML (which markdown renderers pass on as it is), said to be
    shown unrendered."""
    text = escape_html(SURROGATE.sub("\ufffd", source)).replace("\n", "&#10;")
    return f"<div><p><em>({len(source):,} characters, shown as written)</em></p><pre>{text}</pre></div>"


def markdown(source: str, attachments: dict | None = None) -> str:
    """A markdown cell's source as clean HTML on one line, which markdown renderers pass on as it is."""
    if not source.strip():
        return source
    rendered = MarkdownWithMath(renderer=_Renderer(attachments or {})).render(source)
    html = clean_html(rendered).strip().replace("\n", "&#10;")
    return html if html.startswith("<div>") else f"<div>{html}</div>"


def clean_html(html: str) -> str:
    """HTML with only the allow-listed elements, attributes, classes and addresses left."""
    return nh3.clean(SURROGATE.sub("\ufffd", html), attributes=ATTRIBUTES, allowed_classes=CLASSES,
                     clean_content_tags=DROPPED_WITH_CONTENT, url_schemes={"http", "https", "mailto", "data"},
                     attribute_filter=_attribute, filter_style_properties={"text-align"}, id_prefix=ID_PREFIX)


def _attribute(tag: str, name: str, value: str) -> str | None:
    """The last word on an attribute nh3 allowed: a data: address only as an attached picture, a picture only from
    the cell, a link within the cell to a heading's prefixed id."""
    if tag == "img" and name == "src":
        return value if ATTACHED_PICTURE.fullmatch(value) else None
    # how a browser reads an address's scheme: outer spaces and controls dropped, tabs and newlines anywhere
    scheme = re.sub(r"[\t\n\r]", "", value).strip(C0_AND_SPACE).split(":", 1)[0].lower()
    if name in URL_ATTRIBUTES and scheme == "data":
        return None
    if name == "href" and value.startswith("#") and not value.startswith("#" + ID_PREFIX):
        return f"#{ID_PREFIX}{value[1:]}"
    return value


class _Renderer(IPythonRenderer):
    """nbconvert's markdown renderer as nbgrader's templates use it, with a picture taken from the cell's attachments
    only as PNG, JPEG or GIF, and a missing one left out (nbconvert stops the whole page for it)."""

    def __init__(self, attachments: dict):
        super().__init__(escape=False)
        self.cell_attachments = attachments

    def image(self, text: str, url: str, title: str | None = None) -> str:
        if url.startswith("attachment:"):
            bundle = self.cell_attachments.get(url[len("attachment:"):])
            bundle = bundle if isinstance(bundle, dict) else {}
            kind = next((t for t in PICTURE_TYPES if t in bundle), None)
            data = "".join(bundle[kind]) if kind and isinstance(bundle[kind], list) else bundle.get(kind)
            url = f"data:{kind};base64,{''.join(data.split())}" if isinstance(data, str) else ""
        return super().image(text, url, title)


# ---------------------------------------------------------------------------------------------------
# Terminals


def terminal(text: str) -> str:
    """``text`` with every control character but the newline written out as ``\\x1b``, ``\\x0d``, ``\\u202e``..."""
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


class TerminalHandler(logging.Handler):
    """Writes each record, its traceback included, to the standard error of the moment, escaped as ``terminal``
    escapes: a log line can quote a learner's text (an exception's message, a value)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(terminal(self.format(record)) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 (as logging's own handlers do)
            self.handleError(record)


@contextlib.contextmanager
def terminal_logging():
    """Within it, this process's log records that no handler takes (Python's last resort writes them raw to standard
    error) and its warnings go through a ``TerminalHandler``; the logging and warnings of before come back after."""
    last_resort, show = logging.lastResort, warnings.showwarning
    logging.lastResort = TerminalHandler(logging.WARNING)

    def show_warning(message, category, filename, lineno, file=None, line=None):
        logging.lastResort.handle(logging.makeLogRecord({
            "msg": warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"),
            "levelno": logging.WARNING, "levelname": "WARNING"}))

    warnings.showwarning = show_warning
    try:
        yield
    finally:
        logging.lastResort, warnings.showwarning = last_resort, show


# ---------------------------------------------------------------------------------------------------
# CSV


def csv_cell(value):
    """A value for a CSV cell that no spreadsheet runs as a formula and no terminal that shows the file obeys: control
    characters written out as for ``terminal``, then a quote before a text that starts like a formula."""
    if not isinstance(value, str):
        return value
    value = terminal(value)
    if value.startswith(FORMULA_START) and not NUMBER.fullmatch(value):
        return "'" + value
    return value
