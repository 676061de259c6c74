"""Chapter 2 (embeddings): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `one_hot`, `embedding_lookup`, `embeddings` (the `Embeddings` class; only `forward` is the
learner's). Test cells: test_one_hot, test_embedding_lookup, test_embeddings. A learner's embedding_lookup may
call their one_hot, and their Embeddings either: a mistake there costs the later cell too, whose message then
names the earlier cell that fails (the mutants marked "charged once").

The classes of mistakes of issue 12 that apply here: ids of every integer dtype check_ids accepts (int8, int16,
int32, int64, uint8), ids with no elements, a batch of one row, a window exactly full or overfull, float64
tables, inputs changed in place, gradients that do not reach the tables, and a broken earlier function; and nan
where a number belongs. Each cell's checks are weighted parts, so a mistake usually costs the share of the parts it
breaks (embeddings-no-long: the other integer dtypes' part of test_embeddings), not the whole cell.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "02-embeddings"

POSITIONS = "        pos = torch.arange(offset, offset + T, device=idx.device)  # (T,)\n"
SUM = "        return self.wte(idx.long()) + self.wpe(pos)  # (B, T, C) + (T, C) broadcasts over the batch\n"
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


# one_hot that builds integers (torch.long) instead of floats
INTEGER_ONE_HOT = (
    Edit("one_hot", "torch.zeros(*ids.shape, vocab_size)", "torch.zeros(*ids.shape, vocab_size, dtype=torch.long)"),
    Edit("one_hot", "1.0)", "1)"),
)
# embedding_lookup as the product the page explains, with the learner's own one_hot
ONE_HOT_PRODUCT = "    return one_hot(ids, table.shape[0]) @ table\n"


def _positions(new: str) -> Edit:
    return Edit("embeddings", POSITIONS, f"        pos = {new}\n")


MUTANTS = [
    # ---- one_hot
    Mutant(
        "one-hot-long",
        "one_hot returns integers (torch.long), not floats",
        INTEGER_ONE_HOT,
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
        (Edit("embeddings", SUM, "        return self.wte.weight.data[idx.long()] + self.wpe.weight.data[pos]\n"),),
        {"test_embeddings": "not with .data"},
    ),
    # ---- issue 12: ids of every integer dtype check_ids accepts
    Mutant(
        "one-hot-scatter-int",
        "one_hot scatters with the ids as they come: int16, int8 and uint8 ids are no index for scatter_",
        (Edit("one_hot", "ids.long().unsqueeze(-1)", "ids.unsqueeze(-1)"),),
        {"test_one_hot": "convert with ids.long() first"},
    ),
    Mutant(
        "lookup-no-long",
        "embedding_lookup indexes with the ids as they come: int16 fails, uint8 is taken as a mask",
        (Edit("embedding_lookup", "    return table[ids.long()]\n", "    return table[ids]\n"),),
        {"test_embedding_lookup": "convert with ids.long() first"},
    ),
    Mutant(
        "embeddings-no-long",
        "Embeddings hands the ids to nn.Embedding as they come: int64 and int32 only",
        (Edit("embeddings", SUM, SUM.replace("self.wte(idx.long())", "self.wte(idx)")),),
        # Right on int64 and int32 ids: the cell loses the share of its part for the other dtypes only.
        {"test_embeddings": "[int8, int16, int32 and uint8 ids: 1 of 10]"},
    ),
    Mutant(
        "lookup-view-as-long",
        "embedding_lookup converts the ids with .view(torch.long), which reinterprets their bytes",
        (Edit("embedding_lookup", "    return table[ids.long()]\n", "    return table[ids.view(torch.long)]\n"),),
        {"test_embedding_lookup": "convert with ids.long() first"},
    ),
    # ---- ids with no elements
    Mutant(
        "one-hot-stack-rows",
        "one_hot stacks one row of the identity per id: torch.stack of no rows fails",
        (Edit("one_hot", """\
    out = torch.zeros(*ids.shape, vocab_size)
    out.scatter_(-1, ids.long().unsqueeze(-1), 1.0)
    return out
