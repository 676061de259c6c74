"""Chapter 6 (samplers): hidden checks for the filters, the penalties, sampling and beam search.

The oracles are external. Hugging Face's logits processors (`TemperatureLogitsWarper`, `TopKLogitsWarper`,
`TopPLogitsWarper`, `MinPLogitsWarper`, `RepetitionPenaltyLogitsProcessor`, `NoRepeatNGramLogitsProcessor`)
on random logits: batches, single rows, ties, entries already at -inf. The OpenAI presence and frequency
penalties by their formula. `torch.multinomial` on the softmax for sampling, with a chi-square test of the
frequencies. Hugging Face's `generate(num_beams=k)` on random GPT-2s whose weights the learner's beam search
reads in the course's reference `GPT` (chapter 4 is not what is graded here), with end-of-text ids that the
model likes, so that some beams finish early.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, on plain
tensors sent there, and so do the objects they are given, built there from plain recipes
(``sandboxed.helpers.samplers``: a generator from a seed, a GPT-2 from its shape and seed). The expected answers
are computed here, from the same inputs and the same recipes. A sampler's draws are compared with the ones its
generator's seed gives; the learner's global generator is seeded on its side (``learner_side(seed=...)``).

The checks test what the code computes, never how: loops or vectorised code, `torch.where` or
`masked_fill`, sorting up or down all pass. Top-p computed on descending probabilities can differ from
Hugging Face's ascending formula by one token when the running total lands exactly on p, so the inputs
keep every running total away from p; likewise min-p thresholds, and ties where the cut falls.

When a result is wrong, a check computes what each known mistake gives on the same input and names the
one that matches.

Besides the values, the checks hold the learner to what the notebook states: every call runs on the learner's side
through ``helpers.samplers.run``, which says whether it changed its arguments in place (the logits, the ids, the
prompt list); float64 logits come back float64; ids may be int32 as well as int64, and there may be none yet
(shape (B, 0)); a single row (V,) and a batch of one (1, V) work; logits near +-1e4, where a naive exp overflows or
underflows, give the same answers as elsewhere; every setting out of range, NaN included, raises ValueError;
beam search with one beam is greedy decoding, and takes eos_ids as any iterable, a generator included. No test
cell's function calls a learner's function of another test cell (sampling and beam search use only their own
cell's code and the course's chapter 5), so no failure here is charged twice.
"""
from __future__ import annotations

import contextlib
import functools
import itertools

import torch
# Here, not in the checks: transformers' lazy imports race in a judge's threads.
from transformers import (GPT2Config, GPT2LMHeadModel, MinPLogitsWarper, NoRepeatNGramLogitsProcessor,
                          RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from autograder.checks import once
from autograder.sandboxed.helpers import samplers as recipes
from autograder.judge import Remote, ask, cell, learner_side, make, part, seeded, type_of
from coursekit.testing import call, close, describe_error, fail, not_written, quiet_transformers, show

NEG_INF = float("-inf")
NAN = float("nan")
ATOL = 1e-6
RTOL = 1e-6
MARGIN = 1e-4  # how far every running total (top-p) or probability (min-p) stays from the cut
_GPT2 = (GPT2Config, GPT2LMHeadModel)  # what the beam models' recipe builds here: resolved at import (see above)


@contextlib.contextmanager
def _seeded(seed: int):
    """Draw the check's random numbers from a seed of its own: torch's global generator, held by this thread for
    the block (``judge.seeded``: the judge runs several notebooks' checks at once) and given back after."""
    with seeded(seed), torch.no_grad():
        yield


def _t(x: torch.Tensor) -> str:
    """<logits of shape (4, 30)>, with the dtype when it is not float32 (logits) or int64 (ids), and where the logits
    are when they are far from 0 (<float64 logits near -10000 of shape (4, 30)>)."""
    kind = "logits" if x.is_floating_point() else "ids"
    dtype = "" if x.dtype in (torch.float32, torch.int64) else f"{str(x.dtype).removeprefix('torch.')} "
    near = ""
    if x.is_floating_point() and torch.isfinite(x).any():
        centre = x[torch.isfinite(x)].double().mean().item()
        near = f" near {centre:.0f}" if abs(centre) > 1000 else ""
    return f"<{dtype}{kind}{near} of shape {tuple(x.shape)}>"


def _call(fn, *args, label: str, on_error: str = ""):
    """``fn(*args)`` on the learner's side, on fresh copies of the inputs, as ``coursekit.testing.call`` calls it (a
    stub is "not written yet", an error is named with the learner's line and ``on_error``), through
    ``helpers.samplers.run``: ``(what came back, [whether the call changed args[i] in place])``."""
    answer = call(ask, "samplers.run", fn, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args],
                  label=label, hint=on_error)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], list)
            and len(answer[1]) == len(args)):
        fail(f"{label}: the notebook's side answered {show(answer)}, not what the grader asked for")
    return answer


IN_PLACE = ("compute new tensors and leave the ones you are given as they were: logits / t, logits.masked_fill(...), "
            "torch.where(...), or a clone that you then change; not logits /= t, masked_fill_, scatter_ or "
            "logits[...] = ... on the caller's tensor (the caller may still need it: the Sampler, a beam, a second "
            "setting tried on the same logits)")


def _unchanged(changed: list, names: tuple, label: str) -> None:
    """Fail if the call changed one of its arguments in place; ``names[i]`` names args[i] (None: not checked)."""
    for name, was_changed in zip(names, changed):
        if name and was_changed:
            fail(f"{label} changed the {name} it was given, in place", IN_PLACE)


LEAVES_INPUTS = "leaves its inputs alone"  # a part of every test cell here: the calls' arguments, as they were


def _check_unchanged(calls: list) -> None:
    """The part LEAVES_INPUTS of a test cell, on the calls that returned (``calls``: (changed, names, label) of each,
    as ``_unchanged`` takes them). Not entered when none returned: a part never reached fails."""
    if calls:
        with part(LEAVES_INPUTS):
            for changed, names, label in calls:
                _unchanged(changed, names, label)


def _hf(processor, logits: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """A Hugging Face processor on a copy of ``logits``; they take (B, V), so one row (V,) goes in as (1, V)."""
    x = logits.clone()
    if x.dim() == 1:
        return processor(ids, x[None])[0]
    return processor(ids, x)


# ---------------------------------------------------------------- comparing logits

def _same(got, want: torch.Tensor) -> bool:
    """Same shape, -inf in the same places, the other values within tolerance."""
    return isinstance(got, torch.Tensor) and got.shape == want.shape and close(got, want, atol=ATOL, rtol=RTOL)


def _difference(got: torch.Tensor, want: torch.Tensor, label: str) -> str:
    """The first place where ``got`` and ``want`` differ, in words (for a filter: the tokens kept)."""
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}; expected a tensor of logits of shape {tuple(want.shape)}")
    if got.shape != want.shape:
        fail(f"{label} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}",
             "return logits of the same shape as the input: (V,) for one row, (B, V) for a batch; work on the "
             "last dimension (dim=-1)")
    if not got.is_floating_point():
        fail(f"{label} returned a tensor of {got.dtype}; expected floating-point logits")
    if want.dtype == torch.float64 and got.dtype != torch.float64:
        fail(f"{label} returned {str(got.dtype).removeprefix('torch.')} logits for float64 ones",
             "keep the dtype of the logits you are given: float64 in, float64 out (no .float(), and no tensor made "
             "from Python floats with torch.tensor(...), which is float32)")
    vocab = want.shape[-1]
    g, w = got.detach().double().reshape(-1, vocab), want.double().reshape(-1, vocab)
    for row, (gr, wr) in enumerate(zip(g, w)):
        where = "" if want.dim() == 1 else f"row {row}: "
        if torch.isnan(gr).any():
            return f"{where}NaN at token {int(torch.isnan(gr).nonzero()[0])}"
        got_kept, want_kept = (~torch.isneginf(gr)).nonzero().flatten(), (~torch.isneginf(wr)).nonzero().flatten()
        if not torch.equal(got_kept, want_kept):
            return (f"{where}{len(got_kept)} tokens not at -inf, {show(got_kept.tolist())}; expected {len(want_kept)}, "
                    f"{show(want_kept.tolist())}")
        bad = ~torch.isclose(gr, wr, atol=ATOL, rtol=RTOL, equal_nan=True)  # as coursekit.testing.close compares
        if bad.any():
            i = int(bad.nonzero()[0])
            return f"{where}token {i} has logit {gr[i].item():.6g}, expected {wr[i].item():.6g}"
    return ""


