"""Binder's environment.yml, pyproject.toml and constraints.txt ask for the same packages and versions."""
import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> dict[str, SpecifierSet]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d).specifier for d in deps}


def _environment_requirements() -> dict[str, SpecifierSet]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    found = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if not line.startswith("-"):
                    req = Requirement(line)
                    found[req.name.lower()] = req.specifier
            continue
        _, name, spec = re.match(r"([A-Za-z0-9_.-]+)(.*)", dep).group(0, 1, 2)
        # conda's "=1.2.3" pins like pip's "==1.2.3"
        spec = re.sub(r"(?<![<>=!])=(?!=)", "==", spec)
        found[name.lower()] = SpecifierSet(spec)
    return found


def test_environment_matches_pyproject():
    env = _environment_requirements()
    assert env.pop("python") == SpecifierSet("==3.11")
    env.pop("pip")
    assert env == _pyproject_requirements()


def test_torch_is_the_cpu_build_everywhere():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "torch==2.13.0" in pip
    assert any("download.pytorch.org/whl/cpu" in line for line in pip)
    assert _pyproject_requirements()["torch"] == SpecifierSet("==2.13.0")


def test_constraints_satisfy_pyproject():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    for name, spec in _pyproject_requirements().items():
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert spec.contains(pins[name], prereleases=True), f"{name}=={pins[name]} does not satisfy {spec}"
