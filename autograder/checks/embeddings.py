"""Chapter 2 (embeddings): hidden checks for one_hot, embedding_lookup and Embeddings.

The oracles are PyTorch's own ``F.one_hot`` and ``F.embedding``, and Hugging Face's ``GPT2Model``, whose input
layer (``wte(ids) + wpe(positions)``, positions counted on from a cache of earlier tokens) is the layer the
learner writes. Inputs are ones the learner has not seen: ids of other shapes and of every integer dtype that
``check_ids`` accepts (int8, int16, int32, int64, uint8), empty ids, float64 tables, tables of one row, sequences
that fill the block exactly and ones that overfill it, offsets. Every table is filled from a seeded generator, so
a check does not depend on the learner's random state.

The learner's functions and class are stand-ins (``autograder.judge.Remote``): they run where the notebook runs.
The ids and tables are sent there as plain tensors (an ``Embeddings``' tables through ``load_state_dict``), what
comes back is plain tensors, and the expected values are computed here from the same tensors. What must be
measured next to the learner's code is a helper (``sandboxed.helpers.embeddings``): whether a call changed its
arguments in place, the gradients a backward pass leaves in a table, and which of the notebook's functions a
failing function calls (a mistake in one of those is named as the likely cause, ``judge.because_of``).

Each cell's checks are weighted parts (``judge.part``): the values on int64 ids weigh most; the other integer dtypes,
ids with no elements, inputs left unchanged, the errors for bad ids, gradients, float64 tables and Hugging Face's
input layer each cost their own share, so that one edge case costs its share and not the cell. Values compare with
``coursekit.testing.close``: nan or inf where a number is expected is wrong.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.nn.functional as F

from autograder.judge import LearnerError, ask, because_of, cell, earlier, part, seeded
from coursekit.testing import call, close, describe_error, fail, not_written, show

ID_DTYPES = "int8, int16, int32, int64 or uint8"


def _ids(shape: tuple[int, ...], vocab_size: int, seed: int, dtype=torch.long) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_size, shape, generator=gen).to(dtype)


def _table(rows: int, cols: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ids_text(ids: torch.Tensor) -> str:
    """Small id tensors in full, big ones by shape and dtype."""
    dtype = "" if ids.dtype == torch.long else f", dtype={ids.dtype}"
    if 0 < ids.numel() <= 12:
        return f"tensor({ids.tolist()}{dtype})"
    return f"<ids of shape {tuple(ids.shape)}{dtype}>"


def _table_text(table: torch.Tensor) -> str:
    dtype = "" if table.dtype == torch.float32 else f" {_dtype(table.dtype)}"
    return f"<{dtype.strip() + ' ' if dtype else ''}table {table.shape[0]}x{table.shape[1]}>"


def _vec(v: torch.Tensor) -> str:
    values = [round(x, 4) for x in v.detach().flatten().tolist()]
    return show(values)


def _difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where the first wrong vector is, and what it holds (as ``close`` tells them apart)."""
    bad = (~torch.isclose(got.detach().double(), want.double(), atol=1e-5, rtol=1e-5, equal_nan=True)) \
        .reshape(-1, want.shape[-1])
    first = int(bad.any(dim=-1).nonzero()[0])
    where = list(torch.unravel_index(torch.tensor(first), want.shape[:-1])) if want.dim() > 1 else []
    at = f" at {[int(i) for i in where]}" if where else ""
    return (f"the vector{at} is {_vec(got.reshape(-1, want.shape[-1])[first])}, "
            f"expected {_vec(want.reshape(-1, want.shape[-1])[first])}")


def _matches(got: torch.Tensor, candidate) -> bool:
    """Whether ``got`` equals what a known mistake computes (``candidate()``; a crash means no)."""
    try:
        other = candidate()
    except Exception:  # noqa: BLE001 (the mistake cannot even run on this input)
        return False
    return isinstance(other, torch.Tensor) and close(got, other)


def _compare(label: str, got, want: torch.Tensor, mistakes=(), dtype_hint: str = "", hint: str = "") -> None:
    """Fail unless ``got`` equals ``want`` (shape, values, dtype). On a mismatch, name the first of
    ``mistakes`` (candidate, why) whose candidate gives ``got`` and differs from ``want``, else say ``hint``."""
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {show(got)}, expected a tensor of shape {tuple(want.shape)}", hint)
    if got.shape == want.shape and _matches(got, lambda: want):
        if got.dtype != want.dtype:
            fail(f"{label} returned dtype {got.dtype}, expected {want.dtype}", dtype_hint)
        return
    mistakes = [*mistakes,
                (lambda: want.squeeze(), "keep every dimension, even one of size 1 (a batch of one row, a single "
                                         "token): do not squeeze the result")]
    named = next((why for candidate, why in mistakes if _matches(got, candidate) and not _matches(want, candidate)),
                 "")
    if not named and got.shape == want.shape and (~torch.isfinite(got.detach()) & torch.isfinite(want)).any():
        named = ("your result holds nan or inf where the expected values are numbers: look for a division by zero "
                 "(0 / 0 is nan) or an inf multiplied by 0")
    named = named or hint
    if got.shape != want.shape:
        fail(f"{label} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}", named)
    fail(f"{label} returned wrong values: {_difference(got, want)}", named)


