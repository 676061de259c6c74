"""Chapter 3 (masked attention): hidden checks for causal_mask, softmax, attention and CausalSelfAttention.

The oracles are PyTorch's own: ``torch.tril`` for the mask, ``torch.softmax``,
``torch.nn.functional.scaled_dot_product_attention`` for attention (its weights are its output for the
values ``eye(T_k)``) and ``torch.nn.functional.multi_head_attention_forward`` for the whole layer. The inputs
are drawn from fixed seeds, in shapes the visible tests do not use: no queries or no keys, one position, one
query against many keys (chapter 7's cache), fewer queries than keys, head sizes that are not powers of two and
head size 1, several batch and head dimensions, float64, scores large enough that a plain exp overflows. When an
answer is wrong, the message names the first thing that is wrong and, for the known mistakes, what the mistake is.

The learner's functions and class are stand-ins (``autograder.judge.Remote``): they run where the notebook runs,
on tensors sent there as plain data, and what comes back is plain tensors. A layer's weights are drawn here and
sent into it (``load_state_dict``), so the oracle uses the very same numbers. Whether a call changed its inputs in
place, and the gradients of a backward pass (chapter 8 trains this layer), are measured where the inputs are
(``autograder.sandboxed.helpers.attention``); torch's softmax is taken away there while the learner's softmax runs
(``learner_side(forbid=...)``). A failure of a function that calls the learner's functions of earlier test cells
says so when those fail their own tests (``judge.because_of``), so that one mistake reads as one.

Each cell's checks are weighted parts (``judge.part``), each entered once with its cases in a loop inside it: the main
values weigh most; fewer queries than keys, large scores, masks, float64, inputs left unchanged, gradients, no
peeking ahead each cost their own share. Numbers compare with ``coursekit.testing.close``: nan or inf where torch's
result is finite is wrong, and -inf where torch's is -inf is right.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.judge import LearnerError, ask, because_of, cell, is_instance, learner_side, part, type_of
from coursekit.testing import call, close, describe_error, describe_where, expect_raises, fail, not_written, show

ATOL = 1e-5
GRAD_RTOL = 1e-6  # gradients are compared in float64, to this fraction of the largest one


def _randn(*shape, seed: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).mul(scale).to(dtype)


def _close(got, want, atol: float = ATOL) -> bool:
    """A tensor of want's shape, equal to it within atol where want is finite, with the same inf and nan elsewhere."""
    return isinstance(got, torch.Tensor) and close(got, want, atol=atol, rtol=0)


def _shape(t) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"a {type_of(t)}"


def _also(hint: str, because: str) -> str:
    """A hint, and the note of ``judge.because_of`` (which earlier cell's function this one uses fails)."""
    return "; ".join(part for part in (hint, because) if part)


def _tensor(name: str, got, want: torch.Tensor, what: str = "", because: str = "") -> torch.Tensor:
    """Check that a learner's result is a tensor of the right shape (and dtype, for bool and float64)."""
    label = f"{name}{what}"
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}, expected a torch.Tensor of shape {tuple(want.shape)}", because)
    if got.shape != want.shape:
        fail(f"{label} returned {_shape(got)}, expected shape {tuple(want.shape)}", because)
    if got.dtype != want.dtype and (want.dtype in (torch.bool, torch.float64) or got.dtype == torch.bool):
        fail(f"{label} returned a {got.dtype} tensor, expected {want.dtype}",
             _also("keep the dtype of the input (float64 in, float64 out): no .float() and no float32 tensor made "
                   "along the way" if want.dtype == torch.float64 else "", because))
    return got


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    got = got.detach().double()
    if (got.isnan() & ~want.isnan()).any():
        return "nan (your result has nan where the expected one has numbers)"
    return f"{(got - want.double()).abs().max().item():.2e}"


def _learner_failure(err: LearnerError, label: str, forbid: list[str] | None, hint: str):
    """The failure for an error of the learner's code in a call ``label``: a forbidden torch function named, a stub
    said to be not written yet, anything else with its type, message and line, and ``hint``."""
    if forbid and err.type_name == "autograder.sandboxed.hidden.Forbidden":
        used = str(err).removesuffix(" is not available here")
        fail(f"{label} called {used}{describe_where(err.where, err.cell_name)}", NO_TORCH_SOFTMAX)
    if isinstance(err, NotImplementedError):
        raise not_written(label, err) from None
    fail(f"{label} raised {describe_error(err)}", hint)  # as coursekit's call says it


def _run(fn, args: tuple, kwargs: dict, label: str, forbid: list[str] | None = None, hint: str = ""):
    """``fn(*args, **kwargs)`` on the learner's side, where the inputs are: ``(what came back, [whether it changed
    args[i] in place])``. With ``forbid``, those functions raise there while it runs; a call of one is named. An error
    of the learner's code fails with ``hint``."""
    try:
        with learner_side(**({"forbid": forbid} if forbid else {})):
            answer = ask("attention.run", fn, *args, **kwargs)
    except LearnerError as err:
        _learner_failure(err, label, forbid, hint)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], list)
            and len(answer[1]) == len(args)):
        fail(f"{label}: the notebook's side answered {show(answer)}, not what the grader asked for")
    return answer


def _far(got, want: torch.Tensor) -> float | None:
    """None when the tensor ``got`` is ``want`` (finite: an oracle's gradient) to ``GRAD_RTOL`` of its largest value;
    nan when it holds nan or inf; else how far it is."""
    scale = want.abs().max().item() if want.numel() else 0.0
    if close(got, want, atol=GRAD_RTOL * (1.0 + scale), rtol=0):
        return None
    got = got.detach().double()
    return float("nan") if not torch.isfinite(got).all() else (got - want).abs().max().item()


IN_PLACE_GRAPH = ("an in-place operation (x -= ..., x.exp_(), masked_fill_) changed a tensor that the backward pass "
                  "still needs: compute new tensors instead")


