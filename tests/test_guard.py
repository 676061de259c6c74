"""The grading kernel's guard: a notebook may import the reference of earlier chapters, not its own."""

import jupyter_client
import pytest

from autograder.guard import blocked_modules
from minigpt import CHAPTERS


def _grading_kernel_arguments() -> list[str]:
    """The kernel arguments the course's nbgrader configuration gives every grading kernel."""
    from traitlets.config import PyFileConfigLoader
    from autograder.grade import BASE_CONFIG
    config = PyFileConfigLoader(BASE_CONFIG.name, path=str(BASE_CONFIG.parent)).load_config()
    return list(config.Execute.extra_arguments)


GRADING_KERNEL_ARGUMENTS = _grading_kernel_arguments()


def test_blocked_modules_are_this_chapter_and_later():
    assert blocked_modules("04-transformer", CHAPTERS) == {
        "minigpt.transformer", "minigpt.generation", "minigpt.samplers", "minigpt.kv_cache"}
    assert blocked_modules("01-tokens", CHAPTERS) == {f"minigpt.{m}" for m in CHAPTERS.values()}
    assert blocked_modules("not-a-chapter", CHAPTERS) == {f"minigpt.{m}" for m in CHAPTERS.values()}
    # The capstone exports no module of its own: it runs the learner's package next to every chapter's reference.
    assert "08-capstone" not in CHAPTERS and blocked_modules("08-capstone", CHAPTERS) == set()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real kernel started the way nbgrader starts it, in a folder named like a chapter's."""
    folder = tmp_path_factory.mktemp("submitted") / "04-transformer"
    folder.mkdir()
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(extra_arguments=GRADING_KERNEL_ARGUMENTS, cwd=str(folder))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)

    def run(code: str) -> list[str]:
        out = []
        kc.execute_interactive(code, timeout=120, output_hook=lambda m: out.append(
            m["content"].get("text") or m["content"].get("evalue", "")) if m["msg_type"] in ("stream", "error") else None)
        return out

    yield run
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_earlier_chapters_import(kernel):
    assert kernel("from minigpt.attention import CausalSelfAttention; print('ok')") == ["ok\n"]


@pytest.mark.parametrize("code", ["from minigpt.transformer import GPT", "import minigpt.samplers",
                                  "import importlib; importlib.import_module('minigpt.transformer')"])
def test_own_and_later_chapters_do_not(kernel, code):
    out = kernel(code)
    assert len(out) == 1 and "reference solution, which is not available while grading 04-transformer" in out[0]


def test_the_autograder_itself_may_import_anything(kernel):
    # autograder.checks.generation imports minigpt.transformer for its own use
    out = kernel("import sys, autograder.checks.generation\nprint('minigpt.transformer' in sys.modules)")
    assert out == ["True\n"]


def test_a_notebook_cannot_pose_as_the_autograder(kernel):
    out = kernel("exec('import minigpt.samplers', {'__name__': 'autograder.checks.fake'})")
    assert len(out) == 1 and "not available while grading" in out[0]