""", "    return torch.stack([torch.eye(vocab_size)[int(i)] for i in ids.flatten()]).view(*ids.shape, vocab_size)\n"),),
        {"test_one_hot": "hold no ids"},
    ),
    Mutant(
        "lookup-reshape-minus-one",
        "embedding_lookup flattens the ids and reshapes with -1, which cannot be inferred for no ids",
        (Edit("embedding_lookup", "    return table[ids.long()]\n",
              "    return table[ids.long().flatten()].view(*ids.shape, -1)\n"),),
        {"test_embedding_lookup": "hold no ids"},
    ),
    Mutant(
        "embeddings-flat-lookup",
        "Embeddings looks the tokens up as one flat row and reshapes with -1: fails for B = 0 or T = 0",
        (Edit("embeddings", SUM, "        B = idx.shape[0]\n"
                                 "        return self.wte(idx.long().view(-1)).view(B, T, -1) + self.wpe(pos)\n"),),
        {"test_embeddings": "hold no ids"},
    ),
    # ---- a batch of one row
    Mutant(
        "embeddings-squeeze",
        "Embeddings squeezes its output: a batch of one row loses its batch dimension",
        (Edit("embeddings", SUM, SUM.replace("self.wpe(pos)  #", "self.wpe(pos)).squeeze()  #")
              .replace("return self.wte", "return (self.wte")),),
        {"test_embeddings": "do not squeeze"},
    ),
    # ---- the window: exactly full is fine (block-check-off-by-one above), overfull is an error
    Mutant(
        "block-check-ignores-offset",
        "the block check compares T alone with block_size: an offset pushes the positions past the table",
        (Edit("embeddings", "offset + T > self.block_size", "T > self.block_size"),),
        {"test_embeddings": "check offset + T <= block_size"},
    ),
    # ---- float64 tables
    Mutant(
        "lookup-one-hot-product",
        "embedding_lookup as one_hot(ids, V) @ table: float32 one-hot vectors do not multiply a float64 table",
        (Edit("embedding_lookup", "    return table[ids.long()]\n", ONE_HOT_PRODUCT),),
        {"test_embedding_lookup": "a product with one_hot's float32 vectors does not"},
    ),
    Mutant(
        "embeddings-one-hot-product",
        "Embeddings multiplies one-hot vectors by wte: fails once the layer is float64 (.double())",
        (Edit("embeddings", SUM, "        return one_hot(idx, self.vocab_size) @ self.wte.weight + self.wpe(pos)\n"),),
        {"test_embeddings": "the tables hold float64 here"},
    ),
    # ---- gradients: chapter 8 trains the tables
    Mutant(
        "lookup-no-grad",
        "embedding_lookup under torch.no_grad(): right values, no gradient for the table",
        (Edit("embedding_lookup", "    return table[ids.long()]\n",
              "    with torch.no_grad():\n        return table[ids.long()]\n"),),
        {"test_embedding_lookup": "does not require grad"},
    ),
    Mutant(
        "embeddings-no-grad",
        "Embeddings.forward computes under torch.no_grad()",
        (Edit("embeddings", SUM, "        with torch.no_grad():\n    " + SUM),),
        {"test_embeddings": "does not require grad"},
    ),
    # ---- inputs changed in place
    Mutant(
        "one-hot-unsqueeze-in-place",
        "one_hot unsqueezes ids.long() in place: for int64 ids that is the caller's tensor",
        (Edit("one_hot", "ids.long().unsqueeze(-1)", "ids.long().unsqueeze_(-1)"),),
        {"test_one_hot": "changed the caller's ids in place (its shape (6,) became (6, 1))"},
    ),
    # ---- nan where a number belongs
    Mutant(
        "one-hot-zero-over-zero",
        "one_hot as 1 - |d| / |d| with d = id - j: every d != 0 gives 0, but d = 0 gives 0 / 0, nan where the 1 goes",
        (Edit("one_hot", """\
    out = torch.zeros(*ids.shape, vocab_size)
    out.scatter_(-1, ids.long().unsqueeze(-1), 1.0)
    return out
""", """\
    d = (ids.long().unsqueeze(-1) - torch.arange(vocab_size)).float()
    return 1 - d.abs() / d.abs()
