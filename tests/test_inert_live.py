"""What people read is inert, where people read it: nbgrader's formgrader in a real Jupyter server and the feedback
page that `generate_feedback` makes, both in headless Debian Chromium (Selenium, Debian's chromedriver), and
minigpt-grade's table in a real terminal (tmux).

A learner's markdown cell holds payloads that, if they ran, would each say so in a global of the page and write a
file into the instructor's course folder through Jupyter's contents API, with the instructor's login. The same
notebook recorded without the grader's cleaning (a second learner, "control") shows that each payload does run in
this setup, so a page where none runs proves the cleaning, not a payload that could not have run. The table is
printed by a small program in a tmux pane; its screen, title, clipboard buffers and screen mode are read back, and
the same table printed raw shows what the escapes would have done.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder import intake, reports, scoring
from autograder.base import Submission
from autograder.workspace import Workspace, autograded_path
from test_grading_tool import CHAPTER, demo_notebook

pytestmark = pytest.mark.slow

CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 60  # seconds for a page or a server on a busy 2-core machine
# Seconds, at least, that a cleaned page gets for whatever could run in it, at each step (loaded, links clicked): twice
# what its control page, whose payloads all run, took to run them, and no less than this.
SETTLE = 1.0
# What a payload runs: it says so in a global of the top page, and writes ran-<name>.txt through the contents API,
# as the instructor (the login cookie goes along; the XSRF token is read from its cookie, as Jupyter's own pages do).
RAN = ("(top.__ran=top.__ran||[]).push('{name}');"
       "fetch('/api/contents/ran-{name}.txt',{{method:'PUT',"
       "headers:{{'X-XSRFToken':(document.cookie.match(/_xsrf=([^;]*)/)||[])[1]||''}},"
       "body:JSON.stringify({{type:'file',format:'text',content:'ran'}})}})")
PAYLOADS = {
    "svg": '<svg onload="{js}">',
    "img": '<img src=x onerror="{js}">',
    "script": "<script>{js}</script>",
    "details": '<details open ontoggle="{js}"><summary>more</summary></details>',
    "srcdoc": '<iframe srcdoc="<script>{js}</script>"></iframe>',
    "comment": '<!--><img src=x onerror="{js}">-->',
    "link": "[a link](javascript:{js})",  # runs when clicked: the test clicks every link of the cell
}
ORDINARY = "Ordinary learner text with **bold**, `a < b` and $x^2$."
ORDINARY_SHOWN = "Ordinary learner text with bold, a < b and $x^2$."


def required_tools() -> None:
    """Fail, never skip, when something these tests need is missing: a check that does not run is not a pass."""
    missing = [f"{tool}: {how}" for tool, how in [
        ("chromium", "apt-get install chromium (make system-packages)"),
        (CHROMEDRIVER, "apt-get install chromium-driver (make system-packages)"),
        ("tmux", "apt-get install tmux")] if not shutil.which(tool)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the Python package selenium: make env")
    if missing:
        pytest.fail("these tests need:\n  " + "\n  ".join(missing), pytrace=False)


def learner_markdown() -> str:
    return "\n\n".join([ORDINARY] + [html.format(js=RAN.format(name=name)) for name, html in PAYLOADS.items()])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace in which "ada" and "control" handed in the demo chapter with the payloads in a markdown cell: ada's
    notebook recorded by scoring.record (the autograded notebook the formgrader shows) and her feedback made by
    reports.FeedbackPages; control's recorded the same, then put back as it was before cleaning, and its feedback made
    from that by the same nbgrader command."""
    required_tools()
    base = tmp_path_factory.mktemp("inert-live")
    course = base / "course"
    (course / "solutions" / CHAPTER).mkdir(parents=True)
    nbformat.write(demo_notebook(), course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    ws = Workspace(base / "ws", course)
    ws.open([CHAPTER], fresh=True, verbose=False)
    pages = reports.FeedbackPages(ws)
    for student in ("ada", "control"):
        nb = ws.released(CHAPTER)
        nb.cells.insert(1, nbformat.v4.new_markdown_cell(learner_markdown()))
        data = nbformat.writes(nb).encode()
        s = Submission(student, CHAPTER, base / f"{student}.ipynb")
        prepared = intake.sanitize(intake.read_notebook(data), ws, s)
        scoring.record(ws, s, prepared, scoring.cell_scores(prepared, {}), data)  # nothing judged: the pages matter here
        if student == "ada":
            pages.ask(s)
    raw = intake.sanitize(intake.read_notebook(data), ws, s)  # control's (nbgrader's own sanitizing keeps markdown)
    nbformat.write(raw, autograded_path(ws.root, "control", CHAPTER))
    source = ws.root / "feedback-source" / "control" / CHAPTER / f"{CHAPTER}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(raw, source)
    [(code, output)] = ws.nbgrader().run([["generate_feedback", CHAPTER, "--force", "--student", "control",
                                            "--CourseDirectory.autograded_directory=feedback-source"]])
    pages.wait()
    ws.close()
    assert code == 0, output
    return ws.root


@pytest.fixture(scope="module")
def server(workspace, tmp_path_factory):
    """JupyterLab with nbgrader's formgrader, serving the workspace (nbgrader reads the workspace's
    nbgrader_config.py from the folder it starts in); (its address, its token)."""
    runtime = tmp_path_factory.mktemp("jupyter")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = os.urandom(16).hex()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime / "runtime"), "JUPYTER_CONFIG_DIR": str(runtime / "config"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = runtime / "jupyter.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("jupyter-lab")), "--no-browser", "--allow-root",
                                 "--ip", "127.0.0.1", "--port", str(port), f"--IdentityProvider.token={token}",
                                 f"--ServerApp.root_dir={workspace}"],
                                cwd=workspace, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/formgrader/api/assignments?token={token}", timeout=5)
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab with the formgrader did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url, token
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    required_tools()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def ran_in(driver) -> set[str]:
    return set(driver.execute_script("return window.__ran || []"))


