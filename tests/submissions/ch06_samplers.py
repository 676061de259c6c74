"""Chapter 6 (samplers): realistic learner mistakes, each of which must lose points with a message that names
it, and different-but-correct answers, each of which must get full marks.

Solution cells: `temperature`, `filters` (top-k, top-p, min-p), `penalties` (repetition, presence/frequency,
no-repeat n-grams), `sample`, `beam_search`. Test cells: test_temperature, test_filters, test_penalties,
test_sample, test_beam_search. Each test cell calls only the functions of its own solution cell, so a
mistake costs points in exactly one cell.

The variants that replace the `filters` cell whole are written as the notebook had it before issue 17, without the
given lines that pass Hugging Face's `min_tokens_to_keep` and `filter_value` to `hf_cut`: such answers keep full
marks.

`NBGRADER_MUTANTS` are the mutants graded through real nbgrader (one run, a few minutes at most); every
mutant, those included, is also graded in-process by the fast tests, with the test cells run as nbgrader
runs them.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "06-samplers"

TEMPERATURE_RETURN = "    return logits / temperature\n"
KTH = "    kth = torch.topk(logits, k, dim=-1).values[..., -1:]\n"
TOP_K_RETURN = "    return logits.masked_fill(logits < kth, NEG_INF)\n"
REPETITION_BODY = """\
    seen = torch.gather(logits, -1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(-1, ids, seen)
"""
SAMPLE_RETURN = "    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)\n"
SAMPLE_PROBS = "    probs = torch.softmax(logits, dim=-1)\n"
TOP_K_RANGE = """\
    if not k >= 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if k == 0 or k >= logits.shape[-1]:
"""
TOP_P_RANGE = """\
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    if p == 1:
"""
COUNTS = ("    counts = torch.zeros_like(logits).scatter_add(-1, generated, torch.ones_like(generated, "
          "dtype=logits.dtype))\n")
IN_PLACE = "changed the logits it was given, in place"
BEAM_FINISHED = """\
            if step == max_new_tokens or ids[-1] in eos:
                if rank < num_beams:
                    finished.append((score / step ** length_penalty, ids))
"""
BEAM_EARLY_STOP = """\
        if len(finished) == num_beams and running[0][0] / step ** length_penalty <= finished[-1][0]:
            break  # no running beam can still beat the worst kept hypothesis
"""


def _beam(old: str, new: str) -> Edit:
    return Edit("beam_search", old, new)


MUTANTS = [
    # ---- temperature
    Mutant(
        "temperature-after-softmax",
        "temperature applied to the probabilities, after the softmax",
        (Edit("temperature", TEMPERATURE_RETURN, "    return torch.softmax(logits, dim=-1) / temperature\n"),),
        {"test_temperature": "after the softmax"},
    ),
    Mutant(
        "temperature-multiplied",
        "logits multiplied by the temperature",
        (Edit("temperature", TEMPERATURE_RETURN, "    return logits * temperature\n"),),
        {"test_temperature": "you multiplied the logits by the temperature"},
    ),
    Mutant(
        "temperature-in-place",
        "the caller's logits divided in place (/=) and returned",
        (Edit("temperature", TEMPERATURE_RETURN, "    logits /= temperature\n    return logits\n"),),
        {"test_temperature": IN_PLACE},
    ),
    Mutant(
        "temperature-nan-allowed",
        "the range tested as `temperature <= 0`, which lets NaN through",
        (Edit("temperature", "    if not temperature > 0:\n", "    if temperature <= 0:\n"),),
        {"test_temperature": "NaN is no valid temperature"},
    ),
    Mutant(
        "temperature-zero-allowed",
        "no ValueError for a temperature of 0 or less",
        (Edit("temperature", "    if not temperature > 0:\n", "    if False:\n"),),
        {"test_temperature": "raise ValueError"},
    ),
    # ---- top-k
    Mutant(
        "top-k-plus-one",
        "top-k keeps k + 1 tokens",
        (Edit("filters", KTH, "    kth = torch.topk(logits, k + 1, dim=-1).values[..., -1:]\n"),),
        {"test_filters": "you kept k + 1 tokens"},
    ),
    Mutant(
        "top-k-drops-ties",
        "top-k keeps exactly k tokens by index, dropping those tied with the k-th",
        (Edit("filters", KTH + TOP_K_RETURN, """\
    top = torch.topk(logits, k, dim=-1).indices
    return torch.full_like(logits, NEG_INF).scatter(-1, top, logits.gather(-1, top))
"""),),
        {"test_filters": "Hugging Face keeps them all"},
    ),
    Mutant(
        "top-k-strict",
        "top-k with `<=`: the k-th highest logit is removed too",
        (Edit("filters", TOP_K_RETURN, "    return logits.masked_fill(logits <= kth, NEG_INF)\n"),),
        {"test_filters": "you removed the k-th highest logit too"},
    ),
    Mutant(
        "top-k-in-place",
        "top-k writes -inf into the caller's logits",
        (Edit("filters", TOP_K_RETURN, "    logits[logits < kth] = NEG_INF\n    return logits\n"),),
        {"test_filters": IN_PLACE},
    ),
    Mutant(
        "top-k-negative-keeps-all",
        "no range check: a negative k keeps every token",
        (Edit("filters", TOP_K_RANGE, "    if k <= 0 or k >= logits.shape[-1]:\n"),),
        {"test_filters": "raise ValueError for a negative k"},
    ),
    # ---- top-p
    Mutant(
        "top-p-drops-crossing",
        "top-p on descending probabilities that drops the token crossing p",
        (Edit("filters", "torch.sort(logits, dim=-1)  # ascending", "torch.sort(logits, dim=-1, descending=True)  #"),
         Edit("filters", "remove_sorted = cumulative <= 1 - p", "remove_sorted = cumulative > p"),
         Edit("filters", "remove_sorted[..., -1] = False", "remove_sorted[..., 0] = False")),
        {"test_filters": "you dropped the token that crosses p"},
    ),
    Mutant(
        "top-p-keeps-tail",
        "top-p on ascending probabilities that keeps the tail instead of removing it",
        (Edit("filters", "remove_sorted = cumulative <= 1 - p", "remove_sorted = cumulative > 1 - p"),),
        {"test_filters": "you kept the unlikely tail"},
    ),
    Mutant(
        "top-p-threshold-p",
        "top-p on ascending probabilities compared with p instead of 1 - p",
        (Edit("filters", "remove_sorted = cumulative <= 1 - p", "remove_sorted = cumulative <= p"),),
        {"test_filters": "wrong threshold"},
    ),
    Mutant(
        "top-p-no-range-check",
        "no range check: p = 1.5 keeps every token",
        (Edit("filters", TOP_P_RANGE, "    if p >= 1:\n"),),
        {"test_filters": "p must be in (0, 1]"},
    ),
    Mutant(
        "top-p-naive-exp",
        "top-p on exp(logits) / their sum, which overflows for logits near 1e4",
        (Edit("filters", "    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)\n", """\
    weights = sorted_logits.exp()
    cumulative = (weights / weights.sum(dim=-1, keepdim=True)).cumsum(dim=-1)
"""),),
        {"test_filters": "overflows to inf"},
    ),
    # ---- min-p
    Mutant(
        "min-p-absolute",
        "min-p with an absolute threshold p",
        (Edit("filters", "    remove = probs < p * probs.amax(dim=-1, keepdim=True)\n", "    remove = probs < p\n"),),
        {"test_filters": "scales the threshold by the top token's probability"},
    ),
    Mutant(
        "min-p-nan-allowed",
        "the range tested as `p < 0 or p > 1`, which lets NaN through",
        (Edit("filters", "    if not 0 <= p <= 1:\n", "    if p < 0 or p > 1:\n"),),
        {"test_filters": "NaN is no valid p"},
    ),
    Mutant(
        "min-p-naive-exp",
        "min-p on exp(logits) / their sum, which underflows to 0 / 0 for logits near -1e4",
        (Edit("filters", "    probs = logits.softmax(dim=-1)\n",
              "    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)\n"),),
        {"test_filters": "overflows to inf"},
    ),
    # ---- penalties
    Mutant(
        "repetition-divides-negatives",
        "repetition penalty divides every seen logit, negative ones included",
        (Edit("penalties", "    seen = torch.where(seen < 0, seen * penalty, seen / penalty)\n",
              "    seen = seen / penalty\n"),),
        {"test_penalties": "a negative logit must be MULTIPLIED by the penalty"},
    ),
    Mutant(
        "repetition-per-occurrence",
        "repetition penalty applied once per occurrence of a token",
        (Edit("penalties", REPETITION_BODY, """\
    out = logits.clone()
    for row in range(ids.shape[0]):
        for token in ids[row].tolist():
            x = out[row, token]
            out[row, token] = x * penalty if x < 0 else x / penalty
    return out
"""),),
        {"test_penalties": "once per token"},
    ),
    Mutant(
        "repetition-in-place",
        "the penalised logits scattered into the caller's tensor (scatter_)",
        (Edit("penalties", "    return logits.scatter(-1, ids, seen)\n",
              "    return logits.scatter_(-1, ids, seen)\n"),),
        {"test_penalties": IN_PLACE},
    ),
    Mutant(
        "presence-one-hot",
        "counts by F.one_hot, which takes only int64 ids",
        (Edit("penalties", COUNTS,
              "    counts = torch.nn.functional.one_hot(generated, logits.shape[-1]).sum(dim=1).to(logits.dtype)\n"),),
        {"test_penalties": "ids come as int64 or int32"},
    ),
    Mutant(
        "presence-counts-prompt",
        "presence and frequency penalties that count the prompt",
        (Edit("penalties", "    generated = ids[:, prompt_len:]\n", "    generated = ids\n"),),
        {"test_penalties": "you counted the prompt too"},
    ),
    Mutant(
        "presence-times-count",
        "presence penalty multiplied by the count",
        (Edit("penalties", "presence * (counts > 0).to(logits.dtype)", "presence * counts"),),
        {"test_penalties": "the presence penalty is a flat amount"},
    ),
    Mutant(
        "ngram-misses-last",
        "no-repeat n-gram that misses the n-gram ending at the last token",
        (Edit("penalties", "for start in range(len(seq) - n + 1):", "for start in range(len(seq) - n):"),),
        {"test_penalties": "you missed the n-gram that ends at the last token"},
    ),
    Mutant(
        "ngram-no-clone",
        "no-repeat n-gram writes -inf into the caller's logits (out = logits, no copy)",
        (Edit("penalties", "    out = logits.clone()\n", "    out = logits\n"),),
        {"test_penalties": IN_PLACE},
    ),
    Mutant(
        "ngram-ban-by-product",
        "the bans added as a 0/1 mask times -inf: 0 * -inf is nan on every token not banned",
        (Edit("penalties", "    out = logits.clone()\n    if n <= 0",
              "    out = logits.clone()\n    banned = torch.zeros_like(logits)\n    if n <= 0"),
         Edit("penalties", "                out[row, seq[start + n - 1]] = NEG_INF\n    return out\n",
              "                banned[row, seq[start + n - 1]] = 1.0\n    return logits + banned * NEG_INF\n")),
        {"test_penalties": "0 * -inf is nan"},
    ),
    Mutant(
        "ngram-copy-via-list",
        "the logits copied through a Python list, which makes float64 logits float32",
        (Edit("penalties", "    out = logits.clone()\n", "    out = torch.tensor(logits.tolist())\n"),),
        {"test_penalties": "float64 in, float64 out"},
    ),
    # ---- sampling
    Mutant(
        "sample-ignores-generator",
        "sampling with the global random generator instead of the one passed in",
        (Edit("sample", SAMPLE_RETURN, "    return torch.multinomial(probs, num_samples=1).squeeze(-1)\n"),),
        {"test_sample": "you ignored the generator"},
    ),
    Mutant(
        "sample-argmax",
        "argmax instead of a draw",
        (Edit("sample", SAMPLE_RETURN, "    return probs.argmax(dim=-1)\n"),),
        {"test_sample": "you always took the most likely token (argmax)"},
    ),
    Mutant(
        "sample-from-logits",
        "torch.multinomial on the raw logits",
        (Edit("sample", SAMPLE_RETURN,
              "    return torch.multinomial(logits, num_samples=1, generator=generator).squeeze(-1)\n"),),
        {"test_sample": "not from the logits"},
    ),
    Mutant(
        "sample-keeps-dim",
        "one id per row, but in shape (B, 1)",
        (Edit("sample", SAMPLE_RETURN, "    return torch.multinomial(probs, num_samples=1, generator=generator)\n"),),
        {"test_sample": "squeeze the last dimension"},
    ),
    Mutant(
        "sample-squeeze-all",
        "draws squeezed with squeeze(): one row gives a 0-d tensor",
        (Edit("sample", SAMPLE_RETURN,
              "    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze()\n"),),
        {"test_sample": "squeeze(-1), not squeeze()"},
    ),
    Mutant(
        "sample-naive-exp",
        "probabilities as exp(logits) / their sum, which overflows for logits near 1e4",
        (Edit("sample", SAMPLE_PROBS, "    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)\n"),),
        {"test_sample": "overflows to inf"},
    ),
    Mutant(
        "sample-in-place-shift",
        "each row's maximum subtracted from the caller's logits in place before exp",
        (Edit("sample", SAMPLE_PROBS, """\
    logits -= logits.amax(dim=-1, keepdim=True)
    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)