"""),),
        {"test_one_hot": "0 / 0 is nan"},
    ),
    # ---- charged once: a broken earlier function, named in the later cell's message
    Mutant(
        "lookup-detached-used-by-embeddings",
        "embedding_lookup detaches the table, and Embeddings looks its tokens up with it (charged once)",
        (Edit("embedding_lookup", "    return table[ids.long()]\n", "    return table.detach()[ids.long()]\n"),
         Edit("embeddings", SUM, "        return embedding_lookup(self.wte.weight, idx) + self.wpe(pos)\n")),
        {"test_embedding_lookup": "does not require grad",
         "test_embeddings": "your embedding_lookup, which fails its own test (test_embedding_lookup)"},
    ),
    Mutant(
        "one-hot-long-used-by-lookup",
        "one_hot returns integers, and embedding_lookup multiplies its one-hot vectors by the table (charged once)",
        (*INTEGER_ONE_HOT, Edit("embedding_lookup", "    return table[ids.long()]\n", ONE_HOT_PRODUCT)),
        {"test_one_hot": "must return floats",
         "test_embedding_lookup": "your one_hot, which fails its own test (test_one_hot)"},
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
    return F.one_hot(ids.long(), num_classes=vocab_size).float()
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    return table.index_select(0, ids.flatten().long()).view(*ids.shape, table.shape[1])
''',
}
SLICED_WPE = """\
        B, T = idx.size()
        check_ids(idx, self.vocab_size)
        if T + offset > self.block_size:
            raise ValueError(f"sequence of {T} tokens at offset {offset} is longer than block_size={self.block_size}")
        tok_emb = self.wte.weight[idx.long()]               # (B, T, C)
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
    return torch.eye(vocab_size)[ids.long()]
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    return torch.nn.functional.embedding(ids.long(), table)
''',
}
PER_ROW_POSITION_IDS = """\
        B, T = idx.shape
        if offset + T > self.block_size:
            raise ValueError("too many positions")
        position_ids = (torch.arange(T) + offset).unsqueeze(0).expand(B, T)
        return embedding_lookup(self.wte.weight, idx) + self.wpe(position_ids)
"""

# A comparison with arange for the one-hot vectors, torch.index_select with a reshape that names every size, and
# F.embedding on both tables, the block checked as "room left after the offset".
COMPARE = {
    "one_hot": '''\
#| export
def one_hot(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    check_ids(ids, vocab_size)
    return (ids.long().unsqueeze(-1) == torch.arange(vocab_size)).float()
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    rows = torch.index_select(table, 0, ids.reshape(-1).long())
    return rows.reshape(*ids.shape, table.shape[1])
''',
}
FUNCTIONAL_EMBEDDING = """\
        check_ids(idx, self.vocab_size)
        T = idx.shape[-1]
        if T > self.block_size - offset:
            raise ValueError(f"{T} tokens from position {offset} need more than {self.block_size} positions")
        tokens = torch.nn.functional.embedding(idx.to(torch.int64), self.wte.weight)
        positions = torch.nn.functional.embedding(torch.arange(T) + offset, self.wpe.weight)
        return tokens + positions[None, :, :]
"""

# One-hot vectors by advanced-index assignment into a flat buffer, int32 indices (which PyTorch accepts as well as
# int64), and Embeddings with the learner's own lookup on both tables.
FLAT = {
    "one_hot": '''\
#| export
def one_hot(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    check_ids(ids, vocab_size)
    flat = ids.reshape(-1).long()
    out = torch.zeros(flat.numel(), vocab_size)
    out[torch.arange(flat.numel()), flat] = 1.0
    return out.reshape(*ids.shape, vocab_size)
''',
    "embedding_lookup": '''\
#| export
def embedding_lookup(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    check_ids(ids, table.shape[0])
    return table[ids.int()]
''',
}
OWN_LOOKUP_BOTH = """\
        B, T = idx.shape
        if offset + T > self.block_size:
            raise ValueError(f"offset {offset} + {T} tokens > block_size {self.block_size}")
        tok = embedding_lookup(self.wte.weight, idx)
        pos = embedding_lookup(self.wpe.weight, torch.arange(offset, offset + T))
        x = tok + pos
        return x
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
    Variant(
        "compare-functional-embedding",
        "ids == arange(V); torch.index_select and a reshape naming every size; F.embedding on both tables",
        cells=COMPARE,
        edits=(Edit("embeddings", FORWARD_BODY, FUNCTIONAL_EMBEDDING),),
    ),
    Variant(
        "flat-int32-own-lookup",
        "one-hot by index assignment into a flat buffer; table[ids.int()]; the learner's lookup on both tables",
        cells=FLAT,
        edits=(Edit("embeddings", FORWARD_BODY, OWN_LOOKUP_BOTH),),
    ),
]
