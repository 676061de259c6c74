"""The built book, as a browser shows it.

Builds the book once per session with the Makefile's command (``-W``: any warning fails the build), serves
``_build/html`` on 127.0.0.1 and renders pages in headless Debian ``chromium``, which is told that every
other host does not exist. So a formula that comes out typeset proves MathJax is served from the book
itself, not from a CDN.

The build here is the Makefile's, with its pages executed once per session by ``pages_run`` (on torch's portable
kernels, one thread, the pages' clocks off: every cell runs and every claim about numbers is asserted, timing loops
take one round and no claim about time is asserted; ``make course`` runs them on the machine's own kernels and
measures and asserts time), which tests/test_kernel_paths.py shares: the build takes every page from that run's
jupyter-cache and executes none itself. It goes to a folder of its own and leaves the course's ``_build`` alone.

The student release's website (``make student-release``) is tested here too, after the book: its pages run the same
code, and its build reuses the pages' executed notebooks (``pages_run``'s jupyter-cache) instead of running them
all again. In one file, the two builds never run at once (pytest-xdist ``--dist loadfile``).
"""
import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

import pages_run
from coursekit import clocks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
CHAPTERS = [
    entry["file"] for part in TOC["parts"] if part["caption"] == "Chapters" for entry in part["chapters"]
]
CHROMIUM_INSTALL = "apt-get update && apt-get install -y chromium"


def build_command(output: Path, config: Path | None = None) -> list[str]:
    """The Makefile's ``make course`` command, its build in ``output``/_build (``config``: another _config.yml)."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    return [str(jupyter_book), "build", "--all", "-W", "--keep-going", *(["--config", str(config)] if config else []),
            "--path-output", str(output), "."]


@pytest.fixture(scope="session")
def page_cache(tmp_path_factory) -> Path:
    """The jupyter-cache of every chapter page executed (``pages_run``), shared with tests/test_kernel_paths.py."""
    shared = pages_run.shared_folder(tmp_path_factory)
    # from the last page: the other worker, in tests/test_kernel_paths.py, takes them from the first
    failures = [why for page in reversed(pages_run.PAGES) if (why := pages_run.run_page(page, shared))]
    if failures:
        pytest.fail("the book cannot be built: pages failed (tests/test_kernel_paths.py names them too):\n"
                    + "\n\n".join(failures), pytrace=False)
    return pages_run.cache_folder(shared)


@pytest.fixture(scope="session")
def built(tmp_path_factory, page_cache) -> Path:
    """The folder of the book's build (its ``html``), every page's outputs from ``page_cache``."""
    output = tmp_path_factory.mktemp("book")
    config = output / "_config.yml"
    sphinx = {**CONFIG["sphinx"], "local_extensions": {  # resolved against the config file's folder: this one's
        name: str(ROOT / path) for name, path in CONFIG["sphinx"]["local_extensions"].items()}}
    config.write_text(yaml.safe_dump({**CONFIG, "sphinx": sphinx,
                                      "execute": {**CONFIG["execute"], "cache": str(page_cache)}}))
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(ROOT / "src" / "coursekit" / "data" / "tiktoken"),
               HF_HUB_OFFLINE="1", **{clocks.ENV: "off"})
    records = pages_run.cached_pages(page_cache.parent)
    result = subprocess.run(
        build_command(output, config), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0:
        pytest.fail(f"book build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}", pytrace=False)
    # a page whose cells the cache did not match would have been executed again, and cached: none was
    assert pages_run.cached_pages(page_cache.parent) == records == len(pages_run.PAGES)
    return output / "_build"


@pytest.fixture(scope="session")
def site(built) -> Path:
    return built / "html"


@pytest.fixture(scope="session")
def base_url(site):
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        # "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        line = server.stdout.readline()
        port = re.search(r"port (\d+)", line)
        assert port, f"http.server did not start: {line!r}"
        yield f"http://127.0.0.1:{port.group(1)}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(f"Debian chromium is needed for the site tests; install it with: {CHROMIUM_INSTALL}")
    return path


@pytest.fixture(scope="session")
def browse(chromium, base_url):
    """browse(page, *flags) -> chromium's stdout for book page ``page`` (a docname such as book/01-tokens);
    ``query`` is added to its URL, ``window`` and ``budget`` (ms of virtual time for scripts) may be changed."""

    def run(page: str, *flags: str, query: str = "", window: str = "1280,2000", budget: int = 10000,
            timeout: int = 120) -> str:
        with tempfile.TemporaryDirectory() as profile:
            result = subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    # Every host but the local server is unknown: the page cannot reach a CDN.
                    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                    f"--user-data-dir={profile}",
                    f"--virtual-time-budget={budget}",
                    f"--window-size={window}",
                    *flags,
                    f"{base_url}/{page}.html" + (f"?{query}" if query else ""),
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run


@pytest.fixture(scope="session")
def dom(layouts):
    """dom(page) -> the page's DOM after scripts ran (at a laptop's width: ``layouts``), parsed."""
    cache = {}

    def get(page: str) -> "Dom":
        if page not in cache:
            cache[page] = Dom(layouts[page]["dom"])
        return cache[page]

    return get


class Dom(HTMLParser):
    """Tags with their attributes, and the text of <title> and <h1>."""

    def __init__(self, html: str):
        super().__init__()
        self.html = html
        self.tags: list[tuple[str, dict]] = []
        self.text = {"title": "", "h1": ""}
        self._open: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag in self.text:
            self._open.append(tag)

    def handle_endtag(self, tag):
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_data(self, data):
        for tag in self._open:
            self.text[tag] += data

    def find(self, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())]


def expected_binder_url(exercise: str) -> str:
    """The exercise's Binder URL, from the settings in _config.yml the launch buttons use."""
    binderhub = CONFIG["launch_buttons"]["binderhub_url"].rstrip("/")
    org, repo = urlparse(CONFIG["repository"]["url"]).path.strip("/").split("/")[:2]
    branch = CONFIG["repository"]["branch"]
    notebook = f"notebooks/{exercise}/{exercise}.ipynb"
    return f"{binderhub}/v2/gh/{org}/{repo}/{branch}?urlpath=lab/tree/{notebook}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_page_has_book_and_chapter_titles(dom, page):
    page_dom = dom(page)
    assert CONFIG["title"] in page_dom.text["title"]
    assert page_dom.text["h1"].strip(), f"{page} has no <h1>"


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_math_is_typeset_offline(site, dom, page):
    static = (site / f"{page}.html").read_text(encoding="utf-8")
    scripts = [src for src in re.findall(r'<script[^>]*src="([^"]+)"', static) if "mathjax" in src.lower()]
    assert scripts and all(not urlparse(src).scheme for src in scripts), f"MathJax not loaded locally: {scripts}"
    formulas = len(re.findall(r'class="math notranslate', static))
    page_dom = dom(page)
    typeset = page_dom.html.count("<mjx-container")
    assert typeset >= formulas, f"{page}: {formulas} formulas, {typeset} typeset by MathJax"
    assert "<mjx-merror" not in page_dom.html, f"{page}: MathJax reports a TeX error"


