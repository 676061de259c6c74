"""Chapter 3 (masked attention): hidden checks for causal_mask, softmax, attention and CausalSelfAttention.

The oracles are PyTorch's own: ``torch.tril`` for the mask, ``torch.softmax``,
``torch.nn.functional.scaled_dot_product_attention`` for attention (its weights are its output for the
values ``eye(T_k)``) and ``torch.nn.functional.multi_head_attention_forward`` for the whole layer. The inputs
are drawn from fixed seeds, in shapes the visible tests do not use: one position, fewer queries than keys,
head sizes that are not powers of two, several batch and head dimensions, float64. When an answer is wrong,
the message names the first thing that is wrong and, for the known mistakes, what the mistake is.

The learner's functions and class are stand-ins (``autograder.judge.Remote``): they run where the notebook runs,
on tensors sent there as plain data, and what comes back is plain tensors. A layer's weights are drawn here and
sent into it (``load_state_dict``), so the oracle uses the very same numbers. Whether a call changed its inputs in
place is seen where the inputs are (``autograder.helpers.attention``); torch's softmax is taken away there while
the learner's softmax runs (``learner_side(forbid=...)``); and a mistake of a function that another one uses is
named from the verdicts of the notebook's earlier test cells (``earlier``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from autograder.judge import LearnerError, ask, cell, earlier, is_instance, learner_side, type_of
from coursekit.testing import call, describe_error, describe_where, expect_raises, fail, not_written, show

ATOL = 1e-5


def _randn(*shape, seed: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).mul(scale).to(dtype)


def _close(got, want, atol: float = ATOL) -> bool:
    """Same shape, and equal within atol where want is finite; the same inf/nan pattern elsewhere."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    return bool(torch.allclose(got, want, atol=atol, rtol=0, equal_nan=True))


def _shape(t) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"a {type_of(t)}"


def _tensor(name: str, got, want: torch.Tensor, what: str = "") -> torch.Tensor:
    """Check that a learner's result is a tensor of the right shape (and dtype, for bool and float64)."""
    label = f"{name}{what}"
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}, expected a torch.Tensor of shape {tuple(want.shape)}")
    if got.shape != want.shape:
        fail(f"{label} returned {_shape(got)}, expected shape {tuple(want.shape)}")
    if got.dtype != want.dtype and (want.dtype in (torch.bool, torch.float64) or got.dtype == torch.bool):
        fail(f"{label} returned a {got.dtype} tensor, expected {want.dtype}",
             "keep the dtype of the input (float64 in, float64 out)" if want.dtype == torch.float64 else "")
    return got


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    got = got.detach().double()
    if (got.isnan() & ~want.isnan()).any():
        return "nan (your result has nan where the expected one has numbers)"
    return f"{(got - want.double()).abs().max().item():.2e}"


# ---------------------------------------------------------------- causal_mask

# (t_q, t_k): t_k None means the call causal_mask(t_q). Square masks first, the first big enough to tell
# the known mistakes apart (on a 1 x 1 mask, "inverted" and "off by one" look the same); then fewer queries
# than keys (chapter 7's KV cache).
MASK_CASES = [(4, None), (1, None), (2, None), (5, None), (8, None), (13, None), (1, 1), (6, 6),
              (3, 7), (1, 6), (4, 5), (2, 9), (7, 12)]


def _oracle_mask(t_q: int, t_k: int) -> torch.Tensor:
    """The last t_q rows of the full causal mask over t_k positions."""
    return torch.tril(torch.ones(t_k, t_k, dtype=torch.bool))[t_k - t_q:]


def _mask_label(t_q, t_k) -> str:
    return f"causal_mask({t_q})" if t_k is None else f"causal_mask({t_q}, {t_k})"


@cell("test_causal_mask")
def check_causal_mask(causal_mask):
    for t_q, t_k_arg in MASK_CASES:
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
        if not torch.equal(got, want):
            fail(f"{label}: {_first_wrong_pair(got, want, t_q, t_k)}", _mask_mistake(got, t_q, t_k))
    expect_raises(ValueError, causal_mask, 5, 2, name="causal_mask",
                  hint="5 queries cannot be the last positions of only 2 keys: raise ValueError")
    # The device is only checked to be accepted: a CPU grader has no other device to put the mask on (the
    # "meta" device would do, but tracing tril there costs seconds in every grading kernel).
    for device in ("cpu", torch.device("cpu")):
        got = call(causal_mask, 3, 5, device=device, name="causal_mask")
        if not (isinstance(got, torch.Tensor) and torch.equal(got, _oracle_mask(3, 5))):
            fail(f"causal_mask(3, 5, device={device!r}) returned {_shape(got)}, not the mask that "
                 "causal_mask(3, 5) returns")


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

