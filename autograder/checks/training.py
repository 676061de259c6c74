"""Chapter 8 (training): hidden checks for get_batch, cross_entropy and perplexity, estimate_loss, lr_at,
train_step and train.

The oracles: PyTorch's ``F.cross_entropy`` and its gradient, ``torch.optim.lr_scheduler.LambdaLR`` driven by the
reference schedule, and the course's reference training functions (``minigpt.training``) run here on the same
seeded tiny GPTs, the same batches and the same optimizer settings as the learner's code runs on over there
(``autograder.sandboxed.helpers.training`` builds those). A step of the learner's code must leave the model's weights
where the reference step leaves them.
"""
from __future__ import annotations

import copy
import functools
import math
import threading

import torch
import torch.nn.functional as F

from autograder.checks import gap, once_by
from autograder.sandboxed.helpers import training as recipes
from autograder.judge import ask, because_of, cell, learner_side, make, part, seeded, serve_function, type_of
from coursekit.testing import call, close, expect_raises, fail, show
from minigpt import training as reference

CHAPTER = "chapter 8 (training)"
_lock = threading.Lock()


def _tensor(label: str, got, shape, dtype=None) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}, expected a tensor of shape {tuple(shape)}")
    if tuple(got.shape) != tuple(shape):
        fail(f"{label} returned a tensor of shape {tuple(got.shape)}, expected {tuple(shape)}")
    if dtype is not None and got.dtype != dtype:
        fail(f"{label} returned a {str(got.dtype).removeprefix('torch.')} tensor, expected "
             f"{str(dtype).removeprefix('torch.')}", "token ids are int64: .long()")
    return got


