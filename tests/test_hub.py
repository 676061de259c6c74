"""The real submission path, end to end in a browser (issue 17): a JupyterHub on 127.0.0.1 with two learners and an
instructor, nbgrader's exchange in a temporary folder, and headless Debian Chromium (Selenium, Debian's
chromedriver) in the learners' place.

The instructor releases chapter 1; each learner logs in, fetches it in the Assignments tab, writes solutions into the
exercise cells (one learner right, one with a realistic mistake in `bpe_merge`), validates and submits; the
instructor collects, grades with `minigpt-grade` (sandboxed, judged outside) and releases the feedback; each learner
fetches it and sees their score and the checks' messages, never the hidden tests.

The accounts are real: system users made for the test (JupyterHub's LocalProcessSpawner starts each server as its
user, and nbgrader knows a learner by that user name), so the test runs as root, as CI does, and removes them after.
Learners work in the student release's environment (its stub `minigpt`, no solutions or checks) with nbgrader's
instructor tools hidden, as postBuild does on Binder; the instructor works in this repository's environment.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from autograder.publish import student_release as sr
from submissions import apply_edits, hidden_tests, reference_sources
from submissions.ch01_tokens import MUTANTS
from test_student_release import _environment_beside

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "01-tokens"
COURSE = "minigpt"
PASSWORD = "minigpt-hub-test"
# The system users this test makes are named after its process (two runs at once do not meet) and say so in their
# comment, so that a later run removes those of a run that was killed.
ACCOUNT = "minigpt hub test, process "
TEACHER, RIGHT, WRONG = (f"mg{os.getpid()}-{who}" for who in ("teacher", "ada", "bob"))
# What each learner types into the exercise cells: the reference answers, and for the second one a mistake that
# the checks name ("merges the highest rank first"), which also costs the tokenizer's cells that use bpe_merge.
MISTAKE = next(m for m in MUTANTS if m.key == "bpe-highest-rank")
ANSWERS = {RIGHT: reference_sources(CHAPTER),
           WRONG: {**reference_sources(CHAPTER), **apply_edits(CHAPTER, MISTAKE.edits)}}
# How a learner finds each exercise cell in the notebook: a line of its stub.
CELLS = {"pre_split": "def pre_split(", "bpe_merge": "def bpe_merge(", "bpe_merge_fast": "def bpe_merge_fast(",
         "tokenizer": "class Tokenizer:",
         "train_bpe": "def train_bpe("}
PROXY = ROOT / "tools" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = ROOT / "_build" / "screenshots" / "hub-feedback.png"
WAIT = 120  # seconds for anything the browser waits for (a busy 2-core machine starts JupyterLab slowly)


def required_tools() -> None:
    """Fail, never skip, when something this test needs is missing: a check that does not run is not a pass."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the test makes system users for the hub's accounts; CI runs as root)")
    for tool, how in [("chromium", "apt-get install chromium (make system-packages)"),
                      (CHROMEDRIVER, "apt-get install chromium-driver (make system-packages)"),
                      ("bwrap", "apt-get install bubblewrap (make system-packages)"),
                      ("useradd", "Debian's passwd package"), ("node", "Node.js")]:
        if not shutil.which(tool):
            missing.append(f"{tool}: {how}")
    if not PROXY.is_file():
        missing.append(f"{PROXY.relative_to(ROOT)}: make hub-tools (npm ci in tools/hub)")
    for module in ("jupyterhub", "selenium"):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"the Python package {module}: make env")
    if missing:
        pytest.fail("the hub test needs:\n  " + "\n  ".join(missing), pytrace=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, \
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# ---------------------------------------------------------------------------------------------------
# The machine: accounts, the exchange, the environments, the hub


def remove_accounts(mine: bool) -> None:
    """The system users of this run (``mine``), or those of runs whose process is gone, with their homes."""
    for entry in pwd.getpwall():
        if not entry.pw_gecos.startswith(ACCOUNT):
            continue
        pid = int(entry.pw_gecos.removeprefix(ACCOUNT))
        if pid == os.getpid() if mine else not Path(f"/proc/{pid}").exists():
            subprocess.run(["userdel", "--remove", entry.pw_name], capture_output=True)


def add_account(name: str, homes: Path) -> Path:
    home = homes / name
    run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", "--comment",
         f"{ACCOUNT}{os.getpid()}", name])
    return home


