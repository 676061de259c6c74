"""Write Binder's environment.yml from constraints.txt: Python and pip from conda-forge, every other package from
PyPI at the exact version the course was tested with (PyTorch's CPU build from PyTorch's CPU index).

    python tools/binder_environment.py            # rewrite environment.yml (make environment.yml)
    python tools/binder_environment.py --check    # exit 1 when environment.yml is not what constraints.txt gives

conda-forge would install whatever versions it has on the day Binder builds; pip with exact pins installs what
tests/test_environment.py resolved and the test suite ran with.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON = "3.11"
# What repo2docker builds on: constraints.txt's markers for Linux x86-64 and Python 3.11 (conda-forge's newest 3.11;
# the markers split at minor versions), whichever Python runs this.
BINDER_PLATFORM = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": PYTHON,
                   "python_full_version": f"{PYTHON}.5"}


def pins(constraints: Path = ROOT / "constraints.txt", environment: dict | None = None) -> list[str]:
    """The ``name==version`` lines of ``constraints`` that apply on ``environment`` (default: Binder's Linux x86-64)."""
    out = []
    for line in constraints.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(environment or BINDER_PLATFORM):
            out.append(f"{req.name}{req.specifier}")
    return out


def render(constraints: Path = ROOT / "constraints.txt") -> str:
    body = "\n".join(f"      - {pin}" for pin in pins(constraints))
    return f"""\
# The environment Binder (repo2docker) builds for this repository; postBuild then installs the course's own
# packages without their dependencies. Written by tools/binder_environment.py from constraints.txt (make
# environment.yml): only Python and pip come from conda-forge, every other package from PyPI at the version the
# tests ran with, torch as the CPU build from PyTorch's CPU index. tests/test_environment.py resolves it.
name: minigpt
channels:
  - conda-forge
dependencies:
  - python={PYTHON}
  - pip
  - pip:
      - --extra-index-url {TORCH_CPU_INDEX}
{body}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=ROOT / "environment.yml")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if args.out.read_text(encoding="utf-8") != text:
            print(f"{args.out} is out of date with constraints.txt: run `make environment.yml`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
