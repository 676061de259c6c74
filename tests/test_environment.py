"""The course's environments install what the tests ran with: pyproject.toml says which packages, constraints.txt
which versions, the Makefile installs torch's CPU build, and Binder's environment.yml is every pin, for pip."""
import json
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


def test_makefile_installs_torch_alone_from_the_cpu_index():
    """`make env` (dry run): torch with the CPU index and the constraints, then uv, then (with uv) the course without
    that index, each under the constraints."""
    plan = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    installs = [line for line in plan.splitlines() if " pip install " in line and "--upgrade pip" not in line]
    assert installs == [f".venv/bin/python -m pip install --quiet --no-deps --extra-index-url {CPU_INDEX} -c constraints.txt torch",
                        ".venv/bin/python -m pip install --quiet -c constraints.txt uv",
                        ".venv/bin/uv pip install --python .venv/bin/python --quiet --compile-bytecode -c constraints.txt "
                        '-e ".[dev]"'], installs


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


import check_python  # noqa: E402 (tools/, on the path above)


@pytest.mark.parametrize("version, ok", [((3, 11, 7), True), ((3, 11, 5), True), ((3, 11, 2), False),
                                         ((3, 12, 1), False), ((3, 13, 0), False), ((3, 10, 13), False)])
def test_make_env_says_in_one_sentence_which_python_it_needs(version, ok):
    """Debian 12's own 3.11.2 is too old for a pin, and 3.12 and later do not resolve the pins: said before anything
    is installed, instead of a resolver error minutes later."""
    message = check_python.problem(version + ("final", 0))
    if ok:
        assert message is None
    else:
        assert message.startswith("make env needs Python 3.11.5 or a later 3.11")
        assert f"found {'.'.join(map(str, version))}: run it as make env PYTHON=" in message
        assert message.count(". ") == 0 and "\n" not in message, "one sentence"


def test_the_makefiles_check_the_interpreter_before_they_build(tmp_path):
    """The course's Makefile and the student release's run the check first (the release ships the script); it
    passes with the interpreter this suite runs on."""
    from autograder import student_release

    first = r"^{target}:.*\n\t@\$\(PYTHON\) tools/check_python.py\n\trm -rf {venv}\n"
    assert re.search(first.format(target=r"\$\(STAMP\)", venv=r"\$\(VENV\)"), (ROOT / "Makefile").read_text(), re.M)
    student_release.write_tooling(ROOT, tmp_path)
    assert re.search(first.format(target=r"\.venv/\.installed", venv=r"\.venv"), (tmp_path / "Makefile").read_text(),
                     re.M)
    assert (tmp_path / "tools" / "check_python.py").read_bytes() == (ROOT / "tools" / "check_python.py").read_bytes()
    assert subprocess.run([sys.executable, str(ROOT / "tools" / "check_python.py")]).returncode == 0