def _check(fn, args: tuple, want: torch.Tensor, label: str, mistakes=(), note: str = "",
           names: tuple = ("logits",), because: str = "", calls: list | None = None):
    """Fail unless fn(*args) equals ``want``; name the first known mistake that gives the same answer, else ``note``.
    ``because``: the one reason this input can fail where the others passed (logits far from 0), said before any
    guess. Whether the call changed its arguments in place (``names``: see ``_unchanged``) goes to ``calls``, for
    the part LEAVES_INPUTS."""
    got, changed = _call(fn, *args, label=label, on_error=because or note)
    if calls is not None:
        calls.append((changed, names, label))
    diff = _difference(got, want, label)
    if diff:
        hint = because or next((why for why, compute in mistakes if _gives(compute, got)), "")
        fail(f"{label} is wrong at {diff}", hint or _nan_hint(got, want) or _probabilities_hint(got)
             or _mask_value_hint(got, want) or note)


def _nan_hint(got: torch.Tensor, want: torch.Tensor) -> str:
    """NaN where the expected logits hold none, from logits that held none: an arithmetic mask."""
    if not (torch.isnan(got).any() and not torch.isnan(want).any()):
        return ""
    return ("NaN where a logit belongs: 0 * -inf is nan (and so is inf - inf), so a mask multiplied by float('-inf') "
            "puts NaN on every token it keeps. Remove tokens with logits.masked_fill(mask, float('-inf')) or "
            "torch.where(mask, float('-inf'), logits)")


def _gives(compute, got) -> bool:
    try:
        value = compute()
    except Exception:  # noqa: BLE001 (a mistake that cannot even run on this input explains nothing)
        return False
    return _same(got, value)


def _probabilities_hint(got: torch.Tensor) -> str:
    """Rows of numbers in [0, 1] that add up to 1 are probabilities, not logits."""
    g = got.detach().double()
    sums = g.sum(-1)
    if torch.isfinite(g).all() and (g >= 0).all() and close(sums, torch.ones_like(sums), atol=1e-4, rtol=0):
        return ("you returned probabilities; return logits (the removed ones at -inf): the softmax comes later, "
                "when a token is drawn")
    return ""


def _mask_value_hint(got: torch.Tensor, want: torch.Tensor) -> str:
    """Right tokens kept, but the removed ones set to something other than -inf?"""
    removed = torch.isneginf(want)
    if not removed.any() or not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    g = got.detach().double()
    if _same(torch.where(removed, torch.full_like(g, NEG_INF), g), want) and not torch.isneginf(g[removed]).all():
        values = sorted({float(v) for v in g[removed & ~torch.isneginf(g)].tolist()})
        return (f"the tokens you kept are right, but the removed ones hold {show(values)}: set them to -inf "
                "(float('-inf')), so that softmax gives them probability exactly 0 and later filters see them as gone")
    return ""


def _value_error(fn, args: tuple, label: str, hint: str):
    try:
        got = fn(*args)
    except NotImplementedError as err:
        raise not_written(label, err) from None
    except ValueError:
        return
    except Exception as err:  # noqa: BLE001
        if getattr(err, "grader_side", False):  # a lost connection is not the learner's
            raise
        fail(f"{label} raised {describe_error(err)}; expected ValueError", hint)
    else:
        fail(f"{label} returned {_t(got) if isinstance(got, torch.Tensor) else show(got)}; expected ValueError", hint)


NAN_SETTING = ("NaN is no valid {name}, but every comparison with NaN is False, so a test of whether the setting is "
               "OUT of range lets it through: test that it is IN range and raise ValueError otherwise "
               "(`if not {test}: raise ValueError(...)`)")
OVERFLOW = ("the logits here are near +-10,000, as they can be (a very confident model, a logit bias): e^x overflows "
            "to inf above about 88 in float32 and underflows to 0 below about -103, and inf / inf or 0 / 0 is NaN. "
            "Use torch.softmax (or log_softmax), which subtracts each row's maximum before exp, not "
            "exp(logits) / exp(logits).sum()")


# ---------------------------------------------------------------- random logits

def _logits(shape, scale: float = 2.0, removed: float = 0.0, step: float = 0.0) -> torch.Tensor:
    """Random logits; ``removed``: the share already at -inf (never a whole row); ``step``: round to make ties."""
    z = torch.randn(*shape) * scale
    if step:
        z = (z / step).round() * step
    if removed:
        mask = torch.rand(*shape) < removed
        mask[..., 0] = False
        z = z.masked_fill(mask, NEG_INF)
    return z


# ---------------------------------------------------------------- temperature

AFTER_SOFTMAX = ("you applied the temperature after the softmax: it divides the logits, before any softmax (and the "
                 "function returns logits, not probabilities)")


DIVIDED, FLOAT64, BAD_TEMPERATURES = "logits / temperature", "float64 logits", "errors for bad temperatures"


@cell("test_temperature", parts={DIVIDED: 3, FLOAT64: 1, LEAVES_INPUTS: 1, BAD_TEMPERATURES: 1})
def check_temperature(apply_temperature):
    with _seeded(6001):
        batch, row, with_inf, large = _logits((4, 30), 3.0), _logits((50,)), _logits((3, 20), removed=0.3), \
            _logits((2, 12), 80.0)
    cases = [(batch, 0.5), (batch, 1.7), (row, 0.8), (with_inf, 2.0), (large, 0.25), (batch, 1.0), (row, 100.0),
             (batch.double(), 0.7), (large + 1e4, 0.5)]
    calls = []
    for name in (DIVIDED, FLOAT64):
        with part(name):
            for z, t in cases:
                if (z.dtype == torch.float64) == (name == FLOAT64):
                    _check_temperature(apply_temperature, z, t, calls)
    _check_unchanged(calls)
    with part(BAD_TEMPERATURES):
        for bad in (0.0, -0.5, NAN):
            _value_error(apply_temperature, (batch.clone(), bad), f"apply_temperature({_t(batch)}, {bad})",
                         NAN_SETTING.format(name="temperature", test="temperature > 0") if bad != bad else
                         "a temperature must be > 0: 0 would divide by zero (the Sampler turns T = 0 into greedy "
                         "decoding before it gets here) and a negative one would make the least likely token the "
                         "most likely; raise ValueError")


def _check_temperature(apply_temperature, z: torch.Tensor, t: float, calls: list) -> None:
    want = _hf(TemperatureLogitsWarper(t), z)
    mistakes = [
        ("you multiplied the logits by the temperature; divide them: T > 1 must flatten the distribution, "
         "T < 1 sharpen it", lambda: z * t),
        (AFTER_SOFTMAX, lambda: z.softmax(-1) / t),
        (AFTER_SOFTMAX, lambda: (z.softmax(-1) / t).log()),
        (AFTER_SOFTMAX, lambda: z.softmax(-1) ** (1 / t)),
        ("you returned probabilities, softmax(logits / T); return the logits / T themselves",
         lambda: (z / t).softmax(-1)),
        ("you returned log-probabilities, log_softmax(logits / T); return logits / T itself, as Hugging Face "
         "does", lambda: (z / t).log_softmax(-1)),
    ]
    if t != 1.0:
        mistakes.append(("the logits came back unchanged: divide them by the temperature", lambda: z))
    _check(apply_temperature, (z, t), want, f"apply_temperature({_t(z)}, {t})", mistakes, calls=calls)


# ---------------------------------------------------------------- top-k

def _top_k_by_index(z: torch.Tensor, k: int) -> torch.Tensor:
    idx = torch.topk(z, k, dim=-1).indices
    return torch.full_like(z, NEG_INF).scatter(-1, idx, z.gather(-1, idx))


def _keep_at_least(z: torch.Tensor, kth: torch.Tensor, strict: bool = False) -> torch.Tensor:
    return z.masked_fill(z <= kth if strict else z < kth, NEG_INF)


def _top_k_inputs():
    """(plain, row, ties, with_inf): the logits top-k is tried on."""
    with _seeded(6002):
        plain, row = _logits((5, 40), 2.5), _logits((60,), 3.0)
        ties = _logits((6, 30), 2.0, step=1.0)  # whole numbers: many logits equal the k-th
        with_inf = _logits((4, 25), removed=0.5)
    return plain, row, ties, with_inf