def _stream(n: int, seed: int, vocab: int = 50257, dtype=torch.long) -> torch.Tensor:
    return torch.randint(vocab, (n,), generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------- get_batch

WINDOWS, ID_DTYPES, NO_WINDOWS, BAD_IDS = ("windows and targets", "int32, int16 and uint8 ids", "a batch of 0 windows",
                                           "errors for bad ids")
BATCH_CASES = [  # (length of the stream, batch_size, block_size, seed, dtype of the ids, part)
    (100, 4, 8, 0, torch.long, WINDOWS), (50, 1, 16, 1, torch.long, WINDOWS), (9, 3, 8, 2, torch.long, WINDOWS),
    (1000, 16, 32, 3, torch.long, WINDOWS), (64, 5, 4, 4, torch.int32, ID_DTYPES),
    (64, 2, 6, 5, torch.int16, ID_DTYPES), (40, 3, 5, 6, torch.uint8, ID_DTYPES), (20, 0, 5, 7, torch.long, NO_WINDOWS),
]
GLOBAL = "torch's global generator when none is given"
# (length of the stream, batch_size, block_size, the seed of torch's global generator on the learner's side, how no
# generator is given: "None" (generator=None) or "left out")
GLOBAL_CASES = [(100, 4, 8, 8, "None"), (60, 3, 5, 9, "left out")]


def _batch_mistake(ids, B, T, seed, x, y) -> str:
    g = lambda: torch.Generator().manual_seed(seed)  # noqa: E731
    if torch.equal(x, y):
        return "the target is the window itself: it must be the window shifted one token to the right, y[t] = x[t + 1]"
    if len(ids) > T + 1:
        starts = torch.randint(len(ids) - T - 1, (B,), generator=g())
        if torch.equal(x, ids[starts[:, None] + torch.arange(T)].long()):
            return ("the starts are drawn below len(ids) - block_size - 1: draw them with "
                    "torch.randint(len(ids) - block_size, (batch_size,), generator=generator)")
    starts = torch.randint(len(ids) - T, (B,), generator=g())
    if torch.equal(y, ids[(starts[:, None] + torch.arange(T) - 1).clamp(min=0)].long()):
        return "the target is shifted the wrong way: y[t] is the token AFTER x[t]"
    return ("draw the starts with torch.randint(len(ids) - block_size, (batch_size,), generator=generator), then "
            "x = the window at each start and y = the window one token further")


@cell("test_get_batch", parts={WINDOWS: 4, ID_DTYPES: 1, NO_WINDOWS: 1, GLOBAL: 1, BAD_IDS: 1})
def check_get_batch(get_batch):
    for name in (WINDOWS, ID_DTYPES, NO_WINDOWS):
        with part(name):
            for n, B, T, seed, dtype, case_part in BATCH_CASES:
                if case_part == name:
                    _check_batch(get_batch, n, B, T, seed, dtype)
    with part(GLOBAL):
        for n, B, T, seed, generator in GLOBAL_CASES:
            _check_batch(get_batch, n, B, T, seed, torch.long, generator)
    with part(BAD_IDS):
        for ids, B, T in ((_stream(8, 0), 2, 8), (_stream(3, 0), 1, 8), (_stream(20, 0).reshape(4, 5), 2, 3)):
            expect_raises(ValueError, get_batch, ids, B, T, make("training.generator", 0), name="get_batch",
                          hint="check the ids first: one stream (1-D) of at least block_size + 1 ids, a window and "
                               "its target")


def _check_batch(get_batch, n, B, T, seed, dtype, generator="given"):
    """One call of get_batch: with a generator seeded ``seed`` (``generator="given"``), or with none ("None":
    generator=None; "left out") after torch.manual_seed(seed) on the learner's side, whose global generator must then
    draw the starts."""
    ids = _stream(n, seed, vocab=250 if dtype == torch.uint8 else 50257, dtype=dtype)
    shown = {"given": f", <a generator seeded {seed}>", "None": ", generator=None", "left out": ""}[generator]
    label = (f"get_batch(<{n} ids of dtype {str(dtype).removeprefix('torch.')}>, {B}, {T}{shown})"
             + ("" if generator == "given" else f" after torch.manual_seed({seed})"))
    if generator == "given":
        answer = call(ask, "training.run", get_batch, ids, B, T, generator=make("training.generator", seed),
                      label=label)
        want_x, want_y = reference.get_batch(ids, B, T, torch.Generator().manual_seed(seed))
    else:
        with learner_side(seed=seed):
            answer = call(ask, "training.run", get_batch, ids, B, T, label=label,
                          **({"generator": None} if generator == "None" else {}))
        with seeded(seed):
            want_x, want_y = reference.get_batch(ids, B, T)
    got, changed = answer
    if changed[0]:
        fail(f"{label} changed the ids it was given", "read ids, never write into them")
    if not isinstance(got, tuple) or len(got) != 2:
        fail(f"{label} returned {show(got)}, expected a pair (x, y)", "return x, y")
    x = _tensor(f"{label}[0] (x)", got[0], want_x.shape, torch.long)
    y = _tensor(f"{label}[1] (y)", got[1], want_y.shape, torch.long)
    if not (torch.equal(x, want_x) and torch.equal(y, want_y)):
        hint = _batch_mistake(ids.long(), B, T, seed, x, y)
        if generator != "given" and torch.equal(x, reference.get_batch(ids, B, T, torch.Generator())[0]):
            hint = ("with no generator given, the starts come from torch's global generator: pass generator on to "
                    "torch.randint as it is (None there means the global one). A new torch.Generator() draws the "
                    "same windows in every run, whatever torch.manual_seed said")
        fail(f"{label} returned windows that differ from the expected ones (x[0] = {show(x[0].tolist() if B else [])}, "
             f"expected {show(want_x[0].tolist() if B else [])}; y[0] = {show(y[0].tolist() if B else [])}, expected "
             f"{show(want_y[0].tolist() if B else [])})", hint)


# ---------------------------------------------------------------- cross_entropy and perplexity

LOSSES, LARGE, MASKED, DTYPES, GRADIENTS, BAD_SHAPES, PERPLEXITY = (
    "loss values", "logits near +-1000", "logits of -inf", "float64 logits and int32 targets", "gradients",
    "errors for bad shapes", "perplexity")


def _ce_cases():
    """(logits, targets, what they are, the part of test_cross_entropy they belong to)."""
    g = torch.Generator().manual_seed(80)
    cases = [(torch.randn(2, 3, 7, generator=g), "random logits (2, 3, 7)", LOSSES),
             (torch.randn(1, 1, 5, generator=g), "one position (1, 1, 5)", LOSSES),
             (torch.randn(2, 4, 50257, generator=g) * 3, "GPT-2's vocabulary (2, 4, 50257)", LOSSES),
             (torch.randn(2, 5, 11, generator=g) * 1000, "logits near +-1000 (exp overflows in float32)", LARGE),
             (torch.randn(3, 4, 6, generator=g, dtype=torch.float64), "float64 logits", DTYPES),
             (torch.full((2, 2, 4), 7.5), "all logits equal", LOSSES)]
    masked = torch.randn(2, 3, 8, generator=g)
    masked[..., 5:] = float("-inf")  # tokens that can never come: the targets are among the others
    cases.append((masked, "logits with -inf for impossible tokens", MASKED))
    out = []
    for logits, what, name in cases:
        V = logits.shape[-1]
        targets = torch.randint(min(V, 5), logits.shape[:2], generator=g)
        out.append((logits, targets, what, name))
    out.append((out[0][0], out[0][1].int(), "int32 targets", DTYPES))
    return out


def _ce_mistake(logits, targets, got) -> str:
    lp = torch.log_softmax(logits.double(), -1)
    nll = -lp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    got = float(got)
    candidates = [(nll.sum(), "you summed the losses: take the mean over every position (B * T of them)"),
                  (-nll.mean(), "the sign: the loss is MINUS the log-probability of the target, a positive number"),
                  (nll.mean() / math.log(2), "bits: the loss is in nats, the natural logarithm (no division by ln 2)"),
                  ((-torch.log_softmax(logits.double(), 1).gather(-1, targets.long().unsqueeze(-1))).mean(),
                   "softmax over the wrong dimension: normalise over the vocabulary, the last dimension"),
                  (nll.mean(dim=-1).sum() if nll.dim() > 1 else nll.sum(), "the mean must be over all B * T positions")]
    for value, hint in candidates:
        if math.isfinite(value.item()) and close(got, value.item(), atol=1e-4, rtol=1e-4):
            return hint
    if not math.isfinite(got) and torch.isneginf(logits).any():
        return ("the loss is not a number where some logits are -inf (tokens that can never come): 0 * -inf is nan, "
                "so a one-hot vector (or a mask) multiplied with the log-probabilities picks nan up from the tokens "
                "it leaves out. Pick the target's log-probability with gather (or by indexing), which never touches "
                "the others")
    if not math.isfinite(got):
        return "exp of a large logit overflows to inf: use torch.logsumexp (or subtract the largest logit first)"
    return "-log softmax(logits)[target] at each position, then the mean"


# e ** 100 is finite in float64, inf in float32 (past a loss of 88.72). Past log(sys.float_info.max) = 709.7827,
# math.exp raises and the docstring says inf: cases on both sides of that edge (e ** 709.78 is 1.79e308, a float;
# e ** 709.79 is not)
FLOAT64_EDGE = (700.0, 709.78, 709.79, 1000.0)
PERPLEXITY_CASES = (0.0, 1.0, math.log(50257), 4.6, 100.0, *FLOAT64_EDGE)


def _perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


@cell("test_cross_entropy", parts={LOSSES: 3, LARGE: 2, MASKED: 1, DTYPES: 1, GRADIENTS: 2, BAD_SHAPES: 1,
                                   PERPLEXITY: 2})
def check_cross_entropy(cross_entropy, perplexity):
    answers = []  # (label, the gradient that reached the logits, logits, targets) of each call that returned
    for name in (LOSSES, LARGE, MASKED, DTYPES):
        with part(name):
            for logits, targets, what, case_part in _ce_cases():
                if case_part != name:
                    continue
                label = f"cross_entropy(<{what}>, <targets {tuple(targets.shape)}>)"
                answer = call(ask, "training.gradient_norms", cross_entropy, logits, targets, label=label)
                answers.append((label, answer["grad"], logits, targets))  # checked whatever the loss was
                _check_loss(label, answer["loss"], logits, targets)
    if answers:  # (no call returned: the part is not reached, and fails)
        with part(GRADIENTS):
            for label, grad, logits, targets in answers:
                _check_gradient(label, grad, logits, targets)
    with part(BAD_SHAPES):
        for shapes in (((2, 3, 7), (3, 2)), ((2, 3, 7), (2, 3, 1)), ((6, 7), (6,))):
            logits, targets = torch.zeros(*shapes[0]), torch.zeros(*shapes[1], dtype=torch.long)
            expect_raises(ValueError, cross_entropy, logits, targets, name="cross_entropy",
                          hint="logits are (B, T, V) and targets (B, T): check logits.dim() == 3 and "
                               "targets.shape == logits.shape[:2] first")
    with part(PERPLEXITY):
        for loss in PERPLEXITY_CASES:
            want = _perplexity(loss)
            got = call(perplexity, loss, name="perplexity",
                       hint="" if want < math.inf else "e ** loss is past what a float holds: math.exp raises "
                       "OverflowError there; return math.inf, as the docstring says")
            if not isinstance(got, float) or not (got == want if want == math.inf else
                                                  close(got, want, atol=0, rtol=1e-6)):
                fail(f"perplexity({loss:.6g}) returned {show(got)}, expected {want:.6g}", _perplexity_hint(loss, got))
        got = call(perplexity, torch.tensor(2.0), name="perplexity")
        if not isinstance(got, float) or not close(got, math.exp(2.0), atol=1e-5, rtol=0):
            fail(f"perplexity(tensor(2.)) returned {show(got)}, expected {math.exp(2.0):.6g} as a float",
                 "accept a 0-d tensor too: float(loss)")


def _perplexity_hint(loss: float, got) -> str:
    if not (isinstance(got, float) and got == math.inf):
        return "e ** loss, as a float: math.exp(float(loss))"
    if loss < min(FLOAT64_EDGE):
        return ("e ** loss overflows float32 above a loss of about 88.7: compute it as a Python float (float64), "
                "math.exp(float(loss))")
    return (f"inf only past what a float holds: e ** {loss:g} is {math.exp(loss):.4g}, still a float; math.exp "
            "raises OverflowError only above a loss of log(sys.float_info.max) = 709.78: catch that, not a round "
            "threshold")


def _check_loss(label: str, got, logits: torch.Tensor, targets: torch.Tensor) -> None:
    want = F.cross_entropy(logits.flatten(0, 1), targets.long().flatten())
    if not isinstance(got, torch.Tensor) or got.dim() != 0:
        fail(f"{label} returned {show(got)}, expected a 0-d tensor (a single number gradients flow through)",
             "return the mean as a tensor, not .item()")
    if not close(got, want, atol=1e-4, rtol=1e-4):
        fail(f"{label} returned {got.item():.6g}, expected {want.item():.6g} (F.cross_entropy)",
             _ce_mistake(logits, targets, got))
    if got.dtype != logits.dtype:
        fail(f"{label} returned a {str(got.dtype).removeprefix('torch.')} loss for "
             f"{str(logits.dtype).removeprefix('torch.')} logits", "keep the logits' dtype")


def _check_gradient(label: str, grad, logits: torch.Tensor, targets: torch.Tensor) -> None:
    leaf = logits.clone().requires_grad_(True)
    F.cross_entropy(leaf.flatten(0, 1), targets.long().flatten()).backward()
    if grad is None:
        fail(f"{label}: no gradient reached the logits",
             "compute the loss with torch operations on the logits (no .item(), .detach(), numpy or torch.no_grad())")
    if not isinstance(grad, torch.Tensor) or grad.shape != leaf.grad.shape:
        fail(f"{label}: the gradient that reached the logits is {show(grad)}, expected one of shape "
             f"{tuple(leaf.grad.shape)}")
    if not close(grad, leaf.grad, atol=2e-5, rtol=1e-3):
        fail(f"{label}: the gradient of your loss differs from F.cross_entropy's {gap(grad, leaf.grad)}",
             "a mean over all positions; the largest logit subtracted inside logsumexp, not detached by hand")


# ---------------------------------------------------------------- estimate_loss

ESTIMATE_CASES = [  # (model seed, stream length, number of windows, batch_size, model's mode before)
    (10, 400, 5, 2, True), (11, 300, 11, None, False), (12, 500, 1, 4, True), (13, 250, 7, 3, False),
]  # a batch_size of None: left out (estimate_loss's default, ESTIMATE_BATCH: chunks of 8 and 3 here)
ESTIMATE_BATCH = 8


@functools.cache
def _tiny(seed: int):
    with seeded(seed):  # (tiny_gpt seeds torch's generator: one thread at a time)
        return recipes.tiny_gpt(seed)


MEAN, NO_GRAD, MODE_BACK = ("the mean loss", "without gradients, in eval mode", "gives the model back in its mode")


@cell("test_estimate_loss", parts={MEAN: 3, NO_GRAD: 1, MODE_BACK: 1})
def check_estimate_loss(estimate_loss):
    returned = []  # (label, the watched model, its mode before) of each call that returned
    with part(MEAN):
        for seed, n, windows, batch_size, training in ESTIMATE_CASES:
            model = make("training.Watched", make("training.tiny_gpt", seed))
            ours = _tiny(seed)
            ids = _stream(n, seed + 100, vocab=97)
            starts = reference.spread(ids, ours.config.block_size, windows)
            model.train(training)
            label = (f"estimate_loss(<GPT>, <{n} ids>, <{windows} starts>, {ours.config.block_size}"
                     + ("" if batch_size is None else f", batch_size={batch_size}")
                     + f") on a model in {'training' if training else 'eval'} mode")
            got = call(estimate_loss, model, ids, starts, ours.config.block_size,
                       *(() if batch_size is None else (batch_size,)), label=label,
                       hint=because_of(cross_entropy="test_cross_entropy"))
            batch_size = ESTIMATE_BATCH if batch_size is None else batch_size
            returned.append((label, model, training))
            with _lock:
                want = reference.estimate_loss(ours, ids, starts, ours.config.block_size, batch_size)
            _check_mean(label, got, want, ours, ids, starts, batch_size)
    if not returned:  # what the model saw and its mode afterwards tell nothing of calls that crashed
        return
    with part(NO_GRAD):
        for label, model, _ in returned:
            calls = model.calls
            if any(grad for _, grad in calls):
                fail(f"{label} ran the model with gradients on",
                     "measuring needs no gradients: decorate with @torch.no_grad() or use `with torch.no_grad():`")
            if any(mode for mode, _ in calls):
                fail(f"{label} ran the model in training mode", "call model.eval() before measuring (dropout off)")
    with part(MODE_BACK):
        for label, model, training in returned:
            if model.training != training:
                fail(f"{label} left the model in {'training' if model.training else 'eval'} mode",
                     "give the model back in the mode it was in: remember model.training, restore it at the end")


def _check_mean(label: str, got, want: float, ours, ids, starts, batch_size) -> None:
    if not isinstance(got, (float, int)) or isinstance(got, bool):
        fail(f"{label} returned {show(got)}, expected a float", "return the mean loss as a float (.item())")
    # a mean of float32 losses of about 4.6 (ulp 4.8e-7), over chunks summed in another order: a few ulps
    if not close(got, want, atol=1e-4, rtol=0):
        hint = ""
        plain_mean = _unweighted(ours, ids, starts, batch_size)
        if plain_mean is not None and close(got, plain_mean, atol=1e-5, rtol=0):
            hint = ("you averaged the chunks' losses: a last, smaller chunk counts as much as a full one. Weigh "
                    "each chunk by its number of windows")
        fail(f"{label} returned {got:.6f}, expected {want:.6f}",
             hint or because_of(cross_entropy="test_cross_entropy")
             or "the mean cross-entropy over the windows at starts, each window counting once")


def _unweighted(model, ids, starts, batch_size) -> float | None:
    with _lock, torch.no_grad():
        model.eval()
        T = model.config.block_size
        losses = []
        for chunk in starts.split(batch_size):
            positions = chunk[:, None] + torch.arange(T)
            losses.append(F.cross_entropy(model(ids[positions]).flatten(0, 1), ids[positions + 1].flatten()).item())
        return sum(losses) / len(losses) if losses else None


# ---------------------------------------------------------------- lr_at

SCHEDULES = [dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=100),
             dict(max_lr=6e-4, min_lr=6e-5, warmup_steps=0, max_steps=50),
             dict(max_lr=3e-3, min_lr=3e-3, warmup_steps=5, max_steps=20),
             dict(max_lr=1.0, min_lr=0.0, warmup_steps=1, max_steps=2),
             dict(max_lr=2e-3, min_lr=2e-4, warmup_steps=7, max_steps=8)]