def _run(fn, args: tuple, label: str, hint: str = "", **kwargs) -> tuple:
    """``fn(*args, **kwargs)``, called next to the learner's code: (what it returned, [how it changed args[i] in
    place, "" where it did not]) for ``_unchanged``."""
    return call(ask, "embeddings.run", fn, *args, label=label, hint=hint, **kwargs)


def _unchanged(calls: list[tuple[str, list[str]]], names: list[str]) -> None:
    """The calls that returned, ``(label, how each argument changed in place)``, left their tensor arguments as they
    were (``names``: theirs). With no call that returned, nothing could be checked: that fails too."""
    if not calls:
        fail("not checked: no call returned a result")
    for label, changed in calls:
        for name, how in zip(names, changed):
            if how:
                fail(f"{label} changed the caller's {name} in place ({how}): it must leave its arguments as they "
                     "were", "use out-of-place operations on the inputs (ids.unsqueeze(-1), not ids.unsqueeze_(-1); "
                     "x = x + 1, not x += 1). Note that ids.long() returns ids itself when they are int64 already, so "
                     "an in-place change of it changes the caller's ids")


def _input_hint(ids: torch.Tensor, name: str = "ids", last: str = "C") -> str:
    """What is special about these ids, for the message of a call that went wrong on them."""
    if ids.numel() == 0:
        return (f"{name} of shape {tuple(ids.shape)} hold no ids, and the result is empty too, of shape "
                f"(*{name}.shape, {last}) as always: a reshape with -1 cannot infer its size when there are no "
                f"elements, so give every size, or work on the whole {name} tensor at once (no loop over ids)")
    if ids.dtype != torch.long:
        return (f"the ids here are {_dtype(ids.dtype)}: ids may be any integer dtype that check_ids accepts "
                f"({ID_DTYPES}), but PyTorch indexes with int64 and int32 only (and takes uint8 as a mask): "
                f"convert with {name}.long() first")
    return ""


def _expect_value_error(label: str, fn, name: str = "", hint: str = "", wrong_answers=()):
    """``fn()`` must raise ValueError, whose message names ``name`` if given. ``wrong_answers``: (candidate, why)
    pairs naming what the learner's function did instead of raising."""
    try:
        got = fn()
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError as err:
        if name and name not in str(err):
            fail(f"{label} raised ValueError({str(err)!r}); its message should name the bad id {name}", hint)
        return
    except Exception as err:  # noqa: BLE001 (any other error is the mistake being reported)
        if getattr(err, "grader_side", False):  # the grader's own trouble (a lost session) is not the learner's
            raise
        fail(f"{label} raised {describe_error(err)}; expected ValueError", hint)
    why = next((w for candidate, w in wrong_answers if isinstance(got, torch.Tensor) and _matches(got, candidate)), "")
    fail(f"{label} returned a {_what(got)} instead of raising ValueError" + (f": {why}" if why else ""), hint)


def _what(got) -> str:
    return f"tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else show(got)


@contextlib.contextmanager
def _charged_to(obj, **cells: str):
    """A failure of ``obj``'s check also says which of the notebook's functions ``obj`` calls ({name: its test
    cell}) fail their own tests: a mistake there is the likely cause, already charged in that cell."""
    try:
        yield
    except AssertionError as err:
        note = ""
        if any((v := earlier(c)) is not None and v.status == "failed" for c in cells.values()):
            try:
                used = ask("embeddings.uses", obj, list(cells))
            except LearnerError:
                used = []
            note = because_of(**{n: c for n, c in cells.items() if isinstance(used, list) and n in used})
        if not note:
            raise
        message, sep, hint = str(err).partition("\nHint: ")
        raise AssertionError(f"{message}\nHint: {note}" + (f". If not: {hint}" if sep else "")) from None


@contextlib.contextmanager
def _charged_part(name: str, obj, uses: dict[str, str]):
    """``judge.part(name)``, whose failure also says which of the notebook's functions that ``obj`` calls (``uses``,
    {name: its test cell}) fail their own tests (``_charged_to``)."""
    with part(name), _charged_to(obj, **uses):
        yield


CHECK_IDS_HINT = "call check_ids(ids, vocab_size) first: it raises ValueError naming the id"
# (ids, what they are, in a label): check_ids accepts integer tensors only
NOT_INTEGERS = [(torch.tensor([1.0, 2.0]), "a float tensor", "float ids"),
                (torch.tensor([True, False]), "a bool tensor", "bool ids")]