def test_no_page_shows_the_repr_of_an_object(site):
    """A cell whose last line returns an object (``fig.legend(...)``) prints ``<matplotlib.legend.Legend at 0x7f...>``
    under its figure: the reader sees Python's bookkeeping, not the page's."""
    shown = {}
    for page in ALL_PAGES:
        text = html.unescape(re.sub(r"<[^>]+>", "", (site / f"{page}.html").read_text(encoding="utf-8")))
        if found := re.findall(r"<[\w.]+(?: object)? at 0x[0-9a-f]+>", text):
            shown[page] = found
    assert shown == {}, shown


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_exercise_links_open_existing_notebooks(site, dom, page):
    for link in dom(page).find("a", "binder-exercise-link"):
        exercise = re.search(r"notebooks/([^/]+)/", link["href"]).group(1)
        assert link["href"] == expected_binder_url(exercise)
        assert (ROOT / "notebooks" / exercise / f"{exercise}.ipynb").is_file()
        assert (site / "notebooks" / exercise / f"{exercise}.html").is_file()


def test_chapter_1_title(dom):
    assert "token" in dom("book/01-tokens").text["h1"].lower()


def test_chapter_1_shows_a_plot_from_an_executed_cell(site, dom):
    images = [
        img["src"]
        for img in dom("book/01-tokens").find("img")
        if img["src"].startswith("../_images/") and img["src"].endswith(".png")
    ]
    assert images, "no plot image on the chapter 1 page"
    for src in images:
        assert (site / "book" / src).resolve().stat().st_size > 1000, src


def test_chapter_1_links_its_exercise_on_binder(dom):
    hrefs = [a["href"] for a in dom("book/01-tokens").find("a", "binder-exercise-link")]
    assert hrefs == [expected_binder_url("01-tokens")]
    assert hrefs[0].endswith("?urlpath=lab/tree/notebooks/01-tokens/01-tokens.ipynb")


