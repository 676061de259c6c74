"""Chapter 2 (embeddings): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `one_hot`, `embedding_lookup`, `embeddings` (the `Embeddings` class; only `forward` is the
learner's). Test cells: test_one_hot, test_embedding_lookup, test_embeddings. The visible test of
embedding_lookup compares it with `one_hot(ids, V) @ table`, so a one_hot that breaks that product costs
the lookup's points too.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "02-embeddings"

POSITIONS = "        pos = torch.arange(offset, offset + T, device=idx.device)  # (T,)\n"
SUM = "        return self.wte(idx) + self.wpe(pos)  # (B, T, C) + (T, C) broadcasts over the batch\n"
BLOCK_CHECK = """\
        if offset < 0 or offset + T > self.block_size:
            raise ValueError(f"positions {offset} to {offset + T - 1} do not fit in block_size {self.block_size}")
"""

# The whole body of the reference forward, for variants that write it their own way.
FORWARD_BODY = """\
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        check_ids(idx, self.vocab_size)
        T = idx.shape[1]
""" + BLOCK_CHECK + POSITIONS + SUM


def _positions(new: str) -> Edit:
    return Edit("embeddings", POSITIONS, f"        pos = {new}\n")


MUTANTS = [
    # ---- one_hot
    Mutant(
        "one-hot-long",
        "one_hot returns integers (torch.long), not floats",
        (Edit("one_hot", "torch.zeros(*ids.shape, vocab_size)", "torch.zeros(*ids.shape, vocab_size, dtype=torch.long)"),
         Edit("one_hot", "1.0)", "1)")),
        # The lookup's tests use torch's one-hot, so this mistake costs only one_hot's own cell.
        {"test_one_hot": "must return floats"},
    ),
    Mutant(
        "one-hot-no-num-classes",
        "F.one_hot without num_classes: as wide as the largest id",
        (Edit("one_hot", """\
    out = torch.zeros(*ids.shape, vocab_size)
    out.scatter_(-1, ids.long().unsqueeze(-1), 1.0)
    return out
""", "    return torch.nn.functional.one_hot(ids.long()).float()\n"),),
        # The visible tests happen to use the largest id; only the hidden check sees the difference.
        {"test_one_hot": "pass num_classes=vocab_size"},
    ),
    # ---- embedding_lookup
    Mutant(
        "lookup-no-check",
        "embedding_lookup without check_ids: id -1 silently gives the last row",
        (Edit("embedding_lookup", "    check_ids(ids, table.shape[0])\n", ""),),
        {"test_embedding_lookup": "negative indices count from the end"},
    ),
    Mutant(
        "lookup-loop",
        "embedding_lookup loops over the ids as Python ints: works on 1-D ids only",
        (Edit("embedding_lookup", "    return table[ids.long()]\n",
              "    return torch.stack([table[int(i)] for i in ids])\n"),),
        {"test_embedding_lookup": "not on a (B, T) batch"},
    ),
    # ---- Embeddings
    Mutant(
        "offset-ignored",
        "positions 0 .. T-1 whatever the offset",
        (_positions("torch.arange(T, device=idx.device)"),),
        {"test_embeddings": "offset ignored"},
    ),
    Mutant(
        "positions-from-1",
        "position ids start at 1",
        (_positions("torch.arange(offset + 1, offset + T + 1, device=idx.device)"),),
        {"test_embeddings": "not at offset + 1"},
    ),
    Mutant(
        "token-only",
        "token embeddings only, no position embeddings",
        (Edit("embeddings", SUM, "        return self.wte(idx)\n"),),
        {"test_embeddings": "only the token embeddings"},
    ),
    Mutant(
        "positions-from-batch-size",
        "the position index counts the batch (idx.shape[0]) instead of T",
        (Edit("embeddings", "        T = idx.shape[1]\n", "        T = idx.shape[0]\n"),),
        {"test_embeddings": "not the B rows of the batch"},
    ),
    Mutant(
        "no-block-check",
        "no check that offset + T fits in block_size",
        (Edit("embeddings", BLOCK_CHECK, ""),),
        {"test_embeddings": "do not fit in block_size"},
    ),
    Mutant(
        "block-check-off-by-one",
        "offset + T == block_size rejected",
        (Edit("embeddings", "offset + T > self.block_size", "offset + T >= self.block_size"),),
        {"test_embeddings": "offset + T == block_size fits"},
    ),
    Mutant(
        "weight-data",
        "Embeddings reads .weight.data: right values, but no gradients reach the tables",
        (Edit("embeddings", SUM, "        return self.wte.weight.data[idx] + self.wpe.weight.data[pos]\n"),),
        {"test_embeddings": "not with .data"},
    ),
]


# ---------------------------------------------------------------- different but correct

# torch.nn.functional's one_hot, index_select, and the position rows sliced straight from the table.
FUNCTIONAL = {
    "one_hot": '''\
#| export
import torch.nn.functional as F


def one_hot(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    check_ids(ids, vocab_size)
    return F.one_hot(ids, num_classes=vocab_size).float()
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    return table.index_select(0, ids.flatten()).view(*ids.shape, table.shape[1])
''',
}
SLICED_WPE = """\
        B, T = idx.size()
        check_ids(idx, self.vocab_size)
        if T + offset > self.block_size:
            raise ValueError(f"sequence of {T} tokens at offset {offset} is longer than block_size={self.block_size}")
        tok_emb = self.wte.weight[idx]                      # (B, T, C)
        pos_emb = self.wpe.weight[offset:offset + T]        # (T, C)
        return tok_emb + pos_emb.unsqueeze(0)
"""

# One-hot rows of an identity matrix, F.embedding, and position ids of shape (B, T) as Hugging Face builds
# them, with the tokens looked up by the learner's own embedding_lookup.
EYE = {
    "one_hot": '''\
#| export
def one_hot(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    check_ids(ids, vocab_size)
    return torch.eye(vocab_size)[ids]
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    return torch.nn.functional.embedding(ids, table)
''',
}
PER_ROW_POSITION_IDS = """\
        B, T = idx.shape
        if offset + T > self.block_size:
            raise ValueError("too many positions")
        position_ids = (torch.arange(T) + offset).unsqueeze(0).expand(B, T)
        return embedding_lookup(self.wte.weight, idx) + self.wpe(position_ids)
"""

VARIANTS = [
    Variant(
        "functional-sliced",
        "F.one_hot(...).float(); table.index_select; wte.weight[idx] + wpe.weight[offset:offset + T]",
        cells=FUNCTIONAL,
        edits=(Edit("embeddings", FORWARD_BODY, SLICED_WPE),),
    ),
    Variant(
        "eye-position-ids",
        "torch.eye(V)[ids]; F.embedding; (B, T) position ids, tokens through the learner's own embedding_lookup",
        cells=EYE,
        edits=(Edit("embeddings", FORWARD_BODY, PER_ROW_POSITION_IDS),),
    ),
]
