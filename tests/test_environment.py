"""The course's environments install what the tests ran with: pyproject.toml says which packages, constraints.txt
which versions, the Makefile installs torch's CPU build, and Binder's environment.yml is every pin, for pip."""
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import binder_environment  # noqa: E402

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA = re.compile(r"^(nvidia-|cuda-|triton$)")


def _pyproject_requirements() -> dict[str, SpecifierSet]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d).specifier for d in deps}


def _constraints(environment: dict) -> dict[str, str]:
    """name -> pinned version, for the lines of constraints.txt that apply on ``environment``."""
    pins = {}
    for line in binder_environment.pins(environment=environment):
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"constraints.txt pins exactly, not {line}"
        pins[req.name.lower().replace("_", "-")] = spec.version
    return pins


def _binder_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert conda == ["python=3.11", "pip"], f"conda-forge gives Python and pip only, not {conda}"
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


@pytest.mark.parametrize("platform", [{"sys_platform": "linux", "platform_machine": "x86_64"},
                                      {"sys_platform": "darwin", "platform_machine": "arm64"}])
def test_constraints_satisfy_pyproject_on_each_platform(platform):
    pins = _constraints(platform)
    for name, spec in _pyproject_requirements().items():
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert spec.contains(pins[name], prereleases=True), f"{name}=={pins[name]} does not satisfy {spec}"
    linux = platform["sys_platform"] == "linux"
    assert pins["torch"] == ("2.13.0+cpu" if linux else "2.13.0"), "Linux x86-64 gets torch's CPU build, only it"


def test_binder_environment_is_every_pin_of_constraints():
    assert binder_environment.main(["--check"]) == 0, "environment.yml is out of date: make environment.yml"
    pip = _binder_pip()
    assert pip[0] == f"--extra-index-url {CPU_INDEX}"
    assert {Requirement(line).name.lower().replace("_", "-") for line in pip[1:]} == set(
        _constraints(binder_environment.BINDER_PLATFORM))


def _make_env_plan(*variables: str) -> list[str]:
    """`make env`'s commands (dry run), a command continued over lines joined into one."""
    plan = subprocess.run(["make", "-n", "-B", ".venv/.installed", *variables], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    return plan.replace("\\\n", "").splitlines()


def _installs(plan: list[str]) -> list[str]:
    return [line for line in plan if " pip install " in line and "--upgrade pip" not in line]


def test_makefile_installs_torch_alone_from_the_cpu_index():
    """`make env` (dry run): torch with the CPU index and the constraints, then uv, then (with uv) the course without
    that index, each under the constraints. A torch step that fails stops there, saying how to ask for PyPI's."""
    installs = _installs(_make_env_plan())
    torch, hint = (part.strip() for part in installs[0].split(" || "))
    assert [torch, *installs[1:]] == [
        f".venv/bin/python -m pip install --quiet --no-deps --extra-index-url {CPU_INDEX} -c constraints.txt torch",
        ".venv/bin/python -m pip install --quiet -c constraints.txt uv",
        ".venv/bin/uv pip install --python .venv/bin/python --quiet --compile-bytecode -c constraints.txt "
        '-e ".[dev]"'], installs
    assert "make env TORCH_INDEX=" in hint and hint.rstrip().endswith("exit 1; }"), hint


def test_pypi_torch_only_when_asked_for(tmp_path):
    """`make env TORCH_INDEX=` (for a Python that PyTorch's index, or the copy pip has, has no CPU build for): no extra
    index, and every step under a copy of constraints.txt that differs in torch's lines only, which ask for 2.13.0
    without the CPU build's label (on Linux x86-64, PyPI's CUDA build)."""
    plan = _make_env_plan("TORCH_INDEX=")
    assert not [line for line in plan if "download.pytorch.org" in line]
    (sed,) = [line for line in plan if line.startswith("sed ")]
    command, out = sed.split(" > ")
    assert out == ".venv/constraints.txt"
    assert all(" -c .venv/constraints.txt " in line for line in _installs(plan))
    copy = tmp_path / "constraints.txt"
    subprocess.run(f"{command} > {copy}", shell=True, cwd=ROOT, check=True)
    original = (ROOT / "constraints.txt").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, copy.read_text().splitlines(), strict=True) if a != b]
    assert [b.split(" ;")[0] for a, b in changed] == ["torch==2.13.0"], changed
    assert all(a.startswith("torch==2.13.0+cpu ") for a, b in changed)