def check_top_k(top_k_filter, calls: list):
    plain, row, ties, with_inf = _top_k_inputs()
    keep_all = ("k = 0 means no cut, and a k at least the vocabulary size keeps every token: return the logits "
                "unchanged")
    cases = [(plain, 3, ""), (plain, 1, ""), (row, 7, ""), (plain, 39, ""), (ties, 4, ""), (ties, 9, ""),
             (with_inf, 3, ""), (with_inf, 20, "a row with fewer than k finite logits keeps them all"),
             (plain, 40, keep_all), (plain, 55, keep_all), (plain, 0, keep_all), (plain.double(), 5, ""),
             (row[None], 7, "")]
    for z, k, note in cases:
        want = z.clone() if k == 0 else _hf(TopKLogitsWarper(k), z)
        kk = min(k, z.shape[-1])
        mistakes = []
        if 0 < kk:
            kth = torch.topk(z, kk, dim=-1).values[..., -1:]
            mistakes += [
                ("you removed the k-th highest logit too (`logits > kth` or `<=` where `<` belongs): keep every "
                 "logit >= the k-th highest, ties included, as Hugging Face does",
                 lambda: _keep_at_least(z, kth, strict=True)),
                ("you kept exactly k tokens, chosen by index; when logits tie with the k-th highest, Hugging Face "
                 "keeps them all: remove only the logits < the k-th highest", lambda: _top_k_by_index(z, kk)),
                ("you kept the k LOWEST logits; top-k keeps the highest (torch.topk's largest=True, its default)",
                 lambda: z.masked_fill(z > torch.topk(z, kk, dim=-1, largest=False).values[..., -1:], NEG_INF)),
            ]
        if kk < z.shape[-1]:
            kth1 = torch.topk(z, kk + 1, dim=-1).values[..., -1:]
            mistakes.append(("you kept k + 1 tokens: the k-th highest logit is topk(...).values[..., k - 1] (or "
                             "values[..., -1] of topk with k), not values[..., k]", lambda: _keep_at_least(z, kth1)))
        if z.dim() == 2 and 0 < kk:
            flat_kth = torch.topk(z.flatten(), kk).values[-1]
            mistakes.append(("you took the k highest logits of the whole batch; each row is a sequence of its own: "
                             "work along the last dimension (dim=-1)", lambda: _keep_at_least(z, flat_kth)))
        _check(top_k_filter, (z, k), want, f"top_k_filter({_t(z)}, {k})", mistakes, note, calls=calls)


# ---------------------------------------------------------------- top-p

def _sorted_probs(row: torch.Tensor):
    q = row.double().softmax(-1)
    qs, order = q.sort(descending=True, stable=True)
    return q, qs, order, qs.cumsum(-1) - qs  # mass strictly before each token, in decreasing order


def _nucleus_is_clear(row: torch.Tensor, p: float) -> bool:
    """True when every running total is at least MARGIN from p, and no tie straddles the cut."""
    q, qs, order, before = _sorted_probs(row)
    if (before - p).abs().min() < MARGIN:
        return False
    n = int((before < p).sum())
    return n == len(row) or row[order[n - 1]] != row[order[n]]


def _clear_rows(pool: torch.Tensor, p: float, n: int, is_clear) -> torch.Tensor:
    """The first n rows of the pool whose cut at p is clear of float rounding (is_clear(row, p)); the rows after them
    are not looked at."""
    rows = list(itertools.islice((r for r in pool if is_clear(r, p)), n))
    assert len(rows) == n, f"the pool has fewer than {n} rows with a clear cut at p={p}"
    return torch.stack(rows)


def _nucleus(z: torch.Tensor, keep_before) -> torch.Tensor:
    """Keep, in each row, the tokens (in decreasing probability) for which keep_before(mass before, own mass)."""
    out = z.clone()
    for row, orig in zip(out.reshape(-1, z.shape[-1]), z.reshape(-1, z.shape[-1])):
        _, qs, order, before = _sorted_probs(orig)
        keep = keep_before(before, qs)
        row[order[~keep]] = NEG_INF
    return out


def _unsorted_nucleus(z: torch.Tensor, p: float) -> torch.Tensor:
    q = z.double().softmax(-1)
    before = q.cumsum(-1) - q
    return z.masked_fill(before >= p, NEG_INF)


def _top_p_mistakes(z: torch.Tensor, p: float):
    at_least_one = lambda keep: lambda b, q: keep(b, q) | (torch.arange(len(q)) == 0)  # noqa: E731
    return [
        ("you dropped the token that crosses p: keep the most likely tokens until their total REACHES p, that "
         "last token included (for probabilities 0.6, 0.3, 0.1 and p = 0.7: keep 0.6 and 0.3)",
         lambda: _nucleus(z, at_least_one(lambda b, q: b + q <= p))),
        ("you dropped the token that crosses p, and with it every token when the top one alone is above p: keep "
         "the most likely tokens until their total reaches p, that last token included",
         lambda: _nucleus(z, lambda b, q: b + q <= p)),
        ("you kept the unlikely tail and removed the nucleus: on probabilities sorted in ASCENDING order, remove "
         "the tokens whose running total is <= 1 - p, keep the rest",
         lambda: _nucleus(z, at_least_one(lambda b, q: b >= p))),
        ("you kept the unlikely tail and removed the nucleus: on probabilities sorted in ASCENDING order, remove "
         "the tokens whose running total is <= 1 - p, keep the rest", lambda: _nucleus(z, lambda b, q: b >= p)),
        ("you compared the running total with the wrong threshold: sorted ascending, remove the tail whose total "
         "is <= 1 - p (not p); sorted descending, keep tokens while the total before them is < p",
         lambda: _nucleus(z, at_least_one(lambda b, q: b < 1 - p))),
        ("you summed the probabilities in vocabulary order; sort them (most likely first) before the running "
         "total", lambda: _unsorted_nucleus(z, p)),
        ("the most likely token was removed: top-p always keeps at least one token",
         lambda: _nucleus(z, lambda b, q: (b < p) & (torch.arange(len(q)) > 0))),
    ]


def _top_p_inputs():
    """(pool, ties, with_inf, row_pool): the logits whose rows top-p is tried on."""
    with _seeded(6003):
        pool = _logits((200, 40), 2.5)
        ties = _logits((200, 24), 1.5, step=0.5)
        with_inf = _logits((200, 30), 2.0, removed=0.4)
        row_pool = _logits((50, 80), 3.0)
    return pool, ties, with_inf, row_pool


def check_top_p(top_p_filter, calls: list):
    pool, ties, with_inf, row_pool = _top_p_inputs()
    clear = functools.partial(_clear_rows, is_clear=_nucleus_is_clear)
    cases = [(clear(pool, p, 4), p, "") for p in (0.5, 0.8, 0.95, 0.3, 0.05)]
    cases += [(clear(row_pool, 0.9, 1)[0], 0.9, ""), (clear(ties, 0.6, 5), 0.6, ""),
              (clear(with_inf, 0.85, 4), 0.85, ""),
              (pool[:3], 1.0, "p = 1 keeps every token: return the logits unchanged"),
              (clear(pool.double(), 0.7, 3), 0.7, "")]
    for z, p, note in cases:
        want = _hf(TopPLogitsWarper(p), z)
        _check(top_p_filter, (z, p), want, f"top_p_filter({_t(z)}, {p})", _top_p_mistakes(z, p), note, calls=calls)


# ---------------------------------------------------------------- min-p

def _min_p_is_clear(row: torch.Tensor, p: float) -> bool:
    q = row.double().softmax(-1)
    gap = (q - p * q.max()).abs()
    return p == 0.0 or bool((gap[q != q.max()] > MARGIN * q.max()).all())


def _min_p_inputs():
    """(pool, row_pool, with_inf, ties): the logits whose rows min-p is tried on."""
    with _seeded(6004):
        pool, row_pool = _logits((100, 40), 2.5), _logits((20, 70), 2.0)
        with_inf = _logits((100, 30), 2.0, removed=0.4)
        ties = _logits((100, 20), 1.0, step=0.5)
    return pool, row_pool, with_inf, ties