def test_chapter_1_math_is_typeset(dom):
    assert "<mjx-container" in dom("book/01-tokens").html


def test_chapter_1_screenshot(browse, site):
    shot = site.parent / "screenshots" / "01-tokens.png"
    shot.parent.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    browse("book/01-tokens", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2000)


def launch_urlpaths(page_dom) -> list[str]:
    """The JupyterLab paths the page's Binder launch buttons open (the theme's top-bar buttons)."""
    return [unquote(a["href"].split("urlpath=", 1)[1]) for a in page_dom.find("a")
            if a.get("href", "").startswith(CONFIG["launch_buttons"]["binderhub_url"]) and "urlpath=" in a["href"]]


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_launch_button_opens_its_page_source(dom, page):
    """The top-bar button opens the page's own MyST file, which JupyterLab shows as a notebook (next test)."""
    assert f"lab/tree/{page}.md" in launch_urlpaths(dom(page)), launch_urlpaths(dom(page))
    assert (ROOT / f"{page}.md").is_file()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab of the suite's environment (what make env and Binder's postBuild make), serving the repository."""
    import urllib.request

    home = tmp_path_factory.mktemp("lab")
    # JupyterLab writes checkpoints beside what it opens: it serves a copy of the page, not the checkout.
    (home / "root" / "book").mkdir(parents=True)
    shutil.copy(ROOT / "book" / "01-tokens.md", home / "root" / "book")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    port = 20000 + (os.getpid() + 7) % 20000
    server = subprocess.Popen([str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", "--allow-root",
                               f"--port={port}", "--port-retries=0", "--ServerApp.token=t",
                               f"--ServerApp.root_dir={home / 'root'}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=t", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_jupyterlab_opens_a_chapter_page_as_a_notebook(chromium, lab, tmp_path):
    """Where the launch button goes: book/01-tokens.md opens as a notebook (jupytext's viewer, made the default by
    tools/lab_settings.py in make env and postBuild), with the page's code cells, not as text in the editor."""
    assert "python tools/lab_settings.py" in (ROOT / "postBuild").read_text()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "lab_settings.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000",
                             "--window-size=1366,900", "--dump-dom", f"{lab}/lab/tree/book/01-tokens.md?token=t"],
                            capture_output=True, text=True, timeout=180)
    page = Dom(result.stdout)
    assert page.find("div", "jp-NotebookPanel"), "book/01-tokens.md did not open as a notebook"
    assert not page.find("div", "jp-FileEditor"), "book/01-tokens.md opened in the text editor"
    code_cells = len(re.findall(r"^```\{code-cell\}", (ROOT / "book" / "01-tokens.md").read_text(), re.M))
    shown = len(page.find("div", "jp-CodeCell"))
    assert shown >= min(code_cells, 5), f"{shown} code cells shown of the page's {code_cells}"


ALL_PAGES = [TOC["root"]] + [entry["file"] for part in TOC["parts"] for entry in part["chapters"]]
LAYOUT_WIDTHS = (1366, 390)  # a laptop, a phone


@pytest.fixture(scope="session")
def layouts(browse, site) -> dict:
    """{page: {"widths": {width: [problem, ...]}, "dom": the page's HTML after its scripts ran}} of every page of the
    site, measured by tests/layout_probe.html, served beside the pages it measures (it reads them in frames of the
    same origin), in one chromium run: a browser each took 1 s of the 2.5 s a page costs."""
    shutil.copy(ROOT / "tests" / "layout_probe.html", site / "_layout_probe.html")
    out = browse("_layout_probe", "--dump-dom", query=f"pages={','.join(ALL_PAGES)}&widths="
                 f"{','.join(map(str, LAYOUT_WIDTHS))}", window=f"{max(LAYOUT_WIDTHS) + 40},3100",
                 budget=30000 * len(ALL_PAGES), timeout=60 + 30 * len(ALL_PAGES))
    return json.loads(html.unescape(re.search(r'<pre id="result">(.*?)</pre>', out, re.S)[1]))


@pytest.mark.parametrize("page", ALL_PAGES)
def test_nothing_is_cut_off_or_wider_than_the_text_column(layouts, page):
    """At a laptop's and a phone's width, every element fits the text column or scrolls inside a box of its own
    (wide tables and formulas), and no box cuts off its content."""
    found = layouts[page]
    assert "error" not in found, found
    problems = [f"at {width} px: {problem}" for width, listed in found["widths"].items() for problem in listed]
    assert not problems, f"{page}:\n" + "\n".join(problems)


