"""Several nbgrader commands in one process: `python -m autograder.nbgrader_steps NONCE '<json list of argument lists>'`,
or `python -m autograder.nbgrader_steps NONCE -` to read them one per line (a JSON list of arguments) from standard
input as they come, until it closes: a grader keeps such a process for a whole batch (``workspace.NbgraderSession``).

minigpt-grade runs nbgrader's own commands (generate_assignment, generate_feedback) on the instructor's side, never
on learner code. Started one process each, a class's chapters pay nbgrader's start-up (its imports, its config)
once per chapter and command; here they pay it once. Each command runs as the command line would run it (the
same application, the same config files from the current folder), and its output is followed by a line
``MARKER NONCE <index> exit <code> seconds <seconds>`` so that the caller can tell the commands' logs and results
apart; the nonce, new for each run, keeps any line a command prints (a notebook's text in a log) from posing as one.
"""
from __future__ import annotations

import json
import sys
import time

MARKER = "@@ minigpt-grade: nbgrader step"


def run_step(args: list[str]) -> int:
    """One nbgrader command line, in this process; its exit code."""
    from nbgrader.apps.nbgraderapp import NbGraderApp

    def forget() -> None:  # the apps are singletons: the next command must get new ones
        for app in [NbGraderApp, *(sub for sub, _ in NbGraderApp.subcommands.values() if isinstance(sub, type))]:
            app.clear_instance()

    forget()
    try:
        NbGraderApp.launch_instance(argv=list(args))
        return 0
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as err:  # noqa: BLE001 (reported as the command's failure, the next command still runs)
        print(f"{type(err).__name__}: {err}", flush=True)
        return 1
    finally:
        forget()


def main(argv: list[str] | None = None) -> int:
    nonce, steps = (sys.argv[1:] if argv is None else argv)
    steps = (json.loads(line) for line in sys.stdin) if steps == "-" else json.loads(steps)
    worst = 0
    for i, args in enumerate(steps):
        start = time.monotonic()
        code = run_step(args)
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"{MARKER} {nonce} {i} exit {code} seconds {time.monotonic() - start:.1f}", flush=True)
        worst = worst or code
    return worst


if __name__ == "__main__":
    sys.exit(main())