def check_min_p(min_p_filter, calls: list):
    pool, row_pool, with_inf, ties = _min_p_inputs()
    clear = functools.partial(_clear_rows, is_clear=_min_p_is_clear)
    cases = [(clear(pool, p, 4), p) for p in (0.1, 0.3, 0.02, 0.7)]
    cases += [(clear(row_pool, 0.2, 1)[0], 0.2), (clear(with_inf, 0.15, 4), 0.15), (clear(ties, 0.25, 4), 0.25),
              (pool[:3], 0.0), (clear(ties, 1.0, 3), 1.0), (clear(pool.double(), 0.3, 3), 0.3)]
    for z, p in cases:
        want = _hf(MinPLogitsWarper(p), z)
        q = z.softmax(-1)
        mistakes = [
            ("you compared each probability with p itself; min-p scales the threshold by the top token's "
             "probability: remove the tokens with probability < p * max(probability)",
             lambda: z.masked_fill(q < p, NEG_INF)),
            ("you compared logits with p times the top logit; min-p compares probabilities: softmax first, then "
             "remove those < p * the top probability",
             lambda: z.masked_fill(z < p * z.amax(-1, keepdim=True), NEG_INF)),
        ]
        if z.dim() == 2:
            mistakes.append(("you used the top probability of the whole batch; each row has its own top token: "
                             "amax(dim=-1, keepdim=True)", lambda: z.masked_fill(q < p * q.max(), NEG_INF)))
        _check(min_p_filter, (z, p), want, f"min_p_filter({_t(z)}, {p})", mistakes,
               "p = 0 removes nothing" if p == 0 else "", calls=calls)


def _check_far_logits(top_p_filter, min_p_filter, calls: list):
    """Top-p and min-p on logits far from 0, where a naive exp overflows (+1e4) or underflows (-1e4): each must keep
    the tokens it keeps of the same logits moved back near 0, whatever those are, so that a mistake of the cut (its
    own part) is not charged here again. The move is exact: (z + 1e4) - 1e4 loses nothing of z + 1e4 in float32."""
    pool, _, with_inf, _ = _top_p_inputs()
    clear = functools.partial(_clear_rows, is_clear=_nucleus_is_clear)
    for z, p, shift in [(clear(pool + 1e4, 0.9, 4), 0.9, 1e4), (clear(pool - 1e4, 0.6, 4), 0.6, -1e4),
                        (clear(with_inf + 1e4, 0.8, 3), 0.8, 1e4)]:
        _check_far(top_p_filter, "top_p_filter", z, p, shift, calls)
    pool, _, with_inf, _ = _min_p_inputs()
    clear = functools.partial(_clear_rows, is_clear=_min_p_is_clear)
    for z, p, shift in [(clear(pool + 1e4, 0.1, 4), 0.1, 1e4), (clear(pool - 1e4, 0.3, 4), 0.3, -1e4),
                        (clear(with_inf - 1e4, 0.15, 3), 0.15, -1e4)]:
        _check_far(min_p_filter, "min_p_filter", z, p, shift, calls)


def _check_far(fn, name: str, z: torch.Tensor, p: float, shift: float, calls: list):
    near = z - shift
    near_label = f"{name}({_t(near)}, {p})"
    got, changed = _call(fn, near, p, label=near_label)
    calls.append((changed, ("logits",), near_label))
    if not (isinstance(got, torch.Tensor) and got.shape == z.shape and got.is_floating_point()) or \
            torch.isnan(got).any():
        fail(f"{near_label} returned {_t(got) if isinstance(got, torch.Tensor) else show(got)} (see {name}'s own "
             f"part): the same logits {shift:+g} could not be compared with it")
    want = (got.detach().double() + shift).to(z.dtype)  # what it keeps, moved back; -inf stays -inf
    _check(fn, (z, p), want, f"{name}({_t(z)}, {p}) (compared with {near_label} {shift:+g})", because=OVERFLOW,
           calls=calls)


def _check_filter_settings(top_k_filter, top_p_filter, min_p_filter):
    plain = _top_k_inputs()[0]
    for bad in (-1, -5):
        _value_error(top_k_filter, (plain, bad), f"top_k_filter({_t(plain)}, {bad})",
                     "k must be an integer >= 0 (0 means no cut): raise ValueError for a negative k rather than "
                     "keep everything, or torch.topk's own error")
    rows = _top_p_inputs()[0][:3]
    for bad in (1.5, 0.0, -0.2, NAN):
        _value_error(top_p_filter, (rows, bad), f"top_p_filter({_t(rows)}, {bad})",
                     NAN_SETTING.format(name="p", test="0 < p <= 1") if bad != bad else
                     "p must be in (0, 1] (1 keeps every token): raise ValueError for any other p")
    rows = _min_p_inputs()[0][:3]
    for bad in (1.5, -0.1, NAN):
        _value_error(min_p_filter, (rows, bad), f"min_p_filter({_t(rows)}, {bad})",
                     NAN_SETTING.format(name="p", test="0 <= p <= 1") if bad != bad else
                     "p must be in [0, 1] (0 keeps every token, 1 only the most likely): raise ValueError for any "
                     "other p")


TOP_K, TOP_P, MIN_P, FAR, BAD_SETTINGS = ("top_k_filter", "top_p_filter", "min_p_filter", "logits near +-1e4",
                                         "errors for bad settings")


@cell("test_filters", parts={TOP_K: 2, TOP_P: 2, MIN_P: 2, FAR: 1, BAD_SETTINGS: 1, LEAVES_INPUTS: 1})
def check_filters(top_k_filter, top_p_filter, min_p_filter):
    calls = []
    with part(TOP_K):
        check_top_k(top_k_filter, calls)
    with part(TOP_P):
        check_top_p(top_p_filter, calls)
    with part(MIN_P):
        check_min_p(min_p_filter, calls)
    with part(FAR):
        _check_far_logits(top_p_filter, min_p_filter, calls)
    _check_unchanged(calls)
    with part(BAD_SETTINGS):
        _check_filter_settings(top_k_filter, top_p_filter, min_p_filter)


# ---------------------------------------------------------------- penalties

def _rows_of_ids():
    """Logits and ids where seen tokens have positive and negative logits, and some occur several times."""
    with _seeded(6005):
        z = _logits((3, 30), 2.0)
        ids = torch.randint(0, 30, (3, 9))
        ids[:, 4] = ids[:, 1]  # a repeat in every row
        z[0, ids[0, 0]], z[0, ids[0, 2]] = -1.7, 2.3  # make sure both signs occur among the seen tokens
        z[1, ids[1, 0]], z[1, ids[1, 2]] = 1.1, -0.6
        one_z, one_ids = _logits((1, 16), 1.5), torch.tensor([[5, 5, 5, 2]])
        with_inf = _logits((2, 20), removed=0.3)
        inf_ids = torch.randint(0, 20, (2, 6))
    return [(z, ids), (one_z, one_ids), (with_inf, inf_ids)]


INT32 = ("ids come as int64 or int32 tensors (the notebook says so); F.one_hot and a few other functions take only "
         "int64: convert with ids.long() where you need to")
NO_IDS = "with no ids yet (ids of shape (B, 0)) there is nothing to penalise: the logits come back as they are"
PENALTY_ARGS = ("logits", "ids")  # what the penalties are given and must leave as it was


def _ids(ids: torch.Tensor) -> str:
    """ids=[[...]] in a label: the ids themselves, their dtype when it is not int64, or that there are none."""
    text = show(ids.tolist()) if ids.numel() else f"<no ids yet: shape {tuple(ids.shape)}>"
    return text if ids.dtype == torch.int64 else f"{text} ({str(ids.dtype).removeprefix('torch.')})"


def _more_ids(z: torch.Tensor, ids: torch.Tensor) -> list:
    """The same rows again with int32 ids, float64 logits, and no ids yet: (logits, ids, note)."""
    return [(z, ids.int(), INT32), (z.double(), ids, ""), (z, ids[:, :0], NO_IDS)]


def _penalise(z, ids, f, rows=None):
    """Logits with f applied to each seen token once per row; rows=ids of every row for the batch-wide mistake."""
    out = z.clone()
    for b in range(z.shape[0]):
        for t in set((rows if rows is not None else ids[b]).flatten().tolist()):
            out[b, t] = f(z[b, t])
    return out


def _penalise_each_time(z, ids, f):
    out = z.clone()
    for b in range(z.shape[0]):
        for t in ids[b].tolist():
            out[b, t] = f(out[b, t])
    return out