LR_MISTAKES = [
    (lambda s, k: k["max_lr"] * s / k["warmup_steps"] if s < k["warmup_steps"] else None,
     "the warm-up starts at 0: step 0 already trains, at max_lr * (step + 1) / warmup_steps"),
    (lambda s, k: k["max_lr"] * (s + 1) / (k["warmup_steps"] + 1) if s < k["warmup_steps"] else None,
     "the warm-up reaches max_lr at step warmup_steps - 1: max_lr * (step + 1) / warmup_steps"),
    (lambda s, k: 0.5 * k["max_lr"] * (1 + math.cos(math.pi * (s - k["warmup_steps"]) / (k["max_steps"] - k["warmup_steps"])))
     if k["warmup_steps"] <= s < k["max_steps"] else None,
     "the cosine must end at min_lr, not 0: min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2"),
    (lambda s, k: k["min_lr"] + 0.5 * (k["max_lr"] - k["min_lr"]) * (1 + math.cos(math.pi * (s - k["warmup_steps"]) / (k["max_steps"] - k["warmup_steps"])))
     if s > k["max_steps"] else None,
     "after max_steps the rate stays at min_lr (the cosine would climb back up)"),
    (lambda s, k: k["min_lr"] + 0.5 * (k["max_lr"] - k["min_lr"]) * (1 + math.cos(math.pi * s / k["max_steps"]))
     if k["warmup_steps"] <= s < k["max_steps"] else None,
     "the cosine's progress counts from the end of the warm-up: (step - warmup_steps) / (max_steps - warmup_steps)"),
]


