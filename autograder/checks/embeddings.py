"""Chapter 2 (embeddings): hidden checks for one_hot, embedding_lookup and Embeddings.

The oracles are PyTorch's own ``F.one_hot`` and ``F.embedding``, and Hugging Face's ``GPT2Model``, whose input
layer (``wte(ids) + wpe(positions)``, positions counted on from a cache of earlier tokens) is the layer the
learner writes. Inputs are ones the learner has not seen: ids of other shapes and dtypes, other table sizes,
sequences that fill the block, offsets. Every table is filled from a seeded generator, so a check does not
depend on the learner's random state.

The learner's functions and class are stand-ins (``autograder.judge.Remote``): they run where the notebook runs.
The ids and tables are sent there as plain tensors (an ``Embeddings``' tables through ``load_state_dict``), what
comes back is plain tensors, and the expected values are computed here from the same tensors. The one step that
must run next to the learner's layer, a backward pass whose gradients stay in its tables, is a helper
(``autograder.helpers.embeddings``).
"""
from __future__ import annotations

import functools
import threading

import torch
import torch.nn.functional as F

from autograder.judge import LearnerError, ask, cell, seeded
from coursekit.testing import call, describe_error, fail, not_written, show


def _ids(shape: tuple[int, ...], vocab_size: int, seed: int, dtype=torch.long) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_size, shape, generator=gen).to(dtype)