def check_repetition_penalty(apply_repetition_penalty, calls: list, more: bool = False):
    """The cases of the penalty on int64 ids and float32 logits, or with ``more`` those of ``_more_ids``."""
    rows = _rows_of_ids()
    cases = [(z, ids, 1.3, note) for z, ids, note in _more_ids(*rows[0])] if more else \
        [(z, ids, penalty, "") for z, ids in rows for penalty in (1.3, 0.7, 2.0)]
    for z, ids, penalty, note in cases:
        want = _hf(RepetitionPenaltyLogitsProcessor(penalty), z, ids.long())
        right = lambda x, r=penalty: x * r if x < 0 else x / r  # noqa: E731
        mistakes = [
            ("a negative logit must be MULTIPLIED by the penalty: dividing -2.0 by 1.3 gives -1.54, which makes the "
             "token MORE likely; Hugging Face divides positive logits and multiplies negative ones",
             lambda: _penalise(z, ids, lambda x: x / penalty)),
            ("you penalised only the positive logits; a negative one must be multiplied by the penalty (Hugging "
             "Face divides positive logits and multiplies negative ones)",
             lambda: _penalise(z, ids, lambda x: x if x < 0 else x / penalty)),
            ("a positive logit must be DIVIDED by the penalty, a negative one multiplied; you multiplied them all",
             lambda: _penalise(z, ids, lambda x: x * penalty)),
            ("you swapped the two cases: divide POSITIVE logits by the penalty, multiply NEGATIVE ones",
             lambda: _penalise(z, ids, lambda x: x / penalty if x < 0 else x * penalty)),
            ("you applied the penalty once per occurrence; it applies once per token, however often the token "
             "occurs (gather the seen logits, change them, scatter them back)",
             lambda: _penalise_each_time(z, ids, right)),
        ]
        if z.shape[0] > 1:
            mistakes.append(("each row is penalised for the ids in its own row only; you used the ids of every row",
                             lambda: _penalise(z, ids, right, rows=ids)))
        _check(apply_repetition_penalty, (z, ids, penalty), want,
               f"apply_repetition_penalty({_t(z)}, ids={_ids(ids)}, penalty={penalty})", mistakes, note, PENALTY_ARGS,
               calls=calls)


def _counts(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    counts = torch.zeros(ids.shape[0], vocab, dtype=torch.float64)
    for b, row in enumerate(ids.tolist()):
        for t in row:
            counts[b, t] += 1
    return counts


def _openai(z, ids, start, presence, frequency, flat=lambda c: (c > 0).double(), sign=-1.0):
    """OpenAI's formula: logit - presence * [count > 0] - frequency * count, counting ids[:, start:]."""
    c = _counts(ids[:, start:], z.shape[-1])
    return (z.double() + sign * (presence * flat(c) + frequency * c)).to(z.dtype)


def check_presence_frequency(apply_presence_frequency_penalty, calls: list, more: bool = False):
    """The cases of the penalties on int64 ids and float32 logits, or with ``more`` those of ``_more_ids``."""
    (z, ids), (one_z, one_ids), _ = _rows_of_ids()
    ids = ids.clone()
    ids[:, 1:3] = ids[:, 6:8]  # tokens in the prompt that are generated again
    cases = [(z, other, 0 if note == NO_IDS else 2, 0.4, 0.25, note) for z, other, note in _more_ids(z, ids)] \
        if more else [(z, ids, 3, 0.5, 0.0, ""), (z, ids, 3, 0.0, 0.3, ""), (z, ids, 2, 0.4, 0.25, ""),
                      (z, ids, 0, 0.6, 0.2, ""), (z, ids, 4, -0.5, 0.1, ""), (z, ids, 9, 0.7, 0.7, ""),
                      (one_z, one_ids, 1, 0.3, 0.2, "")]
    for z, ids, n, presence, frequency, note in cases:
        want = _openai(z, ids, n, presence, frequency)
        mistakes = [
            ("you counted the prompt too; count only the generated tokens, ids[:, prompt_len:] (OpenAI's penalties "
             "look at what the model wrote, not at what it was given)",
             lambda: _openai(z, ids, 0, presence, frequency)),
            ("you subtracted presence * count; the presence penalty is a flat amount, once, for any token that "
             "occurs at all: presence * (count > 0)",
             lambda: _openai(z, ids, n, presence, frequency, flat=lambda c: c)),
            ("you added the penalties; subtract them: a positive penalty makes repeats LESS likely",
             lambda: _openai(z, ids, n, presence, frequency, sign=1.0)),
            ("off by one in where the generated tokens start: they are ids[:, prompt_len:]",
             lambda: _openai(z, ids, n + 1, presence, frequency)),
            ("off by one in where the generated tokens start: they are ids[:, prompt_len:]",
             lambda: _openai(z, ids, max(n - 1, 0), presence, frequency)),
            ("the frequency penalty grows with the count: frequency * count, not frequency * (count > 0)",
             lambda: _openai(z, ids, n, presence + frequency, 0.0)),
        ]
        _check(apply_presence_frequency_penalty, (z, ids, n, presence, frequency), want,
               f"apply_presence_frequency_penalty({_t(z)}, ids={_ids(ids)}, prompt_len={n}, "
               f"presence={presence}, frequency={frequency})", mistakes,
               note or "a token's logit goes down by presence once it has been generated, and by frequency each time "
               "it was", PENALTY_ARGS, calls=calls)


def _ngram_bans(z, ids, n, windows_end: int = 0, first_only: bool = False):
    """-inf for each token completing an n-gram seen in its row; windows_end=-1 misses the last n-gram."""
    out = z.clone()
    for b, seq in enumerate(ids.tolist()):
        if len(seq) < n:
            continue
        prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
        for start in range(len(seq) - n + 1 + windows_end):
            if tuple(seq[start:start + n - 1]) == prefix:
                out[b, seq[start + n - 1]] = NEG_INF
                if first_only:
                    break
    return out


def check_no_repeat_ngram(ban_repeated_ngrams, calls: list, more: bool = False):
    """The cases of the bans on int64 ids and float32 logits, or with ``more`` those of ``_more_ids``."""
    with _seeded(6006):
        z = _logits((3, 12))
    ids = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2],       # (1, 2) seen twice, followed by 3 and 4
                        [5, 5, 5, 6, 5, 5, 7, 5],       # runs of one token
                        [8, 9, 10, 11, 0, 9, 10, 8]])   # nothing repeats at the end for n >= 3
    short = torch.tensor([[3, 4], [4, 3], [3, 3]])
    last = torch.tensor([[7, 8, 9, 7, 8], [6, 6, 1, 2, 6], [1, 2, 3, 2, 3]])  # n-grams that end at the last token
    cases = [(zz, other, 2, note) for zz, other, note in _more_ids(z, last)] + [(z, ids[:, :0], 1, NO_IDS)] \
        if more else [(z, ids, n, "") for n in (2, 3, 1, 4)] + [(z, short, 2, ""), (z, short, 3, ""),
                                                               (z, short, 4, ""), (z, last, 2, ""), (z, last, 3, "")]
    for z, ids, n, note in cases:
        want = _hf(NoRepeatNGramLogitsProcessor(n), z, ids.long())
        mistakes = [
            ("you missed the n-gram that ends at the last token: the n-grams of a row of length T start at 0, 1, "
             "..., T - n (range(T - n + 1))", lambda: _ngram_bans(z, ids, n, windows_end=-1)),
            ("you banned only the first match; ban the last token of EVERY earlier n-gram whose first n - 1 tokens "
             "equal the last n - 1 tokens of the row", lambda: _ngram_bans(z, ids, n, first_only=True)),
            (f"off by one: you banned repeated {n - 1}-grams; an n-gram is n tokens, so compare the LAST n - 1 "
             "tokens of the row with the first n - 1 of each earlier n-gram",
             lambda: _hf(NoRepeatNGramLogitsProcessor(n - 1), z, ids)),
            (f"off by one: you banned repeated {n + 1}-grams; an n-gram is n tokens, so compare the LAST n - 1 "
             "tokens of the row with the first n - 1 of each earlier n-gram",
             lambda: _hf(NoRepeatNGramLogitsProcessor(n + 1), z, ids)),
        ]
        if not note and ids.shape[1] < n:
            note = "a row shorter than n has no complete n-gram to repeat: nothing is banned"
        _check(ban_repeated_ngrams, (z, ids, n), want, f"ban_repeated_ngrams({_t(z)}, ids={_ids(ids)}, n={n})",
               mistakes, note, PENALTY_ARGS, calls=calls)


