"""The student release: what learners get holds no solutions, hidden tests, grading code or reference.

These tests build releases with a tiny stand-in website (``--book-html``), which takes a second; the release with
the real website, built with the release's repository URL, is tested in test_site.py, after the course's book (its
pages reuse the book's executed notebooks).
"""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml
from packaging.requirements import Requirement

from autograder.publish import student_release as sr

ROOT = sr.COURSE_ROOT
URL = "https://github.com/example-school/minigpt-learners"
CHAPTERS = sr.chapters(ROOT)
COURSE = sr.course_repository(ROOT)  # the instructor's repository, with the solutions
BUILT: list[Path] = []  # every release the tests of this file built, for the last test


@pytest.fixture(scope="module", autouse=True)
def record_builds():
    """Note each release a test builds (through main or build), to read every link of every one at the end."""
    build = sr.build

    def recorded(out, *args, **kwargs):
        build(out, *args, **kwargs)
        BUILT.append(Path(out))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sr, "build", recorded)
        yield


def stand_in_site(folder: Path, repository_url: str = URL) -> Path:
    """A one-page website whose exercise link opens the first notebook in ``repository_url``."""
    folder.mkdir(parents=True)
    link = sr.binder_url(ROOT, repository_url, "main", f"notebooks/{CHAPTERS[0]}/{CHAPTERS[0]}.ipynb")
    (folder / "index.html").write_text(
        f'<html><body><p>Tokens.</p><a class="binder-exercise-link" href="{link}">Launch on Binder</a></body></html>')
    return folder


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("student-release")
    out = tmp / "release"
    site = stand_in_site(tmp / "site")
    assert sr.main([str(out), "--repository-url", URL, "--book-html", str(site)]) == 0
    return out


@pytest.fixture
def copy(release, tmp_path) -> Path:
    """A copy of the release to plant a leak in."""
    return Path(shutil.copytree(release, tmp_path / "release"))


def test_the_release_scans_clean(release):
    assert sr.scan(release) == []


def test_the_release_has_what_learners_need(release):
    for chapter in CHAPTERS:
        assert (release / "notebooks" / chapter / f"{chapter}.ipynb").is_file()
    for path in ["README.md", "LICENSE", "pyproject.toml", "environment.yml", "postBuild", "constraints.txt",
                 "Makefile", "src/minigpt/__init__.py", "src/coursekit/testing.py", "src/coursekit/export.py",
                 "src/coursekit/data/tiktoken/LICENSE", "src/coursekit/data/shakespeare/README.md",
                 "src/coursekit/data/models/shakespeare-gpt/model.safetensors", "docs/index.html", "docs/.nojekyll"]:
        assert (release / path).is_file(), f"{path} is missing"
    assert os.access(release / "postBuild", os.X_OK)
    assert not (release / "autograder").exists() and not (release / "solutions").exists()
    assert (release / "constraints.txt").read_bytes() == (ROOT / "constraints.txt").read_bytes()
    readme = (release / "README.md").read_text()
    assert "minigpt-export notebooks src/minigpt" in readme and "student release" in readme
    assert sr.binder_url(ROOT, URL, "main", f"notebooks/{CHAPTERS[0]}/{CHAPTERS[0]}.ipynb") in readme


def test_what_the_release_points_to_is_in_it(release):
    """Every `make TARGET` and every training/ file that the release's README, notebooks, package and data READMEs
    name is in the release; `make model` trains on the learner's package without touching the course's model."""
    texts = {p: p.read_text(encoding="utf-8") for p in [release / "README.md", *release.glob("training/*.md"),
                                                        *release.rglob("notebooks/*/*.ipynb"),
                                                        *release.rglob("src/coursekit/**/*.py"),
                                                        *release.rglob("src/coursekit/data/**/README.md")]}
    makefile = (release / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    for path, text in texts.items():
        for target in set(re.findall(r"`make (\w[\w-]*)", text)):
            assert target in targets, f"{path.relative_to(release)} names `make {target}`; the Makefile has {targets}"
        for named in set(re.findall(r"training/[\w.]+\.(?:py|md)", text)):
            assert (release / named).is_file(), f"{path.relative_to(release)} names {named}, which is missing"
    assert re.search(r"^model: env\n\t\.venv/bin/python training/train_shipped_model.py --out my-model ", makefile,
                     re.M), "make model writes its own folder, not the course's model"
    run = subprocess.run([sys.executable, "training/train_shipped_model.py", "--help"], cwd=release, text=True,
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(release / "src")})
    assert run.returncode == 0 and "--out" in run.stdout, run.stderr


