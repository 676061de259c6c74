"""What people read is inert (autograder/inert.py): learner text reaches an HTML page only as clean markup, a terminal
only with its control characters shown as text, a CSV file only formula-safe.

Pages are checked here the way the pages are made: nbconvert's markdown renderer (what nbgrader's templates call) and
the whole notebook through nbgrader's own feedback and formgrader templates, read back by an HTML parser that lists
whatever could run. Each payload is first shown to be live in the page nbgrader makes without the grader's help, so a
payload the check cannot see does not pass for a blocked one. A real browser and a real terminal do the same in
tests/test_inert_live.py.
"""
from __future__ import annotations

import copy
import csv
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

from autograder import base, inert, reports, workspace

ROOT = Path(__file__).resolve().parents[1]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

# (name, a learner's markdown, seen live by this file's check in the page nbgrader makes of it as it is)
PAYLOADS = [
    ("svg onload", "<svg onload=alert(1)>", True),
    ("img onerror", "<img src=x onerror=alert(1)>", True),
    ("javascript: link in HTML", '<a href="javascript:alert(1)">click</a>', True),
    ("iframe srcdoc", '<iframe srcdoc="<script>alert(1)</script>"></iframe>', True),
    ("script", "<script>alert(1)</script>", True),
    ("style element", "<style>body{background:url(javascript:alert(1))}</style>", True),
    ("style attribute", '<div style="width:expression(alert(1));background:url(javascript:alert(1))">x</div>', True),
    ("data: link", '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">x</a>', True),
    ("data: svg picture", '<img src="data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+">', True),
    ("markdown javascript: link", "[x](javascript:alert(1))", True),
    ("markdown javascript: link, mixed case", "[x](JaVaScRiPt:alert(1))", True),
    ("markdown javascript: picture", "![x](javascript:alert(1))", True),
    ("markdown reference link", "[x][1]\n\n[1]: javascript:alert(1)", True),
    ("markdown autolink", "<javascript:alert(1)>", True),
    ("markdown data: link", "[x](data:text/html,<script>alert(1)</script>)", True),
    ("HTML split across lines", "<img\nsrc=x\nonerror=\"alert(1)\">", True),
    ("javascript: split by a tab", '<a href="java&#9;script:alert(1)">x</a>', True),
    ("javascript: as entities", '<a href="&#106;&#97;vascript:alert(1)">x</a>', True),
    ("object", '<object data="javascript:alert(1)"></object>', True),
    ("embed", '<embed src="javascript:alert(1)">', True),
    ("form", '<form action="javascript:alert(1)"><button>go</button></form>', True),
    ("input autofocus", "<input autofocus onfocus=alert(1)>", True),
    ("details ontoggle", "<details open ontoggle=alert(1)><summary>s</summary></details>", True),
    ("svg script", "<svg><script>alert(1)</script></svg>", True),
    ("svg animate", '<svg><a><animate attributeName="href" values="javascript:alert(1)"/><text>x</text></a></svg>',
     True),
    ("math mxss", "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>", True),
    ("noscript mxss", '<noscript><p title="</noscript><img src=x onerror=alert(1)>">', True),
    # a browser ends the comment at "<!-->" and runs the picture's handler; Python's parser reads on to "-->" and
    # misses it (tests/test_inert_live.py shows chromium running it)
    ("comment trick", "<!--><img src=x onerror=alert(1)>-->", False),
    ("base", '<base href="javascript:/">', True),
    ("meta refresh", '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">', True),
    ("link stylesheet", '<link rel="stylesheet" href="javascript:alert(1)">', True),
    ("remote picture", '<img src="https://tracker.example/pixel.png">', True),
    ("entities of a script", "&lt;script&gt;alert(1)&lt;/script&gt;", False),
    ("numeric entities of a tag", "&#60;img src=x onerror=alert(1)&#62;", False),
    ("tag in math", "$<img src=x onerror=alert(1)>$", False),
    ("tag in a code span", "`<img src=x onerror=alert(1)>`", False),
]