# The parts the three cells share. A cell's values on int64 ids weigh most; every other part checks one thing the
# contract promises. Each part is entered once, its cases in a loop inside it: its first failure is its message.
OTHER_DTYPES, NO_IDS, UNCHANGED = "int8, int16, int32 and uint8 ids", "ids with no elements", "inputs left unchanged"
GRADIENTS, FLOAT64, BAD_IDS = "gradients for training", "float64 tables", "ValueError for bad ids"


def _part_of(ids: torch.Tensor, values: str) -> str:
    """The part that a call on ``ids`` belongs to: ``values`` for int64 ids with elements."""
    return NO_IDS if ids.numel() == 0 else OTHER_DTYPES if ids.dtype != torch.long else values


# ---------------------------------------------------------------- one_hot

# (ids shape, vocab size, ids dtype). The first case has no id vocab_size - 1, so that a one-hot as wide as the
# largest id shows. No vocabulary as big as GPT-2's: torch.eye(vocab_size)[ids] is a correct answer, and would
# need 10 GB. Then every integer dtype check_ids accepts, ids with no elements, a vocabulary of one token.
ONE_HOT_CASES = [((6,), 11, torch.long), ((3, 5), 17, torch.long), ((2, 3, 4), 9, torch.long), ((1, 1), 4, torch.long),
                 ((1,), 1, torch.long), ((2, 7), 2000, torch.long), ((4, 3), 30, torch.int32),
                 ((2, 5), 300, torch.int16), ((5,), 5, torch.uint8), ((3, 2), 100, torch.int8), ((0,), 7, torch.long),
                 ((2, 0), 3, torch.int32)]


ONE_HOT_VALUES = "one-hot vectors of int64 ids"


@cell("test_one_hot", parts={ONE_HOT_VALUES: 3, OTHER_DTYPES: 1, NO_IDS: 1, UNCHANGED: 1, BAD_IDS: 1})
def check_one_hot(one_hot):
    cases = [(_ids(shape, V - 2 if k == 0 else V, seed=10 + k, dtype=dtype), V)
             for k, (shape, V, dtype) in enumerate(ONE_HOT_CASES)]
    returned = []  # (label, how it changed its arguments) of each call that returned
    for name in (ONE_HOT_VALUES, OTHER_DTYPES, NO_IDS):
        with part(name):
            for ids, V in cases:
                if _part_of(ids, ONE_HOT_VALUES) != name:
                    continue
                label = f"one_hot({_ids_text(ids)}, {V})"
                hint = _input_hint(ids, last="vocab_size")
                got, changed = _run(one_hot, (ids, V), label, hint)
                returned.append((label, changed))
                want = F.one_hot(ids.long(), V).float()
                _compare(label, got, want, _one_hot_mistakes(ids, V),
                         "one_hot must return floats (torch.float32), ready for the matrix product one_hot(ids, V) @ "
                         "table: add .float()", hint)
    with part(UNCHANGED):
        _unchanged(returned, ["ids", "vocab_size"])
    with part(BAD_IDS):
        for ids, V, bad in [(torch.tensor([3, 11, 1]), 11, "11"), (torch.tensor([[0, 1], [2, -3]]), 5, "-3"),
                            (torch.tensor([7, 1000]), 8, "1000"), (torch.tensor([2, 9], dtype=torch.uint8), 9, "9")]:
            _expect_value_error(f"one_hot({_ids_text(ids)}, {V})", lambda: one_hot(ids, V), bad, CHECK_IDS_HINT)
        for ids, what, _ in NOT_INTEGERS:
            _expect_value_error(f"one_hot({ids!r}, 4)", lambda: one_hot(ids, 4), "",
                                f"ids must be integers; check_ids(ids, vocab_size) rejects {what}")


def _one_hot_mistakes(ids, V):
    want = F.one_hot(ids.long(), V)
    return [
        (lambda: want.float().movedim(-1, 0),
         "the vocabulary dimension comes last: shape (*ids.shape, vocab_size); yours is transposed"),
        (lambda: want.float().reshape(-1, V), "keep the ids' shape and add one dimension; you flattened the ids"),
        (lambda: F.one_hot(ids.long()).float(),
         "the one-hot vectors must have vocab_size entries, not max(ids) + 1 (pass num_classes=vocab_size)"),
        (lambda: want.float().roll(-1, dims=-1), "the one is one place too early: at id - 1 instead of id"),
        (lambda: want.float().roll(1, dims=-1), "the one is one place too late: at id + 1 instead of id"),
    ]


# ---------------------------------------------------------------- embedding_lookup