"""),),
        {"test_sample": IN_PLACE},
    ),
    # ---- beam search
    Mutant(
        "beam-forgets-finished",
        "beams that end with an end-of-text id are dropped, not kept as hypotheses",
        (_beam(BEAM_FINISHED, """\
            if ids[-1] in eos:
                continue  # this beam has ended: drop it
            if step == max_new_tokens:
                finished.append((score / step ** length_penalty, ids))
"""),),
        {"test_beam_search": "you forgot the hypotheses that ended with an end-of-text id"},
    ),
    Mutant(
        "beam-length-with-prompt",
        "length penalty on the length of the whole sequence, prompt included",
        (_beam("finished.append((score / step ** length_penalty, ids))",
               "finished.append((score / len(ids) ** length_penalty, ids))"),
         _beam("running[0][0] / step ** length_penalty", "running[0][0] / len(running[0][1]) ** length_penalty")),
        {"test_beam_search": "prompt included"},
    ),
    Mutant(
        "beam-few-candidates",
        "only num_beams candidates per step",
        (_beam("    n_candidates = max(2, 1 + len(eos)) * num_beams\n", "    n_candidates = num_beams\n"),),
        {"test_beam_search": "you took only num_beams candidates per step"},
    ),
    Mutant(
        "beam-no-early-stop",
        "no early stop: always runs to max_new_tokens",
        (_beam(BEAM_EARLY_STOP, ""),),
        {"test_beam_search": "you did not stop early"},
    ),
    Mutant(
        "beam-first-finished",
        "stops at the first finished hypothesis",
        (_beam("        if not running:\n", "        if not running or finished:\n"),),
        {"test_beam_search": "you stopped at the first finished hypothesis"},
    ),
    Mutant(
        "beam-raw-logits",
        "beam scores that add raw logits instead of log-probabilities",
        (_beam("torch.log_softmax(last_logits(model, ids).float(), dim=-1) + score",
               "last_logits(model, ids).float() + score"),),
        {"test_beam_search": "LOG-PROBABILITIES"},
    ),
    Mutant(
        "beam-unmerged",
        "each beam's best candidates listed beam after beam, never ranked against the other beams'",
        (_beam("        best = torch.topk(totals.flatten(), min(n_candidates, totals.numel()))\n", """\
        top = torch.topk(totals, min(n_candidates, vocab), dim=-1)  # each beam's own best candidates
        flat_ids = (top.indices + vocab * torch.arange(len(running))[:, None]).flatten()