def open_and_provoke(driver, url: str, *, control: bool, settle: float = SETTLE) -> tuple[set[str], str, float]:
    """Load the page and click every link of the learner's cell; (what ran, the cell's text, the seconds that took).
    On a control page, whose payloads all run, it waits at each step until they have: those that fire on their own
    (onload, onerror, ontoggle) once the page is loaded, the link's once clicked. A cleaned page, where none should run,
    gets ``settle`` seconds at each step."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def wait(expected: set[str]) -> None:
        if not control:
            time.sleep(settle)
            return
        deadline = time.monotonic() + WAIT
        while not expected <= ran_in(driver) and time.monotonic() < deadline:
            time.sleep(0.05)

    driver.get(url)
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script("return document.readyState") == "complete")
    start = time.monotonic()
    wait(set(PAYLOADS) - {"link"})
    cell = WebDriverWait(driver, WAIT).until(lambda d: next(
        (el for el in d.find_elements(By.CSS_SELECTOR, ".text_cell_render") if "Ordinary learner text" in el.text),
        False))
    for link in cell.find_elements(By.TAG_NAME, "a"):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
        with contextlib.suppress(Exception):  # (a link with nothing to click on is no failure)
            link.click()
    wait(set(PAYLOADS))
    return ran_in(driver), cell.text, time.monotonic() - start


def written(workspace: Path) -> set[str]:
    return {p.name for p in workspace.glob("ran-*.txt")}


def wait_for_files(workspace: Path, names: set[str]) -> set[str]:
    deadline = time.monotonic() + 20
    while written(workspace) != names and time.monotonic() < deadline:
        time.sleep(0.05)
    return written(workspace)


def test_the_formgrader_runs_nothing_a_learner_wrote(workspace, server, browser):
    from nbgrader.api import Gradebook
    from selenium.webdriver.common.by import By

    url, token = server
    browser.get(f"{url}/login")
    browser.find_element(By.ID, "password_input").send_keys(token)
    browser.find_element(By.ID, "login_submit").click()
    deadline = time.monotonic() + WAIT
    while not any(c["name"].startswith("username-") for c in browser.get_cookies()):
        assert time.monotonic() < deadline, "logging in to JupyterLab failed"
        time.sleep(0.25)
    with Gradebook(f"sqlite:///{workspace / 'gradebook.db'}") as gb:
        ids = {s: gb.find_submission_notebook(CHAPTER, CHAPTER, s).id for s in ("ada", "control")}

    ran, _, took = open_and_provoke(browser, f"{url}/formgrader/submissions/{ids['control']}/", control=True)
    assert ran == set(PAYLOADS), "every payload runs in the formgrader when the markdown is kept as it is"
    start = time.monotonic()
    assert wait_for_files(workspace, {f"ran-{n}.txt" for n in PAYLOADS}) == {f"ran-{n}.txt" for n in PAYLOADS}, \
        "and writes into the course folder as the instructor"
    settle = max(SETTLE, 2 * took, 2 * (time.monotonic() - start))
    for path in workspace.glob("ran-*.txt"):
        path.unlink()

    ran, shown, _ = open_and_provoke(browser, f"{url}/formgrader/submissions/{ids['ada']}/", control=False,
                                     settle=settle)
    assert browser.find_elements(By.CSS_SELECTOR, "input.score"), "this is the formgrader's grading page"
    assert ran == set()
    assert ORDINARY_SHOWN in shown
    time.sleep(settle)
    assert written(workspace) == set()


def test_the_feedback_page_runs_nothing_a_learner_wrote(workspace, browser):
    page = workspace / "feedback" / "{}" / CHAPTER / f"{CHAPTER}.html"
    ran, _, took = open_and_provoke(browser, Path(str(page).format("control")).as_uri(), control=True)
    assert ran == set(PAYLOADS), "every payload runs in nbgrader's feedback page when the markdown is kept as it is"
    ran, shown, _ = open_and_provoke(browser, Path(str(page).format("ada")).as_uri(), control=False,
                                     settle=max(SETTLE, 2 * took))
    assert ran == set()
    assert ORDINARY_SHOWN in shown


# ---------------------------------------------------------------------------------------------------
# A terminal

TABLE_PROGRAM = """\
import sys
from pathlib import Path