# (ids shape, ids dtype, table rows V, columns C, table dtype)
LOOKUP_CASES = [((5,), torch.long, 13, 3, torch.float32), ((2, 6), torch.long, 20, 4, torch.float32),
                ((2, 2, 3), torch.long, 7, 5, torch.float32), ((1, 1), torch.long, 3, 2, torch.float32),
                ((4, 3), torch.int32, 50, 6, torch.float32), ((3, 8), torch.long, 50257, 4, torch.float32),
                ((2, 5), torch.int16, 40, 3, torch.float32), ((4,), torch.uint8, 4, 2, torch.float32),
                ((3, 4), torch.int8, 100, 3, torch.float32), ((2, 3), torch.long, 11, 4, torch.float64),
                ((3,), torch.uint8, 200, 2, torch.float64), ((2, 2), torch.long, 1, 1, torch.float32),
                ((0,), torch.long, 5, 3, torch.float32), ((2, 0), torch.int32, 6, 2, torch.float64)]

ONE_HOT_PRODUCT = ("pick the rows of the table (table[ids]): the result has the table's dtype (float64 here), and a "
                   "product with one_hot's float32 vectors does not")


LOOKUP_VALUES = "rows of float32 tables for int64 ids"
LOOKUP_USES = {"one_hot": "test_one_hot"}  # what the learner's embedding_lookup may call


@cell("test_embedding_lookup", parts={LOOKUP_VALUES: 3, OTHER_DTYPES: 1, FLOAT64: 1, NO_IDS: 1, UNCHANGED: 1,
                                      GRADIENTS: 1, BAD_IDS: 1})
def check_embedding_lookup(embedding_lookup):
    cases = []
    for k, (shape, dtype, V, C, table_dtype) in enumerate(LOOKUP_CASES):
        table = _table(V, C, seed=20 + k, dtype=table_dtype)
        ids = _ids(shape, V, seed=30 + k, dtype=dtype)
        if ids.numel():
            ids.view(-1)[0], ids.view(-1)[-1] = V - 1, 0  # the first and the last row are used
        cases.append((_part_of(ids, LOOKUP_VALUES if table_dtype == torch.float32 else FLOAT64), table, ids))
    returned = []  # (label, how it changed its arguments) of each call that returned
    for name in (LOOKUP_VALUES, OTHER_DTYPES, FLOAT64, NO_IDS):
        with _charged_part(name, embedding_lookup, LOOKUP_USES):
            for case_part, table, ids in cases:
                if case_part == name:
                    _check_lookup(embedding_lookup, table, ids, returned)
                    if ids.dim() == 1 and name == LOOKUP_VALUES:  # a row of ids worked: now a batch
                        _lookup_2d_after_1d(embedding_lookup)
    with _charged_part(UNCHANGED, embedding_lookup, LOOKUP_USES):
        _unchanged(returned, ["table", "ids"])
    with _charged_part(GRADIENTS, embedding_lookup, LOOKUP_USES):
        _check_lookup_gradients(embedding_lookup)
    with _charged_part(BAD_IDS, embedding_lookup, LOOKUP_USES):
        _check_lookup_errors(embedding_lookup)


def _check_lookup(embedding_lookup, table, ids, returned: list) -> None:
    label = f"embedding_lookup({_table_text(table)}, {_ids_text(ids)})"
    hint = _input_hint(ids) or (ONE_HOT_PRODUCT if table.dtype != torch.float32 else "")
    got, changed = _run(embedding_lookup, (table, ids), label, hint)
    returned.append((label, changed))
    want = F.embedding(ids.long(), table)
    mistakes = [
        (lambda: table[:, ids.long()], "pick rows of the table (one per token id), not columns: table[ids]"),
        (lambda: table[ids.long().reshape(-1)], "keep the ids' shape: the result is (*ids.shape, C)"),
        (lambda: table[ids.long() % 256], "ids above 255 wrapped around: uint8 (.byte()) holds 0 .. 255 only; "
                                          "convert the ids with ids.long()"),
        (lambda: table[ids.to(torch.int16).long()], "ids above 32767 wrapped around to negative ones: int16 "
                                                    "(.short()) holds -32768 .. 32767 only; convert the ids with "
                                                    "ids.long()"),
    ]
    _compare(label, got, want, mistakes, f"the result has the table's dtype ({_dtype(table.dtype)} here): pick "
                                         "its rows as they are, without converting them", hint)


def _check_lookup_errors(embedding_lookup):
    table = _table(6, 3, seed=40)
    wrong = {
        "6": [(lambda: table[[5]], "id 6 was clamped to the last row 5"),
              (lambda: table[[0]], "id 6 wrapped around to row 0")],
        "-1": [(lambda: table[[5]], "id -1 gave the table's last row: negative indices count from the end in "
                                    "Python, so they must be rejected before indexing")],
        "-2": [(lambda: table[[1, 4]], "id -2 gave row 4: negative indices count from the end in Python, so "
                                       "they must be rejected before indexing")],
        "9": [(lambda: table[[5, 2]], "id 9 was clamped to the last row 5")],
    }
    # Negative ids first: plain indexing does not fail on them, it silently counts from the end.
    for ids, bad in [(torch.tensor([-1]), "-1"), (torch.tensor([[1, -2]]), "-2"), (torch.tensor([6]), "6"),
                     (torch.tensor([9, 2]), "9")]:
        _expect_value_error(f"embedding_lookup(<table 6x3>, {_ids_text(ids)})", lambda: embedding_lookup(table, ids),
                            bad, "call check_ids(ids, table.shape[0]) first: it raises ValueError naming the id",
                            wrong[bad])
    for ids, what, _ in NOT_INTEGERS:
        ids = ids[None]
        _expect_value_error(f"embedding_lookup(<table 6x3>, {ids!r})", lambda: embedding_lookup(table, ids), "",
                            f"ids must be integers; check_ids(ids, table.shape[0]) rejects {what}")