def _table(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _ids_text(ids: torch.Tensor) -> str:
    """Small id tensors in full, big ones by shape and dtype."""
    dtype = "" if ids.dtype == torch.long else f", dtype={ids.dtype}"
    if ids.numel() <= 12:
        return f"tensor({ids.tolist()}{dtype})"
    return f"<ids of shape {tuple(ids.shape)}{dtype}>"


def _vec(v: torch.Tensor) -> str:
    values = [round(x, 4) for x in v.detach().flatten().tolist()]
    return show(values)


def _difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where the first wrong vector is, and what it holds."""
    bad = (~torch.isclose(got.detach().float(), want.float(), atol=1e-5, rtol=1e-5)).reshape(-1, want.shape[-1])
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
    return other.shape == got.shape and torch.allclose(got.detach().float(), other.float(), atol=1e-5, rtol=1e-5)


def _compare(label: str, got, want: torch.Tensor, mistakes=(), dtype_hint: str = "") -> None:
    """Fail unless ``got`` equals ``want`` (shape, values, dtype). On a mismatch, name the first of
    ``mistakes`` (candidate, why) whose candidate gives ``got`` and differs from ``want``."""
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {show(got)}, expected a tensor of shape {tuple(want.shape)}")
    if got.shape == want.shape and _matches(got, lambda: want):
        if got.dtype != want.dtype:
            fail(f"{label} returned dtype {got.dtype}, expected {want.dtype}", dtype_hint)
        return
    hint = next((why for candidate, why in mistakes if _matches(got, candidate) and not _matches(want, candidate)), "")
    if got.shape != want.shape:
        fail(f"{label} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}", hint)
    fail(f"{label} returned wrong values: {_difference(got, want)}", hint)


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


CHECK_IDS_HINT = "call check_ids(ids, vocab_size) first: it raises ValueError naming the id"


# ---------------------------------------------------------------- one_hot

# (ids shape, vocab size). The first case has no id vocab_size - 1, so that a one-hot as wide as the largest
# id shows. No vocabulary as big as GPT-2's: torch.eye(vocab_size)[ids] is a correct answer, and would need 10 GB.
ONE_HOT_CASES = [((6,), 11), ((3, 5), 17), ((2, 3, 4), 9), ((1, 1), 4), ((1,), 1), ((2, 7), 2000)]


@cell("test_one_hot")
def check_one_hot(one_hot):
    for k, (shape, V) in enumerate(ONE_HOT_CASES):
        ids = _ids(shape, V - 2 if k == 0 else V, seed=10 + k)
        label = f"one_hot({_ids_text(ids)}, {V})"
        got = call(one_hot, ids, V, label=label)
        want = F.one_hot(ids, V).float()
        _compare(label, got, want, _one_hot_mistakes(ids, V),
                 "one_hot must return floats (torch.float32), ready for the matrix product one_hot(ids, V) @ table: "
                 "add .float()")
    for ids, V, bad in [(torch.tensor([3, 11, 1]), 11, "11"), (torch.tensor([[0, 1], [2, -3]]), 5, "-3"),
                        (torch.tensor([7, 1000]), 8, "1000")]:
        _expect_value_error(f"one_hot({_ids_text(ids)}, {V})", lambda: one_hot(ids, V), bad, CHECK_IDS_HINT)
    ids = torch.tensor([1.0, 2.0])
    _expect_value_error(f"one_hot({ids!r}, 4)", lambda: one_hot(ids, 4), "",
                        "ids must be integers; check_ids(ids, vocab_size) rejects a float tensor")


def _one_hot_mistakes(ids, V):
    want = F.one_hot(ids, V)
    return [
        (lambda: want.float().movedim(-1, 0),
         "the vocabulary dimension comes last: shape (*ids.shape, vocab_size); yours is transposed"),
        (lambda: want.float().reshape(-1, V), "keep the ids' shape and add one dimension; you flattened the ids"),
        (lambda: F.one_hot(ids).float(),
         "the one-hot vectors must have vocab_size entries, not max(ids) + 1 (pass num_classes=vocab_size)"),
        (lambda: want.float().roll(-1, dims=-1), "the one is one place too early: at id - 1 instead of id"),
        (lambda: want.float().roll(1, dims=-1), "the one is one place too late: at id + 1 instead of id"),
    ]


# ---------------------------------------------------------------- embedding_lookup

# (ids shape, ids dtype, table rows V, columns C)
LOOKUP_CASES = [((5,), torch.long, 13, 3), ((2, 6), torch.long, 20, 4), ((2, 2, 3), torch.long, 7, 5),
                ((1, 1), torch.long, 3, 2), ((4, 3), torch.int32, 50, 6), ((3, 8), torch.long, 50257, 4)]


@cell("test_embedding_lookup")
def check_embedding_lookup(embedding_lookup):
    for k, (shape, dtype, V, C) in enumerate(LOOKUP_CASES):
        table = _table(V, C, seed=20 + k)
        ids = _ids(shape, V, seed=30 + k, dtype=dtype)
        ids.view(-1)[0], ids.view(-1)[-1] = V - 1, 0  # the first and the last row are used
        label = f"embedding_lookup(<table {V}x{C}>, {_ids_text(ids)})"
        got = call(embedding_lookup, table, ids, label=label)
        want = F.embedding(ids, table)
        mistakes = [
            (lambda: table[:, ids.long()], "pick rows of the table (one per token id), not columns: table[ids]"),
            (lambda: table[ids.long().reshape(-1)], "keep the ids' shape: the result is (*ids.shape, C)"),
        ]
        _compare(label, got, want, mistakes)
        if len(shape) == 1:
            _lookup_2d_after_1d(embedding_lookup)
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
    ids = torch.tensor([[0.0, 1.0]])
    _expect_value_error(f"embedding_lookup(<table 6x3>, {ids!r})", lambda: embedding_lookup(table, ids), "",
                        "ids must be integers; check_ids(ids, table.shape[0]) rejects a float tensor")


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


# ---------------------------------------------------------------- Embeddings

# (vocab_size, block_size, n_embd) and the calls (B, T, offset, ids dtype) on each. Order matters for the
# messages: the first call has one row, so that a position index built from the batch size gives a wrong
# answer (named) rather than a crash, and the second has B * T <= block_size, so that positions numbered
# across the whole batch do too; offset + T == block_size must fit.
EMBEDDINGS_CASES = [
    ((50, 8, 6), [(1, 6, 0, torch.long), (2, 3, 0, torch.long), (3, 4, 0, torch.long), (2, 3, 3, torch.long), (2, 1, 7, torch.long),
                  (1, 8, 0, torch.long), (4, 4, 2, torch.long), (2, 5, 1, torch.int32)]),
    ((1000, 16, 5), [(3, 16, 0, torch.long), (2, 7, 9, torch.long), (1, 1, 0, torch.long)]),
    ((50257, 12, 4), [(2, 9, 3, torch.long)]),
]


TABLES_HINT = "keep the given tables wte and wpe (nn.Embedding)"


def _embeddings(Embeddings, V, block, C, seed=None, tables=None):
    """The learner's Embeddings with seeded tables (or ``tables``, (wte, wpe)), so the expected values do not
    depend on torch's RNG: ``(layer, wte, wpe)``, the tables as sent into the layer."""
    name = f"Embeddings(vocab_size={V}, block_size={block}, n_embd={C})"
    emb = call(Embeddings, vocab_size=V, block_size=block, n_embd=C, name="Embeddings")
    for part, rows in (("wte", V), ("wpe", block)):
        table = getattr(getattr(emb, part, None), "weight", None)
        if not isinstance(table, torch.Tensor) or tuple(table.shape) != (rows, C):
            fail(f"{name}.{part}.weight is {_what(table)}, expected shape ({rows}, {C})", TABLES_HINT)
    wte, wpe = tables if tables is not None else (_table(V, C, seed), _table(block, C, seed + 1))
    wte, wpe = wte.detach().clone(), wpe.detach().clone()
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


@cell("test_embeddings")
def check_embeddings(Embeddings):
    for k, ((V, block, C), calls) in enumerate(EMBEDDINGS_CASES):
        emb, wte, wpe = _embeddings(Embeddings, V, block, C, seed=60 + 2 * k)
        for j, (B, T, offset, dtype) in enumerate(calls):
            idx = _ids((B, T), V, seed=100 * k + j, dtype=dtype)
            got = _forward(emb, idx, offset, V, block, C)
            pos = torch.arange(offset, offset + T)
            want = F.embedding(idx, wte) + F.embedding(pos, wpe)
            _compare(_forward_label(idx, offset, V, block, C), got, want, _embeddings_mistakes(wte, wpe, idx, offset))
    _check_embeddings_errors(Embeddings)
    _check_gradients(Embeddings)
    _check_against_gpt2(Embeddings)


def _forward_label(idx, offset, V, block, C) -> str:
    return (f"Embeddings(vocab_size={V}, block_size={block}, n_embd={C})({_ids_text(idx)}"
            + (f", offset={offset})" if offset else ")"))


def _forward(emb, idx, offset, V, block, C):
    """emb(idx) or emb(idx, offset=offset); a ValueError where the positions fit is named as such."""
    label = _forward_label(idx, offset, V, block, C)
    try:
        return emb(idx, offset=offset) if offset else emb(idx)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError as err:
        T = idx.shape[1]
        hint = ""
        if offset + T == block:
            hint = (f"offset + T == block_size fits: with offset={offset} and T={T} the last position is "
                    f"{block - 1}, the last row of wpe; only offset + T > block_size is an error")
        fail(f"{label} raised ValueError: {err}", hint)
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):
            raise
        hint = ""
        if idx.dtype != torch.long:
            hint = "token ids may be any integer dtype (here int32); convert them with idx.long() if you need to"
        elif idx.shape[0] not in (1, idx.shape[1]):
            hint = ("check your positions: they count the T tokens of each row (idx.shape[1]) and are the same "
                    "for every row of the batch, so a (T, C) block of position vectors broadcasts over B")
        fail(f"{label} raised {describe_error(err)}", hint)


