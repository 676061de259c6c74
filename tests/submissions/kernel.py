"""A warm stand-in for the grading kernel: runs submission after submission of one chapter, each as a fresh kernel
would, in one process that imports torch once (``python kernel.py CONFIG``; `submissions.grading.WarmKernel` drives
it).

For each submission it gets the code cells of the notebook as the grader runs it (learner cells, given cells, test
cells whole: hidden part and visible tests) and runs them in order in an IPython shell reset as a new kernel's is
(empty namespace, execution count 1), with ipykernel's own compiler (so a learner's line is found and named as in
the kernel) and nbgrader's ways: an empty cell is not sent; a cell that raises is an error output and the next cell
still runs; a cell past its time limit is interrupted (KeyboardInterrupt). The hidden parts' ``check(...)`` calls
reach the judge that the test process serves on ``MINIGPT_JUDGE``, through the real wire, as from the sandbox. As in
the sandbox: a fresh empty working folder and home, ``NBGRADER_EXECUTION`` set, the reference modules of the chapter
and later ones replaced by the sandbox's own stubs, and of the autograder only its sandbox side. It answers with
each cell's execution count and error output, which the grader's own code turns into scores and messages.

What it cannot give each submission that a kernel has: a fresh interpreter. Modules stay imported; the state a
notebook may change in them (torch's generator, default dtype, grad mode, threads; numpy's and ``random``'s seeds;
warnings filters; the environment; open figures) is put back before each submission.

Requests (on the original stdin) and answers (on the original stdout) are JSON lines; a notebook's own stdin and
stdout are /dev/null.

``python kernel.py --zygote FD`` is where kernels start from: it imports what every kernel imports first (torch,
IPython), then forks a kernel for each request on the Unix socket FD, so that a kernel starts in a tenth of a second
instead of two (a test process starts two a chapter, twenty in all). A request is {"config", "env", "cwd"} with the new
kernel's stdin, stdout and stderr as file descriptors; the answer, its pid. The kernel forked runs as one started from
the command line would: that environment and working folder, nothing of the zygote's open, torch's threads unstarted.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.abc
import importlib.util
import json
import os
import random
import signal
import sys
import time
import traceback
import warnings


class HeldBack(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """What the sandbox does not offer: a blocked reference module imports the sandbox's stub (which raises), and an
    autograder module outside the sandbox's side is not there at all."""

    def __init__(self, stubs: dict[str, list[str]], sandbox_side: list[str]):
        self.stubs, self.sandbox_side = stubs, set(sandbox_side)  # stubs: {module: [its file, the stub's source]}

    def find_spec(self, name, path=None, target=None):
        if name in self.stubs:
            return importlib.util.spec_from_file_location(name, self.stubs[name][0], loader=self)
        parts = name.split(".")
        if parts[0] == "autograder" and len(parts) > 1 and parts[1] not in self.sandbox_side:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        file, source = self.stubs[module.__name__]
        exec(compile(source, file, "exec"), module.__dict__)  # noqa: S102


def interrupt(signum, frame):
    raise KeyboardInterrupt  # what nbgrader's Execute does to a cell past its time limit: interrupt the kernel