def _softmax_cases():
    """(x, dim): dim None means the call softmax(x), with the default dim=-1."""
    inf = math.inf
    return [
        (_randn(7, seed=30), None),
        (_randn(4, 4, seed=31, scale=3), -1),
        (_randn(3, 5, seed=32, scale=3), -1),
        (_randn(3, 5, seed=33, scale=3), 0),
        (_randn(2, 3, 4, seed=34, scale=3), 1),
        (_randn(2, 3, 4, seed=35, scale=3), -2),
        (_randn(2, 3, 4, seed=36, scale=3), 0),
        # Large scores: e^x overflows to inf above 88 in float32 (709 in float64), and inf / inf is nan;
        # e^x underflows to 0 below -103 (-745), and 0 / 0 is nan. Float32 scores stay below 128, where
        # a float32 is exact to 1e-5, so that a softmax computed as exp(x - logsumexp(x)) passes too.
        (torch.tensor([[100.0, 99.0, 95.0], [-120.0, -118.0, -119.0], [1.0, 2.0, 3.0]]), -1),
        (torch.tensor([[110.0, 3.0], [108.0, -5.0], [0.0, 100.0]]), 0),
        (torch.tensor([[1e4, 1e4 - 1, 1e4 - 5], [-1e4, -1e4 + 2, -1e4 + 1], [1.0, 2.0, 3.0]],
                      dtype=torch.float64), -1),
        # Rows far apart: the maximum of the whole tensor is not every row's maximum.
        (torch.tensor([[120.0, 119.0, 0.0], [1.0, 2.0, 3.0]]), -1),
        # Masked entries: e^-inf = 0, so they get weight 0.
        (torch.tensor([[0.5, -inf, 2.0, -inf], [-inf, -inf, 3.0, 1.0], [-inf, 7.0, -inf, -inf]]), -1),
        (torch.tensor([[0.5, -inf], [-inf, 1.0], [2.0, 4.0]]), 0),
        (_randn(4, 6, seed=37, scale=30, dtype=torch.float64), -1),
        (_randn(5, 3, seed=38, scale=30, dtype=torch.float64), 0),
    ]


# While the learner's softmax runs, torch's softmax is off limits where it runs: these raise there.
TORCH_SOFTMAX = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax"]
NO_TORCH_SOFTMAX = ("softmax must be written without torch.softmax / F.softmax / Tensor.softmax: compute it from exp "
                    "and sum")


def _run(fn, args: tuple, kwargs: dict, label: str, forbid: list[str] | None = None):
    """``fn(*args, **kwargs)`` on the learner's side, where the inputs are: ``(what came back, [whether it changed
    args[i] in place])``. With ``forbid``, those functions raise there while it runs; a call of one is named."""
    try:
        with learner_side(**({"forbid": forbid} if forbid else {})):
            answer = ask("attention.run", fn, *args, **kwargs)
    except LearnerError as err:
        if forbid and err.type_name == "autograder.hidden.Forbidden":
            used = str(err).removesuffix(" is not available here")
            fail(f"{label} called {used}{describe_where(err.where, err.cell_name)}", NO_TORCH_SOFTMAX)
        if isinstance(err, NotImplementedError):
            raise not_written(label, err) from None
        raise AssertionError(f"{label} raised {describe_error(err)}") from None  # as coursekit's call says it
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], list)
            and len(answer[1]) == len(args)):
        fail(f"{label}: the notebook's side answered {show(answer)}, not what the grader asked for")
    return answer


@cell("test_softmax")
def check_softmax(softmax):
    for x, dim in _softmax_cases():
        d = -1 if dim is None else dim
        label = f"softmax({_describe(x)})" if dim is None else f"softmax({_describe(x)}, dim={dim})"
        want = torch.softmax(x, dim=d)
        got, changed = _run(softmax, (x,), {} if dim is None else {"dim": dim}, label, forbid=TORCH_SOFTMAX)
        if changed[0]:
            fail(f"{label} changed its input in place", "compute new tensors (x - m, not x -= m): the caller "
                 "still needs its scores")
        _tensor(label, got, want)
        if not _close(got, want):
            fail(f"{label} returned {_values(got)}, expected {_values(want)} "
                 f"(largest difference {_max_diff(got, want)})", _softmax_mistake(x, d, got, want))


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
            if _close(got, candidate()):
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

