"""Chapter 4 (the transformer): hidden checks for LayerNorm, gelu, MLP, Block and GPT.

The oracles are external: `torch.nn.functional.layer_norm`, `F.gelu(approximate="tanh")`, and Hugging Face
`transformers`' GPT2Block and GPT2LMHeadModel with random weights, saved to a temporary folder and loaded
with the learner's `GPT.from_pretrained`. Inputs are ones the learner's visible tests do not use: other
widths, eps values, 1-D, 2-D and 4-D inputs, one position (T = 1), a full context (T = block_size) and one
position more (a ValueError naming block_size), ids of every integer dtype that chapter 2's Embeddings takes,
LayerNorm inputs far from 0 (mean(x^2) - mean^2 cancels there) and gelu inputs up to 1e4 (exp overflows).

Each part then takes a training step, as chapter 8 will: the learner's module in float64 (``.double()``) on a
float64 input, on the learner's side with gradients on; its output must be float64, and the gradients of a loss
on it with respect to its input and every parameter must be the oracle's (``torch.autograd.grad`` on both sides,
float64, to 1e-5 of the largest). A forward under ``torch.no_grad()``, a ``.detach()`` of the mean, a detour
through numpy or an exp that overflows in the backward pass all keep the values and lose these points.

The checks test what the code computes, never how. torch's own `F.layer_norm` inside `LayerNorm` and
`F.gelu(x, approximate="tanh")` get full marks: the notebook asks for the formula by hand, for the sake of
learning it, but a correct answer is a correct answer. So do `torch.rsqrt`, `x.var(correction=0)`, a
`functools.reduce` over the blocks or an `nn.Sequential` of them.

When the result is wrong, a check computes what each known mistake would have returned on the same input
and weights (from the oracle's parts) and names the one that matches. In `Block` and `GPT` it first checks
the parts the learner wrote earlier in the chapter, so that a wrong `LayerNorm` is reported as that and
not as a wrong block, and a part that belongs to chapter 2 or 3 (`Embeddings`, `CausalSelfAttention`) is
named as such; where the parts cannot be told apart that way (a dtype, a gradient), the message says which earlier
test cell of the notebook fails (``judge.because_of``), so that one mistake is explained once.

The learner's classes are stand-ins (``autograder.judge.Remote``): they are built and run where the notebook runs,
and their weights are sent there as plain tensors (``load_state_dict``). The Hugging Face models, the inputs and
the expected values are built here, each from a seed of its own (``torch.Generator``, or ``seeded`` around the
Hugging Face constructors, which draw from torch's global generator). The helpers that must run next to the
learner's code (a call that reports whether it changed its input, a forward and backward pass that sends back
the gradients, a checkpoint folder for ``GPT.from_pretrained``, the files of ``GPT.save_pretrained``) are in
``autograder.sandboxed.helpers.transformer``.

Each cell's checks are weighted parts (``judge.part``), each entered once with its cases in a loop inside it: the
values against the oracle weigh most; edge inputs, inputs far from 0, gelu at large |x|, other id dtypes, the window,
weight tying, inputs left unchanged and the float64 training step each cost their own share. Numbers compare with
``coursekit.testing.close``: nan or inf where the oracle's value is finite is wrong.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from autograder.sandboxed.helpers.transformer import CHECKPOINT_FILES
from autograder.judge import ask, because_of, cell, learner_side, part, seeded, type_of
from coursekit.testing import call, close, describe_call, describe_error, fail, not_written, quiet_transformers, show

# float32 throughout; logits to 1e-4 as the notebook's visible test asks.
ATOL = 1e-5
LOGITS_ATOL = 1e-4
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _generator(seed: int) -> torch.Generator:
    """The check's random numbers come from a generator of its own (several notebooks are judged at once)."""
    return torch.Generator().manual_seed(seed)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type_of(x)


def _output(got, want: torch.Tensor, label: str, atol: float = ATOL) -> float | None:
    """None when ``got`` (rounded to ``want``'s dtype) is ``want`` (finite: an oracle's) to within ``atol`` plus 1e-5
    of its largest value; inf when its shape differs; nan when it holds nan or inf; else the largest difference.
    Fails at once when ``got`` is not a tensor."""
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}, expected a tensor of shape {_shape(want)}",
             "return the tensor itself, not a tuple (no loss, no extra outputs)" if isinstance(got, (tuple, list))
             else "")
    if got.shape != want.shape:
        return float("inf")
    if not got.numel():
        return None
    got = got.detach().to(want.dtype)
    if close(got, want, atol=atol + 1e-5 * want.abs().max().item(), rtol=0):
        return None
    return float("nan") if not torch.isfinite(got).all() else (got - want).abs().max().item()


def _by(diff: float) -> str:
    """How far a result is off, for a message: "by up to 1.23e-02", or the nan or inf it holds."""
    return "with nan or inf where the expected values are finite" if math.isnan(diff) else f"by up to {diff:.2e}"


def _matching(got: torch.Tensor, candidates, atol: float = ATOL) -> str:
    """The explanation of the first candidate mistake whose output is ``got``; "" if none is."""
    for why, compute in candidates:
        try:
            value = compute()
        except Exception:  # noqa: BLE001 (a mistake that cannot even run on this input explains nothing)
            continue
        if close(got.detach().float(), value, atol=atol, rtol=0):
            return why
    return ""


def _run(fn, x: torch.Tensor, name: str, transpose: tuple[int, int] | None = None, hint: str = ""):
    """``fn(x)`` on the learner's side, without gradients, described as ``name(x)`` if it fails (with ``hint``).
    With ``transpose``, ``x`` is sent as it is and ``fn`` gets ``x.transpose(*transpose)`` there, a view that is
    not contiguous. Returns ``(what came back, whether the call changed its input in place)``."""
    label = describe_call(name, (x if transpose is None else x.transpose(*transpose),))
    with learner_side(no_grad=True):
        answer = call(ask, "transformer.run", fn, x, transpose, label=label, hint=hint)
    if not isinstance(answer, tuple) or len(answer) != 2 or not isinstance(answer[1], bool):
        fail(f"{label}: the notebook's side answered {type_of(answer)}, not what the grader asked for")
    return answer


UNCHANGED, TRAINING = "inputs left unchanged", "a training step in float64"


def _unchanged(returned: list[tuple[str, bool]], because: str = "") -> None:
    """Each call that returned (``returned``: its label, whether it changed its input in place) left its input as it
    was. With no call that returned, nothing could be checked: that fails too."""
    if not returned:
        fail("not checked: no call returned a result", because)
    label = next((label for label, changed in returned if changed), None)
    if label is not None:
        fail(f"{label} changed its input in place",
             _also("compute new tensors (x = x + ..., not x += ...; x - mean, not x.sub_(mean)): the caller's tensor "
                   "must stay as it was, and training needs it unchanged to compute gradients", because))


def _also(hint: str, because: str) -> str:
    """A hint, and the note of ``judge.because_of`` (which earlier cell's function this one uses fails)."""
    return "; ".join(text for text in (hint, because) if text)


# ---------------------------------------------------------------- float64, and a training step

GRAD_RTOL = 1e-5  # float64 throughout; a float32 step inside the learner's code still passes
NO_GRAPH = ("no torch.no_grad(), .detach(), .item()/.tolist() or numpy inside forward: chapter 8 trains this "
            "model by backpropagating a loss through this very forward pass")


