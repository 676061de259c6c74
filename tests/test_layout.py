"""The autograder's folders show its sides: ``autograder/sandboxed/`` is all of it that enters a learner's sandbox,
and nothing there imports the grader's side (the judge, the checks, scoring...), which the sandbox does not hold:
an import of it would fail there, or, worse, would tempt someone to bind one more grader file into the sandbox."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from autograder import sandbox

PACKAGE = sandbox.PACKAGE_DIR
SANDBOXED = sandbox.SANDBOXED
# The one import of the grader's side allowed on the sandbox's side: plain `nbgrader autograde` (the trusted setting,
# no judge's socket) runs the judge in the learner's own kernel. In the sandbox there is always a socket, and
# autograder/trusted.py is not there to import.
TRUSTED_FALLBACK = {("hidden.py", "autograder.trusted")}
MODULE_NAME = re.compile(r"autograder(\.\w+)+")


def imported(path: Path, module: str) -> set[str]:
    """Every module the file ``path``, the module named ``module``, imports or names as a whole string
    (``importlib.import_module("autograder.judge")``): ``from X import a`` counts as ``X`` and ``X.a`` (``a`` may be a
    module); relative imports resolved."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([base] if base else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            names.add(node.value)
    return names


def grader_side(name: str) -> bool:
    """Whether ``name`` is a module of the autograder outside ``autograder.sandboxed`` (``autograder`` itself, the
    empty package, is in the sandbox too)."""
    return name.startswith("autograder.") and not (name + ".").startswith(f"autograder.{SANDBOXED.name}.")


def grader_imports(folder: Path = SANDBOXED) -> list[str]:
    """What the files of ``folder`` (the sandboxed package, or a copy of it) import of the grader's side."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        parts = ("autograder", SANDBOXED.name, *relative.with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name in sorted(imported(path, module)):
            allowed = any(relative.as_posix() == file and (name + ".").startswith(module + ".")
                          for file, module in TRUSTED_FALLBACK)
            if grader_side(name) and not allowed:
                found.append(f"{relative.as_posix()} imports {name}")
    return found


def test_the_sandboxed_side_imports_nothing_of_the_graders_side():
    assert grader_imports() == []


def test_the_check_finds_every_kind_of_import(tmp_path):
    """The check above, on a copy of the sandbox's side with one bad import of each kind added: each is found."""
    bad = {
        "hidden.py": "from autograder import judge\n",
        "wire.py": "import autograder.checks.tokens\n",
        "helpers/common.py": "from ... import scoring\n",
        "helpers/tokens.py": "from ...checks import tokens\n",
        "execute.py": "import importlib\nimportlib.import_module('autograder.grade')\n",
    }
    for path in SANDBOXED.rglob("*.py"):
        relative = path.relative_to(SANDBOXED).as_posix()
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text() + bad.get(relative, ""))
    assert grader_imports(tmp_path) == [
        "execute.py imports autograder.grade", "helpers/common.py imports autograder.scoring",
        "helpers/tokens.py imports autograder.checks", "helpers/tokens.py imports autograder.checks.tokens",
        "hidden.py imports autograder.judge", "wire.py imports autograder.checks.tokens"]


def test_the_sandbox_binds_exactly_the_sandboxed_folder(tmp_path):
    """Of the autograder, the sandbox's command binds the sandboxed folder and the package's (empty) __init__.py:
    every file of the one, nothing else."""
    args = sandbox.command(chapter="01-tokens", blocked=[], run_dir=tmp_path, notebook_name="01-tokens.ipynb",
                           cell_timeout=60, limits=sandbox.Limits(memory=1 << 30))
    bound = [Path(args[i + 1]) for i, arg in enumerate(args) if arg == "--ro-bind"]
    files = set()
    for path in bound:
        if path == PACKAGE or PACKAGE in path.parents:
            files |= {p for p in path.rglob("*") if p.is_file()} if path.is_dir() else {path}
    files = {p for p in files if "__pycache__" not in p.parts}
    expected = {PACKAGE / "__init__.py"} | {p for p in SANDBOXED.rglob("*")
                                             if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(map(str, files)) == sorted(map(str, expected))
    assert not imported(PACKAGE / "__init__.py", "autograder")  # in the sandbox too: it must not pull in the grader