def _resolve(args: list[str], tmp_path: Path) -> dict[str, str]:
    """pip's plan for ``pip install args`` into an empty environment: name -> version. ``--retries 0``: where PyTorch's
    index cannot be reached (as on the course's build machines) each lookup fails at once instead of after 8 s."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--retries", "0", "--timeout", "5", "--report", str(report), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


@pytest.mark.slow
def test_the_makefile_torch_step_resolves_to_the_cpu_build_without_cuda_packages(tmp_path):
    plan = _resolve(["--extra-index-url", CPU_INDEX, "-c", "constraints.txt", "torch"], tmp_path)
    assert plan["torch"] == "2.13.0+cpu"
    assert not [name for name in plan if CUDA.match(name)], f"CUDA packages in the plan: {sorted(plan)}"


@pytest.mark.slow
def test_binder_pip_plan_is_exactly_the_tested_versions(tmp_path):
    """What repo2docker's pip would install from environment.yml equals constraints.txt, package for package."""
    requirements = tmp_path / "binder-requirements.txt"
    requirements.write_text("\n".join(_binder_pip()) + "\n")
    plan = _resolve(["-r", str(requirements)], tmp_path)
    assert plan == _constraints(binder_environment.BINDER_PLATFORM)
    assert not [name for name in plan if CUDA.match(name)]


# The Pythons the lock is for: pyproject's requires-python, tools/check_python.py and these agree.
SUPPORTED = ["3.11", "3.12", "3.13", "3.14"]


def _python_environment(python: str) -> dict:
    """Marker values of Linux x86-64 with ``python`` (the lock's markers split at minor versions only)."""
    return dict(binder_environment.BINDER_PLATFORM, python_version=python, python_full_version=f"{python}.5")


def test_requires_python_is_the_supported_range():
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    for python in SUPPORTED:
        assert spec.contains(f"{python}.5") and check_python.problem((*map(int, python.split(".")), 5)) is None
    for python in ("3.11.4", "3.15.0", "3.10.13"):
        assert not spec.contains(python) and check_python.problem(tuple(map(int, python.split(".")))) is not None