def _oracle_gradients(out: torch.Tensor, weight: torch.Tensor, x: torch.Tensor | None,
                      params: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The oracle's gradients of ``(out * weight).sum()`` with respect to ``x`` (None: not asked) and ``params``
    (``torch.autograd.grad``: nothing is accumulated in the oracle's ``.grad``, which threads share)."""
    wrt = ([x] if x is not None else []) + list(params.values())
    grads = list(torch.autograd.grad((out * weight).sum(), wrt))
    dx = grads.pop(0) if x is not None else None
    return dx, dict(zip(params, grads))


def _far(got, want: torch.Tensor) -> float | None:
    """None when the tensor ``got`` is ``want`` (finite: an oracle's gradient) to ``GRAD_RTOL`` of its largest value;
    nan when it holds nan or inf; else how far it is."""
    scale = want.abs().max().item() if want.numel() else 0.0
    if close(got, want, atol=GRAD_RTOL * (1.0 + scale), rtol=0):
        return None
    got = got.detach().double()
    return float("nan") if not torch.isfinite(got).all() else (got - want).abs().max().item()


def _check_training_step(fn, x: torch.Tensor, want: torch.Tensor, what: str, label: str, *,
                         want_dx: torch.Tensor | None, want_grads: dict[str, torch.Tensor], weight: torch.Tensor,
                         hint: str = "", because: str = "") -> None:
    """``fn`` (float64 parameters) on the float64 ``x`` with gradients on, on the learner's side; the output must
    be float64, equal ``want`` (``what`` computes it), carry a gradient, and the gradients of
    ``(out * weight).sum()`` with respect to ``x`` (``want_dx``; None for ids) and to the parameters
    (``want_grads``, by the learner's names) must be the oracle's."""
    with learner_side(no_grad=False):
        answer = call(ask, "transformer.gradients", fn, x, weight, label=label, hint=because)
    if not isinstance(answer, dict) or "output" not in answer:
        fail(f"{label}: the notebook's side answered {type_of(answer)}, not what the grader asked for")
    got = answer["output"]
    diff = _output(got, want, label, atol=1e-5)
    if diff == float("inf"):
        fail(f"{label} returned shape {_shape(got)}, expected {tuple(want.shape)}", _also(hint, because))
    if got.dtype != torch.float64:
        fail(f"{label} returned a {str(got.dtype).removeprefix('torch.')} tensor, expected float64 like its "
             f"{' and '.join(p for p, on in (('input', want_dx is not None), ('parameters', want_grads)) if on)}",
             _also("keep the input's dtype: no .float() or dtype=torch.float32 inside forward; a tensor made "
                   "there takes x's dtype (torch.zeros(..., dtype=x.dtype))", because))
    if diff is not None:
        fail(f"{label} differs from {what} {_by(diff)}", _also(hint, because))
    if answer.get("requires_grad") is not True:
        needing = " and ".join(what for what, asked in (("its parameters", want_grads),
                                                        ("its input", want_dx is not None)) if asked)
        fail(f"{label}: its output carries no gradient (out.requires_grad is False, although {needing} "
             f"require{'s' if needing == 'its input' else ''} grad), so no loss on it can train the model",
             _also(NO_GRAPH, because))
    params = answer.get("params") if isinstance(answer.get("params"), dict) else {}
    wanted = ([("its input", answer.get("input"), want_dx)] if want_dx is not None else []) + \
        [(name, params.get(name), grad) for name, grad in want_grads.items()]
    missing = [name for name, got_grad, _ in wanted if not isinstance(got_grad, torch.Tensor)]
    if missing:
        fail(f"{label}: no gradient reaches {', '.join(missing[:4])}"
             f"{f' (and {len(missing) - 4} more)' if len(missing) > 4 else ''} from a loss on its output",
             _also(NO_GRAPH, because))
    wrong = []
    for name, got_grad, grad in wanted:
        if got_grad.shape != grad.shape:
            wrong.append((name, f"has shape {tuple(got_grad.shape)}, not {tuple(grad.shape)}"))
        elif (far := _far(got_grad, grad)) is not None:
            wrong.append((name, f"holds nan or inf where {what}'s is finite" if math.isnan(far) else
                          f"differs from {what}'s by up to {far:.2e}"))
    if wrong:
        name, how = wrong[0]
        count = f" ({len(wrong)} of the {len(wanted)} gradients differ)" if len(wanted) > 1 else ""
        fail(f"{label}: the output is right but its gradients are not: the gradient of sum(out * r) with respect to "
             f"{name} {how}{count}",
             _also("an exp that overflows in the backward pass (inf / inf is nan) does that even where the values "
                   "come out right: keep exp to numbers <= 0, or use torch.tanh or torch.sigmoid"
                   if "nan or inf" in how else
                   "a .detach() or torch.no_grad() around part of the computation (the mean, the variance, a "
                   "layer) keeps the values and cuts the gradient through it", because))


# ---------------------------------------------------------------- LayerNorm

LN_CASES = [  # (C, eps, input shape, scale, offset): means and scales far from 0 and 1, one tiny variance
    (5, 1e-5, (2, 3, 5), 5.0, 3.0),
    (16, 0.1, (4, 16), 1.0, -2.0),          # 2-D input, a large eps
    (7, 1.0, (1, 1, 7), 2.0, 0.0),          # one position, eps = 1
    (6, 1e-5, (2, 3, 4, 6), 0.003, 0.0),    # 4-D input; variance 1e-5, as large as eps
    (32, 1e-6, (3, 5, 32), 1.0, 1.0),       # a non-contiguous input (a transposed tensor)
]
FAR_FROM_ZERO = ("your LayerNorm is right for inputs near 0 but not for these, whose mean is 300: mean(x^2) - "
                 "mean^2 subtracts two numbers near 90,000 that agree in all but their last digits, and float32 "
                 "loses what is left; compute the variance from the centred values, ((x - mean)^2).mean(-1), or "
                 "x.var(-1, unbiased=False)")
LN_DEFAULT_EPS = 1e-5  # LayerNorm's eps where none is given (an eps of None in a case: left out)
LN_EDGE_CASES = [  # (C, eps, input shape, scale, offset, atol, note when only this case fails)
    (9, 1e-5, (9,), 3.0, 1.0, ATOL, ""),                    # one position alone: a 1-D input
    (8, None, (2, 3, 8), 0.0, 2.0, ATOL, ""),               # every channel equal (variance 0): the default eps keeps
                                                            # 0 / 0 away
    (64, 1e-5, (3, 7, 64), 1.0, 300.0, 1e-3, FAR_FROM_ZERO),  # correct ways agree to 1e-4; mean(x^2) - mean^2: 5e-2
]
LN_FLOAT64 = (12, 1e-3, (2, 3, 12))  # C, eps, input shape: float64 weights and input, then a training step


def _ln_mistakes(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    norm = (x - mean) / torch.sqrt(var + eps)
    mistakes = [
        ("you divided by C - 1 (torch's default unbiased variance, x.var() or x.std()); LayerNorm uses the "
         "biased variance, the mean of (x - mean)^2 over C: x.var(dim=-1, unbiased=False)",
         lambda: (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps) * w + b),
        ("eps belongs inside the square root: (x - mean) / sqrt(var + eps), not / (sqrt(var) + eps)",
         lambda: (x - mean) / (torch.sqrt(var) + eps) * w + b),
        ("you used eps = 1e-5 whatever the constructor was given; use self.eps",
         lambda: (x - mean) / torch.sqrt(var + 1e-5) * w + b),
        ("eps belongs inside the square root: (x - mean) / sqrt(var + eps); you left it out",
         lambda: (x - mean) / torch.sqrt(var) * w + b),
        ("you divided by the variance; divide by the standard deviation, sqrt(var + eps)",
         lambda: (x - mean) / (var + eps) * w + b),
        ("you did not subtract the mean (that is RMSNorm); LayerNorm centres each position's channels first",
         lambda: x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w + b),
        ("the learned scale `weight` is missing: multiply the normalised x by self.weight",
         lambda: norm + b),
        ("the learned shift `bias` is missing: add self.bias after scaling",
         lambda: norm * w),
        ("the learned scale `weight` and shift `bias` are missing: norm * self.weight + self.bias",
         lambda: norm),
        ("weight and bias are swapped: scale by self.weight, then add self.bias",
         lambda: norm * b + w),
    ]
    for dim in range(x.dim() - 1):
        def wrong_dim(dim=dim):
            m = x.mean(dim, keepdim=True)
            return (x - m) / torch.sqrt(x.var(dim, keepdim=True, unbiased=False) + eps) * w + b
        mistakes.append((f"you normalised over dim {dim} of a {x.dim()}-D input; LayerNorm normalises each "
                         "position over its C channels, the last dim (dim=-1, keepdim=True)", wrong_dim))
    mistakes.append(("you normalised over all dims at once; normalise each position over its own C channels "
                     "(dim=-1, keepdim=True)",
                     lambda: (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps) * w + b))
    return mistakes


def _load_parameters(module, state_dict: dict[str, torch.Tensor], name: str, hint: str) -> None:
    """Send ``state_dict`` into the learner's ``module`` (strict=False: a module may hold more); every tensor sent
    must land in a parameter of that name and shape."""
    try:
        result = module.load_state_dict(state_dict, strict=False)
    except Exception as err:  # noqa: BLE001 (a shape that differs, a load_state_dict that breaks)
        fail(f"the check's weights do not load into {name}: {describe_error(err)}", hint)
    unexpected = getattr(result, "unexpected_keys", None)
    if not isinstance(unexpected, list):
        fail(f"{name}.load_state_dict returned {type_of(result)}, not torch's missing and unexpected keys", hint)
    if unexpected:
        fail(f"{name} has no parameter named {', '.join(map(str, unexpected))}", hint)


LN_VALUES, ONE_D_TRANSPOSED, FAR = ("values over the last dim, 2-D to 4-D inputs",
                                    "a 1-D, a transposed and a constant input", "inputs far from 0")
LN_PARTS = {LN_VALUES: 3, ONE_D_TRANSPOSED: 1, FAR: 1, UNCHANGED: 1, TRAINING: 1}


@cell("test_layer_norm", parts=LN_PARTS)
def check_layer_norm(LayerNorm):
    # (seed, C, eps, shape, scale, offset, atol, note, part): LN_CASES' last is the transposed input; of the edge
    # cases, the one with a note is far from 0.
    cases = [(400 + k, *case, ATOL, "", ONE_D_TRANSPOSED if k == len(LN_CASES) - 1 else LN_VALUES)
             for k, case in enumerate(LN_CASES)]
    cases += [(470 + k, *case, FAR if case[-1] else ONE_D_TRANSPOSED) for k, case in enumerate(LN_EDGE_CASES)]
    returned = []  # (label, whether it changed its input) of each call that returned
    for name in (LN_VALUES, ONE_D_TRANSPOSED, FAR):
        with part(name):
            for seed, C, eps, shape, scale, offset, atol, note, case_part in cases:
                if case_part == name:
                    _check_layer_norm_case(LayerNorm, seed, C, eps, shape, scale, offset, atol, note,
                                           transposed=seed == 400 + len(LN_CASES) - 1, returned=returned)
    with part(UNCHANGED):
        _unchanged(returned)
    with part(TRAINING):
        _check_layer_norm_training(LayerNorm)


def _check_layer_norm_case(LayerNorm, seed, C, eps, shape, scale, offset, atol, note, transposed, returned):
    """The learner's LayerNorm(C, eps) with seeded weights on a seeded input (``transposed``: sent as its transpose
    and transposed back on the learner's side, a view that is not contiguous)."""
    g = _generator(seed)
    weight = torch.empty(C).uniform_(0.5, 1.5, generator=g)
    bias = torch.empty(C).uniform_(-1.0, 1.0, generator=g)
    transpose = None
    if transposed:
        sent = torch.randn(*reversed(shape), generator=g) * scale + offset
        transpose = (0, -1)
        x = sent.transpose(*transpose)
    else:
        sent = x = torch.randn(*shape, generator=g) * scale + offset
    name = f"LayerNorm({C})" if eps is None else f"LayerNorm({C}, eps={eps})"
    ln = call(LayerNorm, C, *(() if eps is None else (eps,)), name="LayerNorm")
    _load_parameters(ln, {"weight": weight, "bias": bias}, name,
                     "keep the learned scale and shift as given, self.weight and self.bias, of shape (C,)")
    label = f"{name} on an input of shape {tuple(shape)}"
    eps = LN_DEFAULT_EPS if eps is None else eps
    try:
        got, changed = _run(ln, sent, name, transpose)
    except AssertionError as err:
        if "RuntimeError" in str(err) and "size" in str(err):
            fail(str(err), "the mean and variance over the last dim need keepdim=True to broadcast "
                           "against x, whatever the number of dims")
        raise
    returned.append((label, changed))
    want = F.layer_norm(x.double(), (C,), weight.double(), bias.double(), eps).float()
    diff = _output(got, want, label, atol=atol)
    if diff is None:
        return
    if diff == float("inf"):
        fail(f"{label} returned shape {_shape(got)}, expected {tuple(shape)}",
             "LayerNorm keeps the shape of its input: keepdim=True on the mean and variance")
    fail(f"{label} differs from F.layer_norm {_by(diff)}",
         _matching(got, _ln_mistakes(x, weight, bias, eps)) or note)


def _check_layer_norm_training(LayerNorm) -> None:
    C, eps, shape = LN_FLOAT64
    g = _generator(479)
    weight = torch.empty(C, dtype=torch.float64).uniform_(0.5, 1.5, generator=g)
    bias = torch.empty(C, dtype=torch.float64).uniform_(-1.0, 1.0, generator=g)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * 2 + 1
    r = torch.randn(*shape, generator=g, dtype=torch.float64)
    name = f"LayerNorm({C}, eps={eps}).double()"
    ln = call(call(LayerNorm, C, eps, name="LayerNorm").double, name=f"LayerNorm({C}, eps={eps}).double")
    _load_parameters(ln, {"weight": weight, "bias": bias}, name,
                     "keep the learned scale and shift as given, self.weight and self.bias, of shape (C,)")
    with torch.enable_grad():
        xr, params = x.clone().requires_grad_(True), {"weight": weight.clone().requires_grad_(True),
                                                       "bias": bias.clone().requires_grad_(True)}
        want = F.layer_norm(xr, (C,), params["weight"], params["bias"], eps)
        want_dx, want_grads = _oracle_gradients(want, r, xr, params)
    _check_training_step(ln, x, want.detach(), "F.layer_norm", f"{name} on a float64 input of shape {shape}",
                         want_dx=want_dx, want_grads=want_grads, weight=r)


# ---------------------------------------------------------------- gelu

def _gelu_mistakes(x):
    c = math.sqrt(2 / math.pi)
    return [
        ("this is the exact GELU, x * Phi(x) with erf (F.gelu's default); GPT-2 uses the tanh approximation "
         "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", lambda: F.gelu(x)),
        ("this is ReLU; GPT-2's GELU is smooth and slightly negative for x < 0", lambda: torch.relu(x)),
        ("this is the sigmoid approximation x * sigmoid(1.702 x); GPT-2 uses the tanh form",
         lambda: x * torch.sigmoid(1.702 * x)),
        ("the factor 0.5 is missing", lambda: x * (1 + torch.tanh(c * (x + 0.044715 * x ** 3)))),
        ("the factor x in front is missing: 0.5 * x * (1 + tanh(...))",
         lambda: 0.5 * (1 + torch.tanh(c * (x + 0.044715 * x ** 3)))),
        ("the cubic term 0.044715 x^3 is missing inside the tanh", lambda: 0.5 * x * (1 + torch.tanh(c * x))),
        ("the cubic term is 0.044715 x^3, not x^2", lambda: 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x ** 2)))),
        ("the constant is sqrt(2 / pi), not sqrt(2 * pi)",
         lambda: 0.5 * x * (1 + torch.tanh(math.sqrt(2 * math.pi) * (x + 0.044715 * x ** 3)))),
        ("the sqrt(2 / pi) factor is missing inside the tanh",
         lambda: 0.5 * x * (1 + torch.tanh(x + 0.044715 * x ** 3))),
    ]


