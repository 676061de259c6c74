"""Every chapter page's cells, build-time assertions included, run again on another of torch's kernel paths: the
portable kernels (``kernel_paths.OTHER``'s capability) on one thread, where the book build (tests/test_site.py) runs them
on the machine's own kernels (pages 1 to 4 on every core, the others on the one thread they ask for). A claim the page
asserts must hold on both. The clocks are off (``coursekit.clocks``): timing loops take one round and claims about
time are left to the build, which measures. Two threads here, beside the suite's other worker on a 2-core machine,
made the heaviest pages 3 to 6 times slower (chapter 7 took 490 s): the second thread count is the warm kernels' part
(``kernel_paths``), where the checks' tensors are small.

A failure names the page, the cell's line in its Markdown source, the path (capability and threads) and the error."""
import os
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from coursekit import clocks
from kernel_paths import OTHER, describe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in (ROOT / "book").glob("*.md") if p.stem != "intro")  # the chapters and the capstone
TIMEOUT = 120  # a cell's limit, as the book build's (_config.yml: execute.timeout)

# Run first, in the page's kernel: one thread, whatever the page asks for later.
ONE_THREAD = """\
import torch as _torch
_torch.set_num_threads(1)
_torch.set_num_threads = lambda n: None
"""
WHERE = "print(_torch.backends.cpu.get_cpu_capability(), _torch.get_num_threads())"


def markdown_line(page: Path, source: str) -> int:
    """The line of the page's Markdown where cell ``source`` starts (0 when it cannot be found)."""
    text = page.read_text(encoding="utf-8")
    at = text.find(source.strip().splitlines()[0]) if source.strip() else -1
    return text.count("\n", 0, at) + 1 if at >= 0 else 0


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_page_runs_and_its_assertions_hold_on_another_kernel_path(page):
    capability, _ = OTHER
    nb = jupytext.read(page)
    nb.cells.insert(0, nbformat.v4.new_code_cell(ONE_THREAD))
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, clocks.ENV: "off"}  # the numbers, not the machine's speed
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3")
    with client.setup_kernel(env=env, cwd=str(page.parent)):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as err:
                where = nbformat.v4.new_code_cell(WHERE)
                nb.cells.append(where)
                client.execute_cell(where, len(nb.cells) - 1)
                cap, threads = "".join(o.get("text", "") for o in where.outputs).split() or ("?", "0")
                error = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()[-1]  # without its colours
                pytest.fail(f"{page.relative_to(ROOT)}, the cell at line {markdown_line(page, cell.source)}, on "
                            f"{describe(cap.lower(), int(threads))}: {error}\n{cell.source[-1500:]}", pytrace=False)
