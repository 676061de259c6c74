"""The course's own tools, shared by the book, the learner notebooks, the reference package and the tests.

Importing ``coursekit`` points tiktoken at the GPT-2 tokenizer files shipped with this package, so that the
stock ``tiktoken.get_encoding("gpt2")`` works offline and never writes to the system temp folder.
"""
import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
TIKTOKEN_CACHE_DIR = DATA_DIR / "tiktoken"

# setdefault, not assignment: the Makefile, CI and the tests set the same folder explicitly.
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE_DIR))

from coursekit.data import (  # noqa: E402
    corpus_texts, gpt2_encoding, gpt2_tokenizer_files, shakespeare, shipped_model_dir)

__all__ = ["DATA_DIR", "TIKTOKEN_CACHE_DIR", "corpus_texts", "gpt2_encoding", "gpt2_tokenizer_files", "shakespeare",
           "shipped_model_dir"]