GELU_LARGE = [-1e4, -100.0, -30.0, -12.0, 12.0, 20.0, 30.0, 100.0, 1e4]  # exp(2z) overflows float32 from x = 10.3
GELU_OVERFLOW = ("for large |x|, exp overflows to inf and inf / inf is nan: use torch.tanh, which saturates at -1 "
                 "and 1, or a form in which exp only meets numbers <= 0")


GELU_VALUES, GELU_AT_LARGE, GELU_TRAINING = ("gelu's values", "gelu at large |x|",
                                             "gelu: a training step in float64")
MLP_VALUES, MLP_TRAINING = "the MLP's values", "the MLP: a training step in float64"


def check_gelu(gelu, returned: list) -> None:
    """gelu's parts; the calls that returned go to ``returned`` (label, whether it changed its input)."""
    g = _generator(410)
    inputs = [(torch.linspace(-8.0, 8.0, 1601), None, GELU_VALUES),
              (torch.randn(3, 4, 5, generator=g) * 3, None, GELU_VALUES),
              (torch.tensor([0.0, -1e-3, 1e-3]), None, GELU_VALUES), (torch.tensor(GELU_LARGE), None, GELU_AT_LARGE),
              (torch.empty(0), None, GELU_VALUES),
              (torch.randn(7, 3, generator=g), (0, 1), GELU_VALUES)]  # the last: x.t()
    for name in (GELU_VALUES, GELU_AT_LARGE):
        with part(name):
            for sent, transpose, case_part in inputs:
                if case_part == name:
                    _check_gelu_case(gelu, sent, transpose, returned)
    with part(GELU_TRAINING):
        _check_gelu_training(gelu)