def _check_gradients(fn, args: tuple, *, want_out: torch.Tensor, want_inputs: dict[int, tuple[str, torch.Tensor]],
                     want_params: dict[str, torch.Tensor], weight: torch.Tensor, label: str, no_graph: str,
                     because: str = "", pick: int | None = None, kwargs: dict | None = None,
                     forbid: list[str] | None = None) -> None:
    """A training step on the learner's side: ``fn(*args, **kwargs)`` (its item ``pick``) with gradients on and every
    float argument requiring grad, then the gradients of ``(out * weight).sum()``. The output must be ``want_out``
    and carry a gradient; the gradients with respect to the arguments (``want_inputs``: {index: (name, gradient)})
    and to ``fn``'s parameters (``want_params``, by the learner's names) must be the oracle's. ``no_graph`` is the
    hint for a missing or wrong gradient."""
    try:
        with learner_side(no_grad=False, **({"forbid": forbid} if forbid else {})):
            answer = ask("attention.gradients", fn, list(args), weight, pick, kwargs or {})
    except LearnerError as err:
        why = IN_PLACE_GRAPH if "inplace operation" in str(err) else no_graph if "grad" in str(err) else ""
        _learner_failure(err, label, forbid, _also(why, because))
    if not isinstance(answer, dict) or "output" not in answer:
        fail(f"{label}: the notebook's side answered {show(answer)}, not what the grader asked for")
    got = _tensor(label, answer["output"], want_out, because=because)
    if not _close(got, want_out):
        fail(f"{label} differs from torch's by {_max_diff(got, want_out)}", because)
    needing = [name for name, _ in want_inputs.values()] + (["its parameters"] if want_params else [])
    verb = "requires" if len(needing) == 1 and not want_params else "require"
    if answer.get("requires_grad") is not True:
        fail(f"{label}: the output carries no gradient (requires_grad is False, although "
             f"{', '.join(needing[:-1]) + ' and ' if len(needing) > 1 else ''}{needing[-1]} {verb} grad): "
             "chapter 8 trains through it, and no loss on this output could change anything before it",
             _also(no_graph, because))
    inputs = answer.get("inputs") if isinstance(answer.get("inputs"), list) else []
    params = answer.get("params") if isinstance(answer.get("params"), dict) else {}
    wanted = [(name, inputs[i] if i < len(inputs) else None, grad) for i, (name, grad) in want_inputs.items()] + \
        [(name, params.get(name), grad) for name, grad in want_params.items()]
    missing = [name for name, got_grad, _ in wanted if not isinstance(got_grad, torch.Tensor)]
    if missing:
        fail(f"{label}: no gradient reaches {' and '.join(missing)} from a loss on the output",
             _also(no_graph, because))
    wrong = []
    for name, got_grad, grad in wanted:
        if got_grad.shape != grad.shape:
            wrong.append((name, f"has shape {tuple(got_grad.shape)}, not {tuple(grad.shape)}"))
        elif (far := _far(got_grad, grad)) is not None:
            wrong.append((name, "holds nan or inf where torch's is finite" if math.isnan(far) else
                          f"differs from torch's by up to {far:.2e}"))
    if wrong:
        name, how = wrong[0]
        count = f" ({len(wrong)} of the {len(wanted)} gradients differ)" if len(wanted) > 1 else ""
        fail(f"{label}: the output is right but its gradients are not: the gradient of sum(out * r) with respect to "
             f"{name} {how}{count}", _also(no_graph, because))


