"""Runs inside the sandbox: execute one notebook as nbgrader's Execute preprocessor does, then hand the executed
notebook to the grader through the judge's socket (the sandbox has no other way out).

nbgrader's ``Execute`` is nbclient's ``NotebookClient`` with a few settings and one hook; importing it costs 1.6 s
(the ``nbgrader`` package loads its server extensions, its database layer and nbconvert), nbclient alone 0.4 s, and
every sandboxed notebook pays it. So this runs nbclient with Execute's settings and hook (``Executor``);
``tests/test_execute.py`` checks they are still the ones nbgrader's version has.

    python -m autograder.sandboxed.execute NOTEBOOK --timeout SECONDS

Nothing this sends is trusted: the grader takes from it only the outputs of the notebook's cells, checked and
cut down, to show them; scores come from the judge's verdicts.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys

# jsonschema (through nbformat) loads rfc3987_syntax when it is installed, which builds a grammar for 1.5 s; a
# notebook's validation needs none of its URI formats.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbformat import NotebookNode  # noqa: E402

from autograder.sandboxed import wire  # noqa: E402
from autograder.sandboxed.hidden import JUDGE_ENV  # noqa: E402


# nbgrader 0.9's Execute: its settings that differ from nbclient's defaults
EXECUTE_SETTINGS = {
    "interrupt_on_timeout": True,
    "allow_errors": True,
    "raise_on_iopub_timeout": True,
    "error_on_timeout": {
        "ename": "CellTimeoutError",
        "evalue": "",
        "traceback": ["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel before timeout"],
    },
}


class Executor(NotebookClient):
    """nbgrader's ``Execute`` without nbgrader: nbclient with ``EXECUTE_SETTINGS`` and Execute's hook."""

    def on_cell_executed(self, **kwargs):
        """An error the kernel replied with but did not show (a timeout's) is added to the cell's outputs."""
        cell, reply = kwargs["cell"], kwargs["execute_reply"]
        if reply["content"]["status"] == "error" and not any(
                o.output_type == "error" and o.ename == reply["content"]["ename"] for o in cell.outputs):
            cell.outputs.append(NotebookNode(
                output_type="error", ename=reply["content"]["ename"], evalue=reply["content"]["evalue"],
                traceback=reply["content"]["traceback"] or ["ERROR: An error occurred while showtraceback was disabled"]))


def run_notebook(nb: NotebookNode, timeout: int, folder: str, started=lambda: None) -> None:
    """Execute ``nb`` in place in a python3 kernel started in ``folder``, as nbgrader's Execute preprocessor (through
    nbconvert's ``ExecutePreprocessor.preprocess``) does: every cell with ``store_history``, so that execution
    counts are the kernel's. ``started()`` is called once the kernel answers, before its first cell."""
    client = Executor(nb, timeout=timeout, kernel_name="python3", kernel_manager_class=AsyncKernelManager,
                      resources={"metadata": {"path": folder}}, **EXECUTE_SETTINGS)
    with client.setup_kernel():
        info = client.wait_for_reply(client.kc.kernel_info())
        nb.metadata["language_info"] = info["content"]["language_info"]
        started()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index, store_history=True)
    client.set_widgets_metadata()


def tell_started() -> None:
    """Tell the judge that the kernel answers, before any cell of the notebook runs: whatever stops the run after
    this is the notebook's doing (recorded as its error), where a kernel that never answered is the machine's (the
    notebook is run again). Sent before the learner's code runs, so it cannot be withheld; sent again by that code,
    it can only make a run the learner broke count as theirs."""
    with contextlib.suppress(OSError, wire.WireError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(os.environ[JUDGE_ENV])
        wire.send(sock, {"started": True})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.sandboxed.execute")
    parser.add_argument("notebook")
    parser.add_argument("--timeout", type=int, required=True, help="seconds per cell")
    args = parser.parse_args(argv)

    nb = nbformat.read(args.notebook, as_version=4)
    status, detail = "ran", ""
    try:
        run_notebook(nb, args.timeout, os.path.dirname(os.path.abspath(args.notebook)), started=tell_started)
    except BaseException as err:  # noqa: BLE001 (a dead or deaf kernel: keep what ran until then)
        status, detail = "stopped", f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ[JUDGE_ENV])
        wire.send(sock, {"executed": nbformat.writes(nb), "status": status, "detail": detail[:500]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