REPETITION, PRESENCE, NGRAMS, MORE_IDS = ("apply_repetition_penalty", "apply_presence_frequency_penalty",
                                         "ban_repeated_ngrams", "int32 ids, float64 logits and no ids yet")


@cell("test_penalties", parts={REPETITION: 2, PRESENCE: 2, NGRAMS: 2, MORE_IDS: 1, LEAVES_INPUTS: 1})
def check_penalties(apply_repetition_penalty, apply_presence_frequency_penalty, ban_repeated_ngrams):
    calls = []
    with part(REPETITION):
        check_repetition_penalty(apply_repetition_penalty, calls)
    with part(PRESENCE):
        check_presence_frequency(apply_presence_frequency_penalty, calls)
    with part(NGRAMS):
        check_no_repeat_ngram(ban_repeated_ngrams, calls)
    with part(MORE_IDS):
        check_repetition_penalty(apply_repetition_penalty, calls, more=True)
        check_presence_frequency(apply_presence_frequency_penalty, calls, more=True)
        check_no_repeat_ngram(ban_repeated_ngrams, calls, more=True)
    _check_unchanged(calls)


# ---------------------------------------------------------------- sampling

SAMPLE_DRAWS = 20_000
# A chi-square statistic this unlikely under the right distribution (1 in 10^9) fails: with a fixed seed the
# reference's draws never change, and a correct sampler with other random numbers fails once in a billion.
CHI2_P_VALUE = 1e-9


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic of ``counts`` against ``probs`` (tokens of probability 0 left out) and its p-value."""
    live = probs > 0
    expected = probs[live] * counts.sum()
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, p_value


NOT_FROM_LOGITS = ("torch.multinomial needs non-negative weights with a positive sum in every row: draw from "
                   "softmax(logits, dim=-1), along the last dimension, not from the logits (which can be negative or "
                   "-inf)")


def _draw(sample_from_logits, logits, seed, label, calls: list, on_error: str = NOT_FROM_LOGITS):
    """The learner's draws with a generator seeded with ``seed`` (``torch.Generator().manual_seed(seed)``, made on
    the learner's side), checked to be one id per row; whether the logits were changed in place goes to ``calls``."""
    got, changed = _call(sample_from_logits, logits, make("samplers.generator", seed), label=label, on_error=on_error)
    calls.append((changed, ("logits",), label))
    rows = logits.shape[0]
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {type_of(got)}; expected a tensor of {rows} token ids, one per row")
    if got.shape == (rows, 1):
        fail(f"{label} returned shape {tuple(got.shape)}; expected ({rows},), one id per row",
             "torch.multinomial(probs, 1) gives shape (B, 1): squeeze the last dimension")
    if got.dim() == 0 and rows == 1:
        fail(f"{label} returned a tensor of shape (); expected (1,), one id for the one row",
             "squeeze(-1), not squeeze(): squeeze() also drops the batch dimension when there is one row (B = 1), "
             "and the Sampler reads the id of row 0")
    if got.shape != (rows,):
        fail(f"{label} returned shape {tuple(got.shape)}; expected ({rows},), one id per row")
    if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
        fail(f"{label} returned a tensor of {got.dtype}; expected integer token ids (torch.long)")
    if ((got < 0) | (got >= logits.shape[-1])).any():
        fail(f"{label} returned ids {show(got.tolist())}, outside 0 to {logits.shape[-1] - 1}")
    return got