SMALLEST_TEXT = 9  # px: the least a figure's text may read as a page shows it


def test_every_figure_fits_the_text_column_and_its_text_reads_9_px_or_more(layouts, site):
    """At a laptop's and a phone's width no figure is wider than the page's text column, and each figure's smallest
    text reads 9 px or more: its height in the PNG's own pixels (written in the PNG by coursekit.figures) times the
    width the browser shows the figure at over the PNG's width."""
    from PIL import Image

    from coursekit.figures import TEXT_KEY

    problems, seen = [], 0
    for page, found in layouts.items():
        for width, figures in found.get("figures", {}).items():
            for src, natural, shown in figures["shown"]:
                seen += 1
                name = f"{page}, figure {src.rsplit('/', 1)[-1][:10]}...,"
                if shown > figures["column"] + 0.5:
                    problems.append(f"{name} at {width} px: {shown} px wide in a {figures['column']} px column")
                with Image.open((site / page).parent / src) as png:
                    text = png.text.get(TEXT_KEY)
                if not natural:
                    problems.append(f"{name} at {width} px: the browser could not show it")
                elif text is None:
                    problems.append(f"{name} has no {TEXT_KEY!r}: a page that draws figures calls figures.setup()")
                elif float(text) * shown / natural < SMALLEST_TEXT:
                    problems.append(f"{name} at {width} px: its smallest text reads {float(text) * shown / natural:.1f}"
                                    f" px, under {SMALLEST_TEXT} (drawn {natural} px wide, shown {shown} px)")
    assert seen >= len(CHAPTERS) * len(LAYOUT_WIDTHS), f"only {seen} figures found on the site's pages"
    assert not problems, "\n".join(problems)


def test_the_student_release_website_opens_the_release_on_binder(page_cache, tmp_path):
    """``make student-release``'s whole command: the book built with the release's repository, every Binder link
    (the exercise boxes', the theme's buttons on notebook pages) opening a notebook the release has, and a clean
    scan, on a host the theme does not know (its buttons then link the repository GitHub's way). One build (50 s):
    on GitHub, the theme's own provider, the config differs only in the repository (the next test)."""
    from autograder.publish import student_release as sr

    url = "https://gitea.example-school.org/teach/minigpt-learners"
    out = tmp_path / "release"
    # build() raises if a link opens anything else (another repository, a file the release lacks); the scan finds
    # any text that points to the course's repository
    sr.build(out, ROOT, url, "main", execution_cache=page_cache)
    assert sr.scan(out) == []
    pages = list((out / "docs").rglob("*.html"))
    links = {link for page in pages for link in re.findall(r'href="(https://mybinder\.org/[^"]+)"', page.read_text())}
    chapters = sr.chapters(ROOT)
    assert links == {sr.binder_url(ROOT, url, "main", f"notebooks/{ch}/{ch}.ipynb") for ch in chapters}
    box = (out / "docs" / "book" / f"{chapters[0]}.html").read_text()
    assert "minigpt-grade" not in box and "hidden tests grade it" in box
    notebook = (out / "docs" / "notebooks" / chapters[0] / f"{chapters[0]}.html").read_text()
    assert f'href="{url}"' in notebook and f'href="{url}/issues' in notebook, "the repository and issues buttons"


@pytest.mark.parametrize("url", ["https://github.com/example-school/minigpt-learners",
                                 "https://gitlab.com/example-school/minigpt-learners",
                                 "https://gitea.example-school.org/teach/minigpt-learners"])
def test_the_student_release_book_config_names_its_repository(tmp_path, url):
    """The release's book config: its repository and branch, the course's execution cache, and a theme provider
    only for a host the theme does not know (GitHub's and GitLab's it reads from the address)."""
    from autograder.publish import student_release as sr

    config = sr.release_book_config(ROOT, tmp_path, url, "main")
    assert config["repository"]["url"] == url and config["repository"]["branch"] == "main"
    options = config["sphinx"]["config"].get("html_theme_options", {})
    assert options.get("repository_provider") == (None if "gitea" not in url else "github")
    link = sr.binder_url(ROOT, url, "main", "notebooks/01-tokens/01-tokens.ipynb")
    assert link.startswith(CONFIG["launch_buttons"]["binderhub_url"]) and link.endswith(
        "urlpath=lab/tree/notebooks/01-tokens/01-tokens.ipynb"), link
    assert ("/gh/example-school/minigpt-learners/main" in link) == ("github" in url), link