def _oracle_gradients(out: torch.Tensor, weight: torch.Tensor, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    """The oracle's gradients of ``(out * weight).sum()`` (``torch.autograd.grad``: nothing accumulates in the
    tensors' ``.grad``)."""
    return list(torch.autograd.grad((out * weight).sum(), wrt))


# ---------------------------------------------------------------- causal_mask

# (t_q, t_k): t_k None means the call causal_mask(t_q). Square masks first, the first big enough to tell
# the known mistakes apart (on a 1 x 1 mask, "inverted" and "off by one" look the same); then fewer queries
# than keys (chapter 7's KV cache); then no queries at all: an empty mask.
MASK_CASES = [(4, None), (1, None), (2, None), (5, None), (8, None), (13, None), (1, 1), (6, 6),
              (3, 7), (1, 6), (4, 5), (2, 9), (7, 12), (0, 4), (0, None)]
T_K_ZERO = ("t_k=0 is a number of keys (none), not t_k left out: test `t_k is None`, not `t_k or t_q` "
            "(0 is falsy); 3 queries cannot be the last positions of 0 keys: raise ValueError")


def _oracle_mask(t_q: int, t_k: int) -> torch.Tensor:
    """The last t_q rows of the full causal mask over t_k positions."""
    return torch.tril(torch.ones(t_k, t_k, dtype=torch.bool))[t_k - t_q:]


def _mask_label(t_q, t_k) -> str:
    return f"causal_mask({t_q})" if t_k is None else f"causal_mask({t_q}, {t_k})"


SQUARE, FEWER_QUERIES_PART, NO_QUERIES = "square masks", "fewer queries than keys", "no queries"
MASK_PARTS = {SQUARE: 3, FEWER_QUERIES_PART: 2, NO_QUERIES: 1, "ValueError for impossible sizes": 1,
              "a device given": 1}


def _mask_part(t_q: int, t_k: int) -> str:
    return NO_QUERIES if t_q == 0 else SQUARE if t_q == t_k else FEWER_QUERIES_PART


@cell("test_causal_mask", parts=MASK_PARTS)
def check_causal_mask(causal_mask):
    for name in (SQUARE, FEWER_QUERIES_PART, NO_QUERIES):
        with part(name):
            for t_q, t_k_arg in MASK_CASES:
                if _mask_part(t_q, t_q if t_k_arg is None else t_k_arg) == name:
                    _check_mask(causal_mask, t_q, t_k_arg)
    with part("ValueError for impossible sizes"):
        expect_raises(ValueError, causal_mask, 5, 2, name="causal_mask",
                      hint="5 queries cannot be the last positions of only 2 keys: raise ValueError")
        expect_raises(ValueError, causal_mask, 3, 0, name="causal_mask", hint=T_K_ZERO)
    # A CPU grader has no other device to put the mask on (the "meta" device would do, but tracing tril there costs
    # seconds in every grading kernel): the learner's side reports the devices torch was given during the call
    # (``helpers.attention.devices``). "cpu:0", which no one writes by hand, shows the device given was passed on.
    # A wrong mask costs its points above, not here again.
    with part("a device given"):
        own = call(causal_mask, 3, 5, name="causal_mask")
        for device in ("cpu", torch.device("cpu", 0)):
            label = f"causal_mask(3, 5, device={device!r})"
            got, seen = call(ask, "attention.devices", causal_mask, 3, 5, device=device, label=label)
            if not (isinstance(got, torch.Tensor) and isinstance(own, torch.Tensor) and torch.equal(got, own)):
                fail(f"{label} returned {_shape(got)}, not the mask that causal_mask(3, 5) returns")
            seen = [d for d in seen if isinstance(d, str)] if isinstance(seen, list) else []
            if str(device) not in seen:
                fail(f"{label} never gave torch the device {str(device)!r}"
                     + (f" (only {', '.join(map(repr, seen))})" if seen else "") + ": it was dropped",
                     "make the mask on the device given: torch.ones(..., device=device) (or .to(device) at the end)")


def _check_mask(causal_mask, t_q: int, t_k_arg: int | None) -> None:
    t_k = t_q if t_k_arg is None else t_k_arg
    args = (t_q,) if t_k_arg is None else (t_q, t_k)
    label = _mask_label(t_q, t_k_arg)
    want = _oracle_mask(t_q, t_k)
    got = call(causal_mask, *args, name="causal_mask")
    if isinstance(got, torch.Tensor) and got.shape == (t_q, t_q) and t_k != t_q:
        fail(f"{label} returned shape {tuple(got.shape)}, expected ({t_q}, {t_k})",
             "with t_k given there is one column per key: t_q rows (queries) by t_k columns (keys)")
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype != torch.bool:
        fail(f"{label} returned a {got.dtype} tensor; return a bool tensor, True where the query may attend",
             "attention uses it as a bool mask (masked_fill(~mask, ...))")
    _tensor(label, got, want)
    if not torch.equal(got, want):  # bool tensors: exact
        fail(f"{label}: {_first_wrong_pair(got, want, t_q, t_k)}", _mask_mistake(got, t_q, t_k))


def _first_wrong_pair(got, want, t_q, t_k) -> str:
    i, j = (got != want).nonzero()[0].tolist()
    pos = t_k - t_q + i  # query i is the position t_k - t_q + i
    where = f" (query {i} is position {pos})" if t_q != t_k else ""
    if got[i, j]:
        return f"your mask lets position {pos} see position {j}, which comes after it{where}"
    if j == pos:
        return f"your mask hides position {pos} from itself, but a position may see itself{where}"
    return f"your mask hides position {j} from position {pos}, which may see every position up to its own{where}"


def _mask_mistake(got, t_q, t_k) -> str:
    ones = torch.ones(t_q, t_k, dtype=torch.bool)
    shift = t_k - t_q
    if torch.equal(got, ~ones.tril(shift)):
        return "your mask is inverted: True must mean 'may attend' (key j <= query position)"
    if torch.equal(got, ones.tril(shift - 1)):
        return ("off by one: your mask leaves out the diagonal, but each position may see itself "
                "(key j <= query position, not j < query position)")
    if torch.equal(got, ones.tril(shift + 1)):
        return "off by one: each position may see itself and the positions before it, not the next one"
    if any(torch.equal(got, ones.triu(d)) for d in (shift, 0, 1, shift + 1)):
        return ("your mask is the upper triangle (triu), which lets positions see the future; the allowed "
                "keys are those at or before the query's position: the lower triangle (tril)")
    if shift and torch.equal(got, ones.tril(0)):
        return (f"with t_q < t_k the queries are the LAST t_q positions: query i is position t_k - t_q + i "
                f"(here {shift} + i) and sees keys 0 .. t_k - t_q + i; your queries start at position 0")
    return ""


# ---------------------------------------------------------------- softmax

SOFTMAX_VALUES, LARGE, MASKED, FLOAT64 = ("values along any dim", "large scores (no overflow)", "masked (-inf) scores",
                                          "float64")
ONE_OR_NONE, UNCHANGED, GRADIENTS = "one entry along dim, or no rows", "inputs left unchanged", "gradients for training"
SOFTMAX_PARTS = {SOFTMAX_VALUES: 3, LARGE: 2, MASKED: 1, FLOAT64: 1, ONE_OR_NONE: 1, UNCHANGED: 1, GRADIENTS: 1}


def _softmax_cases():
    """(x, dim, the part it belongs to): dim None means the call softmax(x), with the default dim=-1."""
    inf = math.inf
    return [
        (_randn(7, seed=30), None, SOFTMAX_VALUES),
        (_randn(4, 4, seed=31, scale=3), -1, SOFTMAX_VALUES),
        (_randn(3, 5, seed=32, scale=3), -1, SOFTMAX_VALUES),
        (_randn(3, 5, seed=33, scale=3), 0, SOFTMAX_VALUES),
        (_randn(2, 3, 4, seed=34, scale=3), 1, SOFTMAX_VALUES),
        (_randn(2, 3, 4, seed=35, scale=3), -2, SOFTMAX_VALUES),
        (_randn(2, 3, 4, seed=36, scale=3), 0, SOFTMAX_VALUES),
        # Large scores: e^x overflows to inf above 88 in float32 (709 in float64), and inf / inf is nan;
        # e^x underflows to 0 below -103 (-745), and 0 / 0 is nan. The tolerance grows with the scores
        # (_softmax_atol), so that a softmax computed as exp(x - logsumexp(x)) passes too.
        (torch.tensor([[100.0, 99.0, 95.0], [-120.0, -118.0, -119.0], [1.0, 2.0, 3.0]]), -1, LARGE),
        (torch.tensor([[110.0, 3.0], [108.0, -5.0], [0.0, 100.0]]), 0, LARGE),
        (torch.tensor([[1e4, 1e4 - 1, 1e4 - 5], [-1e4, -1e4 + 2, -1e4 + 1], [1.0, 2.0, 3.0]],
                      dtype=torch.float64), -1, LARGE),
        # Rows far apart: the maximum of the whole tensor is not every row's maximum.
        (torch.tensor([[120.0, 119.0, 0.0], [1.0, 2.0, 3.0]]), -1, LARGE),
        # Masked entries: e^-inf = 0, so they get weight 0.
        (torch.tensor([[0.5, -inf, 2.0, -inf], [-inf, -inf, 3.0, 1.0], [-inf, 7.0, -inf, -inf]]), -1, MASKED),
        (torch.tensor([[0.5, -inf], [-inf, 1.0], [2.0, 4.0]]), 0, MASKED),
        (_randn(4, 6, seed=37, scale=30, dtype=torch.float64), -1, FLOAT64),
        (_randn(5, 3, seed=38, scale=30, dtype=torch.float64), 0, FLOAT64),
        # Scores near +-1000 in float32, with and without -inf beside them.
        (torch.tensor([[1000.0, 999.0, 995.0], [-1000.0, -998.0, -999.0], [1000.0, 1000.0, -inf]]), -1, LARGE),
        (torch.tensor([[1000.0, -3.0], [998.0, 4.0], [-inf, 1000.0]]), 0, LARGE),
        # One entry along dim (its weight is 1), and no rows at all.
        (_randn(4, 1, seed=39, scale=50), -1, ONE_OR_NONE),
        (torch.zeros(0, 5), -1, ONE_OR_NONE),
    ]


def _softmax_atol(x: torch.Tensor) -> float:
    """ATOL, plus what rounding the scores to their dtype costs: every correct method (x minus the maximum, or
    exp(x - logsumexp(x))) agrees with torch's to about |x| * eps."""
    finite = x[torch.isfinite(x)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return ATOL + 2 * torch.finfo(x.dtype).eps * scale


# While the learner's softmax runs, torch's softmax is off limits where it runs: these raise there.
TORCH_SOFTMAX = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax"]
NO_TORCH_SOFTMAX = ("softmax must be written without torch.softmax / F.softmax / Tensor.softmax: compute it from exp "
                    "and sum")
IN_PLACE_SOFTMAX = ("compute new tensors (x - m, not x -= m; no x.sub_(...) or x.exp_()): the caller still needs its "
                    "scores, and training needs them unchanged to compute gradients")
SOFTMAX_GRAPH = ("compute with torch operations on x itself: no .detach(), .data, .clone().detach(), .item()/.tolist(), "
                 "numpy or torch.no_grad() (detaching only the maximum you subtract is fine: it does not change the "
                 "result)")


@cell("test_softmax", parts=SOFTMAX_PARTS)
def check_softmax(softmax):
    cases = _softmax_cases()
    changed_by = []  # the label of each call that changed its input in place, once per call that returned
    for name in (SOFTMAX_VALUES, LARGE, MASKED, FLOAT64, ONE_OR_NONE):
        with part(name):
            for x, dim, case_part in cases:
                if case_part != name:
                    continue
                d = -1 if dim is None else dim
                label = f"softmax({_describe(x)})" if dim is None else f"softmax({_describe(x)}, dim={dim})"
                want = torch.softmax(x, dim=d)
                got, changed = _run(softmax, (x,), {} if dim is None else {"dim": dim}, label, forbid=TORCH_SOFTMAX)
                changed_by.append(label if changed[0] else "")
                _tensor(label, got, want)
                if not _close(got, want, _softmax_atol(x)):
                    fail(f"{label} returned {_values(got)}, expected {_values(want)} "
                         f"(largest difference {_max_diff(got, want)})", _softmax_mistake(x, d, got, want))
    with part(UNCHANGED):
        _unchanged(changed_by, "its input", IN_PLACE_SOFTMAX)
    # A training step: chapter 8 backpropagates through the softmax to the scores.
    x, r = _randn(3, 4, 5, seed=120, scale=5, dtype=torch.float64), _randn(3, 4, 5, seed=121, dtype=torch.float64)
    with torch.enable_grad():
        xr = x.clone().requires_grad_(True)
        want = torch.softmax(xr, dim=1)
        (dx,) = _oracle_gradients(want, r, [xr])
    with part(GRADIENTS):
        _check_gradients(softmax, (x,), kwargs={"dim": 1}, want_out=want.detach(), want_inputs={0: ("x", dx)},
                         want_params={}, weight=r, forbid=TORCH_SOFTMAX, no_graph=SOFTMAX_GRAPH,
                         label=f"softmax(x, dim=1) on a float64 x of shape {tuple(x.shape)} that requires grad")


def _unchanged(changed_by: list[str], what: str, hint: str) -> None:
    """Each call that returned left ``what`` as it was (``changed_by``: per call, its label if it changed them, else
    ""). With no call that returned, nothing could be checked: that fails too."""
    if not changed_by:
        fail("not checked: no call returned a result")
    label = next((c for c in changed_by if c), "")
    if label:
        fail(f"{label} changed {what} in place", hint)


def _describe(x: torch.Tensor) -> str:
    if x.numel() <= 12 and ((x.abs() > 100).any() or x.isinf().any()):
        return _values(x)
    return f"<{x.dtype} tensor of shape {tuple(x.shape)}>"


def _values(x) -> str:
    if not isinstance(x, torch.Tensor):
        return repr(x)
    if x.numel() > 12:
        return f"<tensor of shape {tuple(x.shape)}>"
    return _rounded(x.detach().tolist())


def _rounded(values) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_rounded(v) for v in values) + "]"
    return f"{values:.4g}"


def _softmax_mistake(x, dim, got, want) -> str:
    if not x.ndim:
        return ""
    dim = dim % x.ndim
    candidates = [
        (lambda: _naive(x - x.max(), dim),
         "you subtracted the maximum of the whole tensor; subtract the maximum along dim "
         "(amax(dim=dim, keepdim=True)), so that every slice has an entry e^0 = 1"),
        (lambda: (x - x.amax(dim=dim, keepdim=True)).exp(),
         "divide by the sum along dim, so that the weights sum to 1"),
        (lambda: _naive_total(x - x.amax(dim=dim, keepdim=True)),
         "divide by the sum along dim, not by the sum of the whole tensor"),
        (lambda: _naive(x - x.amax(dim=dim), dim),
         "keep the reduced dimension (keepdim=True) when you take the maximum, so that it lines up with x"),
        (lambda: _naive_no_keepdim_sum(x - x.amax(dim=dim, keepdim=True), dim),
         "keep the reduced dimension (keepdim=True) when you sum, so that it lines up with x"),
    ]
    for other in range(x.ndim):
        if other != dim:
            candidates.append((lambda other=other: torch.softmax(x, dim=other),
                               f"you normalised along dim {other}, not along dim {dim}: use the dim argument"))
    for candidate, hint in candidates:
        try:
            if _close(got, candidate(), _softmax_atol(x)):
                return hint
        except RuntimeError:
            continue
    if isinstance(got, torch.Tensor) and (got.isnan() | got.isinf()).any() and not want.isnan().any():
        return ("your softmax gives nan or inf on large scores: e^x overflows (e^89 is inf in float32, and "
                "inf / inf is nan). Subtract the maximum along dim first; it does not change the result")
    return ""


def _naive(x, dim):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def _naive_total(x):
    e = x.exp()
    return e / e.sum()


def _naive_no_keepdim_sum(x, dim):
    e = x.exp()
    return e / e.sum(dim=dim)


# ---------------------------------------------------------------- attention

FEWER_QUERIES = ("with fewer queries than keys the scores are (..., T_q, T_k), and so is the mask: use the mask as "
                 "it is given (no [:T, :T] slice, no mask of your own made from q's length), and take D from q")
ATTENTION_GRAPH = ("no .detach(), .data or torch.no_grad() on the scores or on the weights you multiply v with: the "
                   "gradient reaches q and k only through them (to return weights for plotting, detach them after "
                   "weights @ v)")


CAUSAL, OTHER_MASKS = "causal attention", "no mask, a mask of holes"
LARGE_FLOAT64 = "float64, and scores in the thousands"
ATTENTION_PARTS = {CAUSAL: 3, FEWER_QUERIES_PART: 1, OTHER_MASKS: 1, LARGE_FLOAT64: 1, UNCHANGED: 1, GRADIENTS: 1}


def _attention_cases():
    """(q, k, v, mask, what, hint, the part it belongs to): the mask is a bool tensor that broadcasts against the
    scores, or None; the hint is for an error the learner's code raises on that case."""
    causal = _oracle_mask
    cases = []
    q, k, v = (_randn(2, 5, 8, seed=40 + i) for i in range(3))
    cases.append((q, k, v, causal(5, 5), "causal, (B, T, D) = (2, 5, 8)", "", CAUSAL))
    q, k, v = (_randn(2, 3, 7, 5, seed=43 + i) for i in range(3))
    cases.append((q, k, v, causal(7, 7), "causal, 3 heads, head size 5", "", CAUSAL))
    q, k, v = (_randn(1, 1, 1, 6, seed=46 + i) for i in range(3))
    cases.append((q, k, v, causal(1, 1), "one position", "", CAUSAL))
    q = _randn(2, 2, 3, 12, seed=49)
    k, v = _randn(2, 2, 9, 12, seed=50), _randn(2, 2, 9, 6, seed=51)
    cases.append((q, k, v, causal(3, 9), "3 queries, the last of 9 keys, values of size 6", FEWER_QUERIES,
                  FEWER_QUERIES_PART))
    q = _randn(2, 3, 1, 8, seed=62)
    k, v = _randn(2, 3, 9, 8, seed=63), _randn(2, 3, 9, 8, seed=64)
    cases.append((q, k, v, causal(1, 9), "one query, the last of 9 keys (chapter 7's cache)", FEWER_QUERIES,
                  FEWER_QUERIES_PART))
    q, k, v = (_randn(3, 6, 10, seed=52 + i) for i in range(3))
    cases.append((q, k, v, None, "no mask", "", OTHER_MASKS))
    q, k, v = (_randn(2, 4, 6, 3, seed=55 + i) for i in range(3))
    g = torch.Generator().manual_seed(58)
    mask = torch.rand(2, 1, 6, 6, generator=g) < 0.5
    mask[..., 0] = True  # every query sees at least one key
    cases.append((q, k, v, mask, "a (B, 1, T, T) mask of random holes", "", OTHER_MASKS))
    q, k, v = (_randn(2, 2, 11, 7, seed=59 + i, dtype=torch.float64) for i in range(3))
    cases.append((q, k, v, causal(11, 11), "float64, head size 7", "", LARGE_FLOAT64))
    # Scores in the thousands: a plain e^x overflows to inf (above 709 in float64), and inf / inf is nan.
    q, k = (_randn(2, 2, 6, 4, seed=65 + i, scale=40, dtype=torch.float64) for i in range(2))
    v = _randn(2, 2, 6, 4, seed=67, dtype=torch.float64)
    cases.append((q, k, v, causal(6, 6), "float64, scores in the thousands", "", LARGE_FLOAT64))
    return cases


def _oracle_attention(q, k, v, mask):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    eye = torch.eye(k.shape[-2], dtype=v.dtype).expand(*k.shape[:-1], k.shape[-2])
    weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)
    return out, weights