def _attention_cases():
    """(q, k, v, mask, what): the mask is a bool tensor that broadcasts against the scores, or None."""
    causal = _oracle_mask
    cases = []
    q, k, v = (_randn(2, 5, 8, seed=40 + i) for i in range(3))
    cases.append((q, k, v, causal(5, 5), "causal, (B, T, D) = (2, 5, 8)"))
    q, k, v = (_randn(2, 3, 7, 5, seed=43 + i) for i in range(3))
    cases.append((q, k, v, causal(7, 7), "causal, 3 heads, head size 5"))
    q, k, v = (_randn(1, 1, 1, 6, seed=46 + i) for i in range(3))
    cases.append((q, k, v, causal(1, 1), "one position"))
    q = _randn(2, 2, 3, 12, seed=49)
    k, v = _randn(2, 2, 9, 12, seed=50), _randn(2, 2, 9, 6, seed=51)
    cases.append((q, k, v, causal(3, 9), "3 queries, the last of 9 keys, values of size 6"))
    q, k, v = (_randn(3, 6, 10, seed=52 + i) for i in range(3))
    cases.append((q, k, v, None, "no mask"))
    q, k, v = (_randn(2, 4, 6, 3, seed=55 + i) for i in range(3))
    g = torch.Generator().manual_seed(58)
    mask = torch.rand(2, 1, 6, 6, generator=g) < 0.5
    mask[..., 0] = True  # every query sees at least one key
    cases.append((q, k, v, mask, "a (B, 1, T, T) mask of random holes"))
    q, k, v = (_randn(2, 2, 11, 7, seed=59 + i, dtype=torch.float64) for i in range(3))
    cases.append((q, k, v, causal(11, 11), "float64, head size 7"))
    return cases


def _oracle_attention(q, k, v, mask):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    eye = torch.eye(k.shape[-2], dtype=v.dtype).expand(*k.shape[:-1], k.shape[-2])
    weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)
    return out, weights


def _attention_label(q, k, v, mask, what) -> str:
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    return f"attention({shapes}, mask={'None' if mask is None else tuple(mask.shape)}) [{what}]"


@cell("test_attention")
def check_attention(attention):
    for q, k, v, mask, what in _attention_cases():
        label = _attention_label(q, k, v, mask, what)
        want_out, want_w = _oracle_attention(q, k, v, mask)
        got, changed = _run(attention, (q, k, v, mask), {}, label)
        if any(changed[:3]):
            fail(f"{label} changed q, k or v in place", "compute new tensors (q / s, not q /= s): the caller "
                 "still needs its queries, keys and values")
        if not (isinstance(got, tuple) and len(got) == 2):
            fail(f"{label} returned {_shape(got)}; return a pair (output, weights)")
        out, weights = got
        _tensor(label, weights, want_w, ": the weights")
        if not _close(weights, want_w):
            fail(f"{label}: the weights differ from scaled_dot_product_attention's by {_max_diff(weights, want_w)}",
                 _attention_mistake(q, k, mask, weights))
        _tensor(label, out, want_out, ": the output")
        if not _close(out, want_out):
            fail(f"{label}: the output differs from scaled_dot_product_attention's by {_max_diff(out, want_out)}",
                 "the weights are right: the output is weights @ v")


def _attention_mistake(q, k, mask, weights) -> str:
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
    broken = _broken_helpers("attention", ("softmax",))
    if broken:
        return broken
    if mask is not None and isinstance(weights, torch.Tensor) and weights.shape[-2:] == mask.shape[-2:]:
        leak = (weights.detach().abs() > 1e-7) & ~mask
        if leak.any():
            *_, i, j = leak.nonzero()[0].tolist()
            return f"query {i} gives weight {weights[leak].flatten()[0]:.3g} to key {j}, which the mask hides"
    return ""


# ---------------------------------------------------------------- CausalSelfAttention

# (n_embd, n_head, B, T): head sizes 4, 3 and 5 (not powers of two), 6, 8 (one head), 2 with one position.
LAYER_CASES = [(16, 4, 2, 6), (24, 8, 1, 7), (30, 5, 3, 5), (8, 1, 2, 4), (12, 6, 1, 1), (20, 4, 2, 9)]
NO_PEEKING_AFTER = (0, 2, 4, 7)  # positions t: changing the input after t must not change outputs up to t
LAYER_HELPERS = ("causal_mask", "softmax", "attention")  # what forward calls


LAYERS_HINT = "keep the layers that __init__ makes: chapter 4 loads GPT-2's weights into them"


def _layer(CausalSelfAttention, n_embd, n_head, seed, dtype=torch.float32):
    """The learner's layer with weights from a fixed seed, whatever its own initialisation, in ``dtype`` and in eval
    mode: ``(layer, its weights {name: tensor})``, the weights as sent into it."""
    name = f"CausalSelfAttention({n_embd}, {n_head})"
    layer = call(CausalSelfAttention, n_embd, n_head, label=name)
    for part in ("c_attn", "c_proj"):
        if not is_instance(getattr(layer, part, None), "torch.nn.Linear"):
            fail(f"{name} has no nn.Linear `{part}`", LAYERS_HINT)
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


