"""Chapter 11, the capstone: a learner's package, built from notebooks, checked piece by piece against the oracles.

The reference (exported from solutions/ as if it were a learner's) matches everywhere; the released stubs are
"not written yet" everywhere; a mutant with one realistic mistake is named in the piece that holds the mistake,
and the pieces built on it wait instead of being blamed.
"""
import importlib
import json
import sys
import time
import types
from pathlib import Path

import pytest

from coursekit import capstone, export

ROOT = Path(__file__).resolve().parents[1]
ALL = [p.name for p in capstone.PIECES]


def exported(tmp_path, source="solutions", name="learner_minigpt") -> Path:
    package = tmp_path / name
    export.write_package(ROOT / source, package)
    return package


def mutant(tmp_path, module: str, old: str, new: str):
    """The reference exported as a learner's package, with one edit in one module."""
    package = exported(tmp_path)
    path = package / f"{module}.py"
    source = path.read_text()
    assert source.count(old) == 1, f"{module}.py no longer holds {old!r}: update this mutant"
    path.write_text(source.replace(old, new))
    return capstone.import_package(package)


@pytest.fixture(scope="module", autouse=True)
def oracle_keeps_logits():
    """Hugging Face's logits kept from one compare to the next: each package here runs the windows the others ran
    (Oracle.keep_logits)."""
    o = capstone.oracle()
    o.keep_logits = 1 << 30
    yield
    o.keep_logits = 0
    o.logits.clear()


@pytest.fixture(scope="module")
def reference_as_learner(tmp_path_factory):
    return capstone.import_package(exported(tmp_path_factory.mktemp("reference")))


def test_side_by_side_agrees_token_for_token_with_hugging_face(reference_as_learner):
    shown = capstone.generate_side_by_side(reference_as_learner, max_new_tokens=24, seed=3)
    yours, reference, hf = shown.columns
    assert [c.name for c in shown.columns] == ["your package", "the course's reference", "Hugging Face"]
    assert len(hf.ids) == 24 and yours.ids == reference.ids == hf.ids
    assert yours.text == hf.text and yours.text.strip()
    assert shown.agreement("your package") == 24
    assert "all 24 tokens as Hugging Face's" in shown._repr_html_()


def test_released_stubs_are_not_written_yet_and_nothing_crashes(tmp_path):
    stubs = capstone.import_package(exported(tmp_path, source="notebooks"))
    report = capstone.compare(stubs)
    for piece in capstone.PIECES:
        result = report.result(piece.name)
        if piece.needs:
            assert result.status == capstone.WAITS and result.message.startswith("waits for: "), result
        else:
            assert result.status == capstone.NOT_WRITTEN and result.message.endswith("is not written yet"), result
    assert report.result("tokenizer").message == "Tokenizer.encode is not written yet"
    assert report.result("kv-cache").waits_for == ("embeddings", "attention")
    assert "finish 01-tokens/01-tokens.ipynb" in report.next_steps()
    yours = capstone.generate_side_by_side(stubs, max_new_tokens=4).columns[0]
    assert yours.ids is None and yours.text == "Tokenizer.encode is not written yet"