def _lookup_2d_after_1d(embedding_lookup):
    """A lookup that works on a row of ids but crashes on a batch: name it before the generic crash message."""
    table, ids = _table(9, 2, seed=50), _ids((2, 3), 9, seed=51)
    try:
        embedding_lookup(table, ids)
    except NotImplementedError:
        pass
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        fail(f"embedding_lookup(<table 9x2>, {_ids_text(ids)}) raised {describe_error(err)}",
             "it works on a 1-D row of ids but not on a (B, T) batch: index the table with the whole id tensor "
             "(table[ids]), which works for ids of any shape, instead of looping over ids or converting them "
             "to Python ints")


def _check_lookup_gradients(embedding_lookup):
    """Chapter 8 trains the tables through this lookup: the table's gradient is, for each row, the sum of the
    output's gradients at every place the row was picked."""
    V, C = 7, 3
    table, ids = _table(V, C, seed=45), torch.tensor([[3, 3, 0], [6, 3, 1]])
    weight = _table(6, C, seed=46).reshape(2, 3, C)
    label = f"embedding_lookup(<table {V}x{C} that requires grad>, {_ids_text(ids)})"
    answer = call(ask, "embeddings.gradients", embedding_lookup, [table, ids], weight, table=0, label=label)
    if not isinstance(answer, dict) or "requires_grad" not in answer:
        got = answer.get("output") if isinstance(answer, dict) else answer
        fail(f"{label} returned {_what(got)}, expected a tensor of shape {tuple(weight.shape)}")
    if not answer["requires_grad"]:
        fail(f"{label} returned a tensor that does not require grad: training could not change the table",
             "index the table itself (table[ids]), not table.detach() or table.data, and not under torch.no_grad()")
    want = torch.zeros(V, C).index_add_(0, ids.flatten(), weight.reshape(-1, C))
    grad = answer.get("table")
    if not isinstance(grad, torch.Tensor) or not close(grad, want):
        fail(f"after {label}, (out * w).sum().backward() gives the table the gradient {show(grad)}, expected "
             f"{show(want)}: each row should get the sum of w at every place it was picked",
             "index the table itself (table[ids]) and do not detach any part of it")


# ---------------------------------------------------------------- Embeddings

# (vocab_size, block_size, n_embd) and the calls (B, T, offset, ids dtype) on each. Order matters for the
# messages: the first call has one row, so that a position index built from the batch size gives a wrong
# answer (named) rather than a crash, and the second has B * T <= block_size, so that positions numbered
# across the whole batch do too; offset + T == block_size must fit. Every integer dtype check_ids accepts, and
# batches with no tokens (T = 0) and no rows (B = 0).
EMBEDDINGS_CASES = [
    ((50, 8, 6), [(1, 6, 0, torch.long), (2, 3, 0, torch.long), (3, 4, 0, torch.long), (2, 3, 3, torch.long),
                  (2, 1, 7, torch.long), (1, 8, 0, torch.long), (4, 4, 2, torch.long), (2, 5, 1, torch.int32),
                  (3, 4, 4, torch.int16), (2, 6, 2, torch.uint8), (1, 3, 5, torch.int8), (2, 0, 0, torch.long),
                  (0, 3, 1, torch.long)]),
    ((1000, 16, 5), [(3, 16, 0, torch.long), (2, 7, 9, torch.long), (1, 1, 0, torch.long), (2, 4, 12, torch.int16)]),
    ((50257, 12, 4), [(2, 9, 3, torch.long)]),
    ((1, 1, 1), [(2, 1, 0, torch.long)]),
]


TABLES_HINT = "keep the given tables wte and wpe (nn.Embedding)"
USED = {"embedding_lookup": "test_embedding_lookup", "one_hot": "test_one_hot"}