def _check_embeddings_errors(Embeddings):
    V, block, C = 30, 6, 4
    emb, wte, wpe = _embeddings(Embeddings, V, block, C, seed=70)
    long_idx = _ids((2, block + 1), V, seed=71)
    ok_idx = _ids((1, 4), V, seed=72)
    for idx, offset, positions in [(long_idx, 0, f"0 .. {block}"), (ok_idx, block - 3, f"{block - 3} .. {block}"),
                                   (ok_idx[:, :1], block, f"{block}")]:
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
    idx = torch.tensor([[1.0, 2.0]])
    _expect_value_error(_forward_label(idx, 0, V, block, C) + " with float ids", lambda: emb(idx), "",
                        "token ids must be integers: check_ids(idx, self.vocab_size) rejects a float tensor")


def _check_gradients(Embeddings):
    """Training needs gradients in both tables: each row gets one gradient per time it was used."""
    V, block, C = 12, 5, 3
    emb, _, _ = _embeddings(Embeddings, V, block, C, seed=80)
    idx = torch.tensor([[3, 3, 0], [7, 3, 11]])
    offset = 1
    label = _forward_label(idx, offset, V, block, C)
    out = _forward(emb, idx, offset, V, block, C)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        fail(f"{label} returned a tensor that does not require grad: training could not change wte and wpe",
             "compute with the tables themselves (self.wte(idx), self.wpe(...) or .weight[...]), not with "
             ".data, .detach() or under torch.no_grad()")
    # The backward pass runs where the layer is (its gradients stay in its tables): a helper there.
    grads = call(ask, "embeddings.gradients", emb, idx, offset, label=f"{label}.sum().backward()")
    if not isinstance(grads, dict):
        fail(f"{label}.sum().backward(): the notebook's side answered {show(grads)}, not what the grader asked for")
    want_wte = torch.bincount(idx.flatten(), minlength=V).float()[:, None].expand(V, C)
    want_wpe = torch.zeros(block)
    want_wpe[offset:offset + idx.shape[1]] = idx.shape[0]
    for name, want in (("wte", want_wte), ("wpe", want_wpe[:, None].expand(block, C))):
        grad = grads.get(name)
        if not isinstance(grad, torch.Tensor) or grad.shape != want.shape or not torch.allclose(grad, want):
            fail(f"after {label}.sum().backward(), {name}.weight.grad is "
                 f"{'None' if grad is None else 'wrong'}: each row of {name} should get a gradient of 1 for each "
                 "time it was used", "compute with the tables themselves, not with .data or .detach()")


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


def _check_against_gpt2(Embeddings):
    V, block, C = 97, 10, 8
    model = _gpt2(V, block, C)
    emb, _, _ = _embeddings(Embeddings, V, block, C, tables=(model.wte.weight, model.wpe.weight))
    for j, (B, T, offset) in enumerate([(2, 10, 0), (3, 4, 6), (1, 1, 9), (2, 3, 2)]):
        idx = _ids((B, T), V, seed=95 + j)
        want = gpt2_input_layer(model, idx, offset)
        got = _forward(emb, idx, offset, V, block, C)
        _compare(_forward_label(idx, offset, V, block, C) + " with GPT-2's tables", got, want,
                 _embeddings_mistakes(model.wte.weight.detach(), model.wpe.weight.detach(), idx, offset))
