"""Test-wide settings: offline, with tiktoken reading the course's own copy of GPT-2's files."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Set before anything imports tiktoken or transformers, so no test can reach for the network.
os.environ["TIKTOKEN_CACHE_DIR"] = str(ROOT / "src" / "coursekit" / "data" / "tiktoken")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"



def pytest_sessionfinish(session, exitstatus):
    """Nothing in this suite may be skipped: a skipped check is a check that silently did not run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped and session.exitstatus == 0:
        session.exitstatus = 1
        reporter.write_line(f"FAILED: {len(skipped)} test(s) skipped; every test in this suite must run "
                            "(reasons: pytest -rs)", red=True)


@pytest.fixture
def torch_one_thread():
    """One torch thread for the test (the course's models and tensors are tiny, and a second thread only adds
    waiting, a lot of it on a busy machine), and torch's random state given back afterwards."""
    from coursekit.testing import isolated

    with isolated():
        yield