def _lambda_lr(schedule: dict, steps: int) -> list[float]:
    """The rates torch's LambdaLR gives with the reference schedule as its factor of max_lr."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=schedule["max_lr"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: reference.lr_at(s, **schedule) / schedule["max_lr"])
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


WARM_UP, COSINE, FLOOR, BAD_SCHEDULES = ("the warm-up", "the cosine decay", "min_lr after max_steps",
                                        "errors for bad schedules")


def _phase(step: int, schedule: dict) -> str:
    """The part of test_lr_at that a step of ``schedule`` belongs to."""
    if step < schedule["warmup_steps"]:
        return WARM_UP
    return COSINE if step < schedule["max_steps"] else FLOOR


@cell("test_lr_at", parts={WARM_UP: 2, COSINE: 2, FLOOR: 1, BAD_SCHEDULES: 1})
def check_lr_at(lr_at):
    oracles = [_lambda_lr(schedule, schedule["max_steps"] + 5) for schedule in SCHEDULES]
    for phase in (WARM_UP, COSINE, FLOOR):
        with part(phase):
            for schedule, oracle in zip(SCHEDULES, oracles):
                for step, want in enumerate(oracle):
                    if _phase(step, schedule) == phase:
                        _check_rate(lr_at, step, schedule, want)
    with part(BAD_SCHEDULES):
        for bad in (dict(max_lr=1e-3, min_lr=1e-2, warmup_steps=1, max_steps=10),
                    dict(max_lr=1e-3, min_lr=-1e-4, warmup_steps=1, max_steps=10),
                    dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=10),
                    dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=-1, max_steps=10)):
            expect_raises(ValueError, lr_at, 0, **bad, name="lr_at",
                          hint="check 0 <= min_lr <= max_lr and 0 <= warmup_steps < max_steps first")


def _check_rate(lr_at, step: int, schedule: dict, want: float) -> None:
    label = f"lr_at({step}, {', '.join(f'{k}={v:g}' for k, v in schedule.items())})"
    got = call(lr_at, step, label=label, **schedule)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        fail(f"{label} returned {show(got)}, expected a float")
    if not close(got, want, atol=1e-12, rtol=1e-9):
        hint = next((why for mistake, why in LR_MISTAKES if (v := mistake(step, schedule)) is not None
                     and close(got, v, atol=1e-12, rtol=1e-9)), "")
        if not math.isfinite(got) and not hint:
            hint = ("with warmup_steps=0 there is no warm-up, and max_lr * (step + 1) / warmup_steps is inf (a "
                    "ZeroDivisionError in plain Python): a blend such as in_warmup * warm + (1 - in_warmup) * decay "
                    "then gives 0 * inf = nan. Compute the warm-up only when step < warmup_steps"
                    if schedule["warmup_steps"] == 0 else
                    "a learning rate that is not a finite number turns every weight into nan at the first step")
        fail(f"{label} returned {got:.6g}, expected {want:.6g} (torch's LambdaLR with the schedule)", hint)


# ---------------------------------------------------------------- train_step

STEP_CASES = [  # (model seed, batch seed, lr, max_grad_norm, steps in a row, model in training mode first)
    (20, 0, 1e-3, None, 1, True), (21, 1, 3e-3, 0.05, 2, False), (22, 2, 1e-2, 1e9, 3, True),
]  # a max_grad_norm of None: left out (train_step's default, STEP_CLIP)
STEP_CLIP = 1.0
# The steps run in float64. AdamW divides by |gradient| + 1e-8: a gradient whose float32 terms cancel down to about
# 1e-8 moves its weight by lr / 1e-8 times the rounding (1.5e-6 measured between two correct float32 losses, 7 times
# under the 1e-5 the weights are compared to). float64's rounding, 1e9 times smaller, stays far below that 1e-8: a
# correct step lands within 1e-13 of the reference's, a wrong one (no zeroing, no clipping) at least lr = 1e-3 away.
STEP_DTYPE = "float64"
STEP_WEIGHTS_ATOL = 1e-5


def _reference_steps(seed, batches, lr, clip):
    """(the reference's loss of each step, its weights after them) on the tiny GPT of ``seed``: a copy of what is
    computed once for each case in this process (every notebook's check asks the same)."""
    key = ("steps", seed, lr, clip, tuple((x.numpy().tobytes(), y.numpy().tobytes()) for x, y in batches))
    return copy.deepcopy(once_by(key, lambda: _run_reference_steps(seed, batches, lr, clip)))


def _run_reference_steps(seed, batches, lr, clip):
    with seeded(seed):
        model = recipes.tiny_gpt(seed, dtype=STEP_DTYPE)
    optimizer = recipes.adamw(model, lr=lr)
    losses = [reference.train_step(model, optimizer, x, y, clip) for x, y in batches]
    return losses, recipes.parameters(model)


STEP_LOSS, WEIGHTS, TRAINING_MODE = ("the loss of each step", "the weights after the steps", "in training mode")


@cell("test_train_step", parts={STEP_LOSS: 1, WEIGHTS: 3, TRAINING_MODE: 1})
def check_train_step(train_step):
    ran = []  # (label, the watched model, its optimizer, the case, its batches, the reference's weights)
    with part(STEP_LOSS):
        for case in STEP_CASES:
            seed, batch_seed, lr, clip, n, training = case
            model = make("training.Watched", make("training.tiny_gpt", seed, dtype=STEP_DTYPE))
            optimizer = make("training.adamw", model, lr)
            model.train(training)
            ids = _stream(400, batch_seed, vocab=97)
            g = torch.Generator().manual_seed(batch_seed)
            batches = [reference.get_batch(ids, 4, 16, g) for _ in range(n)]
            label = f"train_step(<GPT>, <AdamW, lr={lr:g}>, x, y" + \
                ("" if clip is None else f", max_grad_norm={clip:g}") + ")"
            got = [call(train_step, model, optimizer, x, y, *(() if clip is None else (clip,)), label=label,
                        hint=because_of(cross_entropy="test_cross_entropy")) for x, y in batches]
            clip = STEP_CLIP if clip is None else clip
            case = (seed, batch_seed, lr, clip, n, training)
            want, want_params = _reference_steps(seed, batches, lr, clip)
            ran.append((label, model, optimizer, case, batches, want_params))
            _check_step_losses(label, got, want, n)
    if not ran:  # the weights and the mode tell nothing of steps that crashed
        return
    with part(TRAINING_MODE):
        for label, model, *_ in ran:
            calls = model.calls
            if calls and not calls[0][0]:
                fail(f"{label} ran the model in eval mode", "call model.train() first: dropout is on while training")
    with part(WEIGHTS):
        for label, model, optimizer, (seed, _, lr, _, n, _), batches, want_params in ran:
            _check_weights(label, model, optimizer, seed, batches, lr, n, want_params)


def _check_step_losses(label: str, got: list, want: list[float], n: int) -> None:
    if any(not isinstance(v, float) for v in got):
        bad = next(v for v in got if not isinstance(v, float))
        fail(f"{label} returned {show(bad)}, expected the loss as a float", "return loss.item()")
    for k, (g_loss, w_loss) in enumerate(zip(got, want)):
        if not close(g_loss, w_loss, atol=1e-4, rtol=0):
            fail(f"{label}, step {k + 1} of {n} on one model: returned the loss {g_loss:.6f}, expected {w_loss:.6f}",
                 "return the loss of the batch computed BEFORE the step"
                 if k == 0 else "zero the gradients before each backward pass: they add up otherwise")


def _check_weights(label: str, model, optimizer, seed, batches, lr, n: int, want_params: dict) -> None:
    params = ask("training.parameters", model)
    if not isinstance(params, dict):
        fail(f"{label}: the model's parameters could not be read back ({type_of(params)})")
    for key, value in want_params.items():
        theirs = params.get(f"model.{key}", params.get(key))
        if not isinstance(theirs, torch.Tensor) or theirs.shape != value.shape:
            fail(f"{label}: the model's parameter {key} is missing or changed shape")
        if close(_comparable(key, theirs), _comparable(key, value), atol=STEP_WEIGHTS_ATOL, rtol=0):
            continue
        lrs = optimizer.lrs
        hint = "forward, loss, zero the gradients, backward, clip_grad_norm_(model.parameters(), max_grad_norm), step"
        if not lrs:
            hint = "call optimizer.step(): the weights never moved"
        elif _unclipped_matches(seed, batches, lr, params):
            hint = "clip the gradients' norm to max_grad_norm before optimizer.step()"
        fail(f"{label}: after {n} step(s) the weights differ from the reference step's in {key} "
             f"{gap(_comparable(key, theirs), _comparable(key, value))}", hint)


def _comparable(key: str, value: torch.Tensor) -> torch.Tensor:
    """The part of a parameter that a correct step fixes. The keys' bias (the middle third of c_attn.bias) gets no
    gradient in exact arithmetic: it adds q . b_k to every score of a query, which the softmax ignores. Its gradient
    is rounding noise, which AdamW scales up to steps of a fair fraction of lr wherever that noise is above AdamW's
    eps (1e-8): in float32 a correct loss that rounds differently (log_softmax and gather) moves it by 1.2e-5 in
    three steps. In float64 (STEP_DTYPE) the noise is under eps; it is left out still, for a loss computed in
    float32 inside."""
    if key.endswith("attn.c_attn.bias"):
        n_embd = value.shape[0] // 3
        value = torch.cat([value[:n_embd], value[2 * n_embd:]])
    return value


def _unclipped_matches(seed, batches, lr, params) -> bool:
    _, unclipped = _reference_steps(seed, batches, lr, 1e9)
    theirs = {k: params.get(f"model.{k}", params.get(k)) for k in unclipped}
    return all(isinstance(theirs[k], torch.Tensor) and theirs[k].shape == v.shape
               and close(_comparable(k, theirs[k]), _comparable(k, v), atol=STEP_WEIGHTS_ATOL, rtol=0)
               for k, v in unclipped.items())


# ---------------------------------------------------------------- train

TRAIN_CASES = [  # (model seed, data seed, steps, start_step, batch_size, eval_every, schedule, options)
    (30, 0, 7, 0, 3, 3, dict(max_lr=3e-3, min_lr=3e-4, warmup_steps=2, max_steps=7), {}),
    (31, 1, 6, 2, 2, 0, dict(max_lr=1e-3, min_lr=1e-4, warmup_steps=1, max_steps=6), {}),
    (32, 2, 4, 0, 4, 2, dict(max_lr=2e-3, min_lr=2e-3, warmup_steps=0, max_steps=4), {}),
    # train's own defaults and what it passes on: no evaluate at all (None), a max_grad_norm that clips hard (with
    # plain SGD, whose steps shrink with the clipped gradient: AdamW's would not show it)
    (33, 3, 4, 0, 2, 2, dict(max_lr=0.1, min_lr=0.01, warmup_steps=1, max_steps=4),
     {"evaluate": None, "max_grad_norm": 0.02, "optimizer": "sgd"}),
]


TRAIN_LOSSES, RATES, EVALUATIONS = ("the loss of each step", "the learning rate of each step", "evaluate's calls")


@cell("test_train", parts={TRAIN_LOSSES: 2, RATES: 2, EVALUATIONS: 1})
def check_train(train):
    uses = dict(get_batch="test_get_batch", lr_at="test_lr_at", train_step="test_train_step")
    ran = []  # (label, the case, the optimizer and recorder given, what train returned, the reference's, its recorder)
    with part(TRAIN_LOSSES):
        for case in TRAIN_CASES:
            seed, data_seed, steps, start, B, every, schedule, options = case
            model = make("training.tiny_gpt", seed)
            optimizer = make(f"training.{options.get('optimizer', 'adamw')}", model, schedule["max_lr"])
            # evaluate is the judge's: each call is a request this process answers and records (recorder.calls)
            recorder = serve_function(lambda done: done) if "evaluate" not in options else None
            ids = _stream(600, data_seed, vocab=97)
            # train's own arguments (evaluate=None: left to train's default)
            given = {k: v for k, v in options.items() if v is not None and k != "optimizer"}
            shown = "SGD" if options.get("optimizer") == "sgd" else "AdamW"
            label = (f"train(<GPT>, <{shown}>, <600 ids>, steps={steps}, batch_size={B}, schedule={schedule}, "
                     f"eval_every={every}, start_step={start}"
                     + "".join(f", {k}={v!r}" for k, v in given.items()) + ")")
            log = call(train, model, optimizer, ids, steps=steps, batch_size=B, schedule=schedule,
                       generator=make("training.generator", data_seed), eval_every=every, start_step=start,
                       progress=False, **({"evaluate": make("training.Evaluate", recorder.id)} if recorder is not None
                                          else {}), **given,
                       label=label, hint=because_of(**uses) or ("" if recorder is not None else
                                                                "evaluate is None unless one is given: call it only "
                                                                "then"))
            want, our_recorder = _reference_train(case)
            if not isinstance(log, dict) or "losses" not in log or "evals" not in log:
                fail(f"{label} returned {show(log)}, expected a dict with 'losses' and 'evals'")
            ran.append((label, case, optimizer, recorder, log, want, our_recorder))
            losses = log["losses"]
            # losses of about 4.6 in float32: the weights' rounding that AdamW amplifies (STEP_DTYPE) moves a loss
            # by its gradient times that, 4.8e-7 measured after 7 steps with another correct loss; mistakes 1e-3 on
            if not close(losses, want["losses"], atol=1e-4, rtol=0):
                hint = because_of(**uses) or "draw each batch with get_batch(train_ids, batch_size, " \
                    "model.config.block_size, generator), then train_step"
                unclipped = (*case[:7], {"optimizer": options.get("optimizer", "adamw")})  # train_step's default
                if not because_of(**uses) and _groups_apart(optimizer):
                    hint = GROUPS_HINT
                elif "max_grad_norm" in given and not because_of(**uses) and \
                        close(losses, _reference_train(unclipped)[0]["losses"], atol=1e-4, rtol=0):
                    hint = "pass max_grad_norm on: train_step(model, optimizer, x, y, max_grad_norm)"
                fail(f"{label} recorded the losses "
                     f"{show([_rounded(v) for v in losses] if isinstance(losses, list) else losses)}, "
                     f"expected {show([round(v, 4) for v in want['losses']])}", hint)
    if not ran:  # nothing more to read of runs that crashed
        return
    with part(RATES):
        for label, (_, _, steps, start, _, _, schedule, _), optimizer, *_ in ran:
            _check_rates(label, optimizer, schedule, start, steps)
    with part(EVALUATIONS):
        for label, _, _, recorder, log, want, our_recorder in ran:
            if recorder is None:  # no evaluate given: nothing to call, nothing kept
                if list(log["evals"]) != []:
                    fail(f"{label}['evals'] is {show(log['evals'])}, expected [] (no evaluate was given)",
                         "append to evals only when evaluate is given")
                continue
            if recorder.calls != our_recorder.calls:
                fail(f"{label} called evaluate with {show(recorder.calls)}, expected {show(our_recorder.calls)}",
                     "after each eval_every steps done (steps done = step + 1), and after the last step")
            if list(log["evals"]) != [tuple(e) for e in want["evals"]] and \
                    [tuple(e) for e in log["evals"]] != [tuple(e) for e in want["evals"]]:
                fail(f"{label}['evals'] is {show(log['evals'])}, expected {show(want['evals'])}",
                     "append (steps done, what evaluate returned) for each call")


def _reference_train(case) -> tuple[dict, object]:
    """The reference's log of a TRAIN_CASES case, and the recorder it called (None when the case gives none): a copy of
    what is computed once for each case in this process (every notebook's check asks the same)."""
    # a case holds dicts: its repr is its key (plain numbers, strings and None)
    return copy.deepcopy(once_by(("train", repr(case)), lambda: _run_reference_train(case)))


def _run_reference_train(case) -> tuple[dict, object]:
    seed, data_seed, steps, start, B, every, schedule, options = case
    with seeded(seed):
        ours = recipes.tiny_gpt(seed)
        our_optimizer = getattr(recipes, options.get("optimizer", "adamw"))(ours, lr=schedule["max_lr"])
        recorder = recipes.Recorder() if "evaluate" not in options else None
        log = reference.train(ours, our_optimizer, _stream(600, data_seed, vocab=97), steps=steps, batch_size=B,
                              schedule=schedule, generator=torch.Generator().manual_seed(data_seed), eval_every=every,
                              evaluate=recorder, start_step=start, progress=False,
                              **{k: v for k, v in options.items() if k not in ("evaluate", "optimizer")})
    return log, recorder


def _rounded(value):
    return round(value, 4) if isinstance(value, float) else value  # what the learner's list holds, shown as it is


GROUPS_HINT = ("set the learning rate of every parameter group, not only the first: for group in "
               "optimizer.param_groups: group[\"lr\"] = lr (the optimizer has two: with and without weight decay)")


def _groups_apart(optimizer) -> bool:
    """Whether some step ran the optimizer's parameter groups at different learning rates (train sets them all)."""
    steps = optimizer.lrs
    return isinstance(steps, list) and any(isinstance(g, list) and len(set(map(repr, g))) > 1 for g in steps)  # nan


def _check_rates(label: str, optimizer, schedule: dict, start: int, steps: int) -> None:
    if _groups_apart(optimizer):
        fail(f"{label}: the optimizer's parameter groups ran at different learning rates "
             f"({show(next(g for g in optimizer.lrs if len(set(map(repr, g))) > 1))} at one step)", GROUPS_HINT)
    lrs = [group[0] for group in optimizer.lrs]
    want_lrs = [reference.lr_at(s, **schedule) for s in range(start, steps)]
    if len(lrs) != len(want_lrs):
        fail(f"{label} took {len(lrs)} optimizer steps, expected {len(want_lrs)} (steps {start} to {steps - 1})",
             "one train_step per step, from start_step to steps - 1")
    k = next((i for i, (a, b) in enumerate(zip(lrs, want_lrs)) if not close(a, b, atol=1e-12, rtol=0)), None)
    if k is not None:
        cause = because_of(lr_at="test_lr_at")
        fail(f"{label}: step {start + k} ran at the learning rate {lrs[k]:.6g}, expected {want_lrs[k]:.6g}",
             "set every param group's lr to lr_at(step, **schedule) before the step" + (f"; {cause}" if cause else ""))