class Kernel:
    def __init__(self, config: dict):
        self.config = config
        self.environ = dict(os.environ)
        self.filters = list(warnings.filters)
        sys.path[0] = ""  # as in a kernel: the working folder first (not this file's folder)
        for name in config["stubs"]:
            sys.modules.pop(name, None)
        sys.meta_path.insert(0, HeldBack(config["stubs"], config["sandbox_side"]))
        import numpy
        import torch
        from IPython.core.interactiveshell import InteractiveShell
        from ipykernel.compiler import XCachingCompiler
        from traitlets.config import Config

        self.torch, self.numpy = torch, numpy
        self.torch_state = (torch.get_rng_state(), torch.get_default_dtype(), torch.get_num_threads())
        # ipykernel's compiler: cells named and cached as the kernel does, which is how a learner's line is found
        config = Config()
        config.HistoryManager.enabled = False
        self.shell = InteractiveShell.instance(config=config, compiler_class=XCachingCompiler)
        self.errors: list[dict] = []
        self.shell._showtraceback = lambda etype, evalue, stb: self.errors.append(
            {"output_type": "error", "ename": str(etype.__name__), "evalue": str(evalue), "traceback": stb})
        signal.signal(signal.SIGALRM, interrupt)
        self.settle()

    @staticmethod
    def settle() -> None:
        """What lives now (torch, IPython, the modules imported so far) lives on: out of the collector's reach, so that
        the full collections of a shell's reset and those the learner's code sets off walk only what came since (a
        quarter of a second each on torch's and IPython's objects, two or more a submission)."""
        gc.collect()
        gc.freeze()

    def fresh_state(self, home: str) -> None:
        torch = self.torch
        rng, dtype, threads = self.torch_state
        torch.set_rng_state(rng)
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(True)
        gc.enable()
        random.seed()
        self.numpy.random.seed()
        warnings.filters[:] = self.filters
        os.environ.clear()
        os.environ.update(self.environ)
        os.environ["HOME"] = home
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        for name in self.config["stubs"]:
            sys.modules.pop(name, None)

    def run(self, request: dict) -> dict:
        """Run one notebook's code cells; {index: {"count": n, "outputs": [error output]}} of the cells that ran."""
        home = request["home"]
        work = os.path.join(home, self.config["chapter"])
        os.makedirs(work)
        self.fresh_state(home)
        os.environ["MINIGPT_JUDGE"] = request["judge"]
        os.chdir(work)
        shell = self.shell
        shell.reset(new_session=True)  # as a new kernel: an empty namespace, execution count 1
        ran = {}
        for index, source in request["cells"]:
            if not source.strip():
                continue  # nbclient sends no empty cell to the kernel
            count, began = shell.execution_count, time.monotonic()
            self.errors.clear()
            signal.setitimer(signal.ITIMER_REAL, request["cell_timeout"])
            try:
                shell.run_cell(source, store_history=True)
            except KeyboardInterrupt:  # the time limit struck outside the cell's own code
                self.errors.append({"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                    "traceback": []})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            ran[index] = {"count": count, "outputs": list(self.errors), "seconds": time.monotonic() - began}
        shell.reset(new_session=False)  # the notebook's objects go now, not at the next one
        self.settle()  # what the notebook imported stays, as the modules before it did
        return {"cells": ran}


def main(config_text: str) -> None:
    config = json.loads(config_text)
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    with open(os.devnull, "r+") as devnull:  # a notebook's input() and print() reach neither
        os.dup2(devnull.fileno(), 0)
        os.dup2(devnull.fileno(), 1)
    kernel = Kernel(config)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in requests:
        try:
            reply = kernel.run(json.loads(line))
        except BaseException as err:  # noqa: BLE001 (the harness's own failure: say it, go on)
            reply = {"failed": f"{type(err).__name__}: {err}"}
        with contextlib.suppress(OSError):
            os.chdir("/")
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def zygote(channel_fd: int) -> None:
    import socket

    import numpy  # noqa: F401  (what Kernel imports, loaded once for every kernel forked from here)
    import torch  # noqa: F401  (no operation run: no thread pool for a fork to inherit)
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401
    from ipykernel.compiler import XCachingCompiler  # noqa: F401
    from traitlets.config import Config  # noqa: F401

    channel = socket.socket(fileno=channel_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # each kernel is reaped as it ends
    Kernel.settle()  # the modules' pages stay shared with every kernel
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 1 << 22, 3)
        if not message:
            return  # the test process has gone
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                channel.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, fd in enumerate(fds):  # stdin, stdout, stderr
                    os.dup2(fd, target)
                    os.close(fd)
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(request["cwd"])
                main(request["config"])
                code = 0
            except BaseException:  # noqa: BLE001 (said in the kernel's log; the test process sees it end)
                traceback.print_exc()
            os._exit(code)
        for fd in fds:
            os.close(fd)
        channel.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]))
    else:
        main(sys.argv[1])