"""),
         _beam("enumerate(zip(best.values.tolist(), best.indices.tolist()))",
               "enumerate(zip(top.values.flatten().tolist(), flat_ids.tolist()))")),
        {"test_beam_search": "you extended each beam on its own"},
    ),
    Mutant(
        "beam-all-finished",
        "finished candidates kept whatever their rank",
        (_beam("                if rank < num_beams:\n", "                if rank < len(best.indices):\n"),),
        {"test_beam_search": "you kept finished candidates ranked below the first num_beams"},
    ),
    Mutant(
        "beam-eos-as-given",
        "eos_ids used as given: a generator has no len() and can be read only once",
        (_beam("    eos = set(eos_ids)\n", "    eos = eos_ids\n"),),
        {"test_beam_search": "can be read only once"},
    ),
]

# Graded through real nbgrader (the others run in-process only): the mistakes the course names first.
NBGRADER_MUTANTS = ("temperature-after-softmax", "top-k-plus-one", "top-p-drops-crossing",
                    "repetition-divides-negatives", "sample-ignores-generator", "beam-forgets-finished",
                    "top-k-in-place", "min-p-nan-allowed", "sample-naive-exp")


# ---------------------------------------------------------------- different but correct

LOOPS_FILTERS = '''\
#| export
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits (and any tied with the k-th) of each row; -inf elsewhere. k=0: keep all."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"top-k needs an integer k >= 0, not {k}")
    rows = logits.reshape(-1, logits.shape[-1])
    out = rows.clone()
    for r, row in enumerate(rows):
        values = sorted(row.tolist(), reverse=True)
        if 0 < k < len(values):
            for i, v in enumerate(row.tolist()):
                if v < values[k - 1]:
                    out[r, i] = NEG_INF
    return out.reshape(logits.shape)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest most-likely set of each row whose probability reaches p (the crossing token too)."""
    if math.isnan(p) or p <= 0 or p > 1:
        raise ValueError(f"top-p needs 0 < p <= 1, not {p}")
    rows = logits.reshape(-1, logits.shape[-1])
    out = torch.full_like(rows, NEG_INF)
    for r, row in enumerate(rows):
        probs = row.softmax(dim=-1)
        total = 0.0
        for i in sorted(range(len(row)), key=lambda i: -probs[i].item()):
            if total >= p:  # the tokens before this one already reach p
                break
            out[r, i] = row[i]
            total += probs[i].item()
    return out.reshape(logits.shape)


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's; -inf elsewhere."""
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"min-p needs 0 <= p <= 1, not {p}")
    out = logits.clone()
    rows = out.reshape(-1, logits.shape[-1])
    for row in rows:
        probs = row.softmax(dim=-1).tolist()
        top = max(probs)
        for i, q in enumerate(probs):
            if q < p * top:
                row[i] = NEG_INF
    return out
