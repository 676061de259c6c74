"""Every chapter page's cells, build-time assertions included, run on another of torch's kernel paths: the portable
kernels (``pages_run.PATH``) on one thread, where ``make course`` runs them on the machine's own kernels (pages 1 to 4
on every core). A claim the page asserts must hold on both. Each page runs once per session (``pages_run``): the
book build of tests/test_site.py takes its outputs from that run.

A failure names the page, the cell's line in its Markdown source, the path (capability and threads) and the error."""
import pytest

from pages_run import PAGES, run_page, shared_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return shared_folder(tmp_path_factory)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_page_runs_and_its_assertions_hold_on_another_kernel_path(page, shared):
    why = run_page(page, shared)
    if why:
        pytest.fail(why, pytrace=False)