def test_what_learners_read_tells_them_to_run_nothing_the_release_lacks(release):
    """The book's pages and exercise boxes (the instructor's preview and the release's website come from them), the
    course README's section for learners and the release's own texts: none says to run minigpt-grade (the release has
    no grader); they say to run the notebook's cells and its test cells."""
    learners = (ROOT / "README.md").read_text().split("## For learners\n", 1)[1].split("\n## ", 1)[0]
    texts = {"README.md, For learners": learners, **{str(p.relative_to(ROOT)): p.read_text() for p in
                                                   [*(ROOT / "book").glob("*.md"), ROOT / "book/_ext/exercise.py"]},
             **{f"release/{p.relative_to(release)}": p.read_text() for p in
                [release / "README.md", *release.glob("notebooks/*/*.ipynb")]}}
    told = {name for name, text in texts.items()
            if re.search(r"\.venv/bin/minigpt-grade|minigpt-grade[` ]+(?:\{path\}|notebooks/)", text)}
    assert not told, f"these tell learners to run minigpt-grade: {sorted(told)}"
    assert "Run All Cells" in learners and "Run All Cells" in (ROOT / "book/intro.md").read_text()


def test_pyproject_and_binder_environment_ask_for_the_same_packages(release):
    project = tomllib.loads((release / "pyproject.toml").read_text())["project"]
    assert set(project["scripts"]) == {"minigpt-export", "minigpt-generate"}  # no minigpt-grade: no hidden checks
    wanted = {sr._requirement_name(d): d for d in project["dependencies"]}
    assert "nbgrader" in wanted and "torch" in wanted and not sr.NOT_FOR_LEARNERS & set(wanted)
    env = yaml.safe_load((release / "environment.yml").read_text())["dependencies"]
    assert [d for d in env if isinstance(d, str)] == ["python=3.11", "pip"], "conda gives Python and pip only"
    pip = next(dep["pip"] for dep in env if isinstance(dep, dict))
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip
    pins = {sr._canonical(Requirement(d).name): Requirement(d) for d in pip if d[0] != "-"}
    assert [f"{r.name}{r.specifier}" for r in pins.values()] == sr.learner_pins(ROOT)
    assert not {"nh3", "distributed"} & set(pins), "the grader's packages (its page sanitizer, its cluster)"
    # The learners' side only: none of the course's build and test tools, none of JupyterHub (repo2docker's).
    course_tools = {"jupyter-book", "jupytext", "sphinx", "myst-nb", "sphinx-book-theme", "pytest", "pytest-xdist",
                    "hypothesis", "selenium", "jupyterhub"}
    assert not course_tools & set(pins), course_tools & set(pins)
    assert "psutil" in pins, "ipython needs it on Linux"
    for name, requirement in wanted.items():  # each dependency at the version the course's tests ran with
        pinned = pins[name].specifier
        assert len(pinned) == 1 and next(iter(pinned)).operator == "==", f"{name} is not pinned: {pinned}"
        version = next(iter(pinned)).version
        assert Requirement(requirement).specifier.contains(version, prereleases=True), (name, version)
    assert str(pins["torch"].specifier) == "==2.13.0+cpu"


@pytest.mark.slow
def test_binder_resolves_the_release_environment_to_exactly_its_pins(release, tmp_path):
    """pip, as repo2docker runs it on environment.yml, installs exactly the pins: none missing (each package's own
    requirements are among them), none replaced."""
    env = yaml.safe_load((release / "environment.yml").read_text())["dependencies"]
    pip = next(dep["pip"] for dep in env if isinstance(dep, dict))
    (tmp_path / "requirements.txt").write_text("\n".join(pip) + "\n")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--retries", "0", "--timeout", "5", "--report", str(report), "-r", "requirements.txt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in json.loads(report.read_text())["install"]]
    pinned = [f"{Requirement(d).name}{Requirement(d).specifier}" for d in pip if d[0] != "-"]
    # sorted by their canonical names: pip reports a package's own spelling (Jinja2), the lock uv's (jinja2)
    assert sorted(map(sr._canonical, plan)) == sorted(map(sr._canonical, pinned))