def _embeddings(Embeddings, V, block, C, seed=None, tables=None, dtype=torch.float32):
    """The learner's Embeddings with seeded tables (or ``tables``, (wte, wpe)), so the expected values do not
    depend on torch's RNG, in ``dtype`` (``.double()``): ``(layer, wte, wpe)``, the tables as sent into the layer."""
    name = f"Embeddings(vocab_size={V}, block_size={block}, n_embd={C})"
    emb = call(Embeddings, vocab_size=V, block_size=block, n_embd=C, name="Embeddings")
    for table_name, rows in (("wte", V), ("wpe", block)):
        table = getattr(getattr(emb, table_name, None), "weight", None)
        if not isinstance(table, torch.Tensor) or tuple(table.shape) != (rows, C):
            fail(f"{name}.{table_name}.weight is {_what(table)}, expected shape ({rows}, {C})", TABLES_HINT)
    if dtype == torch.float64:
        call(emb.double, label=f"{name}.double()")
    wte, wpe = tables if tables is not None else (_table(V, C, seed), _table(block, C, seed + 1))
    wte, wpe = wte.detach().clone().to(dtype), wpe.detach().clone().to(dtype)
    try:  # the tables are sent into the learner's layer; its own load_state_dict copies them in
        result = emb.load_state_dict({"wte.weight": wte, "wpe.weight": wpe}, strict=False)
    except LearnerError as err:
        fail(f"the check's tables do not load into {name}: {describe_error(err)}", TABLES_HINT)
    unexpected = getattr(result, "unexpected_keys", None)
    if not isinstance(unexpected, list):
        fail(f"{name}.load_state_dict returned {show(result)}, not torch's missing and unexpected keys", TABLES_HINT)
    if unexpected:
        fail(f"{name} has no parameter named {', '.join(map(str, unexpected))}", TABLES_HINT)
    return emb, wte, wpe


def _embeddings_mistakes(wte, wpe, idx, offset):
    B, T = idx.shape
    idx = idx.long()
    tok = wte[idx]
    return [
        (lambda: tok, "you returned only the token embeddings: add the position embeddings wpe of positions "
                      "offset .. offset + T - 1"),
        (lambda: wpe[offset:offset + T].expand(B, T, -1), "you returned only the position embeddings: add the "
                                                          "token embeddings wte[idx]"),
        (lambda: tok + wpe[:T], f"offset ignored: with offset={offset} the positions are {offset} .. "
                                f"{offset + T - 1}, you used 0 .. {T - 1}"),
        (lambda: tok + wpe[offset + 1:offset + T + 1], "position ids start at offset (0 for a whole prompt), not "
                                                       "at offset + 1: use torch.arange(offset, offset + T)"),
        (lambda: tok + wpe[offset], "every token got the same position vector wpe[offset]: positions count the T "
                                    "tokens of each row (idx.shape[1]), not the B rows of the batch (idx.shape[0])"),
        (lambda: tok + wpe[offset:offset + B], "positions count the T tokens of each row (idx.shape[1]), not the "
                                               "B rows of the batch (idx.shape[0])"),
        (lambda: tok + wpe[offset:offset + B][:, None], "row b of the batch got position b for all its tokens: "
                                                        "positions count the T tokens of each row (idx.shape[1]), "
                                                        "not the B rows of the batch (idx.shape[0])"),
        (lambda: tok + wpe[offset + torch.arange(B * T).view(B, T)], "every row of the batch starts again at "
                                                                     "position offset; you numbered the whole "
                                                                     "batch as one long sequence"),
        (lambda: tok * wte.shape[1] ** 0.5 + wpe[offset:offset + T], "GPT-2 adds the token embeddings as they "
                                                                     "are, without scaling them by sqrt(n_embd)"),
        (lambda: torch.cat([tok, wpe[offset:offset + T].expand(B, T, -1)], dim=-1),
         "add the two embeddings (shape (B, T, C)), do not concatenate them"),
        (lambda: (tok + wpe[offset:offset + T]).transpose(0, 1), "the output is (B, T, C), batch first"),
    ]


EMBEDDINGS_VALUES, GPT2_LAYER = "values on (B, T) ids, with and without offset", "the same as GPT-2's input layer"
EMBEDDINGS_PARTS = {EMBEDDINGS_VALUES: 3, OTHER_DTYPES: 1, NO_IDS: 1, UNCHANGED: 1, BAD_IDS: 1, GRADIENTS: 1,
                    FLOAT64: 1, GPT2_LAYER: 1}


