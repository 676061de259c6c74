"""The data the course ships: GPT-2's tokenizer files (served to the stock tiktoken offline) and the corpus."""
import hashlib
import os
import subprocess
import sys

import coursekit
from coursekit.data import SHAKESPEARE_DIR


def test_tokenizer_files_are_byte_exact():
    files = coursekit.gpt2_tokenizer_files()
    # The hashes tiktoken checks; a copy that does not match would be deleted and downloaded again.
    want = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
            "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == want[name], name
    assert (coursekit.TIKTOKEN_CACHE_DIR / "LICENSE").is_file()


def test_stock_tiktoken_loads_offline_in_a_fresh_process():
    """Importing coursekit is enough: no env var set by hand, no network, nothing written to /tmp."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"  # any download attempt fails fast
    code = ("import coursekit, tiktoken, os; e = tiktoken.get_encoding('gpt2'); "
            "print(os.environ['TIKTOKEN_CACHE_DIR']); print(e.encode('Hello world'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cache_dir, ids = out.stdout.splitlines()
    assert cache_dir == str(coursekit.TIKTOKEN_CACHE_DIR)
    assert ids == "[15496, 995]"


def test_gpt2_encoding_names_a_wrong_cache_dir(monkeypatch, tmp_path):
    import pytest
    from coursekit.data import gpt2_encoding
    gpt2_encoding.cache_clear()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="does not hold GPT-2's tokenizer files"):
            gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()


def test_corpus_is_whole_and_documented():
    texts = coursekit.corpus_texts()
    assert len(texts) == 42
    assert texts["hamlet"].startswith("HAMLET, PRINCE OF DENMARK")
    assert "To be, or not to be" in texts["hamlet"]
    assert not any("*** START OF" in t or "*** END OF" in t for t in texts.values())
    assert (SHAKESPEARE_DIR / "README.md").is_file()
    assert 4_500_000 < len(coursekit.shakespeare()) < 5_500_000
