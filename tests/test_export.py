"""The export step: solutions/ -> the reference package, a learner's notebooks -> their own package."""
import importlib.util
import json
import sys

import pytest

from coursekit import export

ROOT = export.Path(__file__).resolve().parents[1]


def test_reference_package_is_in_sync_with_the_solutions():
    diffs = export.drift(ROOT / "solutions", ROOT / "src" / "minigpt")
    assert not diffs, ("src/minigpt differs from what solutions/ exports; run `make notebooks`:\n"
                       + "".join(diffs)[:3000])


def test_check_mode_reports_drift(tmp_path, capsys):
    pkg = tmp_path / "minigpt"
    assert export.main([str(ROOT / "solutions"), str(pkg)]) == 0
    assert export.main([str(ROOT / "solutions"), str(pkg), "--check"]) == 0
    (pkg / "tokens.py").write_text((pkg / "tokens.py").read_text() + "\nx = 1\n")
    (pkg / "stale.py").write_text("")
    assert export.main([str(ROOT / "solutions"), str(pkg), "--check"]) == 1
    out = capsys.readouterr().out
    assert "-x = 1" in out and "stale.py" in out and "out of date" in out
    export.main([str(ROOT / "solutions"), str(pkg)])
    assert not (pkg / "stale.py").exists()
    assert export.drift(ROOT / "solutions", pkg) == []


def _notebook(tmp_path, name, cells):
    folder = tmp_path / name
    folder.mkdir(parents=True)
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": c}
                    for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / f"{name}.ipynb").write_text(json.dumps(nb))
    return folder / f"{name}.ipynb"


def test_export_keeps_solution_code_drops_markers_and_other_cells(tmp_path):
    _notebook(tmp_path, "02-word-vectors", [
        "#| export\nimport math\n",
        "print('not exported')",
        "#| export\ndef f(x):\n    ### BEGIN SOLUTION\n    return math.sqrt(x)\n    ### END SOLUTION\n",
    ])
    files = export.build_package(tmp_path)
    assert set(files) == {"__init__.py", "word_vectors.py"}
    body = files["word_vectors.py"]
    assert "return math.sqrt(x)" in body and "BEGIN SOLUTION" not in body and "not exported" not in body
    assert "CHAPTERS = {'02-word-vectors': 'word_vectors'}" in files["__init__.py"]


def test_a_chapter_without_exported_cells_has_no_module(tmp_path):
    """The capstone exports nothing: it is left out of the package and of CHAPTERS, and the order stays."""
    _notebook(tmp_path, "01-tokens", ["#| export\nX = 1\n"])
    _notebook(tmp_path, "08-capstone", ["print('runs the learner package, exports nothing')"])
    files = export.build_package(tmp_path)
    assert set(files) == {"__init__.py", "tokens.py"}
    assert "CHAPTERS = {'01-tokens': 'tokens'}" in files["__init__.py"]


def test_imports_of_earlier_chapters_become_relative(tmp_path):
    _notebook(tmp_path, "04-model", ["#| export\nfrom minigpt.attention import CausalSelfAttention\n"
                                     "def f():\n    from minigpt.tokens import Tokenizer\n    return Tokenizer\n"])
    body = export.build_package(tmp_path)["model.py"]
    assert "from .attention import CausalSelfAttention" in body
    assert "    from .tokens import Tokenizer" in body and "minigpt." not in body
    _notebook(tmp_path / "x", "04-model", ["#| export\nimport minigpt.attention\n"])
    with pytest.raises(ValueError, match="from minigpt.<module> import"):
        export.build_package(tmp_path / "x")


def test_export_refuses_hidden_tests_and_bad_names(tmp_path):
    _notebook(tmp_path / "a", "01-x", ["#| export\n### BEGIN HIDDEN TESTS\nassert 1\n### END HIDDEN TESTS\n"])
    with pytest.raises(ValueError, match="hidden tests"):
        export.build_package(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no chapter notebook"):
        export.build_package(tmp_path / "empty")
    with pytest.raises(ValueError, match="NN-topic"):
        export.module_name(export.Path("tokens.ipynb"))
    (tmp_path / "b" / "01-bad").mkdir(parents=True)
    (tmp_path / "b" / "01-bad" / "01-bad.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable notebook"):
        export.build_package(tmp_path / "b")


def test_learner_notebooks_export_to_a_package_of_stubs(tmp_path):
    """The released notebooks export to an importable package whose functions are still to be written."""
    pkg = tmp_path / "my_minigpt"
    export.write_package(ROOT / "notebooks", pkg)
    spec = importlib.util.spec_from_file_location("my_minigpt", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_minigpt"] = module
    try:
        spec.loader.exec_module(module)
        assert module.CHAPTERS["01-tokens"] == "tokens"
        tokens = importlib.import_module("my_minigpt.tokens")
        assert tokens.__name__ == "my_minigpt.tokens"
        assert tokens.load_gpt2_ranks()[b" the"] == 262  # given code is exported as it is
        with pytest.raises(NotImplementedError):
            tokens.pre_split("hello")
        with pytest.raises(NotImplementedError):
            tokens.gpt2_tokenizer().encode("hello")
    finally:
        for name in [n for n in sys.modules if n == "my_minigpt" or n.startswith("my_minigpt.")]:
            del sys.modules[name]


def test_learner_notebooks_never_overwrite_the_reference_package(tmp_path):
    """In a course folder (solutions/ beside src/minigpt), only the solutions may be exported into src/minigpt.
    Tried on a copy of the course's layout, so that a regression cannot wipe the real reference."""
    import shutil

    from coursekit.export import check_not_reference, write_package

    with pytest.raises(ValueError, match="reference package"):  # the real layout, checked without writing
        check_not_reference(ROOT / "notebooks", ROOT / "src" / "minigpt")
    course = tmp_path / "course"
    shutil.copytree(ROOT / "notebooks", course / "notebooks")
    (course / "solutions").mkdir()
    shutil.copytree(ROOT / "src" / "minigpt", course / "src" / "minigpt", ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.name: p.read_text() for p in (course / "src" / "minigpt").glob("*.py")}
    with pytest.raises(ValueError, match="reference package.* export your notebooks into another folder"):
        write_package(course / "notebooks", course / "src" / "minigpt")
    assert {p.name: p.read_text() for p in (course / "src" / "minigpt").glob("*.py")} == before
    assert write_package(course / "notebooks", tmp_path / "my_minigpt")  # anywhere else is fine