@cell("test_embeddings", parts=EMBEDDINGS_PARTS)
def check_embeddings(Embeddings):
    with _charged_to(Embeddings, **USED):
        layers = [(_embeddings(Embeddings, V, block, C, seed=60 + 2 * k), calls)
                  for k, ((V, block, C), calls) in enumerate(EMBEDDINGS_CASES)]
    returned = []  # (label, how it changed idx) of each call that returned
    for name in (EMBEDDINGS_VALUES, OTHER_DTYPES, NO_IDS):
        with _charged_part(name, Embeddings, USED):
            for k, ((emb, wte, wpe), calls) in enumerate(layers):
                for j, (B, T, offset, dtype) in enumerate(calls):
                    idx = _ids((B, T), wte.shape[0], seed=100 * k + j, dtype=dtype)
                    if _part_of(idx, EMBEDDINGS_VALUES) == name:
                        _check_forward(emb, idx, offset, wte, wpe, returned)
    with _charged_part(BAD_IDS, Embeddings, USED):
        _check_embeddings_errors(Embeddings)
    with _charged_part(GRADIENTS, Embeddings, USED):
        _check_gradients(Embeddings)
    with _charged_part(FLOAT64, Embeddings, USED):
        _check_float64(Embeddings, returned)
    with _charged_part(GPT2_LAYER, Embeddings, USED):
        _check_against_gpt2(Embeddings, returned)
    with _charged_part(UNCHANGED, Embeddings, USED):
        _unchanged(returned, ["idx"])


def _check_forward(emb, idx, offset, wte, wpe, returned: list, suffix="", want=None):
    """``emb(idx, offset)`` equals ``want`` (default: what the tables ``wte`` and ``wpe``, which ``emb`` holds, give);
    how it changed ``idx`` goes to ``returned``, for ``_unchanged``."""
    V, C = wte.shape
    block = wpe.shape[0]
    label = _forward_label(idx, offset, V, block, C) + suffix
    got, changed = _forward(emb, idx, offset, V, block, C, wte.dtype)
    returned.append((label, changed))
    if want is None:
        pos = torch.arange(offset, offset + idx.shape[1])
        want = F.embedding(idx.long(), wte) + F.embedding(pos, wpe)
    _compare(label, got, want, _embeddings_mistakes(wte, wpe, idx, offset),
             "the output has the tables' dtype: after .double() they hold float64, and so must the output",
             _input_hint(idx, "idx"))


def _forward_label(idx, offset, V, block, C) -> str:
    return (f"Embeddings(vocab_size={V}, block_size={block}, n_embd={C})({_ids_text(idx)}"
            + (f", offset={offset})" if offset else ")"))


def _forward(emb, idx, offset, V, block, C, dtype=torch.float32):
    """(emb(idx) or emb(idx, offset=offset), how it changed idx in place: "" if not); a ValueError where the positions
    fit is named as such."""
    label = _forward_label(idx, offset, V, block, C)
    try:
        out, changed = ask("embeddings.run", emb, idx, offset=offset) if offset else ask("embeddings.run", emb, idx)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError as err:
        B, T = idx.shape
        hint = ""
        if offset + T == block:
            hint = (f"offset + T == block_size fits: with offset={offset} and T={T} the last position is "
                    f"{block - 1}, the last row of wpe; only offset + T > block_size is an error")
        elif 0 in (B, T):
            hint = _input_hint(idx, "idx")
        fail(f"{label} raised {describe_error(err)}", hint)
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        hint = _input_hint(idx, "idx")
        if not hint and dtype != torch.float32:
            hint = ("the tables hold float64 here (after .double()): look their rows up (self.wte(idx)), a product "
                    "with one_hot's float32 vectors does not take their dtype")
        elif not hint and idx.shape[0] not in (1, idx.shape[1]):
            hint = ("check your positions: they count the T tokens of each row (idx.shape[1]) and are the same "
                    "for every row of the batch, so a (T, C) block of position vectors broadcasts over B")
        fail(f"{label} raised {describe_error(err)}", hint)
    return out, changed


def _check_embeddings_errors(Embeddings):
    V, block, C = 30, 6, 4
    emb, wte, wpe = _embeddings(Embeddings, V, block, C, seed=70)
    long_idx = _ids((2, block + 1), V, seed=71)
    ok_idx = _ids((1, 4), V, seed=72)
    for idx, offset, positions in [(long_idx, 0, f"0 .. {block}"), (ok_idx, block - 3, f"{block - 3} .. {block}"),
                                   (ok_idx[:, :1], block, f"{block}"), (_ids((1, 2 * block), V, 73), 0,
                                                                        f"0 .. {2 * block - 1}")]:
        label = _forward_label(idx, offset, V, block, C)
        _expect_value_error(
            label, lambda: emb(idx, offset=offset), "",
            f"positions {positions} do not fit in block_size {block} (wpe has {block} rows): check "
            "offset + T <= block_size and raise ValueError, so that a too long sequence is an error that says so",
            [(lambda: wte[idx] + wpe[(offset + torch.arange(idx.shape[1])).clamp(max=block - 1)],
              "positions past the end were clamped to the last one")])
    for values, bad in [([[0, -1, 3]], "-1"), ([[1, 2, V]], str(V)), ([[4], [V + 7]], str(V + 7))]:
        idx = torch.tensor(values)
        wrap = idx.clone()
        wrap[wrap < 0] += V
        _expect_value_error(
            _forward_label(idx, 0, V, block, C), lambda: emb(idx), bad,
            "check the ids with check_ids(idx, self.vocab_size) before the lookup: it raises ValueError naming the id",
            [(lambda: wte[idx.clamp(0, V - 1)] + wpe[:idx.shape[1]], f"id {bad} was clamped into the vocabulary"),
             (lambda: wte[wrap % V] + wpe[:idx.shape[1]], f"id {bad} wrapped around to another row of wte")])
    for idx, what, kind in NOT_INTEGERS:
        idx = idx[None]
        _expect_value_error(f"{_forward_label(idx, 0, V, block, C)} with {kind}", lambda: emb(idx), "",
                            f"token ids must be integers: check_ids(idx, self.vocab_size) rejects {what}")