'''

LOOPS_PENALTIES = '''\
#| export
import collections


def apply_repetition_penalty(logits: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive logits and multiply negative ones of the tokens in each row of ids (B, T) by penalty."""
    out = logits.clone()
    for row, seq in enumerate(ids.tolist()):
        for token in set(seq):
            x = logits[row, token]
            out[row, token] = x / penalty if x > 0 else x * penalty
    return out


def apply_presence_frequency_penalty(logits: torch.Tensor, ids: torch.Tensor, prompt_len: int,
                                     presence: float, frequency: float) -> torch.Tensor:
    """Subtract presence * (count > 0) + frequency * count, counting each token among ids[:, prompt_len:]."""
    out = logits.clone()
    for row, seq in enumerate(ids.tolist()):
        for token, count in collections.Counter(seq[prompt_len:]).items():
            out[row, token] -= presence + frequency * count
    return out


def ban_repeated_ngrams(logits: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """-inf for every token that would repeat an n-gram already in its row of ids (B, T)."""
    out = logits.clone()
    for row, seq in enumerate(ids.tolist()):
        seen = collections.defaultdict(set)  # the first n - 1 tokens of each n-gram -> the tokens that followed
        for i in range(len(seq) - n + 1):
            seen[tuple(seq[i:i + n - 1])].add(seq[i + n - 1])
        if len(seq) >= n - 1:
            for token in seen.get(tuple(seq[len(seq) - (n - 1):]), ()):
                out[row, token] = NEG_INF
    return out
'''

LOOPS_SAMPLE = '''\
#| export
def sample_from_logits(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of logits (B, V), drawn from softmax(logits)."""
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()  # multinomial normalises them itself
    return torch.stack([torch.multinomial(row, 1, generator=generator)[0] for row in weights])
'''

# Hypotheses in a dict, candidates pooled from each beam's own best and sorted; scores summed in float64.
DICT_BEAM_SEARCH = '''\
#| export
def beam_search(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, num_beams: int = 4,
                length_penalty: float = 1.0, eos_ids: Iterable[int] = ()) -> list[int]:
    """The generated ids of the best beam-search hypothesis (Hugging Face's algorithm, no sampling)."""
    if num_beams < 1 or isinstance(num_beams, bool) or not isinstance(num_beams, int):
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1 for beam search, got {max_new_tokens!r}")
    eos = set(eos_ids)
    width = max(2, 1 + len(eos)) * num_beams
    beams = {tuple(prompt_ids): 0.0}
    done = {}
    for length in range(1, max_new_tokens + 1):
        pool = []
        for ids, total in beams.items():
            logp = torch.log_softmax(last_logits(model, list(ids)).double(), dim=-1)
            top = torch.topk(logp, min(width, logp.numel()))
            pool += [(total + v, ids + (t,)) for v, t in zip(top.values.tolist(), top.indices.tolist())]
        pool.sort(key=lambda c: -c[0])
        pool = pool[:width]
        for total, ids in pool[:num_beams]:
            if ids[-1] in eos or length == max_new_tokens:
                done[ids] = total / length ** length_penalty
        done = dict(sorted(done.items(), key=lambda h: -h[1])[:num_beams])
        beams = dict([(ids, total) for total, ids in pool
                      if ids[-1] not in eos and length < max_new_tokens][:num_beams])
        if not beams:
            break
        if len(done) == num_beams and max(beams.values()) / length ** length_penalty <= min(done.values()):
            break
    best = max(done, key=done.get)
    return list(best[len(prompt_ids):])
'''

VECTORISED_FILTERS = '''\
#| export
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits (and any tied with the k-th) of each row; -inf elsewhere. k=0: keep all."""
    if k < 0:
        raise ValueError("k must not be negative")
    if k == 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = logits.sort(dim=-1, descending=True).values[..., k - 1, None]
    return torch.where(logits >= kth, logits, torch.full_like(logits, NEG_INF))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest most-likely set of each row whose probability reaches p (the crossing token too)."""
    if not (p > 0 and p <= 1):
        raise ValueError("p must be in (0, 1]")
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    mass_before = probs.cumsum(dim=-1) - probs
    keep_sorted = mass_before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, logits, torch.full_like(logits, NEG_INF))


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's; -inf elsewhere."""
    if p != p or p < 0 or p > 1:  # p != p: NaN
        raise ValueError("p must be in [0, 1]")
    logp = logits.log_softmax(dim=-1)
    threshold = logp.amax(dim=-1, keepdim=True) + torch.log(torch.tensor(p))
    return logits.masked_fill(logp < threshold, NEG_INF)
