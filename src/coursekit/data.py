"""Offline data the course ships: the GPT-2 tokenizer files and the Shakespeare corpus.

Nothing here touches the network. See ``data/tiktoken/README.md`` and ``data/shakespeare/README.md`` for
where each file comes from and under which licence.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SHAKESPEARE_DIR = DATA_DIR / "shakespeare"
SHIPPED_MODEL_DIR = DATA_DIR / "models" / "shakespeare-gpt"

# tiktoken caches a download under the sha1 of its URL; these are the names for GPT-2's two files.
_VOCAB_BPE = "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"  # .../gpt-2/encodings/main/vocab.bpe
_ENCODER_JSON = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"  # .../gpt-2/encodings/main/encoder.json


def gpt2_tokenizer_files() -> dict[str, Path]:
    """Paths of GPT-2's ``vocab.bpe`` (the merges, in rank order) and ``encoder.json`` (token -> id)."""
    folder = DATA_DIR / "tiktoken"
    return {"vocab.bpe": folder / _VOCAB_BPE, "encoder.json": folder / _ENCODER_JSON}


@functools.cache
def gpt2_encoding():
    """tiktoken's own GPT-2 encoding, loaded offline from the shipped files: the oracle for chapter 1."""
    import tiktoken

    cache = Path(os.environ.get("TIKTOKEN_CACHE_DIR", ""))
    if not all((cache / name).is_file() for name in (_VOCAB_BPE, _ENCODER_JSON)):
        raise RuntimeError(
            f"TIKTOKEN_CACHE_DIR={str(cache)!r} does not hold GPT-2's tokenizer files, so tiktoken would try to "
            f"download them. Point it at {DATA_DIR / 'tiktoken'} (importing coursekit does that when it is unset)."
        )
    return tiktoken.get_encoding("gpt2")


def corpus_texts() -> dict[str, str]:
    """Every work in the Shakespeare corpus, by file stem (``"hamlet"``, ``"sonnets"``, ...), in name order."""
    return {p.stem.removesuffix("_gut"): _strip_gutenberg(p.read_text(encoding="utf-8"))
            for p in sorted(SHAKESPEARE_DIR.glob("*_gut.txt"))}


def shakespeare(works: tuple[str, ...] | None = None) -> str:
    """The named works (all of them by default) joined by blank lines, as one training or test text."""
    texts = corpus_texts()
    unknown = sorted(set(works or ()) - set(texts))
    if unknown:
        raise ValueError(f"unknown works {unknown}; available: {sorted(texts)}")
    return "\n\n".join(texts[w] for w in (works or texts))


def _strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg licence header and footer if a file still has them (the shipped ones do not)."""
    start = text.find("*** START OF")
    if start != -1:
        text = text[text.index("\n", start) + 1:]
    end = text.find("*** END OF")
    if end != -1:
        text = text[:end]
    return text.strip() + "\n"


def shipped_model_dir() -> Path:
    """The folder of the small GPT the course ships (Hugging Face GPT-2 format: config.json, model.safetensors)."""
    if not (SHIPPED_MODEL_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"the course's model is missing from {SHIPPED_MODEL_DIR}; "
                                "train it with `make model` (see training/README.md)")
    return SHIPPED_MODEL_DIR