# (module, the reference's line, the mistake, the piece that must say "differs", words its message must hold,
#  the pieces that wait for it)
MUTANTS = {
    "merges in the wrong order": (
        "tokens", "rank = heapq.heappop(queue)", "rank = queue.pop(queue.index(max(queue)))",
        "tokenizer", "encodes to", ()),
    "no causal mask": (
        "attention", "y, _ = attention(q, k, v, causal_mask(T, device=x.device))", "y, _ = attention(q, k, v)",
        "attention", "is the causal mask applied?", ("transformer", "kv-cache", "batching")),
    "top-k keeps k + 1": (
        "samplers", "torch.topk(logits, k, dim=-1)", "torch.topk(logits, k + 1, dim=-1)",
        "samplers", "keeps 41 tokens of row 0; Hugging Face's TopKLogitsWarper keeps 40",
        ("constrained decoding", "batching")),
    "the cache appends twice": (
        "kv_cache", "], k], dim=2)\n            v = torch.cat([self.values[layer], v], dim=2)",
        "], k, k], dim=2)\n            v = torch.cat([self.values[layer], v, v], dim=2)",
        "kv-cache", "decode step 1", ("batching",)),
    "the window keeps the first tokens": (
        "generation", "window = ids[-model.config.block_size:]", "window = ids[:model.config.block_size]",
        "generation loop", "last_logits(model, 264 ids) differs from Hugging Face's logits after the last 256",
        ("beam search", "constrained decoding", "batching")),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_a_mistake_is_named_in_its_own_piece_and_blames_no_other(tmp_path, name):
    module, old, new, piece, words, waiting = MUTANTS[name]
    report = capstone.compare(mutant(tmp_path, module, old, new))
    assert report.result(piece).status == capstone.DIFFERS, report.result(piece)
    assert words in report.result(piece).message
    for other in ALL:
        if other in waiting:
            assert report.result(other).status == capstone.WAITS and report.result(other).waits_for == (piece,)
        elif other != piece:
            assert report.result(other).status == capstone.MATCHES, report.result(other)
    assert f"{piece} differs (reopen" in report.next_steps()


def test_the_side_by_side_shows_where_a_mutant_departs(tmp_path):
    package = mutant(tmp_path, *MUTANTS["top-k keeps k + 1"][:3])
    shown = capstone.generate_side_by_side(package, max_new_tokens=40, seed=0, top_k=3)
    agree = shown.agreement("your package")
    assert agree < 40 and shown.columns[1].ids == shown.columns[2].ids
    assert f"departs from Hugging Face at token {agree}" in shown._repr_html_()


def test_a_crash_names_the_call_and_the_line(tmp_path):
    package = mutant(tmp_path, "embeddings", "pos = torch.arange(offset, offset + T, device=idx.device)",
                     "pos = torch.arange(offset, offset + T + 1, device=idx.device)")
    result = capstone.compare(package, pieces=["embeddings"]).result("embeddings")
    assert result.status == capstone.CRASHED
    assert result.message.startswith("Embeddings(ids of a full window) raised ")
    assert "(in Embeddings.forward, embeddings.py line" in result.message


def test_a_module_that_does_not_import_is_named(tmp_path):
    package = exported(tmp_path)
    (package / "generation.py").write_text((package / "generation.py").read_text() + "\ndef (:\n")
    (package / "kv_cache.py").unlink()
    report = capstone.compare(capstone.import_package(package), pieces=["samplers", "beam search", "kv-cache"])
    assert report.result("generation loop").status == capstone.CRASHED
    assert report.result("generation loop").message.startswith("importing generation.py raised SyntaxError")
    assert report.result("samplers").message.startswith("importing samplers.py failed in generation.py, line")
    assert report.result("beam search").status == capstone.WAITS
    assert report.result("kv-cache").status == capstone.NOT_WRITTEN
    assert "there is no kv_cache.py in your package" in report.result("kv-cache").message


def test_compare_checks_the_pieces_asked_for_and_those_they_need(reference_as_learner):
    report = capstone.compare(reference_as_learner, pieces=["kv-cache"])
    assert [r.piece for r in report] == ["embeddings", "attention", "transformer", "kv-cache"]
    with pytest.raises(ValueError, match="no piece named 'cache'; the pieces are tokenizer, embeddings"):
        capstone.compare(reference_as_learner, pieces=["cache"])


def test_the_learner_package_never_takes_the_reference_name(tmp_path):
    with pytest.raises(ValueError, match="would hide the course's reference"):
        capstone.import_package(exported(tmp_path, name="minigpt"))
    with pytest.raises(ValueError, match="is not a folder: give the one that holds your chapter folders"):
        capstone.load_package(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no chapter notebook with '#| export' cells"):
        capstone.load_package(tmp_path / "empty")


def test_load_package_builds_and_imports_a_fresh_package():
    package = capstone.load_package(ROOT / "notebooks")
    assert package.__name__ == "learner_minigpt" and sys.modules["learner_minigpt"] is package
    assert package.CHAPTERS["07-kv-cache"] == "kv_cache" and "11-capstone" not in package.CHAPTERS
    tokens = importlib.import_module("learner_minigpt.tokens")  # the learner notebooks' code: their stubs
    with pytest.raises(NotImplementedError):
        tokens.pre_split("hello")


def test_the_installed_reference_is_recognised(monkeypatch, tmp_path, reference_as_learner):
    import minigpt

    assert capstone.reference_package() == (minigpt, "")
    # In a learner-only copy of the course, minigpt is built from the learner's notebooks.
    learners = exported(tmp_path, source="notebooks", name="minigpt")
    fake = types.ModuleType("minigpt", (learners / "__init__.py").read_text().split('"""')[1])
    fake.__file__ = str(learners / "__init__.py")
    monkeypatch.setitem(sys.modules, "minigpt", fake)
    reference, why = capstone.reference_package()
    assert reference is None and "it is your own package" in why
    column = capstone.generate_side_by_side(reference_as_learner, max_new_tokens=4).columns[1]
    assert column.ids is None and column.text == why


@pytest.mark.slow
@pytest.mark.parametrize("source", ["solutions", "notebooks"])
def test_the_capstone_notebook_runs_top_to_bottom(tmp_path, source):
    """In solutions/ it builds the reference as a learner's package: every piece matches (the report's row of each,
    ticked); in notebooks/, the stubs a learner starts from."""
    import nbformat
    from nbclient import NotebookClient

    notebook = ROOT / source / "11-capstone" / "11-capstone.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()
    seconds = time.perf_counter() - start
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = json.dumps([o.get("text", "") or o.get("data", {}) for o in outputs])
    assert ("Every piece matches" in text) == (source == "solutions")
    assert ("is not written yet" in text) == (source == "notebooks")
    # the report as the notebook shows it: a row per piece, in order, a tick on each for the reference
    report = next(cell for cell in nb.cells if cell.source.startswith("report = capstone.compare("))
    html = "".join(o.data["text/html"] for o in report.outputs if "text/html" in o.get("data", {}))
    where = [html.find(f">{piece}<") for piece in ALL]
    assert -1 not in where and where == sorted(where), f"the report does not name every piece in order: {where}"
    assert (html.count("✓") == len(ALL)) == (source == "solutions"), html
    print(f"{source}/11-capstone ran in {seconds:.1f} s")


# Mistakes in the pieces of chapters 8 and 9, checked with only the pieces they need (cheaper than a whole report).
# (module, the reference's line, the mistake, the piece that must say "differs" (or another status), words its
#  message must hold)
LATER_MUTANTS = {
    "gradients not clipped": (
        "training", "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n", "",
        "training", "after train_step(model, AdamW, x, y) (step 1) differs from PyTorch's step"),
    "targets not moved on": (
        "training", "return ids[positions].long(), ids[positions + 1].long()",
        "return ids[positions].long(), ids[positions].long()",
        "training", "targets are not the windows moved one token on"),
    "the vocabulary as text": (
        "constrained", "else tokenizer.decode_single_token_bytes(i)", "else tokenizer.decode([i]).encode()",
        "constrained decoding", "; tiktoken's bytes for that id are "),
    "no end of text": (  # a whole answer cannot end, and a pattern without a longer answer has nowhere to go
        "constrained", "[] if eos is None or eos >= size else [eos]", "[]",
        "constrained decoding", "Constraint.regex(...), 12, use_cache=False) raised ValueError: after 'red and ",
        capstone.CRASHED),
}


@pytest.mark.parametrize("name", LATER_MUTANTS)
def test_a_mistake_in_training_or_constrained_decoding_is_named(tmp_path, name):
    module, old, new, piece, words, *status = LATER_MUTANTS[name]
    report = capstone.compare(mutant(tmp_path, module, old, new), pieces=[piece])
    assert report.result(piece).status == (status or [capstone.DIFFERS])[0], report.result(piece)
    assert words in report.result(piece).message, report.result(piece).message
    assert all(r.status == capstone.MATCHES for r in report if r.piece != piece), report