def _multinomial(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """torch.multinomial(softmax(logits), 1, generator=...) with a generator seeded with ``seed``: one id per row."""
    return torch.multinomial(logits.softmax(-1), 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)


DRAWS, GENERATOR, ONE_ROW = "draws that follow softmax(logits)", "the generator's draws", "one row, a batch of one"


@cell("test_sample", parts={DRAWS: 3, GENERATOR: 2, ONE_ROW: 1, FAR: 1, LEAVES_INPUTS: 1})
def check_sample(sample_from_logits):
    logits = torch.tensor([1.2, -0.4, NEG_INF, 0.3, 2.0, -1.5, 0.9, NEG_INF, 0.0, -0.8])
    batch = logits.expand(SAMPLE_DRAWS, -1).clone()
    shown = show([round(x, 2) for x in logits.tolist()])
    label = f"sample_from_logits(<{SAMPLE_DRAWS} copies of the logits {shown}>, generator)"
    # Rows of three kinds: a seed gives Hugging Face's tokens only if the draws are torch.multinomial's.
    rows = torch.stack([logits, logits.flip(-1), torch.linspace(-2, 2, len(logits))]).repeat(50, 1)
    calls, first = [], None
    with part(DRAWS):
        with learner_side(seed=1):  # the learner's global generator, seeded just before the call
            first = _draw(sample_from_logits, batch, 6007, label, calls)
        _check_frequencies(label, logits, first)
    if first is not None:  # (no draw: the part is not reached, and fails)
        with part(GENERATOR):
            _check_generator(sample_from_logits, label, batch, rows, first, calls)
    with part(ONE_ROW):
        one_label = f"sample_from_logits({_t(logits[None])}, generator)"
        one = _draw(sample_from_logits, logits[None], 6011, one_label, calls)
        if not torch.equal(one, _multinomial(logits[None], 6011)):
            fail(f"{one_label} drew {show(one.tolist())}; torch.multinomial(softmax(logits), 1, generator=generator) "
                 f"draws {show(_multinomial(logits[None], 6011).tolist())} with the same seed",
                 "draw from softmax(logits, dim=-1) with torch.multinomial(probs, 1, generator=generator), one row "
                 "as a batch of one")
    with part(FAR):
        _check_far_draws(sample_from_logits, rows, calls)
    _check_unchanged(calls)


def _check_far_draws(sample_from_logits, rows: torch.Tensor, calls: list) -> None:
    """Logits far from 0, where a naive exp overflows (+1e4) or underflows (-1e4), must give the draws of the same
    logits moved back near 0 with the same seeds (of the generator, and of the global one), whatever those draws are:
    a mistake of the draws (its own part) is not charged here again. softmax gives both the same probabilities, bit
    for bit: (z + 1e4) - 1e4 is exact in float32, and so are the differences from each row's maximum."""
    for shift, seed in ((1e4, 6012), (-1e4, 6013)):
        far = rows + shift
        near = far - shift
        far_label, near_label = (f"sample_from_logits({_t(x)}, generator)" for x in (far, near))
        with learner_side(seed=seed):
            want = _draw(sample_from_logits, near, seed, near_label, calls)
        with learner_side(seed=seed):
            got = _draw(sample_from_logits, far, seed, far_label, calls, on_error=OVERFLOW)
        if not torch.equal(got, want):
            fail(f"{far_label} drew {show(got.tolist())}; the same logits moved back near 0 ({shift:+g}), with the "
                 f"same seeds, drew {show(want.tolist())}", OVERFLOW)


def _check_frequencies(label: str, logits: torch.Tensor, first: torch.Tensor) -> None:
    """The draws of SAMPLE_DRAWS copies of ``logits``: never a token at -inf, and frequencies that pass a chi-square
    test against softmax(logits)."""
    probs = logits.double().softmax(-1)
    counts = torch.bincount(first, minlength=len(logits)).double()
    if counts[probs == 0].sum():
        fail(f"{label} drew a token whose logit is -inf {int(counts[probs == 0].sum())} times",
             "a token at -inf has probability exactly 0 and must never be drawn")
    if counts.max() == SAMPLE_DRAWS:
        top = int(counts.argmax())
        fail(f"{label} returned token {top} in all {SAMPLE_DRAWS} rows",
             "you always took the most likely token (argmax): that is greedy decoding; draw from softmax(logits) "
             "with torch.multinomial" if top == int(logits.argmax()) else "draw one token per row, each at random")
    stat, p_value = _chi2(counts, probs)
    if p_value < CHI2_P_VALUE:
        freq = counts / SAMPLE_DRAWS
        flat = _chi2(counts, (probs > 0).double() / int((probs > 0).sum()))[1] > CHI2_P_VALUE
        fail(f"{label}: the tokens drawn do not follow softmax(logits): frequencies "
             f"{show([round(f, 3) for f in freq.tolist()])}, expected {show([round(p, 3) for p in probs.tolist()])} "
             f"(chi-square {stat:.0f}, p = {p_value:.1e})",
             "your draws are uniform: take the softmax along the last dimension (dim=-1)" if flat else
             "draw from softmax(logits, dim=-1), one row per sequence")


def _check_generator(sample_from_logits, label: str, batch, rows, first, calls: list) -> None:
    """The draws depend on the generator given, and only on it, and they are torch.multinomial's."""
    with learner_side(seed=2):
        again = _draw(sample_from_logits, batch, 6007, label, calls)
    if not torch.equal(first, again):
        fail(f"{label} gave other tokens with a generator seeded the same way, after a change of the global seed",
             "you ignored the generator: pass generator=generator to torch.multinomial, so that a seed gives the "
             "same tokens every time")
    other_seed = _draw(sample_from_logits, batch, 6008, label, calls)
    if torch.equal(first, other_seed):
        fail(f"{label} drew the same tokens with two differently seeded generators",
             "your draws do not depend on the generator passed in: pass generator=generator to torch.multinomial")
    rows_label = f"sample_from_logits({_t(rows)}, generator)"
    got = _draw(sample_from_logits, rows, 6009, rows_label, calls)
    want = torch.multinomial(rows.softmax(-1), 1, generator=torch.Generator().manual_seed(6009)).squeeze(-1)
    if not torch.equal(got, want):
        fail(f"{rows_label} drew {show(got.tolist())}; torch.multinomial(softmax(logits), 1, generator=generator) "
             f"draws {show(want.tolist())} with the same seed",
             "your draws follow the right distribution but are not the ones torch.multinomial makes: use "
             "torch.multinomial(probs, num_samples=1, generator=generator), so that a seed gives the same tokens "
             "as Hugging Face's generate")
    with _seeded(6010):
        want = torch.multinomial(rows.softmax(-1), 1).squeeze(-1)  # torch's global generator, seeded
    for given in ((None,), ()):  # generator=None, and left out (its default)
        label = f"sample_from_logits({_t(rows)}{', None' if given else ''}) after torch.manual_seed(6010)"
        with learner_side(seed=6010):
            unseeded, _ = _call(sample_from_logits, rows, *given, label=label)
        if not isinstance(unseeded, torch.Tensor) or unseeded.shape != (rows.shape[0],):
            fail(f"{label} returned {show(unseeded)}; without a generator, draw with torch's global random generator "
                 "(generator=None)")
        if not torch.equal(unseeded, want):
            fail(f"{label} drew {show(unseeded.tolist())}; torch's global generator draws {show(want.tolist())}",
                 "with no generator (None, the default), draw with torch's global generator: "
                 "torch.multinomial(probs, 1, generator=None), no generator of your own")


# ---------------------------------------------------------------- beam search

# Random GPT-2s: (vocab_size, block_size, n_layer, n_head, n_embd, seed). Their weights are scaled up from
# GPT-2's initialisation so that the next-token distributions are peaked, as a trained model's are, and
# beams differ by clear margins rather than by rounding.
BEAM_MODELS = {
    "a": (64, 48, 2, 2, 16, 2),
    "b": (97, 40, 3, 4, 24, 3),
}
WEIGHT_STD = 0.4


def _beam_recipe(name: str) -> tuple:
    """The plain recipe of the random GPT-2 ``name``: ``recipes.random_gpt(*recipe)`` builds it."""
    return (*BEAM_MODELS[name], WEIGHT_STD)


@once
def _beam_models(name: str):
    """(the reference GPT holding the weights of the random GPT-2 ``name``, that Hugging Face model): the GPT is
    what the learner's side builds from the same recipe (``_beam_model``); here it runs the known mistakes."""
    recipe = _beam_recipe(name)
    seed = recipe[5]
    with _seeded(seed):  # the recipes draw from torch's global generator: held by this thread meanwhile
        hf = recipes.random_gpt2(*recipe)
        model = recipes.random_gpt(*recipe)
    return model, hf


def _beam_model(name: str) -> Remote:
    """The random GPT-2 ``name`` in the course's reference GPT, on the learner's side (its weights sent there)."""
    return make("samplers.gpt", *BEAM_MODELS[name][:5], _beam_weights(name))


@once
def _beam_weights(name: str) -> dict:
    return recipes.hf_weights(_beam_models(name)[1])


def _hf_beams(hf, prompt, max_new_tokens, num_beams, length_penalty=1.0, eos_ids=(), hypotheses=1):
    """Hugging Face's beam search (greedy when num_beams is 1): the generated ids of its best ``hypotheses``,
    each cut after its first end-of-text id."""
    kwargs = dict(num_beams=num_beams, num_return_sequences=hypotheses, length_penalty=length_penalty) \
        if num_beams > 1 else {}
    with torch.no_grad(), quiet_transformers():
        out = hf.generate(torch.tensor([list(prompt)]), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=list(eos_ids) or None, pad_token_id=0, **kwargs)
    seqs = []
    for row in out[:, len(prompt):].tolist():
        end = next((i for i, t in enumerate(row) if t in eos_ids), None)
        seqs.append(row if end is None else row[:end + 1])
    return seqs


@once
def _liked_tokens(model_name: str, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """Tokens the model writes most after ``prompt`` (in 4 beams, no end-of-text), most frequent first: as
    end-of-text ids they make some beams finish early."""
    _, hf = _beam_models(model_name)
    counts: dict[int, int] = {}
    for seq in _hf_beams(hf, prompt, max_new_tokens, 4, hypotheses=4):
        for t in seq:
            counts[t] = counts.get(t, 0) + 1
    return sorted(counts, key=lambda t: (-counts[t], t))


# (model, prompt, max_new_tokens, num_beams, length_penalty, end-of-text ids as ranks among the liked tokens)
BEAM_CASES = [
    ("a", (3, 14, 15, 9), 12, 4, 1.0, ()),  # beam_search's defaults: num_beams, length_penalty and eos_ids left out
    ("a", (3, 14, 15, 9), 8, 3, 2.0, (2,)),
    ("a", (7, 7, 21), 8, 2, 2.0, (0,)),
    ("a", (3, 14, 15, 9), 8, 4, -1.0, (0, 2)),
    ("a", (40,), 8, 4, 2.0, (0, 2)),
    ("a", (40,), 8, 5, 1.0, (2,)),
    ("a", (40,), 12, 3, 0.5, (2,)),
    ("b", (11, 22, 33, 44, 55, 66, 77), 8, 3, 1.0, (0,)),
    ("b", (5,), 8, 2, 0.0, (2,)),
    ("b", (90, 2), 12, 2, 2.0, (1, 3)),
    ("b", (5,), 8, 1, 1.0, (1,)),
    ("b", (11, 22, 33, 44, 55, 66, 77), 1, 3, 1.0, ()),
    ("a", (3, 14, 15, 9), 12, 1, 2.0, ()),  # one beam is greedy decoding, whatever the length penalty
    ("a", (40,), 8, 1, -1.0, (0,)),
]
BEAM_DEFAULTS = (4, 1.0, [])  # beam_search's num_beams, length_penalty and eos_ids when they are left out
# Cases again with eos_ids given as another iterable than a list (beam_search takes any iterable of ids).
EOS_ITERABLES = [(BEAM_CASES[3], "generator"), (BEAM_CASES[9], "generator"), (BEAM_CASES[4], "set"),
                 (BEAM_CASES[1], "tuple")]
ONE_PASS = ("eos_ids may be any iterable of ids: here a generator, which can be read only once (len() does not take "
            "it, and `in` reads it up to the id it finds): read it into a set first, eos = set(eos_ids)")
GREEDY = ("with num_beams=1, beam search is greedy decoding (Hugging Face's generate with num_beams=1): the best token "
          "at each step, until an end-of-text id or max_new_tokens")


@once
def beam_case(case):
    """The arguments of a case and Hugging Face's answer: (model, prompt, n, beams, length_penalty, eos, want)."""
    name, prompt, n, beams, lp, ranks = case
    model, hf = _beam_models(name)
    liked = _liked_tokens(name, prompt, n)
    eos = [liked[r] for r in ranks]
    return model, list(prompt), n, beams, lp, eos, _hf_beams(hf, prompt, n, beams, lp, eos)[0]


def mistaken_beam_search(model, prompt_ids, max_new_tokens, num_beams, length_penalty, eos_ids, mistake):
    """Beam search with one known mistake (see BEAM_MISTAKES), to name what a learner's answer did."""
    from minigpt.generation import last_logits
    eos = set(eos_ids)
    n_candidates = num_beams if mistake == "few_candidates" else max(2, 1 + len(eos)) * num_beams
    running = [(0.0, list(prompt_ids))]
    finished: list[tuple[float, list[int]]] = []
    for step in range(1, max_new_tokens + 1):
        scores = [last_logits(model, ids).float() for _, ids in running]
        scores = [s if mistake == "raw_logits" else torch.log_softmax(s, -1) for s in scores]
        totals = torch.stack([s + sc for (sc, _), s in zip(running, scores)])
        vocab = totals.shape[1]
        if mistake == "unmerged":  # each beam's own best candidates, beam after beam, never ranked together
            top = torch.topk(totals, min(n_candidates, vocab), dim=-1)
            cands = [(v, b, t) for b in range(len(running))
                     for v, t in zip(top.values[b].tolist(), top.indices[b].tolist())]
        else:
            best = torch.topk(totals.flatten(), min(n_candidates, totals.numel()))
            cands = [(v, f // vocab, f % vocab) for v, f in zip(best.values.tolist(), best.indices.tolist())]
        if mistake == "forget_finished":  # ended beams are dropped as if they were never candidates
            cands = [c for c in cands if c[2] not in eos]
        next_running = []
        for rank, (score, beam, token) in enumerate(cands):
            ids = running[beam][1] + [token]
            if step == max_new_tokens or token in eos:
                if rank < num_beams or mistake == "all_finished":
                    length = len(ids) if mistake == "prompt_length" else step
                    finished.append((score / length ** length_penalty, ids))
            elif len(next_running) < num_beams:
                next_running.append((score, ids))
        finished = sorted(finished, key=lambda h: h[0], reverse=True)[:num_beams]
        running = next_running
        if not running or (mistake == "first_finished" and finished):
            break
        length = len(running[0][1]) if mistake == "prompt_length" else step
        if mistake != "no_early_stop" and len(finished) == num_beams and \
                running[0][0] / length ** length_penalty <= finished[-1][0]:
            break
    if not finished:
        return []
    return finished[0][1][len(prompt_ids):]


BEAM_MISTAKES = {
    "forget_finished": "you forgot the hypotheses that ended with an end-of-text id: keep each finished candidate "
                       "(ranked among the first num_beams) with its score total / length ** length_penalty, and "
                       "compare them with the beams that run to the end",
    "first_finished": "you stopped at the first finished hypothesis; keep searching until num_beams hypotheses "
                      "are finished and no running beam can beat the worst of them (step 5)",
    "prompt_length": "you divided by the length of the whole sequence, prompt included; the length penalty uses "
                     "the number of GENERATED tokens: total / generated_length ** length_penalty",
    "few_candidates": "you took only num_beams candidates per step; take max(2, 1 + number of end-of-text ids) * "
                      "num_beams, so that num_beams beams keep running when some candidates finish",
    "no_early_stop": "you did not stop early: once num_beams hypotheses are finished and the best running beam, "
                     "scored as if it stopped now, cannot beat the worst of them, beam search ends (step 5)",
    "all_finished": "you kept finished candidates ranked below the first num_beams; only those among the first "
                    "num_beams candidates become hypotheses (the others are there to keep num_beams beams running)",
    "raw_logits": "you added raw logits; a beam's score is the sum of LOG-PROBABILITIES, log_softmax(logits)",
    "unmerged": "you extended each beam on its own; beam search ranks the (beam, token) candidates of ALL beams "
                "together and keeps the best num_beams overall, so a good beam can have several children",
}


def _beam_label(prompt, n, *given) -> str:
    """The call as a label; ``given``: num_beams, length_penalty and eos_ids as shown, those left out cut off."""
    names = ("num_beams", "length_penalty", "eos_ids")
    return f"beam_search(<a random GPT-2>, {prompt}, max_new_tokens={n}" + \
        "".join(f", {name}={value}" for name, value in zip(names, given)) + ")"


def _eos_as(eos: list, kind: str):
    """End-of-text ids as the learner's beam_search is given them, and how a label shows them."""
    if kind == "generator":
        return make("samplers.one_pass", list(eos)), f"<a generator of {eos}>"
    if kind == "set":
        return set(eos), show(set(eos))
    if kind == "tuple":
        return tuple(eos), show(tuple(eos))
    return list(eos), show(list(eos))


BEAMS, ONE_BEAM, EOS_ANY, PROMPT = ("beams", "one beam: greedy decoding", "eos_ids as any iterable",
                                   "leaves the prompt list alone")


@cell("test_beam_search", parts={BEAMS: 4, ONE_BEAM: 1, EOS_ANY: 1, PROMPT: 1})
def check_beam_search(beam_search):
    answers = []  # (case, the ids returned with eos_ids as a list), for the hints
    models: dict[str, Remote] = {}  # built on the learner's side once per test
    prompts = []  # (whether each argument was changed, label) of each call that returned, for the part PROMPT
    for name, one_beam in ((BEAMS, False), (ONE_BEAM, True)):
        with part(name):
            for case in BEAM_CASES:
                if (case[3] == 1) == one_beam:
                    _check_beams(beam_search, case, "list", models, answers, prompts)
    with part(EOS_ANY):
        for case, kind in EOS_ITERABLES:
            _check_beams(beam_search, case, kind, models, answers, prompts)
    if prompts:  # (no call returned: the part is not reached, and fails)
        with part(PROMPT):
            for changed, label in prompts:
                if changed[1]:
                    fail(f"{label} changed the prompt_ids list it was given",
                         "copy it before adding tokens (list(prompt_ids), or prompt_ids + [token]): the caller's "
                         "prompt must stay as it was")


def _check_beams(beam_search, case, kind: str, models: dict, answers: list, prompts: list) -> None:
    """One case, with eos_ids given as ``kind`` ("list", "generator", "set", "tuple"): with a list, the ids must be
    Hugging Face's; with another iterable, the ids the list gave (Hugging Face's when that call did not run)."""
    _, prompt, n, beams, lp, eos, want = beam_case(case)
    if case[0] not in models:
        models[case[0]] = _beam_model(case[0])
    eos_arg, eos_shown = _eos_as(eos, kind)
    given = [beams, lp, eos_arg]
    while kind == "list" and given and given[-1] == BEAM_DEFAULTS[len(given) - 1]:
        given.pop()  # a trailing default is left out, so that beam_search's own defaults are used too
    label = _beam_label(prompt, n, *(beams, lp, eos_shown)[:len(given)])
    note = ONE_PASS if kind == "generator" else ""
    got, changed = _call(beam_search, models[case[0]], list(prompt), n, *given, label=label, on_error=note)
    prompts.append((changed, label))
    if isinstance(got, torch.Tensor):
        fail(f"{label} returned a tensor; return a list of int ids")
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) for t in got):
        fail(f"{label} returned {show(got)}; expected a list of int ids such as {want}")
    got = list(got)
    if kind != "list":
        as_list = next((a for c, a in answers if c == case), want)
        if got != as_list:
            fail(f"{label} returned {got}; with eos_ids as a list it returned {as_list}",
                 note or "eos_ids may be any iterable of ids (a list, a tuple, a set, a generator): read it once "
                 "into a set, eos = set(eos_ids)")
        return
    answers.append((case, got))
    if got != want:
        fail(f"{label} returned {got}; Hugging Face's generate(num_beams={beams}) gives {want}",
             _beam_hint(got, want, prompt, eos, answers))


def _beam_hint(got, want, prompt, eos, answers) -> str:
    if got == prompt + want:
        return "return only the generated ids, without the prompt"
    if want and want[-1] in eos and got == want[:-1]:
        return "a hypothesis that finished with an end-of-text id ends with that id: keep it in what you return"
    explaining = []
    case, _ = answers[-1]
    if case[3] == 1:
        return GREEDY
    for mistake, why in BEAM_MISTAKES.items():
        if _mistake_gives(case, mistake) == got:
            explaining.append((mistake, why))
    if not explaining:
        return ("follow the notebook's five steps exactly: 2 * num_beams candidates over all beams, finished ones "
                "scored total / generated_length ** length_penalty, the early stop of step 5")
    # Several mistakes can give the same ids on one case: the one that gives the learner's answers on the
    # most cases so far wins.
    _, why = max(explaining, key=lambda m: sum(_mistake_gives(c, m[0]) == a for c, a in answers))
    return why


@once
def _mistake_gives(case, mistake):
    model, prompt, n, beams, lp, eos, _ = beam_case(case)
    with torch.no_grad():
        return mistaken_beam_search(model, prompt, n, beams, lp, eos, mistake)