'''

# Every function works on a clone that it then changes in place (which the caller never sees); ranges tested with
# math.isnan; the n-grams found with unfold; beams as a tensor of float64 scores, eos_ids read into a frozenset.
CLONE_TEMPERATURE = '''\
#| export
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature; temperature must be > 0."""
    if math.isnan(temperature) or temperature <= 0:
        raise ValueError(f"the temperature must be a number > 0, got {temperature}")
    out = logits.clone()
    out /= temperature
    return out
'''

CLONE_FILTERS = '''\
#| export
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits (and any tied with the k-th) of each row; -inf elsewhere. k=0: keep all."""
    if k < 0:
        raise ValueError(f"top-k needs k >= 0, got {k}")
    out = logits.clone()
    if 0 < k < logits.shape[-1]:
        kth = out.topk(k, dim=-1).values[..., -1:]
        out[out < kth] = NEG_INF
    return out


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest most-likely set of each row whose probability reaches p (the crossing token too)."""
    if math.isnan(p) or p <= 0 or p > 1:
        raise ValueError(f"top-p needs 0 < p <= 1, got {p}")
    out = logits.clone()
    if p == 1:
        return out
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
    drop = probs.cumsum(dim=-1) - probs >= p  # the tokens after the one that reaches p
    drop[..., 0] = False
    values = torch.where(drop, torch.full_like(out, NEG_INF), out.gather(-1, order))
    out.scatter_(-1, order, values)
    return out


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's; -inf elsewhere."""
    if math.isnan(p) or not 0 <= p <= 1:
        raise ValueError(f"min-p needs 0 <= p <= 1, got {p}")
    out = logits.clone()
    probs = torch.softmax(logits, dim=-1)
    out[probs < p * probs.max(dim=-1, keepdim=True).values] = NEG_INF
    return out