def _uv_plan(python: str, requirements: list[str], file: Path, *options: str) -> dict[str, str] | str:
    """uv's resolution of ``requirements`` for CPython ``python`` on Linux x86-64, wheels only, as `make env`'s uv step
    installs them on a fresh machine. ``--python``: this interpreter runs uv's resolver (wheels only: nothing is
    built); without it uv looks for a CPython ``python`` and, finding none, tries to download one (11 s here, where
    that download fails)."""
    file.write_text("\n".join(requirements) + "\n")
    proc = subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "compile", "--quiet", "--no-header",
                           "--no-annotate", "--python", sys.executable, "--python-version", python,
                           "--python-platform", "x86_64-manylinux_2_28", "--only-binary", ":all:", *options, str(file)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        return proc.stderr[-3000:]
    return {Requirement(line).name.lower().replace("_", "-"): next(iter(Requirement(line).specifier)).version
            for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")}


@pytest.mark.slow
@pytest.mark.parametrize("python", SUPPORTED[1:])  # 3.11: the Binder plan and the torch step above
def test_the_lock_resolves_on_each_supported_python(python, tmp_path):
    """uv's plan for Python ``python`` (wheels only, as `make env`'s uv step on a fresh machine) of every pin that
    applies there is exactly those pins: nothing missing, nothing added, no other version. torch is resolved alone,
    without its dependencies: on that Python's Linux x86-64 PyTorch's CPU index would give its CPU build (that index
    cannot be reached here), PyPI its CUDA build; either way a wheel of 2.13.0 must exist for it."""
    pins = [line for line in binder_environment.pins(environment=_python_environment(python))
            if Requirement(line).name != "torch"]
    plan = _uv_plan(python, pins, tmp_path / "pins.txt")
    assert isinstance(plan, dict), f"uv could not resolve the lock for Python {python}: {plan}"
    want = {Requirement(line).name.lower().replace("_", "-"): next(iter(Requirement(line).specifier)).version
            for line in pins}
    assert plan == want, {name: (plan.get(name), want.get(name)) for name in set(plan) | set(want)
                          if plan.get(name) != want.get(name)}
    assert _uv_plan(python, ["torch==2.13.0"], tmp_path / "torch.txt", "--no-deps") == {"torch": "2.13.0"}


import check_python  # noqa: E402 (tools/, on the path above)


@pytest.mark.parametrize("version, ok", [((3, 11, 7), True), ((3, 11, 5), True), ((3, 11, 2), False),
                                         ((3, 12, 1), True), ((3, 13, 0), True), ((3, 14, 0), True),
                                         ((3, 15, 0), False), ((3, 10, 13), False), ((2, 7, 18), False)])
def test_make_env_says_in_one_sentence_which_python_it_needs(version, ok, capsys):
    """Debian 12's own 3.11.2 is too old for a pin (soupsieve), torch 2.13.0 has no wheels past 3.14: said before
    anything is installed, instead of a resolver error minutes later (`make env` then turns to uv, below)."""
    message = check_python.problem(version + ("final", 0))
    if ok:
        assert message is None
    else:
        assert message == f"make env needs Python 3.11.5 to 3.14, found {'.'.join(map(str, version))}"
    assert check_python.SUPPORTED == f"Python 3.11.5 to {SUPPORTED[-1]}"


def _fake_uv(folder: Path, works: bool) -> Path:
    """A `uv` on PATH that records its arguments and, if ``works``, makes the venv as uv would (here from this
    interpreter): the real one downloads CPython from python-build-standalone."""
    folder.mkdir()
    uv = folder / "uv"
    make = f'for last; do :; done; "{sys.executable}" -m venv --without-pip "$last"' if works else "exit 2"
    uv.write_text(f'#!/bin/sh\necho "$@" > "{folder}/args"\n{make}\n')
    uv.chmod(0o755)
    return folder


@pytest.mark.parametrize("works", [True, False])
def test_an_unsupported_python_gets_a_managed_3_11_through_uv(works, tmp_path, monkeypatch, capsys):
    """Python 3.10 (or Debian 12's 3.11.2): .venv from the CPython 3.11 uv manages, said in one line; where uv cannot
    download it (offline), one sentence says which Python to install, and no half-made .venv is left."""
    uv = _fake_uv(tmp_path / "bin", works)
    monkeypatch.setenv("PATH", f"{uv}{os.pathsep}{os.environ['PATH']}")
    venv = tmp_path / ".venv"
    venv.mkdir()
    (venv / "stale").write_text("")
    message = check_python.make_venv(str(venv), (3, 10, 13, "final", 0))
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and said.startswith("Python 3.10.13 (") and said.rstrip().endswith(
        f"{venv} gets a CPython 3.11 that uv downloads and manages."), said
    assert (uv / "args").read_text().split() == ["venv", "--quiet", "--seed", "--managed-python", "--python", "3.11",
                                                 str(venv)]
    if works:
        assert message is None and (venv / "pyvenv.cfg").is_file() and not (venv / "stale").exists()
    else:
        assert message.startswith("make env needs Python 3.11.5 to 3.14, found 3.10.13, and uv could not download "
                                  "CPython 3.11: install Python 3.12 (")
        assert message.count(". ") == 0 and "\n" not in message, "one sentence"
        assert not venv.exists()


def test_the_makefiles_make_the_environment_with_the_interpreter_check(tmp_path):
    """The course's Makefile and the student release's make .venv with the script first (the release ships it); it
    passes with the interpreter this suite runs on."""
    from autograder.publish import student_release

    first = r"^{target}:.*\n\t@\$\(PYTHON\) tools/check_python.py {venv}\n\t{bin}/python -m pip "
    assert re.search(first.format(target=r"\$\(STAMP\)", venv=r"\$\(VENV\)", bin=r"\$\(BIN\)"),
                     (ROOT / "Makefile").read_text(), re.M)
    student_release.write_tooling(ROOT, tmp_path)
    assert re.search(first.format(target=r"\.venv/\.installed", venv=r"\.venv", bin=r"\.venv/bin"),
                     (tmp_path / "Makefile").read_text(), re.M)
    assert (tmp_path / "tools" / "check_python.py").read_bytes() == (ROOT / "tools" / "check_python.py").read_bytes()
    assert subprocess.run([sys.executable, str(ROOT / "tools" / "check_python.py")]).returncode == 0