def _attention_label(q, k, v, mask, what) -> str:
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    return f"attention({shapes}{'' if mask is None else f', mask={tuple(mask.shape)}'}) [{what}]"


@cell("test_attention", parts=ATTENTION_PARTS)
def check_attention(attention):
    because = because_of(softmax="test_softmax")
    cases = _attention_cases()
    changed_by = []  # the label of each call that changed q, k or v in place, once per call that returned
    for name in (CAUSAL, FEWER_QUERIES_PART, OTHER_MASKS, LARGE_FLOAT64):
        with part(name):
            for q, k, v, mask, what, hint, case_part in cases:
                if case_part == name:
                    _check_attention(attention, q, k, v, mask, what, hint, because, changed_by)
    with part(UNCHANGED):
        _unchanged(changed_by, "q, k or v", "compute new tensors (q / s, not q /= s): the caller still needs its "
                                            "queries, keys and values")
    # A training step, 4 queries against 7 keys: chapter 8 backpropagates through attention to q, k and v.
    q, k, v = (_randn(2, 2, t, 5, seed=125 + i, dtype=torch.float64) for i, t in enumerate((4, 7, 7)))
    mask, r = _oracle_mask(4, 7), _randn(2, 2, 4, 5, seed=128, dtype=torch.float64)
    with torch.enable_grad():
        qkv = [t.clone().requires_grad_(True) for t in (q, k, v)]
        want = F.scaled_dot_product_attention(*qkv, attn_mask=mask)
        grads = _oracle_gradients(want, r, qkv)
    with part(GRADIENTS):
        _check_gradients(attention, (q, k, v, mask), pick=0, want_out=want.detach(), weight=r, want_params={},
                         want_inputs={i: (name, grad) for i, (name, grad) in enumerate(zip("qkv", grads))},
                         no_graph=ATTENTION_GRAPH, because=because,
                         label="attention(q, k, v, causal mask (4, 7)) on float64 q, k, v that require grad")


