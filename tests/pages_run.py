"""Each chapter page run once per test session, on another of torch's kernel paths, for both files that need it.

``tests/test_kernel_paths.py`` needs every page's cells run, build-time assertions included, on the portable kernels
(``kernel_paths.OTHER``'s capability) on one thread; ``tests/test_site.py`` needs the pages executed to build the
website. One run serves both: ``run_page`` executes a page as the book build reads it (myst-nb's own reader, so the
notebook hashes as the build's does) and stores the executed notebook in a jupyter-cache shared by the session's
workers; the site's build then takes every page from that cache and runs none itself (it checks that). Whichever
worker asks for a page first runs it, under a lock of that page; the other waits for it and reads its result, a
failure included, so a page is never run twice nor reported differently by the two files.

The machine's own kernels (with every core on pages 1 to 4) run the pages in ``make course``, which also measures and
asserts the pages' claims about time; here the clocks are off (``coursekit.clocks``).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from pathlib import Path

import nbformat

from coursekit import clocks
from kernel_paths import OTHER, describe

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in (ROOT / "book").glob("*.md") if p.stem != "intro")  # the chapters and the capstone
TIMEOUT = 120  # a cell's limit, as the book build's (_config.yml: execute.timeout)
# One thread, whatever a page asks for: one core of the suite's two is this worker's. Two threads here, beside the
# suite's other worker on a 2-core machine, made the heaviest pages 3 to 6 times slower (chapter 7 took 490 s).
PATH = (OTHER[0], 1)  # OTHER's capability
WHERE = "import torch as _torch\nprint(_torch.backends.cpu.get_cpu_capability(), _torch.get_num_threads())"


def shared_folder(tmp_path_factory) -> Path:
    """A folder of this test session that every xdist worker sees (the workers' temporary folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "pages"
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_page(page: Path) -> nbformat.NotebookNode:
    """The page as the book build reads it (myst-nb's reader, with the book's MyST extensions)."""
    import yaml
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    extensions = config.get("parse", {}).get("myst_enable_extensions", [])
    return read_myst_markdown_notebook(page.read_text(encoding="utf-8"), MdParserConfig(enable_extensions=extensions),
                                       path=page)


def markdown_line(page: Path, source: str) -> int:
    """The line of the page's Markdown where cell ``source`` starts (0 when it cannot be found)."""
    text = page.read_text(encoding="utf-8")
    at = text.find(source.strip().splitlines()[0]) if source.strip() else -1
    return text.count("\n", 0, at) + 1 if at >= 0 else 0


def cache_folder(shared: Path) -> Path:
    return shared / ".jupyter_cache"


def run_page(page: Path, shared: Path) -> str:
    """Run ``page`` once per session on ``PATH`` (or read how its run went); "" when every cell ran, else the failure:
    the page, the cell's line in its Markdown source, the path (capability and threads) and the error."""
    result = shared / f"{page.stem}.json"
    with locked(shared / f"{page.stem}.lock"):
        if not result.is_file():
            start = time.monotonic()
            why = _execute(page, shared)
            result.write_text(json.dumps({"failure": why, "seconds": round(time.monotonic() - start, 1)}))
        return json.loads(result.read_text())["failure"]


def _execute(page: Path, shared: Path) -> str:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = read_page(page)
    capability, threads = PATH
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": str(threads),
           "TIKTOKEN_CACHE_DIR": str(ROOT / "src" / "coursekit" / "data" / "tiktoken"), "HF_HUB_OFFLINE": "1",
           clocks.ENV: "off"}  # the numbers, not the machine's speed
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3", record_timing=False)  # cells hash as read
    start = time.monotonic()
    with client.setup_kernel(env=env, cwd=str(page.parent)):  # the build's working folder: the page's
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as err:
                where = nbformat.v4.new_code_cell(WHERE)
                client.execute_cell(where, len(nb.cells))
                cap, n = "".join(o.get("text", "") for o in where.outputs).split() or ("?", "0")
                error = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()[-1]  # without its colours
                return (f"{page.relative_to(ROOT)}, the cell at line {markdown_line(page, cell.source)}, on "
                        f"{describe(cap.lower(), int(n))}: {error}\n{cell.source[-1500:]}")
    seconds = time.monotonic() - start
    with locked(shared / "cache.lock"):
        get_cache(str(cache_folder(shared))).cache_notebook_bundle(
            CacheBundleIn(nb, str(page), data={"execution_seconds": seconds}), check_validity=False, overwrite=True)
    return ""


def cached_pages(shared: Path) -> int:
    """How many executed notebooks the shared cache holds."""
    from jupyter_cache import get_cache

    with locked(shared / "cache.lock"):
        return len(get_cache(str(cache_folder(shared))).list_cache_records())