def test_the_learner_package_is_the_learner_notebooks_export(release):
    modules = sr.export.build_package(release / "notebooks")
    assert sorted(p.name for p in (release / "src" / "minigpt").iterdir()) == sorted(modules)
    reference = sr.export.build_package(ROOT / "solutions")
    with_exercises = {name for name, text in modules.items() if "raise NotImplementedError()" in text}
    assert with_exercises and all(modules[name] != reference[name] for name in with_exercises | {"__init__.py"})


def run_python(release: Path, code: str, cwd: Path) -> str:
    """Run ``code`` with only the release's src/ added to this environment (no bytecode written into OUT)."""
    env = {**os.environ, "PYTHONPATH": str(release / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_learner_package_imports_and_its_stubs_raise(release, tmp_path):
    modules = [name[:-3] for name in sr.export.build_package(release / "notebooks") if name != "__init__.py"]
    out = run_python(release, f"""
import importlib, minigpt
for name in {modules!r}:
    importlib.import_module("minigpt." + name)
print(minigpt.__file__)
from minigpt.attention import causal_mask
try:
    causal_mask(3)
except NotImplementedError:
    print("stub raised NotImplementedError")
""", tmp_path)
    assert out.splitlines() == [str(release / "src" / "minigpt" / "__init__.py"), "stub raised NotImplementedError"]


def test_minigpt_generate_on_the_fresh_learner_package_names_what_is_not_written(release, tmp_path):
    """The learner's package as released (stubs): one line that names the first exercise it needs, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(release / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", "import sys; from minigpt.generation import main; "
                           "sys.exit(main(['Romeo.\\n', '--max-new-tokens', '3', '--temperature', '0']))"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.fullmatch(r"\nminigpt-generate: [\w.]+ \(\w+\.py\) is not written yet in this package: finish its "
                        r"exercise and export the package again\n", proc.stderr), proc.stderr[-3000:]


def _environment_beside(venv: Path, python: str = sys.executable, commands: tuple[str, ...] = ("jupyter*",)) -> Path:
    """A fresh prefix whose Python sees this environment's packages and Jupyter's data files, with ``commands`` of its
    own: what a learner's new environment is to `make env`, without installing 1.6 GB again. ``python``: another
    interpreter of the same version to make it with."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    (next(venv.glob("lib/python3*/site-packages")) / "course.pth").write_text(f"{site}\n")
    shutil.copytree(Path(sys.prefix) / "etc" / "jupyter", venv / "etc" / "jupyter")
    for script in (s for pattern in commands for s in Path(sys.prefix, "bin").glob(pattern)):
        lines = script.read_text().splitlines(keepends=True)
        (venv / "bin" / script.name).write_text(f"#!{venv}/bin/python\n" + "".join(lines[1:]))
        (venv / "bin" / script.name).chmod(0o755)
    return venv


@pytest.mark.slow
def test_the_learners_jupyterlab_has_no_instructor_tools(release, tmp_path):
    """postBuild's commands, run in a learner's environment: JupyterLab starts without nbgrader's formgrader,
    create-assignment and course list (plugins off and locked, server extensions off), with the assignment list
    and validate."""
    import urllib.request

    venv = _environment_beside(tmp_path / "venv")
    env = {**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}", "JUPYTER_PATH": f"{sys.prefix}/share/jupyter",
           "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config"), "JUPYTER_DATA_DIR": str(tmp_path / "user-data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    post_build = (release / "postBuild").read_text()
    for line in sr.LEARNER_LAB.splitlines():
        assert line in post_build and line.replace("jupyter ", ".venv/bin/jupyter ") in (release / "Makefile").read_text()
        subprocess.run(line.split(), env=env, check=True, capture_output=True, cwd=tmp_path, timeout=120)
    port = 20000 + os.getpid() % 20000
    server = subprocess.Popen([f"{venv}/bin/jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
                               "--port-retries=0", "--ServerApp.token=t", f"--ServerApp.root_dir={tmp_path}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        page = None
        for _ in range(120):
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=t", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert page, "JupyterLab did not start"
        config = json.loads(html.unescape(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)[1]))
        hidden = {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list"}
        assert hidden <= set(config["disabledExtensions"]) and hidden <= set(config.get("lockedExtensions", []))
        assert not {"@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:validate-assignment"} & set(
            config["disabledExtensions"])
        for path, served in [("formgrader", False), ("assignments", True)]:
            try:
                code = urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}?token=t", timeout=10).status
            except urllib.error.HTTPError as error:
                code = error.code
            assert (code != 404) == served, f"/{path} answered {code}"  # 400 for the list: it wants a course
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_chapter_4_imports_earlier_chapters_from_the_learners_package(release):
    folder = release / "notebooks" / "04-transformer"
    cells = json.loads((folder / "04-transformer.ipynb").read_text())["cells"]
    imports = [line.strip() for cell in cells if cell["cell_type"] == "code"
               for line in "".join(cell["source"]).splitlines() if re.match(r"\s*from minigpt\.\w+ import ", line)]
    assert any("minigpt.attention" in line for line in imports)
    out = run_python(release, "\n".join(imports) + """
import sys
for name, module in sorted(sys.modules.items()):
    if name.split(".")[0] in ("minigpt", "coursekit"):
        print(name, module.__file__)
""", folder)
    loaded = dict(line.split(" ", 1) for line in out.splitlines())
    assert "minigpt.attention" in loaded and "minigpt.embeddings" in loaded
    assert all(Path(path).is_relative_to(release / "src") for path in loaded.values()), loaded


def _add_cell(notebook: Path, source: str) -> None:
    nb = json.loads(notebook.read_text())
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": source})
    notebook.write_text(json.dumps(nb))


def _first_stub_to_pass(notebook: Path) -> None:
    nb = json.loads(notebook.read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution")
                and c["cell_type"] == "code")
    cell["source"] = "".join(cell["source"]).replace("raise NotImplementedError()", "pass")
    notebook.write_text(json.dumps(nb))


def _page_with_solution(page: Path) -> None:
    """Reference code as a highlighted code cell of a website page: tags and entities around every token."""
    code = (ROOT / "src" / "minigpt" / "attention.py").read_text()
    body = "".join(f'<span class="n">{html.escape(tok)}</span>' for tok in re.split(r"(\W)", code))
    page.write_text(f'<html><body><div class="highlight"><pre>{body}</pre></div></body></html>')


LEAKS = {
    # name: (plant(release), path the finding names, what it says)
    "solution marker in a notebook": (
        lambda r: _add_cell(r / "notebooks/01-tokens/01-tokens.ipynb", "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
        "notebooks/01-tokens/01-tokens.ipynb", "BEGIN SOLUTION"),
    "solution cell without its stub": (
        lambda r: _first_stub_to_pass(r / "notebooks/02-embeddings/02-embeddings.ipynb"),
        "notebooks/02-embeddings/02-embeddings.ipynb", "no `raise NotImplementedError()` stub"),
    "instructor notebook released": (
        lambda r: shutil.copy(ROOT / "solutions/03-attention/03-attention.ipynb", r / "notebooks/03-attention"),
        "notebooks/03-attention/03-attention.ipynb", "a copy of the course's solutions/03-attention"),
    "reference module copied into the package": (
        lambda r: shutil.copy(ROOT / "src/minigpt/attention.py", r / "src/minigpt/attention.py"),
        "src/minigpt/attention.py", "a copy of the course's src/minigpt/attention.py"),
    "reference package copied whole": (
        lambda r: (shutil.rmtree(r / "src/minigpt"), shutil.copytree(ROOT / "src/minigpt", r / "src/minigpt")),
        "src/minigpt/transformer.py", "differs from the export of notebooks/"),
    "reference code pasted into another file": (
        lambda r: (r / "src/coursekit/helpers.py").write_text("# handy\n" + (ROOT / "src/minigpt/tokens.py").read_text()),
        "src/coursekit/helpers.py", "solution code of 01-tokens"),
    "reference code on a website page": (
        lambda r: _page_with_solution(r / "docs/attention.html"),
        "docs/attention.html", "solution code of 03-attention"),
    "hidden check call in a page": (
        lambda r: (r / "docs/feedback.html").write_text("<p>check(&quot;x&quot;) check( 'test_bpe_merge', bpe_merge)</p>"),
        "docs/feedback.html", "calls the hidden test check('test_bpe_merge')"),
    "autograder file": (
        lambda r: (r / "tools").mkdir(exist_ok=True) or shutil.copytree(ROOT / "autograder/checks", r / "tools/autograder/checks"),
        "tools/autograder/checks/tokens.py", "under autograder/"),
    "autograder import": (
        lambda r: (r / "src/coursekit/grading.py").write_text("from autograder.checks import tokens\n"),
        "src/coursekit/grading.py", "from autograder"),
    "gradebook": (
        lambda r: (r / "gradebook.db").write_bytes(b"SQLite format 3\0"), "gradebook.db", "grading file"),
    "compiled reference": (
        lambda r: (r / "src/minigpt/__pycache__").mkdir() or (r / "src/minigpt/__pycache__/attention.cpython-311.pyc")
        .write_bytes(b"\0" * 100), "src/minigpt/__pycache__/attention.cpython-311.pyc", "compiled Python"),
}


@pytest.mark.parametrize("leak", LEAKS)
def test_the_scan_names_each_leak(copy, leak):
    plant, where, what = LEAKS[leak]
    plant(copy)
    findings = sr.scan(copy)
    assert any(f.startswith(where) and what in f for f in findings), "\n".join(findings) or "no findings"


def test_the_command_exits_1_on_a_leak(copy, capsys):
    """And a file that points to the course's repository (with the solutions), in any of its forms, is one."""
    (copy / "gradebook.db").write_bytes(b"")
    (copy / "README.md").write_text(f"Solutions: [here]({COURSE.replace('/', '%2F')}.git)\n")
    assert sr.main([str(copy), "--scan"]) == 1
    out = capsys.readouterr().out
    assert "LEAK gradebook.db: grading file" in out
    assert f"LEAK README.md: points to the course's repository {COURSE}, which holds the solutions" in out


def test_it_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert sr.main([str(tmp_path), "--no-book"]) == 2
    assert "refusing to write into" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_a_rebuild_clears_the_release_but_keeps_its_git_history(tmp_path):
    out = tmp_path / "release"
    assert sr.main([str(out), "--no-book"]) == 0
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "stale.txt").write_text("from an earlier release")
    assert sr.main([str(out), "--no-book"]) == 0
    assert (out / ".git" / "HEAD").is_file() and not (out / "stale.txt").exists()
    assert not (out / "docs").exists()


def test_a_website_needs_the_release_repository(tmp_path, capsys):
    assert sr.main([str(tmp_path / "release")]) == 2
    err = capsys.readouterr().err
    assert "make student-release RELEASE_URL=https://" in err and "--repository-url" in err, err
    assert not (tmp_path / "release").exists()


@pytest.mark.parametrize("url, message", [
    (COURSE, "the course's own repository (_config.yml's), which holds the solutions"),
    ("https://example.org/x", "no repository in it, only a host: give the repository's whole address"),
    ("https://example.org", "no repository in it"),
    ("github.com/org/repo", "an address without https://, where Binder clones the release over https"),
    ("ssh://git@github.com/org/repo", "an ssh address, where Binder clones the release over https"),
    ("git@github.com:org/repo.git", "an ssh address"),
    ("file:///srv/git/minigpt", "a file: address"),
    ("https://github.com/org/repo/tree/main", "not the repository's address: give https://github.com/org/repo"),
    ("https://gitlab.com/org/repo?x=1", "a query or a fragment"),
])
def test_a_repository_the_website_cannot_link_is_refused_before_anything_is_written(tmp_path, capsys, url,
                                                                                  message):
    assert sr.main([str(tmp_path / "release"), "--repository-url", url]) == 2
    err = capsys.readouterr().err
    assert err == f"student_release: --repository-url {url}: " + err.split(": ", 2)[2] and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "release").exists()


@pytest.mark.parametrize("url, binder", [
    ("https://github.com/school/minigpt", "https://mybinder.org/v2/gh/school/minigpt/main"),
    ("https://gitlab.com/school/minigpt", "https://mybinder.org/v2/gl/school%2Fminigpt/main"),
    ("https://gitlab.com/uni/dept/minigpt", "https://mybinder.org/v2/gl/uni%2Fdept%2Fminigpt/main"),  # a subgroup
    ("https://gitlab.com/uni/dept/minigpt.git", "https://mybinder.org/v2/gl/uni%2Fdept%2Fminigpt/main"),
    ("https://gitlab.school.edu/teach/minigpt",
     "https://mybinder.org/v2/git/https%3A%2F%2Fgitlab.school.edu%2Fteach%2Fminigpt/main"),
    ("https://bitbucket.org/school/minigpt", "https://mybinder.org/v2/git/https%3A%2F%2Fbitbucket.org%2Fschool%2Fminigpt/main"),
    ("https://codeberg.org/school/minigpt", "https://mybinder.org/v2/git/https%3A%2F%2Fcodeberg.org%2Fschool%2Fminigpt/main"),
    ("https://git.school.edu/teach/minigpt", "https://mybinder.org/v2/git/https%3A%2F%2Fgit.school.edu%2Fteach%2Fminigpt/main"),
])
def test_any_git_host_is_accepted_and_binder_opens_it(url, binder):
    """BinderHub's GitHub and GitLab providers for github.com and gitlab.com, any other host (Bitbucket, a GitLab of
    one's own, Gitea, Forgejo) as a plain git URL escaped whole (tests/test_site.py builds a release for a Gitea
    host)."""
    sr.check_repository_url(url)
    assert sr.binder_url(ROOT, url, "main", "notebooks/01-tokens/01-tokens.ipynb").split("?")[0] == binder


def test_a_release_whose_website_fails_to_build_leaves_nothing_that_looks_finished(tmp_path, capsys, monkeypatch):
    def fails(*args, **kwargs):
        raise sr.UsageError("the website did not build (jupyter-book exit 1):\nExtension error: the theme's")

    monkeypatch.setattr(sr, "build_website", fails)
    out = tmp_path / "release"
    assert sr.main([str(out), "--repository-url", URL]) == 2
    assert "Extension error: the theme's" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [sr.MARKER]  # and the next run may write there again
    assert sr.main([str(out), "--no-book"]) == 0


def test_a_failed_build_shows_the_end_of_its_log():
    """Sphinx's warnings, and the last lines, where an error that stopped the build says what it was."""
    log = "\n".join(["Running Sphinx", "page.md:3: WARNING: a warning", *[f"line {i}" for i in range(40)],
                     "Extension error (sphinx_book_theme): Provider not recognized in repository url",
                     "There was an error in building your book. Look above for the cause."])
    shown = sr.build_failure(log, Path("/nonexistent")).splitlines()
    assert shown[0] == "page.md:3: WARNING: a warning" and "line 5" not in shown
    assert shown[-2:] == ["Extension error (sphinx_book_theme): Provider not recognized in repository url",
                          "There was an error in building your book. Look above for the cause."]


def course_links(folder: Path) -> list[str]:
    """Every address in the text files of ``folder`` (links, buttons, bare URLs; HTML entities and %-escapes undone)
    that opens the course's repository: itself, or Binder (gh/, gl/, git/) on it, as 'file: address'."""
    course = urlparse(COURSE)
    path = course.path.strip("/")
    forms = [f"{course.netloc}/{path}", f"/v2/gh/{path}", f"/v2/gl/{path}"]  # git/ holds the address whole
    opens = re.compile("|".join(re.escape(form) for form in forms) + r"(?:\.git)?(?![\w-]|\.\w)", re.I)
    found = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts):
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for address in re.findall(r"(?:https?|git)(?::|%3A)[^\s\"'<>()\]]+", html.unescape(text), re.I):
            if opens.search(unquote(address)):
                found.append(f"{file.relative_to(folder)}: {address}")
    return found


def instructor_site(folder: Path) -> Path:
    """What `make course` builds, in small: a chapter page whose theme buttons open the course's repository, its
    issues and the page's own source on Binder, and whose exercise box opens the notebook there."""
    (folder / "book").mkdir(parents=True)
    (folder / "index.html").write_text('<html><body><a href="book/01-tokens.html">Tokens</a></body></html>')
    source = sr.binder_url(ROOT, COURSE, "main", f"book/{CHAPTERS[0]}.md")
    exercise = sr.binder_url(ROOT, COURSE, "main", f"notebooks/{CHAPTERS[0]}/{CHAPTERS[0]}.ipynb")
    (folder / "book" / f"{CHAPTERS[0]}.html").write_text(
        f'<html><body><a href="{html.escape(source)}">Binder</a><a href="{COURSE}">repository</a>'
        f'<a href="{COURSE}/issues/new?title=Issue%20on%20page">open issue</a>'
        f'<a class="binder-exercise-link" href="{html.escape(exercise)}">Launch on Binder</a></body></html>')
    return folder


def test_the_instructors_website_is_refused_naming_its_pages_and_what_to_run(tmp_path, capsys):
    """`make course`'s website opens the course's repository (the solutions) and chapter pages' sources the release
    does not have: --book-html refuses it, says why on which pages and what to type, and leaves no release."""
    site = instructor_site(tmp_path / "site")
    assert len(course_links(site)) == 4  # what the last test looks for, it finds
    out = tmp_path / "release"
    assert sr.main([str(out), "--repository-url", URL, "--book-html", str(site)]) == 2
    err = capsys.readouterr().err
    page = f"book/{CHAPTERS[0]}.html"
    assert f"refusing --book-html {site}: it is not a website built for the release {URL}" in err, err
    assert f"Binder opens book/{CHAPTERS[0]}.md, which the release does not have (on 1 page(s): {page})" in err
    assert f"Binder opens the course's repository {COURSE}, which holds the solutions (on 1 page(s): {page})" in err
    assert f"links to the course's repository {COURSE}, which holds the solutions (on 1 page(s): {page})" in err
    assert err.rstrip().endswith(f"make student-release RELEASE_URL={URL}"), err
    assert [p.name for p in out.iterdir()] == [sr.MARKER]


def test_a_copied_website_must_open_the_release_itself(tmp_path, capsys):
    """A website built for another learners' repository (or branch) is refused too, and --book-html without the
    release's address (the release fixture copies one built for the release)."""
    other = stand_in_site(tmp_path / "other", repository_url="https://github.com/example-school/last-year")
    assert sr.main([str(tmp_path / "a"), "--repository-url", URL, "--book-html", str(other), "--branch", "spring"]) == 2
    err = capsys.readouterr().err
    assert ("opens https://mybinder.org/v2/gh/example-school/last-year/main, not the release repository "
            f"{URL} (branch spring) (on 1 page(s): index.html)") in err, err
    assert err.rstrip().endswith(f"make student-release RELEASE_URL={URL} RELEASE_BRANCH=spring"), err
    assert sr.main([str(tmp_path / "b"), "--book-html", str(other)]) == 2
    assert "RELEASE_URL=https://HOST/OWNER/REPO" in capsys.readouterr().err
    inside = stand_in_site(tmp_path / "c" / "docs")  # an earlier release's website, left where the next run clears
    assert sr.main([str(tmp_path / "c"), "--repository-url", URL, "--book-html", str(inside)]) == 2
    assert "which this command clears first: copy it elsewhere" in capsys.readouterr().err
    assert (inside / "index.html").is_file()


def test_no_release_the_tests_built_opens_the_course_repository(release):
    """Every link of every release this file built (a website, none, a README with and without a Binder link)
    opens the release or elsewhere, never the instructor's repository."""
    built = list(dict.fromkeys(folder for folder in [release, *BUILT] if folder.is_dir()))
    assert release in built
    found = [f"{folder.name}/{link}" for folder in built for link in course_links(folder)]
    assert not found, "\n".join(found)