@cell("test_causal_self_attention")
def check_causal_self_attention(CausalSelfAttention):
    for n, (C, H, B, T) in enumerate(LAYER_CASES):
        layer, w = _layer(CausalSelfAttention, C, H, seed=70 + n)
        x = _randn(B, T, C, seed=80 + n)
        _check_split_merge(layer, x, C, H)
        with torch.no_grad(), learner_side(no_grad=True):
            y = call(layer, x, label=f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}")
            _tensor(f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}", y, x)
            _check_no_peeking(layer, x, y, C, H, seed=90 + n)
            want = _oracle_layer(w, x, H)
            if not _close(y, want):
                fail(f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}: the output differs from "
                     f"torch's multi-head attention by {_max_diff(y, want)}", _layer_mistake(w, x, y, H))
    # float64 through and through: the mask and the scale must not force float32.
    layer, w = _layer(CausalSelfAttention, 12, 3, seed=99, dtype=torch.float64)
    x = _randn(2, 5, 12, seed=100, dtype=torch.float64)
    with torch.no_grad(), learner_side(no_grad=True):
        y = call(layer, x, label="CausalSelfAttention(12, 3).double() on float64 x")
        want = _oracle_layer(w, x, 3)
    _tensor("CausalSelfAttention(12, 3).double() on float64 x", y, want)
    if not _close(y, want, atol=1e-9):
        fail(f"CausalSelfAttention(12, 3).double() on float64 x: the output differs from torch's by "
             f"{_max_diff(y, want)}", "keep the input's dtype all the way through")


def _check_split_merge(layer, x, C, H):
    B, T, _ = x.shape
    name = f"CausalSelfAttention({C}, {H})"
    got = call(layer.split_heads, x, label=f"{name}.split_heads(x of shape {tuple(x.shape)})")
    want = _oracle_split(x, H)
    _tensor(f"{name}.split_heads(x of shape {tuple(x.shape)})", got, want)
    if not torch.equal(got, want):
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
    if not torch.equal(back, want_back):
        hint = "merge_heads must undo split_heads: merge_heads(split_heads(x)) == x"
        if torch.equal(back, heads.reshape(B, T, C)):
            hint += ("; a plain view/reshape to (B, T, C) does not undo the transpose: swap n_head and T back "
                     "first (transpose(1, 2)), then reshape")
        fail(f"{name}.merge_heads(heads of shape {tuple(heads.shape)}) did not put the heads' channels back "
             "where split_heads takes them from", hint)


def _check_no_peeking(layer, x, y, C, H, seed):
    B, T, _ = x.shape
    for t in NO_PEEKING_AFTER:
        if t >= T - 1:
            continue
        x2 = x.clone()
        x2[:, t + 1:] = _randn(B, T - t - 1, C, seed=seed + t, scale=3)
        y2 = call(layer, x2, label=f"CausalSelfAttention({C}, {H}) on x of shape {tuple(x.shape)}")
        changed = (y2[:, :t + 1] - y[:, :t + 1]).abs().amax(dim=(0, 2)) > ATOL
        if changed.any():
            p = int(changed.nonzero()[0])
            fail(f"CausalSelfAttention({C}, {H}) peeks ahead: changing the inputs after position {t} changed "
                 f"the output at position {p}",
                 _broken_helpers("forward", LAYER_HELPERS)
                 or "position p may only read positions 0 .. p: pass the causal mask to attention")


def _layer_mistake(w, x, y, H) -> str:
    """``w``: the layer's weights, {name: tensor}; its c_attn and c_proj are nn.Linear layers holding them."""
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
    return _broken_helpers("forward", LAYER_HELPERS) or (
        "the steps: q, k, v = c_attn(x) split in three; split_heads; causal attention; merge_heads; c_proj")


def _broken_helpers(fn: str, names) -> str:
    """Name the learner's functions among ``names`` that ``fn`` (the learner's function of that name) calls and
    that failed their own test cells earlier in the notebook (``test_<name>``): a mistake there is the one to
    fix first."""
    broken = []
    for name in names:
        verdict = earlier(f"test_{name}")
        if verdict is not None and verdict.status in ("failed", "unfinished"):
            broken.append(name)
    if not broken:
        return ""
    if len(broken) == 1:
        return f"{fn} uses your {broken[0]}, which fails its own test above: fix that first"
    return f"{fn} uses your {' and '.join(broken)}, which fail their own tests above: fix those first"