def _check_attention(attention, q, k, v, mask, what: str, hint: str, because: str, changed_by: list[str]) -> None:
    label = _attention_label(q, k, v, mask, what)
    want_out, want_w = _oracle_attention(q, k, v, mask)
    got, changed = _run(attention, (q, k, v) if mask is None else (q, k, v, mask), {}, label,  # None: its default
                        hint=_also(hint, because))
    changed_by.append(label if any(changed[:3]) else "")
    if not (isinstance(got, tuple) and len(got) == 2):
        fail(f"{label} returned {_shape(got)}; return a pair (output, weights)")
    out, weights = got
    _tensor(label, weights, want_w, ": the weights", because)
    if not _close(weights, want_w):
        fail(f"{label}: the weights differ from scaled_dot_product_attention's by {_max_diff(weights, want_w)}",
             _also(_attention_mistake(q, k, v, mask, weights, because), because))
    _tensor(label, out, want_out, ": the output", because)
    if not _close(out, want_out):
        fail(f"{label}: the output differs from scaled_dot_product_attention's by {_max_diff(out, want_out)}",
             _also("the weights are right: the output is weights @ v", because))


def _attention_mistake(q, k, v, mask, weights, because: str = "") -> str:
    """The known mistake that gives these weights; else, when the learner's softmax does not fail its own test
    (``because`` empty), what is wrong with them (nan, weight on hidden keys)."""
    d = q.shape[-1]
    raw = q @ k.transpose(-2, -1)
    scaled = raw / math.sqrt(d)

    def masked(scores, fill=-math.inf):
        return scores if mask is None else scores.masked_fill(~mask, fill)

    candidates = [
        (lambda: torch.softmax(masked(raw), -1),
         f"the scores are not scaled: divide q @ k^T by sqrt(D) (here sqrt({d}))"),
        (lambda: torch.softmax(masked(raw / d), -1),
         f"you divided the scores by D = {d}; divide by sqrt(D) = {math.sqrt(d):.3g}"),
        (lambda: torch.softmax(masked(raw * math.sqrt(d)), -1),
         "you multiplied the scores by sqrt(D); divide by it"),
        (lambda: torch.softmax(masked(scaled), -2),
         "you took the softmax over the queries (dim -2); each query's weights over the keys (dim -1) must "
         "sum to 1"),
    ]
    if v.shape[-1] != d:
        candidates.append((lambda: torch.softmax(masked(raw / math.sqrt(v.shape[-1])), -1),
                           f"you divided by the square root of the values' size ({v.shape[-1]}); D is the size of "
                           f"the queries and keys, q.shape[-1] = {d}"))
    if mask is not None:
        candidates += [
            (lambda: torch.softmax(scaled, -1),
             "the mask is not applied: each query gives weight to keys the mask hides"),
            (lambda: torch.softmax(scaled, -1) * mask,
             "the mask is applied after the softmax: the hidden keys get weight 0, but the others no longer "
             "sum to 1. Mask the scores (with -inf) before the softmax"),
            (lambda: torch.softmax(scaled * mask, -1),
             "masked scores set to 0 (with masked_fill(..., 0) or by multiplying with the mask) still get "
             "weight e^0 / sum, like any other score: fill them with -inf, so that they get e^-inf = 0"),
            (lambda: torch.softmax(scaled.masked_fill(mask, -math.inf), -1),
             "your mask is used the wrong way round: True means 'may attend', so hide the scores where the "
             "mask is False (~mask)"),
        ]
    for candidate, hint in candidates:
        try:
            if _close(weights, candidate()):
                return hint
        except RuntimeError:
            continue
    if because:
        return ""
    if isinstance(weights, torch.Tensor) and (weights.isnan() | weights.isinf()).any():
        if scaled.abs().max().item() > (88 if scaled.dtype == torch.float32 else 709):
            return ("your weights hold nan where torch's hold numbers: on large scores e^x overflows (above 88 in "
                    "float32, 709 in float64) and inf / inf is nan. Compute the weights with your softmax, which "
                    "subtracts the maximum first")
        return ("your weights hold nan where torch's hold numbers, on scores too small to overflow: look for 0 * inf "
                "(a mask multiplied by -inf gives 0 * -inf = nan where keys are allowed) or 0 / 0. Hide the scores "
                "with scores.masked_fill(~mask, float('-inf'))")
    if mask is not None and isinstance(weights, torch.Tensor) and weights.shape[-2:] == mask.shape[-2:]:
        leak = (weights.detach().abs() > 1e-7) & ~mask
        if leak.any():
            *_, i, j = leak.nonzero()[0].tolist()
            return f"query {i} gives weight {weights[leak].flatten()[0]:.3g} to key {j}, which the mask hides"
    return ""