def _check_gelu_case(gelu, sent, transpose, returned: list) -> None:
    x = sent if transpose is None else sent.transpose(*transpose)
    label = f"gelu on an input of shape {tuple(x.shape)}"
    got, changed = _run(gelu, sent, "gelu", transpose)
    returned.append((label, changed))
    want = F.gelu(x.double(), approximate="tanh").float()
    diff = _output(got, want, label)
    if diff is None:
        return
    if diff == float("inf"):
        fail(f"{label} returned shape {_shape(got)}, expected {tuple(x.shape)}",
             "gelu works element by element: the output has the input's shape")
    if math.isnan(diff):
        bad = (~torch.isfinite(got.detach().float()) & torch.isfinite(want)).flatten().nonzero()[0].item()
        fail(f"{label} returned {got.flatten()[bad].item()} at x = {x.flatten()[bad].item():g}, where "
             f"F.gelu(x, approximate='tanh') is {want.flatten()[bad].item():g}", GELU_OVERFLOW)
    worst = (got.detach().float() - want).abs().argmax()
    fail(f"{label} differs from F.gelu(x, approximate='tanh') by up to {diff:.2e} "
         f"(at x = {x.flatten()[worst].item():.3f})", _matching(got, _gelu_mistakes(x)))


def _check_gelu_training(gelu) -> None:
    g = _generator(480)
    x = torch.cat([torch.linspace(-6.0, 6.0, 25, dtype=torch.float64), torch.tensor(GELU_LARGE, dtype=torch.float64),
                   torch.randn(20, generator=g, dtype=torch.float64) * 3])
    r = torch.randn(x.shape, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        xr = x.clone().requires_grad_(True)
        want = F.gelu(xr, approximate="tanh")
        want_dx, _ = _oracle_gradients(want, r, xr, {})
    _check_training_step(gelu, x, want.detach(), "F.gelu(x, approximate='tanh')",
                         f"gelu on a float64 input of shape {tuple(x.shape)} that requires grad",
                         want_dx=want_dx, want_grads={}, weight=r, hint=GELU_OVERFLOW)


# ---------------------------------------------------------------- MLP

def _mlp_mistakes(w, x):
    """``w``: the MLP's weights, {name: tensor}."""
    fc = lambda v: F.linear(v, w["c_fc.weight"], w["c_fc.bias"])  # noqa: E731
    proj = lambda v: F.linear(v, w["c_proj.weight"], w["c_proj.bias"])  # noqa: E731
    tanh_gelu = lambda v: F.gelu(v, approximate="tanh")  # noqa: E731
    return [
        ("the activation is missing: without gelu between c_fc and c_proj the MLP is one linear map",
         lambda: proj(fc(x))),
        ("the MLP uses ReLU; use GPT-2's gelu (your function above) between c_fc and c_proj",
         lambda: proj(torch.relu(fc(x)))),
        ("the MLP uses the exact (erf) GELU, F.gelu(x) by default; GPT-2's is the tanh form, your gelu above",
         lambda: proj(F.gelu(fc(x)))),
        ("gelu goes between c_fc and c_proj, not after c_proj", lambda: tanh_gelu(proj(fc(x)))),
        ("gelu goes between c_fc and c_proj, not before c_fc", lambda: proj(fc(tanh_gelu(x)))),
        ("gelu goes once, between c_fc and c_proj, not after c_proj as well",
         lambda: tanh_gelu(proj(tanh_gelu(fc(x))))),
        ("the MLP returns c_proj(gelu(c_fc(x))) alone; the residual x + ... is the Block's job",
         lambda: x + proj(tanh_gelu(fc(x)))),
    ]


MLP_CASES = [(4, (2, 3, 4)), (24, (1, 1, 24)), (10, (5, 10))]


def _mlp_weights(C: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights large enough that every form of GELU shows, for the parameters of GPT-2's MLP."""
    shapes = {"c_fc.weight": (4 * C, C), "c_fc.bias": (4 * C,), "c_proj.weight": (C, 4 * C), "c_proj.bias": (C,)}
    return {name: torch.empty(shape).normal_(0.0, 0.7, generator=g) for name, shape in shapes.items()}


def check_mlp(MLP, returned: list) -> None:
    """The MLP's parts; the calls that returned go to ``returned`` (label, whether it changed its input)."""
    with part(MLP_VALUES):
        for k, (C, shape) in enumerate(MLP_CASES):
            g = _generator(420 + k)
            w = _mlp_weights(C, g)
            x = torch.randn(*shape, generator=g) * 2
            mlp = call(MLP, C, name="MLP")
            _load_parameters(mlp, w, f"MLP({C})", "keep the layers as given: c_fc, nn.Linear(C, 4C), and c_proj, "
                             "nn.Linear(4C, C)")
            label = f"MLP({C}) on an input of shape {shape}"
            got, changed = _run(mlp, x, f"MLP({C})")
            returned.append((label, changed))
            want = F.linear(F.gelu(F.linear(x, w["c_fc.weight"], w["c_fc.bias"]), approximate="tanh"),
                            w["c_proj.weight"], w["c_proj.bias"])
            diff = _output(got, want, label, atol=1e-4)
            if diff is None:
                continue
            if diff == float("inf"):
                fail(f"{label} returned shape {_shape(got)}, expected {shape}",
                     "c_fc widens C to 4C, gelu keeps the shape, c_proj brings 4C back to C")
            fail(f"{label} differs from c_proj(gelu(c_fc(x))) {_by(diff)}",
                 _matching(got, _mlp_mistakes(w, x), atol=1e-4))
    with part(MLP_TRAINING):
        _check_mlp_training(MLP)


def _check_mlp_training(MLP) -> None:
    C, shape = 6, (2, 3, 6)
    g = _generator(481)
    w = {name: t.double() for name, t in _mlp_weights(C, g).items()}
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    r = torch.randn(*shape, generator=g, dtype=torch.float64)
    mlp = call(call(MLP, C, name="MLP").double, name=f"MLP({C}).double")
    _load_parameters(mlp, w, f"MLP({C}).double()", "keep the layers as given: c_fc, nn.Linear(C, 4C), and c_proj, "
                     "nn.Linear(4C, C)")
    with torch.enable_grad():
        xr, params = x.clone().requires_grad_(True), {n: t.clone().requires_grad_(True) for n, t in w.items()}
        want = F.linear(F.gelu(F.linear(xr, params["c_fc.weight"], params["c_fc.bias"]), approximate="tanh"),
                        params["c_proj.weight"], params["c_proj.bias"])
        want_dx, want_grads = _oracle_gradients(want, r, xr, params)
    _check_training_step(mlp, x, want.detach(), "c_proj(gelu(c_fc(x)))",
                         f"MLP({C}).double() on a float64 input of shape {shape}", want_dx=want_dx,
                         want_grads=want_grads, weight=r)


@cell("test_mlp", parts={GELU_VALUES: 2, GELU_AT_LARGE: 1, GELU_TRAINING: 1, MLP_VALUES: 2, MLP_TRAINING: 1,
                         UNCHANGED: 1})
def check_gelu_and_mlp(gelu, MLP):
    returned = []  # (label, whether it changed its input) of each call of gelu or MLP that returned
    check_gelu(gelu, returned)
    check_mlp(MLP, returned)
    with part(UNCHANGED):
        _unchanged(returned)


# ---------------------------------------------------------------- Hugging Face's GPT-2, the oracle

def _hf_config(vocab_size, block_size, n_layer, n_head, n_embd, eps):
    """GPT-2 as Hugging Face writes it. A GPT2Block built alone has no attention implementation chosen for
    it otherwise; "sdpa" is causal without a mask (eager would need one)."""
    from transformers import GPT2Config
    return GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_layer=n_layer, n_head=n_head,
                      n_embd=n_embd, layer_norm_epsilon=eps, activation_function="gelu_new",
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                      tie_word_embeddings=True, attn_implementation="sdpa")


def _randomise(module: torch.nn.Module) -> None:
    """Random values for every parameter, LayerNorms and biases included (HF initialises those to 1 and 0,
    which would hide a LayerNorm used in the wrong place). From torch's generator: inside ``seeded``."""
    for name, p in module.named_parameters():
        if p.dim() == 1 and ("ln_" in name):
            p.uniform_(0.5, 1.5) if name.endswith("weight") else p.normal_(0.0, 0.3)
        elif p.dim() == 1:
            p.normal_(0.0, 0.2)
        else:
            p.normal_(0.0, 0.5 if name.endswith(("wte.weight", "wpe.weight")) else 0.2)


# The oracles are built once per process and only read afterwards (eval mode, no gradients), by any thread.
# Whatever runs Hugging Face's loading and saving holds this lock: quiet_transformers turns process-wide switches
# (its logging, its progress bars, the warnings filters) off and back on, which threads must not interleave.
_BUILD = threading.RLock()


@functools.cache
def _hf_block(C: int, n_head: int, block_size: int, eps: float, seed: int):
    """Hugging Face's GPT2Block with random weights (its constructor draws from torch's global generator)."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    with _BUILD, seeded(seed), torch.no_grad(), quiet_transformers():
        hf_block = GPT2Block(_hf_config(50, block_size, 2, n_head, C, eps)).eval()
        _randomise(hf_block)
    return hf_block


_FLOAT64: dict[int, torch.nn.Module] = {}


def _float64(hf: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of the oracle ``hf``, made once (the oracles live as long as the process)."""
    with _BUILD:
        if id(hf) not in _FLOAT64:
            _FLOAT64[id(hf)] = copy.deepcopy(hf).double()
        return _FLOAT64[id(hf)]


def _block_state_dict(hf_block) -> dict[str, torch.Tensor]:
    """A Hugging Face GPT2Block's tensors under minigpt's names (the same, with Conv1D weights transposed)."""
    return {name: t.t().contiguous() if name.endswith(_CONV1D) else t.clone()
            for name, t in hf_block.state_dict().items() if not name.endswith((".attn.bias", ".masked_bias"))}


def _hf_attn(hf_block):
    return lambda h: hf_block.attn(h)[0]


def _part_mistake(module, hf_module, x, name: str, what: str, atol: float) -> str:
    """If the learner's part ``module`` gives other values than Hugging Face's ``hf_module`` on ``x``, say so."""
    try:
        got = module(x)
    except Exception as err:  # noqa: BLE001
        return f"{name} raised {describe_error(err)}; {what}"
    want = hf_module(x)
    want = want[0] if isinstance(want, tuple) else want
    if not isinstance(got, torch.Tensor) or not close(got, want, atol=atol, rtol=0):
        return f"{name} on its own differs from the same part of Hugging Face's GPT-2; {what}"
    return ""


def _block_parts_mistake(block, hf_block, x, name: str) -> str:
    """Name the first part of a block that is wrong on its own: LayerNorm, MLP (this chapter) or attention."""
    y = hf_block.ln_1(x)
    parts = [
        ("ln_1", hf_block.ln_1, x, "fix LayerNorm first (test_layer_norm)"),
        ("ln_2", hf_block.ln_2, x, "fix LayerNorm first (test_layer_norm)"),
        ("mlp", hf_block.mlp, y, "fix gelu and MLP first (test_mlp)"),
        ("attn", _hf_attn(hf_block), y,
         "the block's attention is chapter 3's CausalSelfAttention (minigpt.attention): fix it there"),
    ]
    for attribute, hf_module, inp, what in parts:
        why = _part_mistake(getattr(block, attribute), hf_module, inp, f"{name}{attribute}", what, atol=1e-4)
        if why:
            return why
    return ""


def _block_mistakes(hf_block, x):
    ln_1, ln_2, attn, mlp = hf_block.ln_1, hf_block.ln_2, _hf_attn(hf_block), hf_block.mlp

    def two_steps(first, second):
        h = first(x)
        return second(h)

    return [
        ("this is a post-norm block, ln(x + attn(x)): GPT-2 is pre-norm, x + attn(ln_1(x)), then "
         "x + mlp(ln_2(x)); the residual stream itself is never normalised",
         lambda: two_steps(lambda v: ln_1(v + attn(v)), lambda h: ln_2(h + mlp(h)))),
        ("the residual around attention is missing: x = x + attn(ln_1(x)), not x = attn(ln_1(x))",
         lambda: two_steps(lambda v: attn(ln_1(v)), lambda h: h + mlp(ln_2(h)))),
        ("the residual around the MLP is missing: x = x + mlp(ln_2(x)), not x = mlp(ln_2(x))",
         lambda: two_steps(lambda v: v + attn(ln_1(v)), lambda h: mlp(ln_2(h)))),
        ("both residuals are missing: each layer's output is added to x (x = x + ...), not put in its place",
         lambda: mlp(ln_2(attn(ln_1(x))))),
        ("ln_2 is used before attention too; attention reads ln_1(x), the MLP reads ln_2(x)",
         lambda: two_steps(lambda v: v + attn(ln_2(v)), lambda h: h + mlp(ln_2(h)))),
        ("ln_1 is used before the MLP too; attention reads ln_1(x), the MLP reads ln_2(x)",
         lambda: two_steps(lambda v: v + attn(ln_1(v)), lambda h: h + mlp(ln_1(h)))),
        ("ln_1 and ln_2 are swapped; attention reads ln_1(x), the MLP reads ln_2(x)",
         lambda: two_steps(lambda v: v + attn(ln_2(v)), lambda h: h + mlp(ln_1(h)))),
        ("the MLP runs before attention; GPT-2's block runs attention first, then the MLP",
         lambda: two_steps(lambda v: v + mlp(ln_2(v)), lambda h: h + attn(ln_1(h)))),
        ("attention and MLP both read the block's input (a 'parallel' block); in GPT-2 the MLP reads "
         "x after attention's output was added", lambda: x + attn(ln_1(x)) + mlp(ln_2(x))),
        ("the residual is added to the normalised x; the residual stream x itself is never normalised: "
         "x + attn(ln_1(x))",
         lambda: two_steps(lambda v: ln_1(v) + attn(ln_1(v)), lambda h: ln_2(h) + mlp(ln_2(h)))),
        ("the LayerNorms are missing: x + attn(ln_1(x)), then x + mlp(ln_2(x))",
         lambda: two_steps(lambda v: v + attn(v), lambda h: h + mlp(h))),
    ]


BLOCK_CONFIGS = [  # (n_embd, n_head, block_size, layer_norm_epsilon)
    (16, 2, 8, 1e-5),
    (24, 3, 12, 1e-3),
]


def _load(module, state_dict, name: str) -> None:
    """Hugging Face's weights, sent into the learner's module (strict: every name and shape as GPT-2's)."""
    try:
        module.load_state_dict(state_dict)
    except Exception as err:  # noqa: BLE001
        fail(f"Hugging Face's GPT-2 weights do not load into {name}: {describe_error(err)}",
             "keep GPT-2's names and shapes (ln_1, attn, ln_2, mlp with c_fc and c_proj), as given")


BLOCK_USES = {"LayerNorm": "test_layer_norm", "MLP": "test_mlp"}  # the learner's parts a Block is made of


BLOCK_VALUES = "the same as Hugging Face's GPT2Block"


@cell("test_block", parts={BLOCK_VALUES: 3, UNCHANGED: 1, TRAINING: 1})
def check_block(Block, GPTConfig):
    because = because_of(**BLOCK_USES)
    returned = []  # (label, whether it changed its input) of each call that returned
    with torch.no_grad(), learner_side(no_grad=True):
        with part(BLOCK_VALUES):
            _check_block(Block, GPTConfig, because, returned)
    with part(UNCHANGED):
        _unchanged(returned, because)
    with part(TRAINING):
        _check_block_training(Block, GPTConfig, BLOCK_CONFIGS[0], seed=430, because=because)


def _new_block(Block, GPTConfig, C, n_head, block_size, eps, seed):
    """The learner's Block of this shape with Hugging Face's weights: (the block, its name, the oracle)."""
    config = call(GPTConfig, vocab_size=50, block_size=block_size, n_layer=2, n_head=n_head, n_embd=C,
                  layer_norm_epsilon=eps, name="GPTConfig")
    name = f"Block(GPTConfig(n_embd={C}, n_head={n_head}, layer_norm_epsilon={eps}))"
    block = call(Block, config, name="Block")
    hf_block = _hf_block(C, n_head, block_size, eps, seed=seed)
    _load(block, _block_state_dict(hf_block), name)
    call(block.eval, name=f"{name}.eval")
    return block, name, hf_block


def _check_block(Block, GPTConfig, because: str, returned: list):
    for k, (C, n_head, block_size, eps) in enumerate(BLOCK_CONFIGS):
        block, name, hf_block = _new_block(Block, GPTConfig, C, n_head, block_size, eps, seed=430 + k)
        g = _generator(435 + k)
        for B, T in ((2, block_size), (1, 1), (3, 5)):
            x = torch.randn(B, T, C, generator=g) * 2 + 0.5
            label = f"{name} on an input of shape {(B, T, C)}"
            got, changed = _run(block, x, name, hint=because)
            returned.append((label, changed))
            want = hf_block(x)
            want = want[0] if isinstance(want, tuple) else want
            diff = _output(got, want, label, atol=1e-4)
            if diff is None:
                continue
            if diff == float("inf"):
                fail(f"{label} returned shape {_shape(got)}, expected {(B, T, C)}",
                     _also("a block keeps the shape (B, T, C): the residual stream goes in and comes out", because))
            hint = _block_parts_mistake(block, hf_block, x, "Block.") or \
                _also(_matching(got, _block_mistakes(hf_block, x), atol=1e-4), because)
            fail(f"{label} differs from Hugging Face's GPT2Block with the same weights {_by(diff)}", hint)


def _hf_gradients(hf, out, weight, x, rename) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The gradients of ``(out * weight).sum()`` with respect to ``x`` and to the parameters of the Hugging Face
    module ``hf``, under minigpt's names (``rename``) and layouts (Conv1D weights transposed)."""
    params = {rename(name): p for name, p in hf.named_parameters()}
    dx, grads = _oracle_gradients(out, weight, x, params)
    return dx, {name: g.t() if name.endswith(_CONV1D) else g for name, g in grads.items()}


def _check_block_training(Block, GPTConfig, block_config, seed: int, because: str) -> None:
    C, n_head, block_size, eps = block_config
    with torch.no_grad(), learner_side(no_grad=True):
        block, name, _ = _new_block(Block, GPTConfig, C, n_head, block_size, eps, seed=seed)
        block = call(block.double, name=f"{name}.double")
    hf64 = _float64(_hf_block(C, n_head, block_size, eps, seed=seed))
    g = _generator(482)
    x = torch.randn(2, block_size, C, generator=g, dtype=torch.float64) * 2 + 0.5
    r = torch.randn(2, block_size, C, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        xr = x.clone().requires_grad_(True)
        want = hf64(xr)
        want = want[0] if isinstance(want, tuple) else want
        want_dx, want_grads = _hf_gradients(hf64, want, r, xr, lambda n: n)
    _check_training_step(block, x, want.detach(), "Hugging Face's GPT2Block",
                         f"{name}.double() on a float64 input of shape {tuple(x.shape)}", want_dx=want_dx,
                         want_grads=want_grads, weight=r, because=because)


# ---------------------------------------------------------------- GPT

GPT_CONFIGS = [  # (vocab_size, block_size, n_layer, n_head, n_embd, layer_norm_epsilon)
    (97, 12, 3, 2, 16, 1e-5),
    (211, 9, 2, 4, 24, 1e-3),
]


@functools.cache
def _hf_model(config_args, seed: int):
    """Hugging Face's GPT2LMHeadModel with random weights (its constructor draws from torch's global generator)."""
    from transformers import GPT2LMHeadModel
    with _BUILD, seeded(seed), torch.no_grad(), quiet_transformers():
        hf = GPT2LMHeadModel(_hf_config(*config_args)).eval()
        _randomise(hf)
    assert hf.lm_head.weight is hf.transformer.wte.weight, "the oracle's LM head must be tied"
    return hf


@functools.cache
def _hf_checkpoint(config_args, seed: int) -> dict[str, bytes]:
    """The files of ``_hf_model(config_args, seed)`` as Hugging Face saves them: {name: bytes}."""
    hf = _hf_model(config_args, seed)
    with tempfile.TemporaryDirectory() as folder, _BUILD, quiet_transformers():
        hf.save_pretrained(folder)
        return {name: (Path(folder) / name).read_bytes() for name in CHECKPOINT_FILES}


def _hf_logits(hf, idx) -> torch.Tensor:
    with torch.no_grad():
        return hf(idx).logits


def _gpt_mistakes(hf, idx, want):
    t = hf.transformer
    head = lambda v: hf.lm_head(v)  # noqa: E731
    blocks = list(t.h)
    pos = torch.arange(idx.shape[1])
    emb = t.wte(idx) + t.wpe(pos)

    def run(x, order, norm_each=False):
        for block in order:
            x = block(x)
            x = x[0] if isinstance(x, tuple) else x
            x = t.ln_f(x) if norm_each else x
        return x

    return [
        ("the final LayerNorm ln_f is missing: logits = lm_head(ln_f(x)) after the last block",
         lambda: head(run(emb, blocks))),
        ("the position embeddings are missing: the blocks must read token + position embeddings, self.emb(idx), "
         "not the token table wte alone", lambda: head(t.ln_f(run(t.wte(idx), blocks)))),
        ("the blocks ran in reverse order; run self.h in order, h[0] first",
         lambda: head(t.ln_f(run(emb, blocks[::-1])))),
        ("only the last block ran; x must go through every block in self.h, in order",
         lambda: head(t.ln_f(run(emb, blocks[-1:])))),
        ("only the first block ran; x must go through every block in self.h, in order",
         lambda: head(t.ln_f(run(emb, blocks[:1])))),
        ("the blocks never ran; x must go through every block in self.h, in order",
         lambda: head(t.ln_f(emb))),
        ("ln_f ran after every block; it runs once, after the last block",
         lambda: head(run(emb, blocks, norm_each=True))),
        ("these are probabilities (softmax); GPT.forward returns the logits, before any softmax",
         lambda: torch.softmax(want, dim=-1)),
        ("these are log-probabilities (log_softmax); GPT.forward returns the logits themselves",
         lambda: torch.log_softmax(want, dim=-1)),
    ]


def _gpt_shape_hint(got, B, T, config_args) -> str:
    vocab_size, block_size, _, _, n_embd, _ = config_args
    if tuple(got.shape) == (B, vocab_size):
        return "return the logits at every position, (B, T, vocab_size); chapter 5 picks the last one"
    if tuple(got.shape) == (B, T, n_embd):
        return "these are the final vectors (B, T, C): the LM head turns them into logits, lm_head(ln_f(x))"
    if tuple(got.shape) == (B, T, block_size):
        return "these logits come from the position table wpe; the LM head is tied to the token table wte"
    return "one logit per vocabulary entry at every position: (B, T, vocab_size)"


def _gpt_parts_mistake(model, hf, idx) -> str:
    """Name a wrong part of the model: its embeddings (chapter 2), a block, or ln_f."""
    t = hf.transformer
    emb = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
    try:
        parts = model.emb, model.h[0], model.ln_f
    except Exception:  # noqa: BLE001 (a model without the given parts: the message says what differs, no more)
        return ""
    why = _part_mistake(parts[0], lambda i: emb, idx, "model.emb", "the embeddings are chapter 2's Embeddings "
                        "(minigpt.embeddings): fix them there", atol=1e-5)
    if why:
        return why
    first = parts[1]
    why = _block_parts_mistake(first, t.h[0], emb, "model.h[0].")
    if why:
        return why
    why = _part_mistake(first, t.h[0], emb, "model.h[0]", "fix Block first (test_block)", atol=1e-4)
    return why or _part_mistake(parts[2], t.ln_f, emb, "model.ln_f", "fix LayerNorm first (test_layer_norm)",
                                atol=1e-4)


GPT_USES = {"LayerNorm": "test_layer_norm", "MLP": "test_mlp", "Block": "test_block"}
ID_DTYPES = (torch.int32, torch.int16, torch.int8, torch.uint8)  # tried besides int64, where Embeddings takes them
IDS = ("ids may be of any integer dtype that chapter 2's Embeddings takes, and self.emb(idx) takes them all; "
       "nn.Embedding alone takes int64 and int32 only: index wte with idx.long() if you do it by hand")
WINDOW = ("the model has block_size rows of position embeddings, so more than block_size positions must raise "
          "ValueError naming block_size: self.emb(idx) does (chapter 2's Embeddings); positions made by hand need "
          "the check `if T > self.config.block_size: raise ValueError(...)` first")


@functools.cache
def _reference_embeddings(vocab_size: int, block_size: int):
    """Chapter 2's Embeddings, the course's reference that the notebook imports, of this size (its weights do not
    matter: it only tells which ids it takes)."""
    from minigpt.embeddings import Embeddings

    with seeded(0):
        return Embeddings(vocab_size, block_size, 2)


def _embeddings_take(idx: torch.Tensor, vocab_size: int, block_size: int) -> bool:
    """Whether chapter 2's Embeddings takes these ids (their dtype): what GPT.forward must take too."""
    try:
        with torch.no_grad():
            _reference_embeddings(vocab_size, block_size)(idx)
    except Exception:  # noqa: BLE001 (ids it refuses)
        return False
    return True


def _pretrained(GPT, config_args, seed: int) -> dict:
    """The learner's GPT loading Hugging Face's checkpoint of ``_hf_model(config_args, seed)`` (the model: a
    stand-in), with what the checks give it: ``inputs`` (int64 ids of several shapes), ``small`` (ids that every
    integer dtype holds), ``window`` (one position more than block_size)."""
    vocab_size, block_size, n_layer, n_head, n_embd, eps = config_args
    shape = f"n_layer={n_layer}, n_head={n_head}, n_embd={n_embd}, vocab_size={vocab_size}, block_size={block_size}"
    # The checkpoint is written into a folder on the learner's side, and loaded there.
    model = call(ask, "transformer.from_pretrained", GPT, _hf_checkpoint(config_args, seed),
                 label=f"GPT.from_pretrained(<a folder holding a Hugging Face GPT-2 checkpoint, {shape}>)")
    g = _generator(seed + 1)
    inputs = [torch.randint(0, vocab_size, (2, block_size), generator=g),
              torch.randint(0, vocab_size, (1, 1), generator=g),
              torch.randint(0, vocab_size, (3, 5), generator=g)]
    small = torch.randint(0, min(vocab_size, 128), (3, 5), generator=g)
    window = torch.randint(0, vocab_size, (1, block_size + 1), generator=g)
    return {"model": model, "hf": _hf_model(config_args, seed), "shape": shape, "config_args": config_args,
            "inputs": inputs, "small": small, "window": window}


def _check_logits(model, hf, idx: torch.Tensor, shape: str, config_args, because: str) -> None:
    vocab_size = config_args[0]
    B, T = idx.shape
    kind = "" if idx.dtype == torch.int64 else f"{str(idx.dtype).removeprefix('torch.')} "
    label = f"GPT ({shape}) on {kind}ids of shape {(B, T)}"
    got = call(model, idx, label=label, hint=_also(IDS if kind else "", because))
    want = _hf_logits(hf, idx.long())
    diff = _output(got, want, label, atol=LOGITS_ATOL)
    if diff is None:
        return
    if diff == float("inf"):
        fail(f"{label} returned logits of shape {_shape(got)}, expected {(B, T, vocab_size)}",
             _also(_gpt_shape_hint(got, B, T, config_args), because))
    hint = _gpt_parts_mistake(model, hf, idx.long()) or \
        _also(_matching(got, _gpt_mistakes(hf, idx.long(), want), atol=LOGITS_ATOL), because)
    fail(f"{label}: the logits differ from Hugging Face's GPT2LMHeadModel with the same weights {_by(diff)}", hint)


def _check_window(model, shape: str, idx: torch.Tensor, vocab_size: int, block_size: int, because: str) -> None:
    """``idx``, one position more than block_size: a ValueError that names block_size."""
    label = f"GPT ({shape}) on ids of shape {(1, block_size + 1)}, one position more than block_size"
    try:
        got = model(idx)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError as err:
        if getattr(err, "grader_side", False):
            raise
        if "block_size" not in str(err):
            fail(f"{label} raised {describe_error(err)}, whose message does not name block_size", WINDOW)
        return
    except Exception as err:  # noqa: BLE001 (the learner's error, reported with its line)
        if getattr(err, "grader_side", False):
            raise
        fail(f"{label} raised {describe_error(err)}; expected a ValueError naming block_size", _also(WINDOW, because))
    cropped = isinstance(got, torch.Tensor) and tuple(got.shape) == (1, block_size, vocab_size)
    fail(f"{label} returned {f'logits of shape {_shape(got)}' if isinstance(got, torch.Tensor) else type_of(got)}; "
         "expected a ValueError naming block_size",
         "you cropped idx to its last block_size tokens: cropping is the caller's choice (chapter 5's generation "
         "loop does it); the model itself refuses a window it has no positions for" if cropped else WINDOW)


def _check_gpt_training(model, config_args, seed: int, because: str) -> None:
    """The model loaded from Hugging Face's checkpoint, in float64: its logits, and the gradients of a loss on them
    with respect to every parameter (the tied LM head's included, in emb.wte.weight's)."""
    vocab_size, block_size, n_layer, n_head, n_embd, eps = config_args
    shape = f"n_layer={n_layer}, n_head={n_head}, n_embd={n_embd}, vocab_size={vocab_size}, block_size={block_size}"
    with torch.no_grad(), learner_side(no_grad=True):
        model = call(model.double, name="GPT.double")
    hf64 = _float64(_hf_model(config_args, seed))
    g = _generator(483)
    idx = torch.randint(0, vocab_size, (2, block_size), generator=g)
    r = torch.randn(2, block_size, vocab_size, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        want = hf64(idx).logits
        _, want_grads = _hf_gradients(hf64, want, r, None, _minigpt_name)
    _check_training_step(model, idx, want.detach(), "Hugging Face's GPT2LMHeadModel",
                         f"GPT ({shape}).double() on ids of shape {tuple(idx.shape)}", want_dx=None,
                         want_grads=want_grads, weight=r, because=because)


def _minigpt_name(hf_name: str) -> str:
    """transformer.wte.weight -> emb.wte.weight; transformer.h.0.ln_1.weight -> h.0.ln_1.weight."""
    name = hf_name.removeprefix("transformer.")
    return "emb." + name if name.startswith(("wte.", "wpe.")) else name


# What GPT.save_pretrained's config.json must say of a model's shape, Hugging Face's names for GPTConfig's fields.
_SHAPE_KEYS = ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd", "layer_norm_epsilon")


def _saved_model(files, config, config_args):
    """Hugging Face's GPT2LMHeadModel loaded from the files that the learner's ``save_pretrained`` wrote. Their
    config.json must describe the model's shape; the model is then built from the check's own config (nothing
    of the learner's configures the grader's model), and its weights read from model.safetensors only."""
    from transformers import GPT2LMHeadModel

    hint = "GPT.save_pretrained and GPTConfig.to_hf are given: keep them as they are"
    if not isinstance(files, dict) or set(files) != set(CHECKPOINT_FILES) or \
            not all(isinstance(data, bytes) for data in files.values()):
        names = sorted(map(str, files)) if isinstance(files, dict) else []
        fail(f"GPT({config}).save_pretrained(folder) wrote {names}, expected config.json and model.safetensors",
             hint)
    try:
        written = json.loads(files["config.json"].decode("utf-8"))
    except (ValueError, RecursionError) as err:
        fail(f"GPT({config}).save_pretrained(folder) wrote a config.json that is not JSON ({err})", hint)
    if not isinstance(written, dict):
        fail(f"GPT({config}).save_pretrained(folder) wrote a config.json that holds a {type(written).__name__}, "
             "not Hugging Face's settings", hint)
    want = dict(zip(_SHAPE_KEYS, config_args))
    wrong = [f"{key}={show(written.get(key))} (expected {value!r})" for key, value in want.items()
             if written.get(key) != value]
    if wrong:
        fail(f"GPT({config}).save_pretrained(folder) wrote a config.json for another model: {', '.join(wrong)}",
             hint)
    with tempfile.TemporaryDirectory() as folder, _BUILD, quiet_transformers():
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        try:
            return GPT2LMHeadModel.from_pretrained(folder, config=_hf_config(*config_args),
                                                   use_safetensors=True).eval()
        except Exception as err:  # noqa: BLE001 (files that Hugging Face cannot read)
            fail(f"Hugging Face cannot load what GPT({config}).save_pretrained(folder) wrote: "
                 f"{type(err).__name__}: {str(err)[:300]}", hint)


def _check_weight_tying(GPT, GPTConfig, config_args, seed: int) -> None:
    """A model made by GPT(config), saved with save_pretrained and loaded by Hugging Face, gives the same
    logits: true only if the LM head is the token table (HF's checkpoint format has no separate head)."""
    vocab_size, block_size, n_layer, n_head, n_embd, eps = config_args
    config = call(GPTConfig, vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                  n_embd=n_embd, layer_norm_epsilon=eps, name="GPTConfig")
    with learner_side(seed=seed):  # the learner's random initialisation, the same in every run
        model = call(GPT, config, name="GPT")
    model = call(model.eval, name="GPT.eval")
    idx = torch.randint(0, vocab_size, (2, block_size), generator=_generator(seed))
    got = call(model, idx, name="GPT.forward")
    files = call(ask, "transformer.saved_files", model, label="GPT.save_pretrained(<an empty folder>)")
    hf = _saved_model(files, config, config_args)
    want = _hf_logits(hf, idx)
    diff = _output(got, want, f"GPT({config})", atol=LOGITS_ATOL)
    if diff is None:
        return
    if call(ask, "transformer.head_is_token_table", model, label="model.lm_head.weight is model.emb.wte.weight") \
            is False:
        fail(f"GPT({config}): its logits differ by up to {diff:.2e} from the same model saved and loaded in "
             "Hugging Face, whose LM head is the token table",
             "lm_head is not tied to the token table: keep `self.lm_head.weight = self.emb.wte.weight` in "
             "__init__ (weight tying), so the head that writes tokens is the table that reads them")
    fail(f"GPT({config}): its logits differ by up to {diff:.2e} from the same model saved and loaded in Hugging "
         "Face", "the logits must come from lm_head, which is tied to the token table emb.wte")


GPT_LOGITS, OTHER_IDS = "the logits of Hugging Face's GPT-2 checkpoint", "int32, int16, int8 and uint8 ids"
WINDOW_PART, TIED = "ValueError past block_size", "the LM head tied to the token table"
GPT_PARTS = {GPT_LOGITS: 3, OTHER_IDS: 1, WINDOW_PART: 1, TIED: 1, TRAINING: 1}


@cell("test_gpt", parts=GPT_PARTS)
def check_gpt(GPT, GPTConfig):
    because = because_of(**GPT_USES)
    with torch.no_grad(), learner_side(no_grad=True):
        loaded = [_pretrained(GPT, config_args, seed=440 + 10 * k) for k, config_args in enumerate(GPT_CONFIGS)]
        with part(GPT_LOGITS):
            for m in loaded:
                for idx in m["inputs"]:
                    _check_logits(m["model"], m["hf"], idx, m["shape"], m["config_args"], because)
        with part(WINDOW_PART):
            for m in loaded:
                _check_window(m["model"], m["shape"], m["window"], *m["config_args"][:2], because)
        with part(OTHER_IDS):
            for m in loaded:
                for dtype in ID_DTYPES:
                    if _embeddings_take(m["small"].to(dtype), *m["config_args"][:2]):
                        _check_logits(m["model"], m["hf"], m["small"].to(dtype), m["shape"], m["config_args"],
                                      because)
        with part(TIED):
            _check_weight_tying(GPT, GPTConfig, GPT_CONFIGS[0], seed=460)
    with part(TRAINING):
        _check_gpt_training(loaded[0]["model"], GPT_CONFIGS[0], seed=440, because=because)