from autograder import inert, reports
from autograder.base import LostPoints, Result

if sys.argv[1] == "raw":
    inert.terminal = lambda text: text  # the table as it would be printed without the grader's escaping
results = [
    Result("ada", "01-tokens", "graded", 0, 13, [
        LostPoints("test_pre_split", 0, 3, "AssertionError: wrong\\x1bM\\x1b[2K\\rada       01-tokens  13 / 13"),
        LostPoints("test_bpe_merge", 0, 5, "ValueError: no\\x1b]0;pwned\\x07"),
        LostPoints("test_decode\\x1b[2K", 0, 5, "KeyError: 50257\\x1b]52;c;MTMgLyAxMw==\\x07"),
    ], cell_errors=["tokenizer: NameError: name 'x' is not defined\\r\\x1b[2K"],
       review=["pre_split, line 1: runs other programs: !ls\\x1b[?1049h"]),
    Result("bob\\x1b[1A\\x1b[2K", "01-tokens", "graded", 13, 13),
]
print(reports.format_table(results), flush=True)
if len(sys.argv) > 2:
    Path(sys.argv[2]).touch()
"""


class Tmux:
    """A tmux server of this test's own (its own socket), in which OSC 52 would set a paste buffer."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.socket = folder / "tmux.sock"
        self.config = folder / "tmux.conf"
        self.config.write_text("set-option -g set-clipboard on\n")

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.config), *args], capture_output=True,
                              text=True, env={**os.environ, "TERM": "xterm-256color"}, timeout=30)
        assert proc.returncode == 0, f"tmux {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def show(self, session: str, command: str) -> tuple[list[str], str, str, str]:
        """Run ``command`` (which touches the file named last on its line when done) in a new 200x60 pane: (the
        screen's lines, the pane's title, whether the other screen is on, the paste buffers)."""
        done = self.folder / f"{session}.done"
        self("new-session", "-d", "-s", session, "-x", "200", "-y", "60", f"{command} {done}; exec sleep 600")
        deadline = time.monotonic() + WAIT
        while not done.exists():
            assert time.monotonic() < deadline, f"the program in tmux did not finish:\n{self('capture-pane', '-p')}"
            time.sleep(0.2)
        time.sleep(0.5)  # (tmux reads the pane's output on its own schedule)
        screen = [line.rstrip() for line in self("capture-pane", "-p", "-t", session).splitlines()]
        title, other_screen = self("display-message", "-p", "-t", session, "#{pane_title}|#{alternate_on}") \
            .strip().split("|")
        buffers = self("list-buffers")
        for name in self("list-buffers", "-F", "#{buffer_name}").split():
            self("delete-buffer", "-b", name)
        self("kill-session", "-t", session)
        return screen, title, other_screen, buffers


def test_the_table_in_a_terminal_shows_the_true_score_and_every_line(tmp_path):
    from autograder import inert

    required_tools()
    root = Path(intake.__file__).resolve().parents[1]
    program = tmp_path / "table.py"
    program.write_text(TABLE_PROGRAM)
    python = f"cd {root} && PYTHONPATH={root} {sys.executable} {program}"
    tmux = Tmux(tmp_path)
    tmux("new-session", "-d", "-s", "keep", "exec sleep 600")  # a pane nothing writes to: an untouched title
    untouched = tmux("display-message", "-p", "-t", "keep", "#{pane_title}").strip()
    try:
        screen, title, other_screen, buffers = tmux.show("raw", f"{python} raw")
        assert (title, other_screen) == ("pwned", "1") and "13 / 13" in buffers, \
            "printed raw, the table sets the title and the clipboard and switches screens (the check sees escapes work)"
        assert not any("0 / 13" in line for line in screen)

        screen, title, other_screen, buffers = tmux.show("inert", f"{python} inert")
        assert (title, other_screen, buffers) == (untouched, "0", "")
        expected = subprocess.run([sys.executable, str(program), "inert"], capture_output=True, text=True, cwd=root,
                                  env={**os.environ, "PYTHONPATH": str(root)}, check=True).stdout.splitlines()
        assert not any(inert.CONTROL.search(line) for line in expected)
        assert screen[:len(expected)] == expected, "the screen shows the table exactly as printed, line for line"
        assert expected[1].startswith("ada") and "0 / 13" in expected[1]
        assert sum("(0 / " in line for line in expected) == 3
        assert any("error in tokenizer" in line for line in expected)
        assert any("review: pre_split, line 1" in line for line in expected)
    finally:
        tmux("kill-server")