# ---------------------------------------------------------------- CausalSelfAttention

# (n_embd, n_head, B, T): head sizes 4, 3 and 5 (not powers of two), 6, 8 (one head), 2 with one position, 1.
LAYER_CASES = [(16, 4, 2, 6), (24, 8, 1, 7), (30, 5, 3, 5), (8, 1, 2, 4), (12, 6, 1, 1), (20, 4, 2, 9), (4, 4, 2, 3)]
NO_PEEKING_AFTER = (0, 2, 4, 7)  # positions t: changing the input after t must not change outputs up to t
LAYER_USES = {"causal_mask": "test_causal_mask", "softmax": "test_softmax", "attention": "test_attention"}
LENGTHS = (3, 7, 1, 5)  # one layer, called on these sequence lengths one after the other
LENGTHS_HINT = ("the same layer reads sequences of any length, one call after the other (generation adds a token at "
                "each step): build the mask from each call's own T, and keep no mask or size from an earlier call")
PEEKING = "position p may only read positions 0 .. p: pass the causal mask to attention"
LAYER_GRAPH = ("no torch.no_grad(), .detach() or .data in forward: chapter 8 trains this layer by backpropagating a "
               "loss through this very forward pass to c_attn and c_proj")


LAYERS_HINT = "keep the layers that __init__ makes: chapter 4 loads GPT-2's weights into them"