'''

CLONE_PENALTIES = '''\
#| export
def apply_repetition_penalty(logits: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive logits and multiply negative ones of the tokens in each row of ids (B, T) by penalty."""
    out = logits.clone()
    rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(ids)
    seen = out[rows, ids]
    out[rows, ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return out


def apply_presence_frequency_penalty(logits: torch.Tensor, ids: torch.Tensor, prompt_len: int,
                                     presence: float, frequency: float) -> torch.Tensor:
    """Subtract presence * (count > 0) + frequency * count, counting each token among ids[:, prompt_len:]."""
    out = logits.clone()
    for row in range(ids.shape[0]):
        counts = torch.bincount(ids[row, prompt_len:].long(), minlength=logits.shape[-1]).to(logits.dtype)
        out[row] -= presence * (counts > 0).to(logits.dtype) + frequency * counts
    return out


def ban_repeated_ngrams(logits: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """-inf for every token that would repeat an n-gram already in its row of ids (B, T)."""
    out = logits.clone()
    if n < 1 or ids.shape[1] < n:  # no complete n-gram yet
        return out
    grams = ids.long().unfold(1, n, 1)  # (B, T - n + 1, n): every n-gram of every row
    for row in range(ids.shape[0]):
        tail = ids[row, ids.shape[1] - n + 1:].long()  # the last n - 1 tokens
        match = (grams[row, :, :n - 1] == tail).all(dim=-1)
        out[row, grams[row, match, n - 1]] = NEG_INF
    return out
'''

TENSOR_BEAM_SEARCH = '''\
#| export
def beam_search(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, num_beams: int = 4,
                length_penalty: float = 1.0, eos_ids: Iterable[int] = ()) -> list[int]:
    """The generated ids of the best beam-search hypothesis (Hugging Face's algorithm, no sampling)."""
    if num_beams < 1 or isinstance(num_beams, bool) or not isinstance(num_beams, int):
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1 for beam search, got {max_new_tokens!r}")
    eos = frozenset(int(t) for t in eos_ids)
    width = max(2, 1 + len(eos)) * num_beams
    beams, scores = [list(prompt_ids)], torch.zeros(1, dtype=torch.float64)
    hypotheses = []  # (score, generated ids)
    for step in range(1, max_new_tokens + 1):
        logp = torch.stack([torch.log_softmax(last_logits(model, ids).double(), dim=-1) for ids in beams])
        vocab = logp.shape[-1]
        top = (scores[:, None] + logp).flatten().topk(min(width, logp.numel()))
        kept, kept_scores = [], []
        for rank, (score, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
            ids = beams[index // vocab] + [index % vocab]
            if ids[-1] in eos or step == max_new_tokens:
                if rank < num_beams:
                    hypotheses.append((score / step ** length_penalty, ids[len(prompt_ids):]))
            elif len(kept) < num_beams:
                kept.append(ids)
                kept_scores.append(score)
        hypotheses = sorted(hypotheses, key=lambda h: -h[0])[:num_beams]
        if not kept:
            break
        if len(hypotheses) == num_beams and kept_scores[0] / step ** length_penalty <= hypotheses[-1][0]:
            break
        beams, scores = kept, torch.tensor(kept_scores, dtype=torch.float64)
    return hypotheses[0][1]
'''

# Log-space everywhere: top-k by kthvalue (the logits themselves when nothing is cut), top-p by logcumsumexp, min-p
# against log(p); repetition penalty on each row's unique ids; counts by scatter_add_ into a tensor of its own; n-gram
# bans as a mask; sampling from exp(logits - logsumexp).
LOG_SPACE_FILTERS = '''\
#| export
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits (and any tied with the k-th) of each row; -inf elsewhere. k=0: keep all."""
    if not (isinstance(k, int) and k >= 0):
        raise ValueError("k must be an integer >= 0")
    if k == 0 or k >= logits.shape[-1]:
        return logits  # nothing to cut
    kth = -(-logits).kthvalue(k, dim=-1, keepdim=True).values
    return torch.where(logits < kth, NEG_INF, logits)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest most-likely set of each row whose probability reaches p (the crossing token too)."""
    if not (p > 0 and p <= 1):
        raise ValueError("p must be in (0, 1]")
    if p == 1:
        return logits
    logp, order = logits.log_softmax(dim=-1).sort(dim=-1, descending=True)
    mass = logp.logcumsumexp(dim=-1)
    before = torch.cat([torch.full_like(mass[..., :1], NEG_INF), mass[..., :-1]], dim=-1)  # log of the mass before
    keep = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before < math.log(p))
    return logits.masked_fill(~keep, NEG_INF)


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's; -inf elsewhere."""
    if math.isnan(p) or p < 0 or p > 1:
        raise ValueError("p must be in [0, 1]")
    if p == 0:
        return logits
    logp = logits.log_softmax(dim=-1)
    return logits.masked_fill(logp < logp.amax(dim=-1, keepdim=True) + math.log(p), NEG_INF)
'''

LOG_SPACE_PENALTIES = '''\
#| export
def apply_repetition_penalty(logits: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive logits and multiply negative ones of the tokens in each row of ids (B, T) by penalty."""
    out = logits.clone()
    for row in range(ids.shape[0]):
        seen = torch.unique(ids[row]).long()
        values = out[row, seen]
        out[row, seen] = torch.where(values > 0, values / penalty, values * penalty)
    return out


def apply_presence_frequency_penalty(logits: torch.Tensor, ids: torch.Tensor, prompt_len: int,
                                     presence: float, frequency: float) -> torch.Tensor:
    """Subtract presence * (count > 0) + frequency * count, counting each token among ids[:, prompt_len:]."""
    generated = ids[:, prompt_len:].long()
    counts = torch.zeros_like(logits)
    counts.scatter_add_(-1, generated, torch.ones(generated.shape, dtype=logits.dtype))
    return logits - presence * counts.clamp(max=1) - frequency * counts


def ban_repeated_ngrams(logits: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """-inf for every token that would repeat an n-gram already in its row of ids (B, T)."""
    banned = torch.zeros_like(logits, dtype=torch.bool)
    for row, seq in enumerate(ids.tolist()):
        if n < 1 or len(seq) < n:
            continue
        tail = seq[len(seq) - n + 1:]
        for start in range(len(seq) - n + 1):
            if seq[start:start + n - 1] == tail:
                banned[row, seq[start + n - 1]] = True
    return logits.masked_fill(banned, NEG_INF)
'''

LOG_SPACE_SAMPLE = '''\
#| export
def sample_from_logits(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of logits (B, V), drawn from softmax(logits)."""
    probs = (logits - logits.logsumexp(dim=-1, keepdim=True)).exp()
    return torch.multinomial(probs, 1, generator=generator).flatten()
'''

VARIANTS = [
    Variant(
        "loops",
        "Python loops everywhere; top-p by descending running total; sampling row by row from exp weights; "
        "beams in a dict with float64 scores",
        cells={"filters": LOOPS_FILTERS, "penalties": LOOPS_PENALTIES, "sample": LOOPS_SAMPLE,
               "beam_search": DICT_BEAM_SEARCH},
        edits=(Edit("temperature", TEMPERATURE_RETURN, "    return torch.div(logits, temperature)\n"),),
    ),
    Variant(
        "vectorised-alternatives",
        "torch.where top-k on sorted values; top-p with mass_before < p; min-p in log space; repetition "
        "penalty with torch.where on a mask; multinomial on softmax without a squeeze",
        cells={"filters": VECTORISED_FILTERS},
        edits=(Edit("temperature", TEMPERATURE_RETURN, "    return logits * (1.0 / temperature)\n"),
               Edit("penalties", REPETITION_BODY, """\
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, ids, True)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)
"""),
               Edit("sample", SAMPLE_RETURN,
                    "    return torch.multinomial(probs, 1, replacement=True, generator=generator)[:, 0]\n")),
    ),
    Variant(
        "clone-then-change",
        "every function changes a clone of its input in place; ranges tested with math.isnan; n-grams by unfold; "
        "repetition penalty by advanced indexing; beams with float64 scores in a tensor, eos_ids in a frozenset",
        cells={"temperature": CLONE_TEMPERATURE, "filters": CLONE_FILTERS, "penalties": CLONE_PENALTIES,
               "beam_search": TENSOR_BEAM_SEARCH},
        edits=(Edit("sample", SAMPLE_RETURN,
                    "    return torch.multinomial(probs, num_samples=1, generator=generator).view(-1)\n"),),
    ),
    Variant(
        "log-space",
        "top-k by kthvalue, top-p by logcumsumexp, min-p against log(p), the input itself returned when nothing is "
        "cut; repetition penalty on unique ids; counts by scatter_add_; n-gram bans as a mask; sampling from "
        "exp(logits - logsumexp)",
        cells={"filters": LOG_SPACE_FILTERS, "penalties": LOG_SPACE_PENALTIES, "sample": LOG_SPACE_SAMPLE},
        edits=(Edit("temperature", TEMPERATURE_RETURN, "    return torch.true_divide(logits, temperature)\n"),),
    ),
]