ORDINARY = """\
# A heading

Some *emphasis*, **strong** text, a code span `a < b and x<y`, a [link](https://example.org "its title"),
a [link to the heading](#A-heading), inline math $x^2 < y_{<t}$ and a picture ![a dot](attachment:dot.png).

$$
\\sum_t \\log p(x_t \\mid x_{<t})
$$

1. one
2. two

- item with `code`
- ~~struck~~

| left | right |
|:-----|------:|
| 1    | 2     |

```python
def f(a, b):

    return a < b
```

> a quote
"""

SAFE_TAGS = {"div", "p", "span", "a", "em", "strong", "b", "i", "u", "s", "del", "ins", "code", "pre", "kbd", "samp",
             "var", "sub", "sup", "small", "mark", "br", "hr", "img", "ul", "ol", "li", "dl", "dt", "dd", "blockquote",
             "q", "cite", "abbr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tfoot", "tr", "th",
             "td", "caption", "details", "summary",
             "body", "main"}  # (the last two: nbconvert's classic template opens them again inside nbgrader's)
URL_ATTRIBUTES = {"href", "src", "cite", "action", "formaction", "data", "background", "poster", "xlink:href"}
ATTACHED_PICTURE = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/]+=*")


class LiveParts(HTMLParser):
    """What in a piece of HTML could run, load or take over the page: tags beyond plain markup, event handlers,
    styles, addresses other than http(s), mailto, the page's own and attached pictures."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in SAFE_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = value or ""
            if name.startswith("on") or name in {"srcdoc", "formaction", "action", "xmlns"}:
                self.found.append(f"<{tag} {name}>")
            elif name == "style" and not re.fullmatch(r"text-align:\s*\w+;?", value.strip()):
                self.found.append(f"<{tag} style={value!r}>")
            elif name in URL_ATTRIBUTES:
                scheme = re.sub(r"[\t\n\r]", "", value).strip("".join(map(chr, range(0x21)))).lower()
                if tag == "img" and name == "src":
                    if not ATTACHED_PICTURE.fullmatch(value):
                        self.found.append(f"<img src={value[:40]!r}>")
                elif re.match(r"[a-z][a-z0-9+.-]*:", scheme) and not scheme.startswith(("http:", "https:", "mailto:")):
                    self.found.append(f"<{tag} {name}={value[:40]!r}>")


def live_parts(html: str) -> list[str]:
    parser = LiveParts()
    parser.feed(html)
    parser.close()
    return parser.found


def page(markdown: str, attachments: dict | None = None) -> str:
    """A markdown cell's HTML as nbgrader's formgrader and feedback templates make it (``markdown2html``)."""
    return MarkdownWithMath(renderer=IPythonRenderer(escape=False, attachments=attachments or {})).render(markdown)


def text(html: str) -> str:
    return BeautifulSoup(html, "html.parser").get_text()


def elements(html: str) -> list[tuple[str, dict]]:
    return [(el.name, {k: " ".join(v) if isinstance(v, list) else v for k, v in el.attrs.items()})
            for el in BeautifulSoup(html, "html.parser").find_all(True)]


# ---------------------------------------------------------------------------------------------------
# HTML


@pytest.mark.parametrize("name, payload, live", PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_each_payload_is_inert_in_the_page(name, payload, live):
    for source in (payload, f"Before.\n\n{payload}\n\nAfter, **bold**."):
        if live:
            assert live_parts(page(source)), f"{name}: the check should see this payload live in nbgrader's page"
        stored = inert.markdown(source)
        assert live_parts(page(stored)) == [], f"{name}: {page(stored)}"


def test_text_that_spells_markup_stays_text():
    for payload, shown in [("&lt;script&gt;alert(1)&lt;/script&gt;", "<script>alert(1)</script>"),
                           ("`<img src=x onerror=alert(1)>`", "<img src=x onerror=alert(1)>"),
                           ("$a<b$", "$a<b$")]:
        assert text(page(inert.markdown(payload))).strip() == shown


def test_ordinary_markdown_renders_as_before():
    attachments = {"dot.png": {"image/png": PNG}}
    before = page(ORDINARY, attachments)
    stored = inert.markdown(ORDINARY, attachments)
    after = page(stored)
    assert live_parts(after) == []
    assert text(after) == text(before)
    assert "$x^2 < y_{<t}$" in text(after) and "a code span a < b and x<y" in text(after)
    got = elements(after)
    assert got[0] == ("div", {}), "the cell's HTML is one block"
    assert [tag for tag, _ in got[1:]] == [tag for tag, _ in elements(before)]
    assert ("h1", {"id": "md-A-heading"}) in got, "a heading keeps its id, prefixed"
    assert ("a", {"href": "#md-A-heading", "rel": "noopener noreferrer"}) in got, "a link to it follows"
    assert ("a", {"href": "https://example.org", "title": "its title", "rel": "noopener noreferrer"}) in got
    assert ("img", {"src": f"data:image/png;base64,{PNG}", "alt": "a dot"}) in got, "an attached picture stays"
    assert ("th", {"style": "text-align:left"}) in got, "a column keeps its alignment"
    assert any(tag == "span" and attrs.get("class") == "k" for tag, attrs in got), "code keeps its highlighting"
    assert "\n" not in stored


def test_the_page_shows_the_stored_html_as_it_is_and_cleaning_twice_changes_nothing():
    for source in [ORDINARY] + [payload for _, payload, _ in PAYLOADS]:
        stored = inert.markdown(source, {"dot.png": {"image/png": PNG}})
        assert page(stored).strip() == stored, "a markdown renderer passes the cell's HTML on untouched"
        assert inert.markdown(stored) == stored


def test_a_lone_surrogate_or_a_title_that_starts_like_an_address_is_no_trouble():
    assert text(page(inert.markdown("odd \ud800 text"))).strip() == "odd \ufffd text"
    assert inert.clean_html('<abbr title="data: the numbers">d</abbr>') == '<abbr title="data: the numbers">d</abbr>'


def test_a_missing_or_unsafe_attachment_shows_its_alt_text():
    svg = {"x.svg": {"image/svg+xml": "PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"}}
    assert elements(page(inert.markdown("![gone](attachment:gone.png)")))[-1] == ("img", {"alt": "gone"})
    assert elements(page(inert.markdown("![vector](attachment:x.svg)", svg)))[-1] == ("img", {"alt": "vector"})


def test_the_courses_own_markdown_renders_the_same():
    """Every markdown cell of the course's chapters: the same elements, attributes and text (ids prefixed, links
    marked rel=noopener), in one block."""
    cells = [cell for path in sorted((ROOT / "solutions").glob("*/*.ipynb"))
             for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"]
    assert len(cells) > 50
    for cell in cells:
        before, after = page(cell.source), page(inert.markdown(cell.source))
        assert text(after) == text(before), cell.source[:200]
        unprefixed = [(tag, {k: v.replace("md-", "", 1) if k in ("id", "href") else v
                             for k, v in attrs.items() if k != "rel"}) for tag, attrs in elements(after)[1:]]
        assert unprefixed == elements(before), cell.source[:200]


def hostile_notebook() -> nbformat.NotebookNode:
    """A graded notebook in which a learner wrote markup everywhere a page shows something of theirs."""
    nb = nbformat.v4.new_notebook()
    md = nbformat.v4.new_markdown_cell("## My answer\n\nPlain words.\n\n" + "\n\n".join(p for _, p, _ in PAYLOADS))
    md.metadata["tags"] = ['"><img src=x onerror=alert(1)>']
    code = nbformat.v4.new_code_cell('print("<script>alert(1)</script>")')
    code.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": 1,
                                 "grade_id": "test_ok", "schema_version": 3, "score": 0}
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="<script>alert(1)</script>\x1b[31mred\x1b[0m"),
        nbformat.v4.new_output("execute_result", data={"text/plain": "<img src=x onerror=alert(1)>"},
                               execution_count=1),
        nbformat.v4.new_output("error", ename="Error", evalue="<svg onload=alert(1)>",
                               traceback=["\x1b[31m<svg onload=alert(1)>\x1b[0m", "\x1b]0;title\x07<b>x</b>"]),
    ]
    forged = nbformat.v4.new_code_cell("x = 1")
    forged.metadata["nbgrader"] = {"grade": True, "solution": True, "locked": False, "points": 1,
                                   "grade_id": "<img src=x onerror=alert(1)>", "schema_version": 3, "score": 0}
    raw = nbformat.v4.new_raw_cell('<div class="navbar-fixed-top" id="statusmessage">13 / 13</div><script>1</script>')
    nb.cells = [md, code, forged, raw]
    return nb


def nbgrader_page(nb: nbformat.NotebookNode, template: str) -> str:
    """The notebook part of the page nbgrader's feedback (``generate_feedback``) or formgrader template makes."""
    import nbgrader
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    formgrader = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    c = Config()  # as nbgrader's GenerateFeedback sets it up
    c.HTMLExporter.template_name = template
    c.HTMLExporter.extra_template_basedirs = [str(formgrader / "templates")]
    c.HTMLExporter.extra_template_paths = [str(formgrader / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    resources = {"nbgrader": {"notebook": "nb", "score": 0, "max_score": 1, "late_penalty": 0},
                 "base_url": "", "notebook_id": "nb", "assignment_id": "a", "submission_id": "s", "index": 0,
                 "total": 1, "student": "ada", "notebook_path": "nb.ipynb"}
    html, _ = HTMLExporter(config=c).from_notebook_node(nb, resources=resources)
    container = BeautifulSoup(html, "html.parser").find(id="notebook-container")
    assert container is not None, "nbgrader's template should hold the notebook in #notebook-container"
    return str(container)


def blank(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with nothing of the learner's: what is live in its page is the template's own (score fields)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.source = ""
        if cell.cell_type == "code":
            cell.outputs = []
    return nb


@pytest.mark.parametrize("template", ["feedback", "formgrade"])
def test_nothing_of_the_learner_runs_in_nbgraders_pages(template):
    nb = hostile_notebook()
    template_parts = live_parts(nbgrader_page(blank(nb), template))
    assert live_parts(nbgrader_page(nb, template)) != template_parts, "the check should see the learner's parts live"
    shown = nbgrader_page(inert.notebook(nb), template)
    assert live_parts(shown) == live_parts(nbgrader_page(blank(inert.notebook(nb)), template))
    assert "Plain words." in text(shown) and "<script>alert(1)</script>" in text(shown), "outputs stay as text"
    assert "navbar-fixed-top" not in shown and 'id="statusmessage"' not in shown, "no class or id of the page"


def test_the_learners_view_is_inert_too():
    nb = reports.feedback_notebook(hostile_notebook())
    assert live_parts(nbgrader_page(nb, "feedback")) == []
    assert inert.notebook(nb) == nb, "an inert notebook is made inert unchanged"


def test_a_cell_id_that_is_not_nbformats_is_replaced_so_that_the_page_can_be_made():
    nb = hostile_notebook()
    nb.cells[0].id = 'x" onmouseover="alert(1)'
    with pytest.raises(nbformat.ValidationError):
        nbgrader_page(nb, "feedback")
    shown = inert.notebook(nb)
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", shown.cells[0].id)
    assert [c.id for c in shown.cells[1:]] == [c.id for c in nb.cells[1:]]
    assert live_parts(nbgrader_page(shown, "feedback")) == []


def test_a_grade_id_that_is_not_text_in_a_page_leaves_its_cell():
    nb = inert.notebook(hostile_notebook())
    assert "nbgrader" not in nb.cells[2].metadata
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "test_ok"
    assert nb.cells[1].source == hostile_notebook().cells[1].source, "code is left as it is"


# ---------------------------------------------------------------------------------------------------
# Terminals


@pytest.mark.parametrize("raw, shown", [
    ("\x1bM", "\\x1bM"),  # reverse index: the cursor up a line
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # OSC 0: the window title, ended by BEL
    ("\x1b]52;c;MTMgLyAxMw==\x1b\\", "\\x1b]52;c;MTMgLyAxMw==\\x1b\\"),  # OSC 52: the clipboard, ended by ST
    ("\x1b[?1049h", "\\x1b[?1049h"),  # the other screen
    ("\x1b[2K\x1b[1A\x1b[10;1H", "\\x1b[2K\\x1b[1A\\x1b[10;1H"),  # CSI: clear the line, cursor moves
    ("\r13 / 13", "\\x0d13 / 13"),
    ("0\b\b13", "0\\x08\\x0813"),
    ("\x00\x07\t\x7f", "\\x00\\x07\\x09\\x7f"),
    ("\x9b2J\x9d0;t\x9c", "\\x9b2J\\x9d0;t\\x9c"),  # C1: CSI, OSC, ST in one byte each
    ("evil\u202egnp.exe", "evil\\u202egnp.exe"),  # bidi override
    ("\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d\u200e\u200f\u061c",
     "\\u2066\\u2067\\u2068\\u2069\\u202a\\u202b\\u202c\\u202d\\u200e\\u200f\\u061c"),
    ("\ud800", "\\ud800"),  # a lone surrogate, as JSON lets a notebook carry one: printing it would fail
])
def test_terminal_shows_each_control_as_text(raw, shown):
    assert inert.terminal(raw) == shown
    assert inert.terminal(shown) == shown


def test_terminal_keeps_newlines_and_ordinary_text():
    ordinary = "AssertionError: bpe_merge(b'abc') returned [b'ab']\n  Hint: naïve — 日本語 ✓ \\x1b"
    assert inert.terminal(ordinary) == ordinary


def hostile_result() -> base.Result:
    return base.Result(
        "ada\x1b]0;pwned\x07", "01-tokens", "graded", 0, 13,
        [base.LostPoints("test_a\x1b[2K", 0, 13, "AssertionError: no\x1bM\x1b[2K\rada  01-tokens  13 / 13")],
        cell_errors=["tokenizer: \x1b]52;c;cHduZWQ=\x07Error"], review=["\x1b[?1049hline 1: runs other programs"],
        log="/tmp/\u202elog")


def test_the_table_has_no_control_characters_and_its_columns_line_up():
    table = reports.format_table([hostile_result(), base.Result("bob", "01-tokens", "graded", 13, 13)])
    assert not inert.CONTROL.search(table.replace("\n", ""))
    lines = table.splitlines()
    assert lines[1].startswith("ada\\x1b]0;pwned\\x07  01-tokens  0 / 13")
    assert lines[-1].index("13 / 13") == lines[1].index("0 / 13")
    assert "test_a\\x1b[2K (0 / 13): AssertionError: no\\x1bM\\x1b[2K\\x0dada  01-tokens  13 / 13" in table


def test_warnings_show_controls_as_text(capsys):
    base.warn("ignored /class/\x1b[2Kbob: not a plain student id")
    assert capsys.readouterr().err == "minigpt-grade: ignored /class/\\x1b[2Kbob: not a plain student id\n"


# ---------------------------------------------------------------------------------------------------
# CSV


@pytest.mark.parametrize("value, kept", [
    ('=HYPERLINK("https://evil.example","13/13")&T("', "'=HYPERLINK(\"https://evil.example\",\"13/13\")&T(\""),
    ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
    ("-2+3", "'-2+3"),
    ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
    ("\t=1+1", "\\x09=1+1"),  # a control character is written out: the cell no longer starts with it
    ("\r=1+1", "\\x0d=1+1"),
    ("ok\x1b]0;owned\x07", "ok\\x1b]0;owned\\x07"),
    ("-", "'-"),
    ("-3", "-3"), ("+4.5", "+4.5"), ("13", "13"), ("1e3", "1e3"), (7, 7), (-1.5, -1.5), ("", ""),
    ("graded", "graded"), ("a=b", "a=b"),
])
def test_csv_cells(value, kept):
    assert inert.csv_cell(value) == kept


def test_grades_csv_holds_no_formula(tmp_path):
    r = base.Result("ada", "01-tokens", "graded", 0, 13, review=['=HYPERLINK("https://evil.example")&T(", line 1: '
                                                               "runs other programs: !ls"],
                     detail="-1+1", isolation="sandbox")
    ws = workspace.Workspace(tmp_path, tmp_path)
    reports.write_reports(ws, [r])
    rows = list(csv.reader(io.StringIO((tmp_path / "grades.csv").read_text())))
    row = dict(zip(rows[0], rows[1]))
    assert row["review"].startswith("'=HYPERLINK(") and row["detail"] == "'-1+1"
    assert row["score"] == "0" and row["max_score"] == "13"
    assert all(not cell.startswith(inert.FORMULA_START) for cell in rows[1])