def as_user(name: str, cmd: list[str], cwd: Path, env: dict[str, str], prefix: Path) -> subprocess.CompletedProcess:
    """A command as the instructor types it in a terminal on the hub: their account and environment, the hub's
    settings."""
    home = Path(pwd.getpwnam(name).pw_dir)
    variables = {"HOME": str(home), "USER": name, "PATH": f"{prefix}/bin:/usr/bin:/bin", **env}
    return run(["runuser", "-u", name, "--", "env", "-i", *(f"{k}={v}" for k, v in variables.items()), *cmd],
               cwd=cwd, timeout=600)


HUB_CONFIG = '''\
# The course's hub, as tests/test_hub.py runs it (the README's "A course on JupyterHub" says what a real one sets).
c = get_config()
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{hub_dir}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{hub_dir}/cookie_secret"
c.JupyterHub.pid_file = "{hub_dir}/jupyterhub.pid"
# Test accounts with one password; a course uses its own authenticator (PAM, OAuth, LTI).
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = {accounts!r}
c.Authenticator.admin_users = {{{teacher!r}}}
# Each account's server runs as its system user (nbgrader knows a learner by that name), in JupyterLab.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
LEARNER_ENV, COURSE_ENV = {learner_env!r}, {course_env!r}


def environment(spawner):
    """Learners get the student release's environment (nbgrader's instructor tools hidden), the instructor the
    course's."""
    prefix = COURSE_ENV if spawner.user.name == {teacher!r} else LEARNER_ENV
    spawner.cmd = [prefix + "/bin/python", "-m", "jupyterhub.singleuser"]
    spawner.environment.update({{"PATH": prefix + "/bin:/usr/bin:/bin", **{variables!r}}})


c.Spawner.pre_spawn_hook = environment
'''

NBGRADER_CONFIG = '''\
# Every account's nbgrader settings on the hub (/etc/jupyter/nbgrader_config.py on a real one): course, exchange.
c = get_config()
c.CourseDirectory.course_id = {course!r}
c.Exchange.root = {exchange!r}
'''


