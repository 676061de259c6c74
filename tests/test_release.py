"""notebooks/ is what nbgrader generates from solutions/, and holds nothing learners should not see."""
import json
import shutil

import pytest

from autograder.publish import release
from autograder.base import DEFAULT_COURSE_ROOT as ROOT
from minigpt import CHAPTERS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return release.generate(ROOT, tmp_path_factory.mktemp("release") / "course")


def test_committed_notebooks_equal_nbgrader_output(generated):
    diffs = release.differences(generated, ROOT / "notebooks")
    assert not diffs, "notebooks/ is out of date; run `make notebooks`:\n" + "\n".join(diffs)


def test_drift_is_detected(generated, tmp_path):
    copy = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", copy)
    nb_path = copy / "01-tokens" / "01-tokens.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"][0]["source"] = ["edited by hand\n"]
    nb_path.write_text(json.dumps(nb))
    (copy / "01-tokens" / "extra.txt").write_text("x")
    diffs = release.differences(generated, copy)
    assert any("01-tokens.ipynb: differs" in d for d in diffs)
    assert any("extra.txt: not generated" in d for d in diffs)


def test_release_has_stubs_and_no_solutions_or_hidden_tests(generated):
    for nb_path in generated.rglob("*.ipynb"):
        text = nb_path.read_text()
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text and "autograder" not in text
        cells = json.loads(text)["cells"]
        solutions = [c for c in cells if c["metadata"].get("nbgrader", {}).get("solution")]
        assert all("raise NotImplementedError()" in "".join(c["source"]) for c in solutions)
        # A chapter that builds a module of minigpt is an exercise; the capstone builds none, it runs the learner's.
        assert bool(solutions) == (nb_path.parent.name in CHAPTERS), nb_path.parent.name
