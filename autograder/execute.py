"""Runs inside the sandbox: execute one notebook with nbgrader's own Execute preprocessor, then hand the executed
notebook to the grader through the judge's socket (the sandbox has no other way out).

    python -m autograder.execute NOTEBOOK --timeout SECONDS

Nothing this sends is trusted: the grader takes from it only the outputs of the notebook's cells, checked and
cut down, to show them; scores come from the judge's verdicts.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from autograder import wire
from autograder.hidden import JUDGE_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.execute")
    parser.add_argument("notebook")
    parser.add_argument("--timeout", type=int, required=True, help="seconds per cell")
    args = parser.parse_args(argv)

    # jsonschema (through nbformat) loads rfc3987_syntax when it is installed, which builds a grammar for 1.5 s; a
    # notebook's validation needs none of its URI formats.
    sys.modules.setdefault("rfc3987_syntax", None)
    from nbgrader.preprocessors import Execute
    import nbformat

    nb = nbformat.read(args.notebook, as_version=4)
    status, detail = "ran", ""
    executor = Execute(timeout=args.timeout, kernel_name="python3")
    try:
        executor.preprocess(nb, {"metadata": {"path": os.path.dirname(os.path.abspath(args.notebook))}})
    except BaseException as err:  # noqa: BLE001 (a dead or deaf kernel: keep what ran until then)
        status, detail = "stopped", f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(os.environ[JUDGE_ENV])
        wire.send(sock, {"executed": nbformat.writes(nb), "status": status, "detail": detail[:500]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
