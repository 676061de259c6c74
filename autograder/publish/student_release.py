"""Build the student release: everything learners get, and nothing they must not see.

    python -m autograder.publish.student_release OUT --repository-url https://github.com/ORG/REPO [--branch main]
    python -m autograder.publish.student_release OUT --repository-url URL --book-html DIR  # a website built for URL
    python -m autograder.publish.student_release OUT --no-book                 # no website
    python -m autograder.publish.student_release OUT --scan                    # change nothing; scan OUT again

OUT becomes a repository of its own, pushed as it is: the learner notebooks (``notebooks/``, copied from the
committed nbgrader release), the learner's package ``src/minigpt`` (``minigpt-export`` of those notebooks,
so every exercise is a ``raise NotImplementedError()`` stub), ``src/coursekit`` (the tools, the offline data
and the shipped model), its own ``pyproject.toml``, Binder's ``environment.yml`` and ``postBuild``,
``constraints.txt``, a ``Makefile``, a learner README, a licence and the website in ``docs/``. The website is
built with the release's repository URL, so its Binder buttons open the release, not the course; a copied website
(``--book-html``) must be one built so: one whose links open another repository, such as ``make course``'s preview,
which opens the course's (the solutions), is refused.

It ends with a scan of OUT (``scan``) for solutions, hidden tests, grading code and copies of the reference
implementation; any finding makes the exit status 1. A usage problem exits 2. OUT is cleared on each run,
except its ``.git``, and only when this command made it (``.minigpt-student-release`` marks it).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import html
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml
from packaging.requirements import Requirement

from autograder.base import ANSI_ESCAPE, DEFAULT_CELL_TIMEOUT, DEFAULT_COURSE_ROOT
from autograder.intake import course_chapters as chapters
from coursekit import export

COURSE_ROOT = DEFAULT_COURSE_ROOT
MARKER = ".minigpt-student-release"
WEBSITE = "docs"  # GitHub Pages serves a branch's docs/ folder as it is
# Not for learners: the website's build (the release ships it built, without its sources) and minigpt-grade's
# process control, cluster and page sanitizer (the release has no autograder).
NOT_FOR_LEARNERS = {"jupyter-book", "jupytext", "psutil", "distributed", "nh3"}
# nbgrader's instructor tools (create assignment, formgrader, course list) hidden from the learners' JupyterLab; the
# assignment list (fetch, submit: a course's JupyterHub) and the Validate button stay. nbgrader is one package, its
# instructor side included (no pip option leaves it out): switched off and locked here, with nothing in the release
# for it to use (no gradebook, sources or hidden tests). Run in the environment's prefix, on Binder and locally.
LEARNER_LAB = ("jupyter labextension disable --level=sys_prefix @jupyter/nbgrader:formgrader "
               "@jupyter/nbgrader:create-assignment @jupyter/nbgrader:course-list\n"
               "jupyter labextension lock --level=sys_prefix @jupyter/nbgrader:formgrader "
               "@jupyter/nbgrader:create-assignment @jupyter/nbgrader:course-list\n"
               "jupyter server extension disable --sys-prefix nbgrader.server_extensions.formgrader "
               "nbgrader.server_extensions.course_list")
COPY_IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.pyc")

# What the scan looks for.
LEAK_TEXT = re.compile(r"BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN TESTS|END HIDDEN TESTS"
                       r"|\bfrom\s+autograder\b|\bimport\s+autograder\b")
GRADING_FOLDERS = {"autograder", "solutions", ".grading", "submitted", "autograded", "feedback"}
GRADING_FILES = {"gradebook.db", "nbgrader_config.py"}
MIN_SOLUTION_CHARS = 30  # shorter solution regions ("return x") could appear in any text
MIN_CHECK_STRING_CHARS = 40
MIN_COPIED_FILE_BYTES = 64  # smaller files (an empty __init__.py) say nothing about where they came from
_SOLUTION_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.M | re.S)
_BINDER_LINK = re.compile(r'href="([^"]*/v2/[^"]*\?urlpath=[^"]*)"')


class UsageError(Exception):
    """The command cannot do what it was asked (exit status 2)."""


# ---------------------------------------------------------------------------------------------------
# Building the release


def prepare(out: Path) -> None:
    """Empty OUT (all but ``.git``) if this command made it; refuse any other non-empty folder."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise UsageError(f"refusing to write into {out}: it is not empty and was not made by this command "
                             f"(no {MARKER} in it)")
        _empty(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("Made by the minigpt course's student release command, which rebuilds this folder "
                              "(all but .git) on each run.\n")


def _empty(out: Path) -> None:
    """Remove what this command wrote into OUT: all but ``.git`` (the release's own history, when the instructor
    made OUT a repository) and the marker that lets the next run write there again."""
    for child in out.iterdir() if out.is_dir() else ():
        if child.name in (".git", MARKER):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


THEME_PROVIDERS = ("github", "gitlab", "bitbucket")  # the hosts sphinx-book-theme recognises in an address


def check_repository_url(url: str) -> None:
    """The release's repository: an http(s) address of a repository (host, owner, name), on any git host BinderHub
    can clone (GitHub and GitLab by their own providers, any other, such as Gitea or Forgejo, as a plain git URL)."""
    parsed = urlparse(url)
    parts = [part for part in parsed.path.split("/") if part]
    example = "e.g. make student-release RELEASE_URL=https://github.com/ORG/REPO"
    if url.startswith("git@") or parsed.scheme not in ("http", "https"):
        kind = "an ssh address" if url.startswith("git@") or parsed.scheme == "ssh" else \
            f"a {parsed.scheme}: address" if parsed.scheme else "an address without https://"
        raise UsageError(f"--repository-url {url}: {kind}, where Binder clones the release over https: give the "
                         f"repository's https address, as a browser shows it ({example})")
    if not parsed.netloc or len(parts) < 2:
        raise UsageError(f"--repository-url {url}: no repository in it, only a host: give the repository's whole "
                         f"address, its owner and name (and GitLab's subgroups) after the host ({example})")
    if parsed.netloc.lower() == "github.com" and len(parts) != 2:
        raise UsageError(f"--repository-url {url}: a page inside a GitHub repository, not the repository's address: "
                         f"give https://github.com/{parts[0]}/{parts[1].removesuffix('.git')}")
    if parsed.query or parsed.fragment:
        raise UsageError(f"--repository-url {url}: a query or a fragment (?... or #...): give the repository's "
                         "address alone")


def check_course(course_root: Path) -> None:
    """Every chapter in solutions/ has its learner notebook (the release copies the committed ones)."""
    if not chapters(course_root):
        raise UsageError(f"no chapters in {course_root / 'solutions'}")
    for chapter in chapters(course_root):
        if not (course_root / "notebooks" / chapter / f"{chapter}.ipynb").is_file():
            raise UsageError(f"notebooks/{chapter}/{chapter}.ipynb is missing: run `make notebooks` to generate "
                             "the learner notebooks from solutions/")


def copy_notebooks(course_root: Path, out: Path) -> None:
    for chapter in chapters(course_root):
        shutil.copytree(course_root / "notebooks" / chapter, out / "notebooks" / chapter, ignore=COPY_IGNORE)


def release_dependencies(course_root: Path) -> list[str]:
    deps = tomllib.loads((course_root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return [d for d in deps if _requirement_name(d) not in NOT_FOR_LEARNERS]


def _requirement_name(line: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", line.strip()).group(0).lower()


def write_pyproject(course_root: Path, out: Path) -> None:
    project = tomllib.loads((course_root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    # Console scripts of the shipped packages whose module the release has (minigpt-grade needs the hidden checks).
    scripts = {name: target for name, target in project.get("scripts", {}).items()
               if (out / "src" / (target.split(":")[0].replace(".", "/") + ".py")).is_file()}
    deps = "".join(f"    {json.dumps(d)},\n" for d in release_dependencies(course_root))
    script_lines = "".join(f"{name} = {json.dumps(target)}\n" for name, target in scripts.items())
    (out / "pyproject.toml").write_text(f"""\
# The learner's copy of the minigpt course: the exercise notebooks, your own minigpt package (rebuilt from
# them by `minigpt-export notebooks src/minigpt`) and coursekit (the course's tools and offline data).
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "minigpt-course-student"
version = {json.dumps(project["version"])}
description = {json.dumps(project["description"])}
readme = "README.md"
requires-python = {json.dumps(project["requires-python"])}
license = {json.dumps(project["license"])}
dependencies = [
{deps}]

[project.scripts]
{script_lines}
[tool.setuptools]
package-dir = {{ "minigpt" = "src/minigpt", "coursekit" = "src/coursekit" }}
packages = ["minigpt", "coursekit", "coursekit.data.models", "coursekit.data.recorded", "coursekit.data.shakespeare",
            "coursekit.data.tiktoken"]

[tool.setuptools.package-data]
coursekit = ["data/**/*"]
""", encoding="utf-8")


def _binder_environment(course_root: Path):
    """tools/binder_environment.py: the pins of constraints.txt on Binder's platform, and its index and Python."""
    spec = importlib.util.spec_from_file_location("_binder_environment", course_root / "tools" / "binder_environment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def learner_pins(course_root: Path) -> list[str]:
    """The release's packages (pyproject.toml's, less NOT_FOR_LEARNERS) and everything they need on Binder's Linux,
    found from the installed packages' own requirements, each pinned as constraints.txt pins it. The course's
    build, test and grading tools (Sphinx, the book's themes, pytest, selenium, JupyterHub, nh3, Dask) are not among
    them."""
    binder = _binder_environment(course_root)
    pinned = {_canonical(Requirement(pin).name): pin for pin in binder.pins(course_root / "constraints.txt")}
    platform = {**binder.BINDER_PLATFORM, "python_version": binder.PYTHON}
    todo = [Requirement(d) for d in release_dependencies(course_root)]
    extras: dict[str, set[str]] = {}  # package -> the extras asked of it
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        if name in extras and set(req.extras) <= extras[name]:
            continue
        extras.setdefault(name, set()).update(req.extras)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            # needed on Binder's Python only, not installed on the one running this (overrides, below 3.12): pinned,
            # its own requirements unread here (pip on Binder still resolves them)
            requires = []
        for line in requires:
            need = Requirement(line)
            if need.marker is None or any(need.marker.evaluate({**platform, "extra": extra})
                                          for extra in extras[name] | {""}):
                todo.append(need)
    missing = sorted(set(extras) - set(pinned))
    if missing:
        raise UsageError(f"constraints.txt pins no version of {', '.join(missing)}, which the learners' packages "
                         "need: run make env and pin what it installed")
    return sorted(pinned[name] for name in extras)


def write_environment(course_root: Path, out: Path) -> None:
    """Binder's files for the release: the learners' packages only, pinned (see learner_pins)."""
    binder = _binder_environment(course_root)
    body = "\n".join(f"      - {pin}" for pin in learner_pins(course_root))
    (out / "environment.yml").write_text(f"""\
# The environment Binder (repo2docker) builds for this repository; postBuild then installs the course's packages
# (pyproject.toml) without their dependencies, which are these: what the learners' side needs and nothing of the
# course's own build, test and grading tools, each at the version the course was tested with, torch as its CPU build.
# repo2docker's own server packages (JupyterHub's single-user server) are left as repo2docker installs them;
# JupyterLab and Jupyter Server are pinned because nbgrader 0.9.6, whose learner side runs in them, needs them
# (JupyterLab 4.2 to 4: its extension is built for that).
name: minigpt
channels:
  - conda-forge
dependencies:
  - python={binder.PYTHON}
  - pip
  - pip:
      - --extra-index-url {binder.TORCH_CPU_INDEX}
{body}
""", encoding="utf-8")
    (out / "postBuild").write_text(f"""\
#!/usr/bin/env bash
# Binder runs this after building environment.yml: install the course's packages without touching the pinned
# dependencies above, and keep only the learner's side of nbgrader in JupyterLab.
set -euo pipefail
python -m pip install --no-deps -e .
{LEARNER_LAB}
""", encoding="utf-8")
    (out / "postBuild").chmod(0o755)
    shutil.copy2(course_root / "constraints.txt", out / "constraints.txt")


def write_tooling(course_root: Path, out: Path) -> None:
    (out / "tools").mkdir(exist_ok=True)
    shutil.copy(course_root / "tools" / "check_python.py", out / "tools" / "check_python.py")
    (out / "Makefile").write_text("""\
# Your copy of the minigpt course. `make env` once, `make lab` to work, `make package` after each chapter.
PYTHON ?= python3

.PHONY: env lab package model

env: .venv/.installed

# .venv from $(PYTHON) where it is Python 3.11.5 to 3.14, else from a CPython 3.11 that uv downloads (it says so).
# torch first, alone, from PyTorch's CPU index: constraints.txt asks for its CPU build on Linux x86-64 (192 MB),
# where PyPI's torch is a CUDA build of several GB.
.venv/.installed: pyproject.toml constraints.txt
\t@$(PYTHON) tools/check_python.py .venv
\t.venv/bin/python -m pip install --quiet --upgrade pip
\t.venv/bin/python -m pip install --quiet --no-deps --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt torch
\t.venv/bin/python -m pip install --quiet -c constraints.txt -e .
\t""" + LEARNER_LAB.replace("jupyter ", ".venv/bin/jupyter ").replace("\n", " >/dev/null 2>&1\n\t") + """ >/dev/null 2>&1
\ttouch $@

# Jupyter refuses to run as root unless told to: as root (a container), it is told to.
lab: env
\t.venv/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

# Your notebooks' `#| export` cells -> your package src/minigpt, which the next chapters import.
package: env
\t.venv/bin/minigpt-export notebooks src/minigpt

# A model like the course's, trained by your own chapter 8 code into my-model/ (training/README.md): hours on a CPU.
model: env
\t.venv/bin/python training/train_shipped_model.py --out my-model --run my-model-run
""", encoding="utf-8")
    (out / ".gitignore").write_text(".venv/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\nmy-model/\nmy-model-run/\n",
                                    encoding="utf-8")


TRAINING_README = """\
# Training a model like the course's

`train_shipped_model.py` is the script that trained the course's small model
(`src/coursekit/data/models/shakespeare-gpt/`) with chapter 8's functions. In your copy it runs **your** package:
once chapters 4 and 8 work (`make package`), `make model` trains a model of the same shape with your own
`minigpt.training` into `my-model/`, and leaves the course's model as it is. The full run takes a few hours on a
laptop's CPU; a short one shows the loss falling in minutes:

```
make model                                                    # the full run, into my-model/
.venv/bin/python training/train_shipped_model.py --steps 300 --out my-model --run my-model-run
.venv/bin/python training/train_shipped_model.py --help       # every option
```
"""


def write_training(course_root: Path, out: Path) -> None:
    """The script that trained the course's model (chapter 8 and the model's README point to it), run by the
    release's ``make model`` on the learner's own package, into a folder of its own."""
    (out / "training").mkdir(exist_ok=True)
    shutil.copy(course_root / "training" / "train_shipped_model.py", out / "training" / "train_shipped_model.py")
    (out / "training" / "README.md").write_text(TRAINING_README, encoding="utf-8")


def write_license(course_root: Path, out: Path) -> None:
    config = yaml.safe_load((course_root / "_config.yml").read_text(encoding="utf-8"))
    data = out / "src" / "coursekit" / "data"
    folders = sorted(str(readme.parent.relative_to(out)) for readme in data.rglob("README.md"))
    (out / "LICENSE").write_text(f"""\
MIT License

Copyright (c) {config.get("copyright", "")} {config.get("author", "")}

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
documentation files (the "Software"), to deal in the Software without restriction, including without limitation
the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and
to permit persons to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or substantial portions of
the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO
THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS
IN THE SOFTWARE.

The data the course ships has its own origin and terms, given by the README (and licence files) in each of
these folders: {", ".join(folders)}.
""", encoding="utf-8")


def write_readme(course_root: Path, out: Path, repository_url: str | None, branch: str, website: bool) -> None:
    names = chapters(course_root)
    first = f"notebooks/{names[0]}/{names[0]}.ipynb"
    binder = (f"[open this repository on Binder]({binder_url(course_root, repository_url, branch, first)})"
              if repository_url else "open this repository on Binder (mybinder.org)")
    site = ("The course website is in `docs/` (open `docs/index.html`), or wherever your instructor published it."
            if website else "Your instructor publishes the course website.")
    docs_row = "| `docs/` | the course website, built |\n" if website else ""
    (out / "README.md").write_text(f"""\
# minigpt: how a GPT writes, one token at a time

Build a GPT, piece by piece, until it writes text. This repository is the course's student release: the
exercise notebooks, your own `minigpt` package, and the course's tools and data.

{site}
Each chapter page explains one piece and ends with a box that opens its exercise notebook.
Chapters: {", ".join(f"`{n}`" for n in names)}; notebook `notebooks/NN-topic/NN-topic.ipynb` for each.

## Working on the exercises

- **On Binder**, with nothing to install: {binder}, or press "Launch on Binder" on the
  website. Binder sessions are temporary: download your notebooks before you stop.
- **On your own machine**, with `make` and Python 3.11.5 to 3.14 (with another, `make env` gets a 3.11 through
  uv): `make env` (a `.venv` with everything the course needs; CPU only, offline once installed), then
  `make lab` (JupyterLab on `notebooks/`).

In each notebook, replace every `raise NotImplementedError()` with your code and run the test cell under it.
A failed test names the call, what it returned and what was expected. Those tests are a sample: your
instructor grades with more.

Before you hand a notebook in, run it the way the grader will: from the top, in a fresh kernel (in JupyterLab,
Kernel > Restart Kernel and Run All Cells). Every test cell should pass, no cell should depend on one you ran
earlier and then deleted, and no cell should take more than {DEFAULT_CELL_TIMEOUT} seconds: the grader stops a
cell there.

## Your package

`src/minigpt/` is your own GPT: the `#| export` cells of your notebooks, one module per chapter. It starts as
stubs. After finishing a chapter, rebuild it (on Binder, in a terminal):

```sh
minigpt-export notebooks src/minigpt        # or: make package
```

Later chapters import the earlier ones (chapter 4 does `from minigpt.attention import ...`), so they run
your code. When chapters 2 to 5 work, `minigpt-generate $'Juliet.\\nO Romeo, Romeo,' --temperature 0` streams
text from the course's small Shakespeare model, computed by your own code (greedy: chapter 5's loop); once chapter
6 works, leave out `--temperature 0` and it samples (`minigpt-generate --help` lists the settings).

## Handing in

- **On your course's JupyterHub with nbgrader**: fetch each assignment in the Assignments tab, work on it
  there, and press Submit.
- **Otherwise**: download your notebook, keeping its name (such as `{names[0]}.ipynb`), and hand it in
  where your instructor says.

## What is here

| path | what it is |
|---|---|
| `notebooks/` | the exercise notebooks |
| `src/minigpt/` | your package, built from your notebooks |
| `src/coursekit/` | the course's tools and test helpers, and its offline data: GPT-2's tokenizer files, the Shakespeare corpus, the course's small model |
{docs_row}| `environment.yml`, `postBuild` | Binder's environment |
| `pyproject.toml`, `constraints.txt`, `Makefile`, `tools/` | your local environment (Python 3.11.5 to 3.14) |
| `training/` | the script that trained the course's model; `make model` runs it on your package |

Licence: `LICENSE` (MIT); the data's own terms are in the README of each folder under `src/coursekit/data/`.
""", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------
# The website


def _exercise_extension(course_root: Path):
    """book/_ext/exercise.py, whose binder_url the exercise boxes use: one rule for every Binder link."""
    spec = importlib.util.spec_from_file_location("_exercise_ext", course_root / "book" / "_ext" / "exercise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def binder_url(course_root: Path, repository_url: str, branch: str, path_in_repo: str) -> str:
    config = yaml.safe_load((course_root / "_config.yml").read_text(encoding="utf-8"))
    options = {"launch_buttons": config.get("launch_buttons", {}), "repository_url": repository_url,
               "repository_branch": branch}
    return _exercise_extension(course_root).binder_url(options, path_in_repo)


def release_book_config(course_root: Path, out: Path, repository_url: str, branch: str,
                        execution_cache: Path | None = None) -> dict:
    """The course's _config.yml with the release's repository, for a build whose Binder buttons open the release."""
    config = yaml.safe_load((course_root / "_config.yml").read_text(encoding="utf-8"))
    config.setdefault("repository", {}).update(url=repository_url, branch=branch)
    sphinx = config.setdefault("sphinx", {})
    # Jupyter Book resolves these against the config file's folder, which is a temporary one here.
    sphinx["local_extensions"] = {name: str((course_root / path).resolve())
                                  for name, path in (sphinx.get("local_extensions") or {}).items()}
    # The release does not have the chapter pages' sources (see book/_ext/exercise.py).
    sphinx.setdefault("config", {}).update(exercise_launch_buttons_only=True)
    if not any(provider in urlparse(repository_url).netloc.lower() for provider in THEME_PROVIDERS):
        # The theme stops at an address it does not recognise unless told a provider. GitHub's pattern gives the
        # right repository and issues links (owner/name, /issues) on Gitea and Forgejo too; the Binder links come
        # from book/_ext/exercise.py, which writes a plain git URL for any host but GitHub's and GitLab's.
        sphinx["recursive_update"] = True  # merge the theme option below into Jupyter Book's own, not replace them
        sphinx["config"].setdefault("html_theme_options", {})["repository_provider"] = "github"
    # The pages run the same code whatever the repository: reuse the course build's executed notebooks.
    config.setdefault("execute", {})["cache"] = str(execution_cache or course_root / "_build" / ".jupyter_cache")
    if out.resolve().is_relative_to(course_root):
        config.setdefault("exclude_patterns", []).append(str(out.resolve().relative_to(course_root)))
    return config


def build_website(course_root: Path, out: Path, repository_url: str, branch: str,
                  execution_cache: Path | None = None) -> None:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    if not jupyter_book.is_file():
        raise UsageError(f"{jupyter_book} is missing (make env installs it); or pass --book-html or --no-book")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(course_root / "src" / "coursekit" / "data" / "tiktoken"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MPLBACKEND", None)  # it would replace the notebooks' inline backend: no plots
    with tempfile.TemporaryDirectory(prefix="minigpt-student-book-") as tmp:
        config = Path(tmp) / "_config.yml"
        settings = release_book_config(course_root, out, repository_url, branch, execution_cache)
        config.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")
        print(f"building the website with repository {repository_url} (branch {branch}); minutes on a cold cache")
        proc = subprocess.run([str(jupyter_book), "build", "--all", "-W", "--keep-going", "--config", str(config),
                               "--path-output", tmp, str(course_root)],
                              cwd=course_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise UsageError(f"the website did not build (jupyter-book exit {proc.returncode}):\n"
                             + build_failure(proc.stdout, Path(tmp) / "_build" / "html" / "reports"))
        shutil.copytree(Path(tmp) / "_build" / "html", out / WEBSITE)


def build_failure(log: str, reports: Path) -> str:
    """Sphinx's warnings and, for each page whose code failed, the end of its traceback (in a folder about to go)."""
    lines = [ANSI_ESCAPE.sub("", line) for line in log.splitlines()]
    flagged = [line for line in lines if ": WARNING:" in line or ": ERROR:" in line]
    # and the end of the log, where an error that stopped Sphinx (an extension's, a theme's) says what it was
    shown = flagged + [line for line in lines[-30:] if line not in flagged and line.strip()]
    for report in sorted(reports.rglob("*.err.log")):
        tail = [ANSI_ESCAPE.sub("", line) for line in report.read_text(errors="replace").splitlines() if line.strip()]
        shown += [f"{report.relative_to(reports)}:"] + [f"    {line}" for line in tail[-3:]]
    return "\n".join(shown)


def course_repository(course_root: Path) -> str | None:
    """The course's own repository (``_config.yml``'s), with the solutions: no release may link to it."""
    config = yaml.safe_load((course_root / "_config.yml").read_text(encoding="utf-8"))
    return (config.get("repository") or {}).get("url") or None


def repository_address(url: str) -> re.Pattern:
    """Every way a text can point at the repository ``url``, once HTML entities and %-escapes are undone
    (``pointing``): its address (any scheme or case, with or without .git), or a launch link to it (Binder's
    ``gh/ORG/REPO``, ``gl/`` and its path, ``git/`` and its address; Colab's ``github/ORG/REPO``)."""
    parsed = urlparse(url)
    before = rf"(?:{re.escape(parsed.netloc)}/|/v2/g[hl]/|colab\.research\.google\.com/github/)"
    path = re.escape(parsed.path.strip("/").removesuffix(".git"))
    return re.compile(rf"{before}{path}(?:\.git)?(?![\w-]|\.\w)", re.I)  # not .../REPO-other, nor REPO.other


def pointing(text: str) -> str:
    """A text as the addresses in it read: HTML entities and %-escapes undone (Binder escapes a git URL whole)."""
    return unquote(html.unescape(text))


def website_problems(course_root: Path, out: Path, repository_url: str, branch: str) -> list[str]:
    """What on the release's website would send learners elsewhere: a Binder link that opens another repository or
    a file the release does not have, and any link to the course's own repository, which holds the solutions."""
    site = out / WEBSITE
    course = course_repository(course_root)
    to_course = repository_address(course) if course else None
    problems: dict[str, list[str]] = {}
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        name = page.relative_to(site).as_posix()
        binder = set(_BINDER_LINK.findall(text))
        for href in binder:
            href = pointing(href)
            path = href.split("urlpath=", 1)[1].split("tree/", 1)[-1]
            if not (out / path).is_file():
                problems.setdefault(f"Binder opens {path}, which the release does not have", []).append(name)
            if to_course and to_course.search(href):
                problems.setdefault(f"Binder opens the course's repository {course}, which holds the solutions",
                                    []).append(name)
            elif href != pointing(binder_url(course_root, repository_url, branch, path)):
                problems.setdefault(f"Binder opens {href.split('?', 1)[0]}, not the release repository "
                                    f"{repository_url} (branch {branch})", []).append(name)
        links = set(re.findall(r'(?:href|src)="([^"]*)"', text)) - binder
        if to_course and any(to_course.search(pointing(link)) for link in links):
            problems.setdefault(f"links to the course's repository {course}, which holds the solutions",
                                []).append(name)
    problems = {what: list(dict.fromkeys(pages)) for what, pages in problems.items()}  # a page with two such links
    return [f"{WEBSITE}/: {what} (on {len(pages)} page(s): {', '.join(pages[:3])}{', ...' if len(pages) > 3 else ''})"
            for what, pages in problems.items()]


# ---------------------------------------------------------------------------------------------------
# The scan


def _flat(text: str) -> str:
    """Words only: the same text matches whether it is code, Markdown or a rendered page."""
    return " ".join(re.findall(r"\w+", text))


def readable_text(path: Path, data: bytes) -> str | None:
    """What a reader sees in a file: a notebook's strings, a page's text without tags; None for binaries."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if path.suffix == ".ipynb":
        try:
            strings: list[str] = []
            _strings(json.loads(text), strings)
            return "\n".join(strings)
        except json.JSONDecodeError:
            return text
    if path.suffix in (".html", ".htm"):
        return html.unescape(re.sub(r"<[^>]+>", "", text))
    return text


def _strings(value, found: list[str]) -> None:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, list):
        for item in value:
            _strings(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, found)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if ".git" not in path.relative_to(folder).parts[:1] and (path.is_file() or path.is_symlink()):
            yield path


class Fingerprints:
    """What the hidden side of the course looks like: its files, solution code and check functions, and the address of
    the course's repository, where all of them are."""

    def __init__(self, course_root: Path):
        # Files the learner side has too are no clue: a data file nbgrader copies from solutions/ to
        # notebooks/, a module exported the same from both (a chapter with no exercise in it).
        learner_side = {_sha(p.read_bytes()) for folder in ("notebooks", "src/coursekit")
                        for p in _files(course_root / folder)}
        try:
            learner_side |= {_sha(text.encode()) for text in export.build_package(course_root / "notebooks").values()}
        except ValueError:
            pass  # no learner notebooks to export: nothing to allow
        self.copies: dict[str, str] = {}  # sha256 -> course path
        for folder in ("solutions", "autograder", "src/minigpt"):
            for path in _files(course_root / folder):
                data = path.read_bytes()
                if len(data) >= MIN_COPIED_FILE_BYTES and _sha(data) not in learner_side:
                    self.copies.setdefault(_sha(data), str(path.relative_to(course_root)))
        self.snippets: list[tuple[str, str]] = []  # (flat text, what it is)
        for nb in export.chapter_notebooks(course_root / "solutions"):
            cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
            for cell in cells:
                source = "".join(cell.get("source", []))
                for region in _SOLUTION_REGION.findall(source):
                    if len(_flat(region)) >= MIN_SOLUTION_CHARS:
                        self.snippets.append((_flat(region), f"solution code of {nb.parent.name}"))
        # What the course shows learners anyway: a check may word its messages like the lesson does.
        shipped = _flat("\n".join(readable_text(p, p.read_bytes()) or ""
                                  for folder in ("src/coursekit", "notebooks", "book")
                                  for p in _files(course_root / folder) if p.suffix in (".py", ".ipynb", ".md")))
        cells = []
        for check in sorted((course_root / "autograder" / "checks").glob("*.py")):
            where = f"autograder/checks/{check.name}"
            tree = ast.parse(check.read_text(encoding="utf-8"))
            cells += [(d.args[0].value, where) for node in tree.body if isinstance(node, ast.FunctionDef)
                      for d in node.decorator_list if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "cell"
                      and d.args and isinstance(d.args[0], ast.Constant)]
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = _flat(node.value)
                    # Text the learner side shows anyway (coursekit's own messages) says nothing hidden.
                    if len(text) >= MIN_CHECK_STRING_CHARS and text not in shipped:
                        self.snippets.append((text, f"text of {where}"))
        self.check_cells = dict(cells)
        self.course = course_repository(course_root)
        self.to_course = repository_address(self.course) if self.course else None
        # its owner's name, which every form of the address holds as typed: a quick first test (megabytes of corpus)
        self.course_owner = urlparse(self.course).path.strip("/").split("/")[0].lower() if self.course else ""
        # Hidden tests call `check("test_x", ...)` with the grade id of a cell the judge has checks for.
        self.check_call = (re.compile(r"\bcheck\s*\(\s*[\"'](" + "|".join(map(re.escape, sorted(self.check_cells)))
                                      + r")[\"']") if cells else None)


def scan(out: Path, course_root: Path = COURSE_ROOT) -> list[str]:
    """Every place in OUT that holds something learners must not see, as 'path: what'. Empty when clean."""
    out = Path(out)
    prints = Fingerprints(course_root)
    findings = []
    for path in _files(out):
        rel = path.relative_to(out).as_posix()
        parts = set(path.relative_to(out).parts)
        for folder in sorted(parts & GRADING_FOLDERS):
            findings.append(f"{rel}: under {folder}/ (the grading side of the course)")
        if path.name in GRADING_FILES:
            findings.append(f"{rel}: grading file")
        if path.suffix == ".pyc":
            findings.append(f"{rel}: compiled Python (could hold any code)")
        if path.is_symlink():
            findings.append(f"{rel}: a symbolic link (the release must hold real files)")
            continue
        data = path.read_bytes()
        copied = prints.copies.get(_sha(data)) if len(data) >= MIN_COPIED_FILE_BYTES else None
        if copied:
            findings.append(f"{rel}: a copy of the course's {copied}")
        text = readable_text(path, data)
        if text is None:
            continue
        raw = data.decode("utf-8")
        if prints.to_course and prints.course_owner in raw.lower() and prints.to_course.search(pointing(raw)):
            findings.append(f"{rel}: points to the course's repository {prints.course}, which holds the solutions")
        # (the substring tests first: the regular expressions are slow on megabytes of corpus)
        markers = LEAK_TEXT.findall(text) if any(k in text for k in ("SOLUTION", "HIDDEN", "autograder")) else []
        for marker in sorted(set(markers)):
            findings.append(f"{rel}: {marker!r}")
        flat = _flat(text)
        words = set(flat.split())  # a cheap first test: a snippet's words must all be in the file
        findings += [f"{rel}: {what}" for snippet, what in prints.snippets
                     if words.issuperset(snippet.split()) and snippet in flat]
        if prints.check_call and "check" in text:
            for name in sorted(set(prints.check_call.findall(text))):
                findings.append(f"{rel}: calls the hidden test check({name!r}) ({prints.check_cells[name]})")
    return findings + package_findings(out) + stub_findings(out)


def package_findings(out: Path) -> list[str]:
    """src/minigpt must be exactly what the release's notebooks export: stubs, not the reference."""
    if not (out / "notebooks").is_dir():
        return ["notebooks/: missing"]
    try:
        want = export.build_package(out / "notebooks")
    except ValueError as err:
        return [f"notebooks/: the learner's package cannot be exported from them ({err})"]
    why = {
        "missing": "missing (run minigpt-export notebooks src/minigpt)",
        "not exported": "not exported from notebooks/ (the learner's package is only that)",
        "differs": "differs from the export of notebooks/ (the reference, or edited?)",
    }
    return [f"src/minigpt/{name}: {why[kind]}"
            for name, kind in export.differences(want, out / "src" / "minigpt").items()]


def stub_findings(out: Path) -> list[str]:
    """Every code cell nbgrader marks as a solution must be a stub in the learner notebooks."""
    findings = []
    for nb in sorted((out / "notebooks").rglob("*.ipynb")):
        rel = nb.relative_to(out).as_posix()
        try:
            cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError) as err:
            findings.append(f"{rel}: not a readable notebook ({err})")
            continue
        for i, cell in enumerate(cells):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            source = "".join(cell.get("source", []))
            if cell.get("cell_type") == "code" and meta.get("solution") and "raise NotImplementedError()" not in source:
                findings.append(f"{rel}: solution cell {meta.get('grade_id', i)} has no `raise NotImplementedError()` "
                                "stub (does it hold the answer?)")
    return findings


# ---------------------------------------------------------------------------------------------------
# The command


def build(out: Path, course_root: Path = COURSE_ROOT, repository_url: str | None = None, branch: str = "main",
          book_html: Path | None = None, no_book: bool = False, execution_cache: Path | None = None) -> None:
    """Write the student release into OUT.

    ``book_html``: a website already built for ``repository_url``, copied instead of building one (a website whose
    links open anything else is refused); ``execution_cache``: jupyter-cache folder for the website's pages (default:
    the course build's own).
    """
    check_course(course_root)
    if not (no_book or repository_url):
        raise UsageError("the website's Binder buttons need the release repository, where OUT will be pushed: "
                         "make student-release RELEASE_URL=https://HOST/OWNER/REPO (here: --repository-url URL), or "
                         "--no-book")
    if repository_url:
        check_repository_url(repository_url)
        course = course_repository(course_root)
        if course and repository_address(course).search(repository_url):
            raise UsageError(f"--repository-url {repository_url}: the course's own repository (_config.yml's), which "
                             "holds the solutions: push the release to a repository of its own "
                             "(e.g. make student-release RELEASE_URL=https://github.com/ORG/minigpt-learners)")
    if book_html and not (Path(book_html) / "index.html").is_file():
        raise UsageError(f"{book_html} is not a built website (no index.html in it)")
    if book_html and Path(book_html).resolve().is_relative_to(Path(out).resolve()):
        raise UsageError(f"--book-html {book_html} is inside {out}, which this command clears first: copy it elsewhere")
    prepare(out)
    try:
        _write_release(out, course_root, repository_url, branch, book_html, no_book, execution_cache)
    except BaseException:
        _empty(out)  # nothing half-built that looks like a release
        raise


def _write_release(out: Path, course_root: Path, repository_url: str | None, branch: str, book_html: Path | None,
                   no_book: bool, execution_cache: Path | None) -> None:
    copy_notebooks(course_root, out)
    shutil.copytree(course_root / "src" / "coursekit", out / "src" / "coursekit", ignore=COPY_IGNORE)
    export.write_package(out / "notebooks", out / "src" / "minigpt")
    write_pyproject(course_root, out)
    write_environment(course_root, out)
    write_tooling(course_root, out)
    write_training(course_root, out)
    write_license(course_root, out)
    write_readme(course_root, out, repository_url, branch, website=not no_book)
    if no_book:
        return
    if book_html:
        shutil.copytree(book_html, out / WEBSITE, ignore=shutil.ignore_patterns(".buildinfo"))
    else:
        build_website(course_root, out, repository_url, branch, execution_cache)
    (out / WEBSITE / ".nojekyll").write_text("")  # GitHub Pages would hide _static/ and _images/
    problems = "\n".join(website_problems(course_root, out, repository_url, branch))
    if problems and book_html:
        make = f"make student-release RELEASE_URL={repository_url}"
        make += f" RELEASE_BRANCH={branch}" if branch != "main" else ""
        raise UsageError(f"refusing --book-html {book_html}: it is not a website built for the release "
                         f"{repository_url}, and learners would follow its links:\n{problems}\n"
                         "The website make course builds is the instructor's preview: its buttons open the course's "
                         "repository, and its chapter pages' launch buttons open sources the release does not have. "
                         f"Build the release's own website instead (it reuses the pages make course executed): {make}")
    if problems:
        raise UsageError(f"the website built for the release would send learners elsewhere:\n{problems}")


def size(folder: Path) -> str:
    total = sum(p.stat().st_size for p in _files(folder) if p.is_file())
    return f"{total / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.publish.student_release",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write (made by this command, or empty)")
    parser.add_argument("--repository-url", help="where OUT will be pushed (Binder buttons open it)")
    parser.add_argument("--branch", default="main", help="the branch of that repository (default: main)")
    website = parser.add_mutually_exclusive_group()
    website.add_argument("--book-html", type=Path, help="copy this website, already built for --repository-url (such "
                         "as an earlier release's docs/), instead of building one; a website whose links open "
                         "another repository or files the release lacks (make course's preview) is refused")
    website.add_argument("--no-book", action="store_true", help="no website in the release")
    parser.add_argument("--scan", action="store_true", help="change nothing: scan OUT and report")
    parser.add_argument("--course-root", type=Path, default=COURSE_ROOT)
    args = parser.parse_args(argv)
    root, out = args.course_root.resolve(), args.out.resolve()
    try:
        if not args.scan:
            build(out, root, args.repository_url, args.branch, args.book_html, args.no_book)
        elif not (out / MARKER).is_file():
            raise UsageError(f"{out} is not a student release (no {MARKER} in it)")
    except UsageError as err:
        print(f"student_release: {err}", file=sys.stderr)
        return 2
    findings = scan(out, root)
    for finding in findings:
        print(f"LEAK {finding}")
    if findings:
        print(f"{out}: {len(findings)} finding(s); do not publish it", file=sys.stderr)
        return 1
    print(f"{out}: student release, {size(out)}, {len(chapters(root))} chapters; the scan found nothing hidden")
    return 0


if __name__ == "__main__":
    sys.exit(main())