def _layer(CausalSelfAttention, n_embd, n_head, seed, dtype=torch.float32):
    """The learner's layer with weights from a fixed seed, whatever its own initialisation, in ``dtype`` and in eval
    mode: ``(layer, its weights {name: tensor})``, the weights as sent into it."""
    name = f"CausalSelfAttention({n_embd}, {n_head})"
    layer = call(CausalSelfAttention, n_embd, n_head, label=name)
    for linear in ("c_attn", "c_proj"):
        if not is_instance(getattr(layer, linear, None), "torch.nn.Linear"):
            fail(f"{name} has no nn.Linear `{linear}`", LAYERS_HINT)
    g = torch.Generator().manual_seed(seed)
    C = n_embd
    shapes = {"c_attn.weight": (3 * C, C), "c_attn.bias": (3 * C,), "c_proj.weight": (C, C), "c_proj.bias": (C,)}
    weights = {key: (torch.randn(shape, generator=g, dtype=torch.float64) * 0.5).float()
               for key, shape in shapes.items()}
    try:  # sent into the learner's layer; its own load_state_dict copies them in
        result = layer.load_state_dict(weights, strict=False)
    except LearnerError as err:
        fail(f"the check's weights do not load into {name}: {describe_error(err)}", LAYERS_HINT)
    unexpected = getattr(result, "unexpected_keys", None)
    if not isinstance(unexpected, list):
        fail(f"{name}.load_state_dict returned {show(result)}, not torch's missing and unexpected keys", LAYERS_HINT)
    if unexpected:
        fail(f"{name} has no parameter named {', '.join(map(str, unexpected))}", LAYERS_HINT)
    layer = call(layer.to, dtype, label=f"{name}.to({dtype})")
    call(layer.eval, label=f"{name}.eval()")
    return layer, {key: w.to(dtype) for key, w in weights.items()}


def _oracle_split(x, n_head):
    B, T, C = x.shape
    return x.unflatten(-1, (n_head, C // n_head)).transpose(1, 2)  # head h holds channels h*D .. (h+1)*D - 1


def _oracle_layer(w, x, n_head):
    """torch's multi-head attention with the layer's weights ``w``: c_attn is its in-projection, c_proj its out."""
    T, C = x.shape[1], x.shape[2]
    # (T, B, C), the layout multi_head_attention_forward takes. Contiguous, so that torch computes the in-projection
    # as one matrix product over all positions, as the layer's c_attn does: on a transposed view of plain tensors
    # it goes position by position, which rounds differently (by up to 1.5e-5 here, more than ATOL).
    x_tbc = x.transpose(0, 1).contiguous()
    y, _ = F.multi_head_attention_forward(
        x_tbc, x_tbc, x_tbc, C, n_head, w["c_attn.weight"], w["c_attn.bias"], None, None, False, 0.0,
        w["c_proj.weight"], w["c_proj.bias"], training=False, need_weights=False,
        attn_mask=~_oracle_mask(T, T))  # True = hidden, for torch
    return y.transpose(0, 1)


LAYER_VALUES, SPLIT_MERGE, NO_PEEKING = ("the same as torch's multi-head attention", "split_heads and merge_heads",
                                         "no peeking ahead")
LAYER_PARTS = {LAYER_VALUES: 3, SPLIT_MERGE: 1, NO_PEEKING: 1, "sequences of several lengths in turn": 1, FLOAT64: 1,
               GRADIENTS: 1}


@cell("test_causal_self_attention", parts=LAYER_PARTS)
def check_causal_self_attention(CausalSelfAttention):
    because = because_of(**LAYER_USES)
    cases = [(*_layer(CausalSelfAttention, C, H, seed=70 + n), _randn(B, T, C, seed=80 + n), C, H, n)
             for n, (C, H, B, T) in enumerate(LAYER_CASES)]
    with part(SPLIT_MERGE):
        for layer, w, x, C, H, n in cases:
            _check_split_merge(layer, x, C, H)
    with torch.no_grad(), learner_side(no_grad=True):
        with part(LAYER_VALUES):
            for layer, w, x, C, H, n in cases:
                label = f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}"
                y = call(layer, x, label=label, hint=because)
                _tensor(label, y, x, because=because)
                want = _oracle_layer(w, x, H)
                if not _close(y, want):
                    fail(f"{label}: the output differs from torch's multi-head attention by {_max_diff(y, want)}",
                         _also(_layer_mistake(w, x, y, H, because), because))
        with part(NO_PEEKING):
            for layer, w, x, C, H, n in cases:
                _check_no_peeking(layer, x, C, H, seed=90 + n, because=because)
    with part("sequences of several lengths in turn"):
        _check_lengths(CausalSelfAttention, because)
    # float64 through and through: the mask and the scale must not force float32.
    with part(FLOAT64):
        layer, w = _layer(CausalSelfAttention, 12, 3, seed=99, dtype=torch.float64)
        x = _randn(2, 5, 12, seed=100, dtype=torch.float64)
        label = "CausalSelfAttention(12, 3).double() on float64 x"
        with torch.no_grad(), learner_side(no_grad=True):
            y = call(layer, x, label=label, hint=because)
            want = _oracle_layer(w, x, 3)
        _tensor(label, y, want, because=because)
        if not _close(y, want, atol=1e-9):
            fail(f"{label}: the output differs from torch's by {_max_diff(y, want)}",
                 _also("keep the input's dtype all the way through", because))
    with part(GRADIENTS):
        _check_layer_gradients(CausalSelfAttention, because)


def _check_lengths(CausalSelfAttention, because: str) -> None:
    """One layer called on sequences of several lengths in turn, as generation calls it."""
    C, H = 16, 4
    layer, w = _layer(CausalSelfAttention, C, H, seed=110)
    before = ""
    for T in LENGTHS:
        x = _randn(2, T, C, seed=111 + T)
        label = f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}{before}"
        with torch.no_grad(), learner_side(no_grad=True):
            y = call(layer, x, label=label, hint=_also(LENGTHS_HINT, because))
            want = _oracle_layer(w, x, H)
        _tensor(label, y, want, because=_also(LENGTHS_HINT, because))
        if not _close(y, want):
            fail(f"{label}: the output differs from torch's multi-head attention by {_max_diff(y, want)}",
                 _also(LENGTHS_HINT, because))
        before = f", after a call on x of shape {tuple(x.shape)}"