class Hub:
    """A JupyterHub on 127.0.0.1 with the course's accounts, under ``base`` (a folder every account can traverse)."""

    def __init__(self, base: Path):
        self.base = base
        self.exchange = base / "exchange"
        self.etc = base / "etc" / "jupyter"
        self.homes = base / "home"
        self.hub_dir = base / "hub"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = self.hub_dir / "jupyterhub.log"

    def nbgrader_env(self) -> dict[str, str]:
        return {"JUPYTER_CONFIG_PATH": str(self.etc)}

    def set_up(self, learner_env: Path, course_env: Path, release: Path) -> None:
        for folder in (self.etc, self.homes, self.hub_dir):
            folder.mkdir(parents=True)
        self.exchange.mkdir()
        self.exchange.chmod(0o777)  # nbgrader's exchange: every account writes there, nbgrader checks the mode
        (self.etc / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(course=COURSE, exchange=str(self.exchange)))
        variables = {**self.nbgrader_env(), "JUPYTER_PATH": f"{sys.prefix}/share/jupyter",
                     "TIKTOKEN_CACHE_DIR": str(release / "src" / "coursekit" / "data" / "tiktoken"),
                     "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        (self.hub_dir / "jupyterhub_config.py").write_text(HUB_CONFIG.format(
            port=self.port, hub_port=free_port(), api_port=free_port(), proxy=str(PROXY), hub_dir=self.hub_dir,
            password=PASSWORD, accounts={RIGHT, WRONG, TEACHER}, teacher=TEACHER, learner_env=str(learner_env),
            course_env=str(course_env), variables=variables))
        for name in (TEACHER, RIGHT, WRONG):
            add_account(name, self.homes)

    def start(self) -> None:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([f"{sys.prefix}/bin/jupyterhub", "-f", "jupyterhub_config.py"],
                                            cwd=self.hub_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"JupyterHub stopped:\n{self.log_tail()}"
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.url}/hub/health", timeout=5).status == 200:
                    return
            time.sleep(0.5)
        pytest.fail(f"JupyterHub did not answer in {WAIT} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.is_file() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # the hub stops the users' servers and its proxy on the way out
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def shared_python(opened: list[tuple[Path, int]]) -> str:
    """This interpreter (`make env` checked it: 3.11.5 or later), runnable by every account: the folders above it that
    other users cannot pass (pyenv in root's home) get the search bit for others, no more, until the test gives them
    back their modes (``opened``). A real hub installs its Python where every account reaches it; Debian 12's own
    python3.11 is 3.11.2, which `make env` refuses, and on which nbconvert's HTML export fails with the pinned
    soupsieve (the formgrader's view of a notebook: a server error)."""
    real = Path(os.path.realpath(sys.executable))
    if not real.stat().st_mode & 0o001:
        pytest.fail(f"{real} may not be run by other users", pytrace=False)
    for folder in reversed(real.parents):
        mode = stat.S_IMODE(folder.stat().st_mode)
        if not mode & 0o001:
            opened.append((folder, mode))
            folder.chmod(mode | 0o001)
    return sys.executable


def course_environment(base: Path, python: str) -> Path:
    """The instructor's environment: this repository's, nbgrader's instructor tools included."""
    venv = _environment_beside(base / "course-env", python, ("jupyter*", "nbgrader", "alembic"))  # nbgrader: alembic
    editable = next(Path(sys.prefix).glob("lib/python3*/site-packages/__editable__.*.pth"))
    # after course.pth, which puts this environment's packages (the finder of the editable install among them) in view
    shutil.copyfile(editable, next(venv.glob("lib/python3*/site-packages")) / "zz-editable.pth")
    return venv


def student_release(base: Path) -> Path:
    """What learners get (no solutions, hidden tests or reference), without its website."""
    release = base / "release"
    run([sys.executable, "-m", "autograder.publish.student_release", str(release), "--no-book"], cwd=ROOT, timeout=600)
    return release


def learner_environment(base: Path, python: str, release: Path) -> Path:
    """The student release's environment: this one's packages with the release's `minigpt` and `coursekit` (not this
    repository's), and nbgrader's instructor tools hidden by the release's own commands (its postBuild's)."""
    venv = _environment_beside(base / "learner-env", python)
    (next(venv.glob("lib/python3*/site-packages")) / "release.pth").write_text(f"{release / 'src'}\n")
    env = {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}", "JUPYTER_PATH": f"{sys.prefix}/share/jupyter"}
    for line in sr.LEARNER_LAB.splitlines():
        run(line.split(), env=env, cwd=base, timeout=120)
    return venv


# ---------------------------------------------------------------------------------------------------
# The browser


def browser(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    return driver


class Learner:
    """One learner's browser on the hub."""

    def __init__(self, hub: Hub, name: str, profile: Path):
        self.hub, self.name = hub, name
        self.driver = browser(profile)

    # small helpers over Selenium ----------------------------------------------------------------

    def wait(self, condition, what: str, timeout: float = WAIT):
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.25).until(condition)
        except TimeoutException:
            shot = SCREENSHOT.with_name(f"hub-failed-{self.name}.png")
            shot.parent.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(shot))
            pytest.fail(f"{self.name}: {what} did not happen in {timeout:g} s (screenshot: {shot}); hub log:\n"
                        f"{self.hub.log_tail(15)}")

    def element(self, css: str, what: str, text: str | None = None, timeout: float = WAIT):
        """The first visible element matching ``css`` (and containing ``text``)."""
        from selenium.webdriver.common.by import By

        def find(driver):
            for el in driver.find_elements(By.CSS_SELECTOR, css):
                with contextlib.suppress(Exception):
                    if el.is_displayed() and (text is None or text in el.text):
                        return el
            return False

        return self.wait(find, what, timeout)

    def click(self, css: str, what: str, text: str | None = None):
        el = self.element(css, what, text)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
        el.click()
        return el

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    # what the learner does ------------------------------------------------------------------------

    def log_in(self) -> None:
        self.driver.get(f"{self.hub.url}/hub/login")
        self.element("input#username_input", "the hub's login page").send_keys(self.name)
        self.element("input#password_input", "the password field").send_keys(PASSWORD)
        self.click("#login_submit", "the Sign in button")
        # the hub starts the learner's server, then JupyterLab loads
        self.element("#jp-main-dock-panel", "JupyterLab after login", timeout=2 * WAIT)
        assert f"/user/{self.name}/lab" in self.driver.current_url, self.driver.current_url

    def open_assignments(self) -> list[str]:
        """Open the Assignments tab from the Nbgrader menu; the menu's items."""
        self.click(".lm-MenuBar-itemLabel", "the Nbgrader menu", text="Nbgrader")
        self.element(".lm-Menu-itemLabel", "the Nbgrader menu's items", text="Assignment List")
        items = self.js("return [...document.querySelectorAll('.lm-Menu-itemLabel')].map(e => e.textContent)")
        self.click(".lm-Menu-itemLabel", "the Assignment List item", text="Assignment List")
        self.element("#released_assignments_list", "the Assignments tab")
        return items

    def fetch_assignment(self) -> list[str]:
        """Fetch chapter 1 in the Assignments tab; the Nbgrader menu's items."""
        menu = self.open_assignments()
        self.click("#released_assignments_list .list_item button", "the Fetch button of 01-tokens", text="Fetch")
        self.element("#fetched_assignments_list .list_item", "01-tokens among the downloaded assignments",
                     text=CHAPTER)
        return menu

    def open_notebook(self) -> None:
        self.driver.get(f"{self.hub.url}/user/{self.name}/lab/tree/{CHAPTER}/{CHAPTER}.ipynb")
        self.element(".jp-Notebook .jp-CodeCell .cm-content", "the notebook's cells")
        self.element(".jp-StatusBar-TextItem", "the kernel to start", text="Idle")

    def write_cell(self, marker: str, source: str) -> None:
        """Type ``source`` over the whole cell whose code contains ``marker`` (select all in its editor, then text
        input as a keyboard or a paste gives it: no auto-indentation or closing brackets added)."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        # JupyterLab keeps only the cells near the view in the page: scroll down (round again from the top) until
        # the cell is there
        editor = self.wait(lambda d: self.js("""
            const cell = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
                .find(c => (c.querySelector('.cm-content')?.textContent || '').includes(arguments[0]));
            const outer = document.querySelector('.jp-mod-current .jp-WindowedPanel-outer');
            if (!cell) {
                const bottom = outer.scrollTop + outer.clientHeight >= outer.scrollHeight - 2;
                outer.scrollTop = bottom ? 0 : outer.scrollTop + 0.8 * outer.clientHeight;
                return null;
            }
            cell.scrollIntoView({block: 'center'});
            return cell.querySelector('.cm-content');""", marker), f"the cell with {marker!r}")
        editor.click()
        ActionChains(self.driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).perform()
        self.driver.execute_cdp_cmd("Input.insertText", {"text": source})

    def save(self) -> None:
        self.click("[data-command='docmanager:save']", "the notebook's Save button")
        self.wait(lambda d: not self.js("return document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')"),
                  "the notebook to be saved", timeout=60)

    def validate(self) -> str:
        self.click(".jp-Toolbar-item button, .jp-ToolbarButtonComponent", "the Validate button", text="Validate")
        dialog = self.element(".jp-Dialog-content", "the validation results", timeout=3 * WAIT)
        self.wait(lambda d: "Validating" not in dialog.text and dialog.text.strip(), "validation to finish",
                  timeout=3 * WAIT)
        text = dialog.text
        self.click(".jp-Dialog-button", "the dialog's OK button", text="Ok")
        return text

    def submit(self) -> None:
        self.driver.get(f"{self.hub.url}/user/{self.name}/lab")
        self.element("#jp-main-dock-panel", "JupyterLab")
        self.open_assignments()
        self.click("#fetched_assignments_list .list_item button", "the Submit button of 01-tokens", text="Submit")
        self.element("#submitted_assignments_list .list_item", "the submission among the submitted assignments",
                     text=CHAPTER)

    def fetch_feedback(self) -> str:
        """Fetch the feedback in the Assignments tab, follow its link, open the page in a browser tab; its text."""
        self.driver.get(f"{self.hub.url}/user/{self.name}/lab")
        self.element("#jp-main-dock-panel", "JupyterLab")
        self.open_assignments()
        self.click("#submitted_assignments_list .list_item button", "the Fetch Feedback button", text="Fetch Feedback")
        self.click("#submitted_assignments_list .list_item a", "the view feedback link", text="view feedback")
        self.element(".jp-DirListing-item", "the feedback page in the file browser", text=f"{CHAPTER}.html")
        home = Path(pwd.getpwnam(self.name).pw_dir)
        page, = home.glob(f"{CHAPTER}/feedback/*/{CHAPTER}.html")
        self.driver.get(f"{self.hub.url}/user/{self.name}/files/{quote(page.relative_to(home).as_posix())}")
        return self.element("body", "the feedback page", text="Score").text


    def formgrader(self, student: str) -> dict:
        """The instructor's view of the grades: nbgrader's formgrader, opened in a browser tab of its own on the
        gradebook of the course's ``.grading/`` (the instructor's ``~/.jupyter/nbgrader_config.py`` names it).
        Inside JupyterLab, the Formgrader item of the Nbgrader menu shows it in a frame, which JupyterHub >= 4.1
        forbids on a user's server (``frame-ancestors 'none'``: the tab stays blank, nbgrader #1870). What it shows:
        the assignments, {student: score} on the chapter's submissions page, {test cell: score} in ``student``'s
        autograded notebook as the formgrader renders it, and the Content-Security-Policy of the instructor's
        server."""
        base = f"{self.hub.url}/user/{self.name}/formgrader"
        self.log_in()
        self.driver.get(f"{base}/manage_assignments")
        self.element(".name a", "01-tokens among the formgrader's assignments", text=CHAPTER)
        self.driver.get(f"{base}/manage_submissions/{CHAPTER}")
        self.wait(lambda d: len(self.js("return document.querySelectorAll('tr .student-id')")) >= 2
                  and "/" in self.js("return document.querySelector('tr .score')?.textContent || ''"),
                  "the formgrader's table of the submissions of 01-tokens")
        scores = self.js("""return Object.fromEntries([...document.querySelectorAll('tr')]
            .filter(tr => tr.querySelector('.student-id'))
            .map(tr => [tr.querySelector('.student-id').textContent.trim(),
                        tr.querySelector('.score').textContent.trim()]))""")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(SCREENSHOT.with_name("hub-formgrader.png")))
        # the learner's autograded notebook, from their page of the chapter
        self.driver.get(f"{base}/manage_students/{student}/{CHAPTER}")
        self.click(".name a", f"the link to {student}'s notebook", text=CHAPTER)
        self.element("#notebook", f"{student}'s autograded notebook in the formgrader", text="def bpe_merge")
        # each test cell's score box: the autograder's score as its placeholder (its value is a manual score)
        self.wait(lambda d: self.js("const boxes = [...document.querySelectorAll('input.score')];"
                                    "return boxes.length > 0 && boxes.every(i => i.placeholder !== '')"),
                  "the scores of the notebook's test cells")
        cells = self.js("return Object.fromEntries([...document.querySelectorAll('input.score')]"
                        ".map(i => [i.id, i.placeholder]))")
        cookies = "; ".join(f"{c['name']}={c['value']}" for c in self.driver.get_cookies())  # this login's
        with urllib.request.urlopen(urllib.request.Request(base, headers={"Cookie": cookies}), timeout=WAIT) as page:
            policy = page.headers.get("Content-Security-Policy", "")
        return {"scores": scores, "cells": cells, "policy": policy}


# ---------------------------------------------------------------------------------------------------
# The test


def submit(learner: Learner) -> str:
    """A learner's part: log in, fetch chapter 1, write the exercises, save, validate, submit; what Validate said."""
    learner.log_in()
    menu = learner.fetch_assignment()
    assert "Assignment List" in menu and not {"Formgrader", "Course List", "Create assignment"} & set(menu), \
        f"{learner.name}'s Nbgrader menu: {menu}"
    learner.driver.get(f"{learner.hub.url}/user/{learner.name}/formgrader")  # nbgrader's server side of it is off too
    assert "404" in learner.element("body", "the formgrader's address").text, learner.driver.page_source[:500]
    learner.open_notebook()
    for grade_id, source in ANSWERS[learner.name].items():
        learner.write_cell(CELLS[grade_id], source)
    learner.save()
    saved = json.loads((Path(pwd.getpwnam(learner.name).pw_dir) / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    typed = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in saved["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    assert typed == ANSWERS[learner.name], f"{learner.name}'s saved notebook is not what was typed"
    said = learner.validate()
    learner.submit()
    return said


def test_learners_submit_through_the_hub_and_fetch_feedback_without_hidden_tests():
    required_tools()
    start = time.monotonic()

    def lap(what: str) -> None:
        print(f"hub test: {what} after {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    remove_accounts(mine=False)  # left by a run that was killed
    base = Path(tempfile.mkdtemp(prefix="minigpt-hub-"))
    base.chmod(0o755)  # every account reaches the exchange, the environments and its home through it
    hub = Hub(base)
    learners: dict[str, Learner] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
    opened: list[tuple[Path, int]] = []  # folders given the search bit for others (shared_python)
    try:
        python = shared_python(opened)
        release = pool.submit(student_release, base)
        course_env = course_environment(base, python)
        hub.set_up(learner_environment(base, python, base / "release"), course_env, base / "release")
        hub.start()
        lap("hub started")

        # The instructor releases chapter 1 from their course folder: the learner notebook as this repository has it.
        course = Path(pwd.getpwnam(TEACHER).pw_dir) / "course"
        shutil.copytree(ROOT / "notebooks" / CHAPTER, course / "notebooks" / CHAPTER)
        (course / "nbgrader_config.py").write_text(
            f"c = get_config()\nload_subconfig({str(ROOT / 'autograder' / 'nbgrader_config.py')!r})\n"
            f"c.CourseDirectory.root = {str(course)!r}\n")
        run(["chown", "-R", f"{TEACHER}:{TEACHER}", str(course)])
        as_user(TEACHER, ["nbgrader", "release_assignment", CHAPTER], course, hub.nbgrader_env(), course_env)
        release.result()  # the learners' kernels import its coursekit

        # Both learners at once, each in a browser of their own.
        for name in (RIGHT, WRONG):
            learners[name] = Learner(hub, name, base / f"browser-{name}")
        validation = dict(zip(learners, pool.map(submit, learners.values())))
        lap("both learners submitted")
        assert "Success! Your notebook passes all the tests." in validation[RIGHT], validation[RIGHT]
        assert "Success" not in validation[WRONG] and "expect(bpe_merge" in validation[WRONG], validation[WRONG]

        # The instructor collects, grades in the sandbox and releases the feedback.
        as_user(TEACHER, ["nbgrader", "collect", CHAPTER], course, hub.nbgrader_env(), course_env)
        # minigpt-grade as root (sudo on a hub): its sandbox caps each notebook's memory and processes in a cgroup
        results = course / "grades.json"
        run([f"{sys.prefix}/bin/minigpt-grade", "--class", "submitted", "--chapter", CHAPTER, "--workdir", ".grading",
             "--json", str(results), "--quiet"], cwd=course, timeout=600, env={**os.environ, **hub.nbgrader_env()})
        lap("graded")
        graded = {r["student"]: r for r in json.loads(results.read_text())["results"]}
        assert {r["status"] for r in graded.values()} == {"graded"} and graded.keys() == learners.keys(), graded
        assert {r["isolation"] for r in graded.values()} == {"sandbox"}
        assert graded[RIGHT]["score"] == graded[RIGHT]["max_score"] and not graded[RIGHT]["lost"], graded[RIGHT]
        lost = {lp["grade_id"]: lp["message"] for lp in graded[WRONG]["lost"]}
        assert set(lost) == set(MISTAKE.lost), lost
        assert all(want in lost[cell] for cell, want in MISTAKE.lost.items()), lost
        as_user(TEACHER, ["nbgrader", "release_feedback", CHAPTER], course / ".grading", hub.nbgrader_env(), course_env)

        # Each learner fetches the feedback: their score and the checks' messages, not the hidden tests; meanwhile
        # the instructor reads the class's scores in the formgrader, in a tab of its own (Learner.formgrader).
        instructor_config = Path(pwd.getpwnam(TEACHER).pw_dir) / ".jupyter" / "nbgrader_config.py"
        instructor_config.parent.mkdir()
        instructor_config.write_text(f"c = get_config()\nc.CourseDirectory.root = {str(course / '.grading')!r}\n")
        run(["chown", "-R", f"{TEACHER}:{TEACHER}", str(instructor_config.parent)])
        learners[TEACHER] = Learner(hub, TEACHER, base / "browser-teacher")
        formgrader = pool.submit(learners[TEACHER].formgrader, WRONG)
        hidden = {line.strip() for part in hidden_tests(CHAPTER).values() for line in part.splitlines()} - {""}
        pages = dict(zip((RIGHT, WRONG), pool.map(Learner.fetch_feedback, (learners[RIGHT], learners[WRONG]))))
        lap("both learners read their feedback")
        seen = formgrader.result()
        lap("the instructor read the scores in the formgrader")
        shown = {name: f"{round(float(graded[name]['score']), 2):g} / {round(float(graded[name]['max_score']), 2):g}"
                 for name in (RIGHT, WRONG)}  # as the formgrader writes them: roundToPrecision(score, 2)
        assert seen["scores"] == shown, seen["scores"]
        lost_scores = {lp["grade_id"]: lp["score"] for lp in graded[WRONG]["lost"]}
        assert set(lost_scores) < set(seen["cells"]), seen["cells"]
        assert all(abs(float(seen["cells"][cell]) - score) < 0.01 for cell, score in lost_scores.items()), seen["cells"]
        # why the menu's framed formgrader is blank, and stays so: the header is kept, not relaxed
        assert "frame-ancestors 'none'" in seen["policy"], seen["policy"]
        for name, page in pages.items():
            # as nbgrader's feedback template writes it: `| float | round(2)`
            score = f"Score: {round(float(graded[name]['score']), 2)} / {round(float(graded[name]['max_score']), 2)}"
            assert f"{CHAPTER} ({score})" in page, f"{name}'s feedback does not say {score}:\n{page[:500]}"
            assert "hidden tests ran here" in page
            shown = [line for line in hidden if line in page]
            assert not shown, f"{name}'s feedback shows hidden test code: {shown}"
        assert all(want in pages[WRONG] for want in MISTAKE.lost.values()), pages[WRONG]
        # the picture: the second learner's feedback at the cell the mistake lost
        wrong = learners[WRONG]
        wrong.js("""const out = [...document.querySelectorAll('pre')].find(e => e.textContent.includes(arguments[0]));
                    out.scrollIntoView({block: 'center'});""", MISTAKE.lost["test_bpe_merge"])
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        wrong.driver.save_screenshot(str(SCREENSHOT))
    finally:
        for learner in learners.values():
            with contextlib.suppress(Exception):
                learner.driver.quit()
        pool.shutdown(cancel_futures=True)
        hub.stop()
        remove_accounts(mine=True)
        shutil.rmtree(base, ignore_errors=True)
        for folder, mode in opened:
            folder.chmod(mode)