def _check_gradients(Embeddings):
    """Training needs gradients in both tables: each row of wte gets the output's gradients at every place its
    token was, each row of wpe those at its position in every row of the batch."""
    V, block, C = 12, 5, 3
    emb, _, _ = _embeddings(Embeddings, V, block, C, seed=80)
    idx = torch.tensor([[3, 3, 0], [7, 3, 11]])
    offset = 1
    label = _forward_label(idx, offset, V, block, C)
    weight = _table(6, C, seed=81).reshape(2, 3, C)
    # The backward pass runs where the layer is (its parameters are there): a helper.
    answer = call(ask, "embeddings.gradients", emb, [idx], weight, kwargs={"offset": offset},
                  label=f"{label} with gradients")
    if not isinstance(answer, dict):
        fail(f"{label} with gradients: the notebook's side answered {show(answer)}, not what the grader asked for")
    if "requires_grad" not in answer:
        fail(f"{label} returned {_what(answer.get('output'))}, expected a tensor of shape {tuple(weight.shape)}")
    if not answer["requires_grad"]:
        fail(f"{label} returned a tensor that does not require grad: training could not change wte and wpe",
             "compute with the tables themselves (self.wte(idx), self.wpe(...) or .weight[...]), not with "
             ".data, .detach() or under torch.no_grad()")
    want = {"wte.weight": torch.zeros(V, C).index_add_(0, idx.flatten(), weight.reshape(-1, C)),
            "wpe.weight": torch.zeros(block, C)}
    want["wpe.weight"][offset:offset + idx.shape[1]] = weight.sum(0)
    params = answer.get("params") or {}
    for name, w in want.items():
        grad = params.get(name)
        if not isinstance(grad, torch.Tensor) or not close(grad, w):
            fail(f"after {label}, (out * w).sum().backward() leaves {name}.grad "
                 f"{'None' if grad is None else 'wrong'}: each row of {name.split('.')[0]} should get the sum of w "
                 "at every place it was used", "compute with the tables themselves, not with .data or .detach()")


def _check_float64(Embeddings, returned: list):
    """A layer made float64 by .double() computes in float64."""
    V, block, C = 40, 7, 3
    emb, wte, wpe = _embeddings(Embeddings, V, block, C, seed=85, dtype=torch.float64)
    _check_forward(emb, _ids((2, 5), V, seed=86), 2, wte, wpe, returned, suffix=" after .double()")


# ---------------------------------------------------------------- against Hugging Face's GPT-2

_BUILD = threading.Lock()  # one build of the oracle, whichever thread asks first


@functools.cache
def _gpt2_cached(V: int, block: int, C: int):
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=V, n_positions=block, n_embd=C, n_layer=1, n_head=1, embd_pdrop=0.0,
                        resid_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    with seeded(0):  # its constructor draws from torch's global generator: seeded, under the judge's lock
        return GPT2Model(config).eval()


def _gpt2(V: int, block: int, C: int):
    """Hugging Face's GPT-2 with weights from seed 0, built once per process and only read afterwards."""
    with _BUILD:
        return _gpt2_cached(V, block, C)


def gpt2_input_layer(model, idx: torch.Tensor, offset: int) -> torch.Tensor:
    """What GPT-2's first block reads (hidden_states[0]) for ``idx`` after ``offset`` earlier tokens, which it
    holds in its key/value cache and counts its positions from."""
    with torch.no_grad():
        cache = None
        if offset:
            cache = model(torch.zeros(idx.shape[0], offset, dtype=torch.long), use_cache=True).past_key_values
        return model(idx, past_key_values=cache, use_cache=cache is not None, output_hidden_states=True).hidden_states[0]


def _check_against_gpt2(Embeddings, returned: list):
    V, block, C = 97, 10, 8
    model = _gpt2(V, block, C)
    emb, wte, wpe = _embeddings(Embeddings, V, block, C, tables=(model.wte.weight, model.wpe.weight))
    for j, (B, T, offset) in enumerate([(2, 10, 0), (3, 4, 6), (1, 1, 9), (2, 3, 2)]):
        idx = _ids((B, T), V, seed=95 + j)
        _check_forward(emb, idx, offset, wte, wpe, returned, suffix=" with GPT-2's tables",
                       want=gpt2_input_layer(model, idx, offset))