def _check_layer_gradients(CausalSelfAttention, because: str) -> None:
    """A training step through the learner's layer (float64): the gradients of its four parameters and of its
    input must be those of torch's multi-head attention with the same weights."""
    C, H = 12, 3
    layer, w = _layer(CausalSelfAttention, C, H, seed=130, dtype=torch.float64)
    x, r = _randn(2, 5, C, seed=131, dtype=torch.float64), _randn(2, 5, C, seed=132, dtype=torch.float64)
    with torch.enable_grad():
        params = {name: t.clone().requires_grad_(True) for name, t in w.items()}
        xr = x.clone().requires_grad_(True)
        want = _oracle_layer(params, xr, H)
        dx, *grads = _oracle_gradients(want, r, [xr, *params.values()])
    _check_gradients(layer, (x,), want_out=want.detach(), want_inputs={0: ("x", dx)},
                     want_params=dict(zip(params, grads)), weight=r, no_graph=LAYER_GRAPH, because=because,
                     label=f"CausalSelfAttention({C}, {H}).double() on a float64 x of shape {tuple(x.shape)} that "
                           "requires grad")


def _check_split_merge(layer, x, C, H):
    """split_heads and merge_heads move numbers without computing: their results must be exact."""
    B, T, _ = x.shape
    name = f"CausalSelfAttention({C}, {H})"
    got = call(layer.split_heads, x, label=f"{name}.split_heads(x of shape {tuple(x.shape)})")
    want = _oracle_split(x, H)
    _tensor(f"{name}.split_heads(x of shape {tuple(x.shape)})", got, want)
    if not close(got, want, atol=0, rtol=0):
        hint = "head h holds the channels h * head_size .. (h + 1) * head_size - 1 of every position"
        if torch.equal(got, x.reshape(B, H, T, C // H)):
            hint = ("a plain view(B, n_head, T, head_size) mixes positions and channels: the (B, T, C) memory "
                    "is position by position. View as (B, T, n_head, head_size) first, then swap T and n_head "
                    "(transpose(1, 2))")
        fail(f"{name}.split_heads(x of shape {tuple(x.shape)}) put the wrong numbers in the heads "
             f"(largest difference {_max_diff(got, want)})", hint)
    heads = _randn(B, H, T, C // H, seed=T + C)
    back = call(layer.merge_heads, heads, label=f"{name}.merge_heads(heads of shape {tuple(heads.shape)})")
    want_back = heads.transpose(1, 2).reshape(B, T, C)
    _tensor(f"{name}.merge_heads(heads of shape {tuple(heads.shape)})", back, want_back)
    if not close(back, want_back, atol=0, rtol=0):
        hint = "merge_heads must undo split_heads: merge_heads(split_heads(x)) == x"
        if torch.equal(back, heads.reshape(B, T, C)):
            hint += ("; a plain view/reshape to (B, T, C) does not undo the transpose: swap n_head and T back "
                     "first (transpose(1, 2)), then reshape")
        fail(f"{name}.merge_heads(heads of shape {tuple(heads.shape)}) did not put the heads' channels back "
             "where split_heads takes them from", hint)


def _check_no_peeking(layer, x, C, H, seed, because: str = ""):
    """Changing the inputs after position t changes no output up to t (an output that turns nan has changed too).
    Outputs that hold nan or inf to begin with cannot tell (nan is nan whatever it read): that fails."""
    B, T, _ = x.shape
    label = f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}"
    y = call(layer, x, label=label, hint=because)
    _tensor(label, y, x, because=because)
    if not torch.isfinite(y).all():
        fail(f"{label} returned nan or inf, so whether a position reads the ones after it cannot be told", because)
    for t in NO_PEEKING_AFTER:
        if t >= T - 1:
            continue
        x2 = x.clone()
        x2[:, t + 1:] = _randn(B, T - t - 1, C, seed=seed + t, scale=3)
        y2 = call(layer, x2, label=label, hint=because)
        _tensor(label, y2, x, because=because)
        p = next((p for p in range(t + 1) if not close(y2[:, p], y[:, p], atol=ATOL, rtol=0)), None)
        if p is not None:
            fail(f"CausalSelfAttention({C}, {H}) peeks ahead: changing the inputs after position {t} changed "
                 f"the output at position {p}", _also(PEEKING, because))


def _layer_mistake(w, x, y, H, because: str = "") -> str:
    """``w``: the layer's weights, {name: tensor}; its c_attn and c_proj are nn.Linear layers holding them. The
    steps in general when no known mistake matches and no function that forward uses fails (``because`` empty)."""
    B, T, C = x.shape
    c_attn = lambda t: F.linear(t, w["c_attn.weight"], w["c_attn.bias"])  # noqa: E731
    c_proj = lambda t: F.linear(t, w["c_proj.weight"], w["c_proj.bias"])  # noqa: E731
    q, k, v = c_attn(x).split(C, dim=2)
    mask = _oracle_mask(T, T)

    def heads_out(q, k, v, split=_oracle_split):
        return F.scaled_dot_product_attention(split(q, H), split(k, H), split(v, H), attn_mask=mask)

    def merged(o):
        return o.transpose(1, 2).reshape(B, T, C)

    plain = lambda t, h: t.reshape(B, h, T, C // h)  # noqa: E731
    candidates = [
        (lambda: merged(heads_out(q, k, v)),
         "the heads' merged output must go through the output projection: end with self.c_proj(...)"),
        (lambda: c_proj(heads_out(q, k, v).reshape(B, T, C)),
         "the heads are merged without moving T back in front of n_head: transpose(1, 2) before the reshape "
         "(use merge_heads)"),
        (lambda: c_proj(merged(heads_out(q, k, v, plain))),
         "the heads are split with a plain view(B, n_head, T, head_size): view as (B, T, n_head, head_size) "
         "and transpose (use split_heads)"),
    ]
    for order in ((k, q, v), (q, v, k), (v, k, q), (k, v, q), (v, q, k)):
        candidates.append((lambda order=order: c_proj(merged(heads_out(*order))),
                           "c_attn's output is queries, keys and values in that order: q, k, v = "
                           "split into three along the channels"))
    for candidate, hint in candidates:
        try:
            if _close(y, candidate()):
                return hint
        except RuntimeError:
            continue
    return "" if because else \
        "the steps: q, k, v = c_attn(x) split in three; split_heads; causal attention; merge_heads; c_proj"
