"""Chapter 5 (the generation loop): hidden checks for last_logits, token_stream, find_stop / held_back and
TextStream.

The learner's functions are stand-ins (``autograder.judge.Remote``): they run where the notebook runs, and so do
the models, choosers and tokenizer they are given, built there from plain recipes (``autograder.sandboxed.helpers.
generation``: a seed and a shape, a script of ids; ``make("common.gpt2_encoding")``). The expected answers are
computed here from the same recipes.

The oracles are external. For the model's loop: Hugging Face's ``GPT2LMHeadModel`` holding seeded random weights
(``gpt2_weights``, a state dict in its layout); the learner's side loads the same weights into the course's
reference model (``minigpt.transformer.GPT``, so that this chapter grades the loop, not the learner's transformer).
Its ``generate(do_sample=False)`` gives the greedy tokens when prompt and output fit in the window; for longer runs
its forward on the last ``block_size`` tokens, step by step. For stop strings: ``re.search`` over the escaped
alternatives, and a brute force over the ends of the text. For streaming: a scripted model (its logits put a fixed
next token on top, whatever the context) writes a token sequence chosen so that stop strings and UTF-8 characters
fall across token boundaries, and the expected text is tiktoken's ``decode`` of those ids, cut before the first stop
string.

Besides the ordinary cases, the checks use the sizes and types the contract allows: one id, a window exactly full
and one over, ``max_new_tokens=0``; a model that is not a ``torch.nn.Module`` (a callable with ``.config`` that,
like chapter 7's cached model, returns scores only for the positions it has not seen); ``eos_ids`` as a list, a
tuple, a set and a generator; a chooser given a prompt longer than the window (it must get every id); stop strings
that end the text, that begin it, several that match at once, text before one in the same token, a stop string or an
end-of-text token on the last allowed token; and the arguments the given constructor refuses.

When an answer is wrong, the message names the first case that fails and, for the known mistakes, what the
mistake is. token_stream runs the learner's last_logits, and TextStream their token_stream, find_stop and
held_back: a failure there says first which of those fail their own tests (``judge.because_of``). A learner's
generator is read on its side in one request (``helpers.generation.drain``), which gives back a StopIteration that
a generator turned into "generator raised StopIteration" at the learner's line. Nothing here assumes how the learner
wrote the code: a while loop, ``torch.inference_mode``, decoding the whole text at each step and diffing, looking
for stop strings in all the text, pieces of one character, or another way to compute ``held_back`` all pass.
"""
from __future__ import annotations

import dataclasses
import functools
import re

import torch
from transformers import GPT2Config, GPT2LMHeadModel  # here: transformers' lazy imports race in a judge's threads

import coursekit
from autograder.checks import Shape, gap, once
from autograder.sandboxed.helpers import generation as recipes
from autograder.judge import Remote, ask, because_of, cell, collect, make, part, seeded, serve, type_of
from coursekit.testing import call, close, fail, quiet_transformers, show

CHAPTER = "chapter 5 (the generation loop)"
ATOL = 1e-4
END = "<|endoftext|>"


# ---------------------------------------------------------------- random GPT-2 models and the HF oracle

# Small windows, so that short runs already overflow them. A larger initializer_range than GPT-2's 0.02
# spreads the logits, so that no greedy step is a near tie that float rounding could flip (tests check
# that every step the checks use has a margin of at least 1e-3). The seeds are ones whose greedy runs have a
# margin of at least 1e-2 at every step of the checks' cases and of the known mistakes' runs on them, and where
# a known mistake changes a case's tokens, it changes one of the first 12 (those a message shows).
SHAPES = {
    "a": Shape(vocab_size=97, block_size=12, n_layer=2, n_head=2, n_embd=24, seed=48),
    "b": Shape(vocab_size=61, block_size=7, n_layer=1, n_head=3, n_embd=12, seed=0),
}
INIT_RANGE = 0.2


def _recipe(name: str) -> dict:
    """The plain recipe of the random GPT-2 of shape ``name``: ``recipes.seeded_gpt(**recipe)`` builds it."""
    s = SHAPES[name]
    return dict(vocab_size=s.vocab_size, block_size=s.block_size, n_layer=s.n_layer, n_head=s.n_head,
                n_embd=s.n_embd, seed=s.seed, init_range=INIT_RANGE)


@once
def _hf(name: str):
    """Hugging Face's GPT2LMHeadModel holding the seeded weights of the shape ``name`` (the oracle)."""
    s = SHAPES[name]
    config = GPT2Config(vocab_size=s.vocab_size, n_positions=s.block_size, n_layer=s.n_layer, n_head=s.n_head,
                        n_embd=s.n_embd, initializer_range=INIT_RANGE, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    weights = recipes.gpt2_weights(s.vocab_size, s.block_size, s.n_layer, s.n_embd, s.seed, INIT_RANGE)
    with seeded(s.seed), quiet_transformers():  # its initializer draws from torch's global generator
        hf = GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    if set(missing) != {"lm_head.weight"} or unexpected or hf.lm_head.weight is not hf.transformer.wte.weight:
        raise RuntimeError(f"the seeded weights do not fit GPT2LMHeadModel: missing {missing}, unexpected "
                           f"{unexpected}")
    return hf.eval()


@functools.cache
def _models(name: str):
    """(Hugging Face model, the same weights in minigpt's GPT) for the shape ``name``: the GPT is what the learner's
    side builds (for the course's tests; the checks use a stand-in of it)."""
    with seeded(0):  # GPT's own initializer draws before the weights are loaded
        ours = recipes.seeded_gpt(**_recipe(name))
    return _hf(name), ours


def _model(name: str) -> Remote:
    """The GPT of shape ``name`` on the learner's side."""
    return make("generation.seeded_gpt", **_recipe(name))


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _hf_logits(hf, window: list[int], pos: int = -1) -> torch.Tensor:
    """Hugging Face's logits at ``pos`` after ``window``: a copy of those computed once for each model, window and
    position in this process (every notebook's check asks the same, and the known mistakes are replayed on them)."""
    return _hf_logits_once(hf, tuple(window), pos).clone()


@once
def _hf_logits_once(hf, window: tuple[int, ...], pos: int) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([list(window)])).logits[0, pos].clone()


def hf_generate(hf, prompt: list[int], n: int, eos_ids=()) -> list[int]:
    """Hugging Face's greedy generate: the new ids (the end-of-text id included, and nothing after it)."""
    if n == 0:
        return []  # generate refuses max_new_tokens=0
    with quiet_transformers():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, num_beams=1, eos_token_id=sorted(eos_ids) or None,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _argmax(logits: torch.Tensor, ids: list[int]) -> int:
    return int(torch.argmax(logits))


def _first(ids: list[int], block: int) -> list[int]:
    return ids[:block]


def _last(ids: list[int], block: int) -> list[int]:
    return ids[-block:]


def _short(ids: list[int], block: int) -> list[int]:
    return ids[-(block - 1):]


def hf_loop(hf, prompt: list[int], n: int, eos_ids=(), choose=_argmax, *, window=_last, pos: int = -1,
            grow: bool = True, after_eos: str = "yield") -> list[int]:
    """The loop run step by step with HF's forward on a window: with the defaults, the right answer; the
    keyword arguments make the known mistakes, to recognise them."""
    block = hf.config.n_positions
    ids, out = list(prompt), []
    for _ in range(n):
        token = choose(_hf_logits(hf, window(ids, block), pos), list(ids))
        if token in eos_ids and after_eos != "continue":
            if after_eos == "yield":
                out.append(token)
            break
        out.append(token)
        if grow:
            ids.append(token)
    return out


# ---------------------------------------------------------------- last_logits

# (shape, length): short, exactly the window, one more than the window, several windows.
LAST_LOGITS_CASES = [("a", 1), ("a", 5), ("b", 3), ("a", 12), ("b", 7), ("a", 13), ("b", 8), ("a", 30), ("b", 20)]

WINDOW_MISTAKES = [
    (dict(window=_first), "context trimmed from the wrong end (kept the first block_size tokens): the model must "
                          "read the LAST block_size tokens, ids[-block_size:]"),
    (dict(window=_short), "the window is one token short: keep the last block_size tokens, not block_size - 1"),
    (dict(pos=0), "logits taken at position 0 (the first token of the window): the next token's scores are at "
                  "the LAST position, logits[0, -1]"),
    (dict(window=_first, pos=0), "logits taken at position 0, and the context trimmed from the wrong end"),
]


def _type_name(obj) -> str:
    """The short type name of what the learner's code returned (a stand-in: of the object on its side)."""
    return type_of(obj).rpartition(".")[2] if isinstance(obj, Remote) else type(obj).__name__


def _read_back(theirs) -> list:
    """A list given to the learner's code (``make("generation.listed", ...)``), as it is now."""
    return collect(theirs)[0]


# What the model may be, and what that rules out: said when the learner's code fails on a model that is not a GPT.
NOT_A_MODULE = ("the model may be any callable with .config (chapter 7's cached model is not a torch.nn.Module, and "
                "returns scores only for the positions it has not seen): call model(x), take the last position with "
                "logits[0, -1], and do not use model.parameters(), .device, .eval() or .forward")
# The lengths of the ids given one after another to the model that is not an nn.Module (shape "a", block_size 12):
# after the first call, each of the next two adds one id, so that model returns the new position only, (1, 1, V);
# then exactly the window, and one more.
NOT_A_MODULE_LENGTHS = (3, 4, 5, 12, 13)


FITS, LONGER, NOT_A_GPT = ("a context that fits the window", "a context longer than block_size",
                           "a model that is not an nn.Module")


@cell("test_last_logits", parts={FITS: 2, LONGER: 2, NOT_A_GPT: 1})
def check_last_logits(last_logits):
    models = {}
    for name, longer in ((FITS, False), (LONGER, True)):
        with part(name):
            for shape, length in LAST_LOGITS_CASES:
                if (length > SHAPES[shape].block_size) != longer:
                    continue
                model = models[shape] = models.get(shape) or _model(shape)
                block, vocab = SHAPES[shape].block_size, SHAPES[shape].vocab_size
                _check_logits(last_logits, model, f"<GPT with block_size={block}, vocab_size={vocab}>", shape,
                              _ids(length, vocab, seed=100 * length + block))
    with part(NOT_A_GPT):
        plain = make("generation.NotAModule", models.get("a") or _model("a"))
        ids = _ids(max(NOT_A_MODULE_LENGTHS), SHAPES["a"].vocab_size, seed=5)
        for length in NOT_A_MODULE_LENGTHS:
            _check_logits(last_logits, plain, "<a model that is not an nn.Module: a callable with .config, like "
                                              "chapter 7's cached model>", "a", ids[:length], NOT_A_MODULE)


def _check_logits(last_logits, model, name: str, shape: str, ids: list[int], why: str = ""):
    """One call of the learner's last_logits on ``model`` (a stand-in of the model of shape ``shape``, or of one that
    answers as it does); ``why``: what this model is there to show, added to every hint."""
    hf = _hf(shape)
    block, vocab, length = SHAPES[shape].block_size, SHAPES[shape].vocab_size, len(ids)
    theirs = make("generation.listed", ids)  # the list the learner's code gets, to read back afterwards
    label = f"last_logits({name}, <{length} ids>)"
    long = "a sequence longer than block_size must be cut to its last block_size tokens" if length > block else ""
    got = call(last_logits, model, theirs, hint=_join(why, long), label=label)
    if _read_back(theirs) != ids:
        fail(f"{label} changed the list of ids it was given", "read ids, never modify them: slice a copy")
    want = _hf_logits(hf, _last(ids, block))
    if not isinstance(got, torch.Tensor):
        fail(f"{label} returned {_type_name(got)}, expected a torch.Tensor of shape ({vocab},)", why)
    if got.shape != want.shape:
        hint = ""
        if got.numel() == vocab:
            hint = f"return a 1-D tensor of {vocab} scores: logits[0, -1], not logits[:, -1]"
        elif got.dim() >= 2 and got.shape[-1] == vocab:
            hint = "return only the scores after the LAST position, logits[0, -1]"
        elif got.dim() == 0:
            hint = "logits[0, -1] is already the (V,) scores: squeeze() then [-1] takes one score when T is 1"
        fail(f"{label} returned a tensor of shape {tuple(got.shape)}, expected ({vocab},)", _join(hint, why))
    if got.requires_grad:
        fail(f"{label} returned a tensor that is part of a gradient graph",
             "generation never trains: run the model under torch.no_grad() (or torch.inference_mode())")
    got = got.detach().float()
    if close(got, want, atol=ATOL, rtol=0):
        return
    hint = ""
    if close(got, torch.softmax(want, -1), atol=1e-6, rtol=0):
        hint = "you returned probabilities (softmax): return the raw logits; the chooser decides what to do"
    elif close(got, torch.log_softmax(want, -1), atol=ATOL, rtol=0):
        hint = "you returned log-probabilities (log_softmax): return the raw logits"
    for mistake, mistake_why in WINDOW_MISTAKES:
        window, pos = mistake.get("window", _last), mistake.get("pos", -1)
        if close(got, _hf_logits(hf, window(ids, block), pos), atol=ATOL, rtol=0):
            hint = mistake_why
            break
    fail(f"{label}: wrong logits: they differ from Hugging Face's GPT-2 on the last {min(length, block)} ids "
         f"{gap(got, want)}", _join(hint, why))


def _join(*parts: str) -> str:
    """Hints joined into one, the empty ones left out. Where a failure may come from an earlier cell's function that
    fails its own test (``because_of``), that comes first: the diagnosis after it assumes that function is right."""
    return "; ".join(text for text in parts if text)


# ---------------------------------------------------------------- token_stream

@dataclasses.dataclass(frozen=True)
class LoopCase:
    shape: str
    prompt_len: int
    n: int
    what: str
    eos: str = ""  # "" none; "mid" an id that first comes at step >= 2; "first" the first id; "several";
    #                "generator": as "mid", given as a generator (which can be read only once)
    choose: bool = False  # True: a chooser that picks the LOWEST score
    plain: bool = False  # True: the model is not an nn.Module (``helpers.generation.NotAModule``)


LOOP_CASES = [
    LoopCase("a", 3, 8, "a prompt of 3 ids, 8 new tokens"),
    LoopCase("b", 1, 6, "a prompt of 1 id"),
    LoopCase("a", 5, 0, "max_new_tokens=0"),
    LoopCase("a", 4, 20, "prompt and output longer than the window (block_size=12)"),
    LoopCase("b", 12, 6, "a prompt longer than the window (block_size=7)"),
    LoopCase("b", 7, 4, "a prompt that fills the window exactly (block_size=7)"),
    LoopCase("a", 3, 9, "an end-of-text id in eos_ids", eos="mid"),
    LoopCase("b", 2, 6, "the first new token is in eos_ids", eos="first"),
    LoopCase("a", 6, 6, "several eos_ids, as a tuple", eos="several"),
    LoopCase("a", 5, 9, "eos_ids as a generator, which can be read only once", eos="generator"),
    LoopCase("a", 3, 7, "choose = a chooser that picks the LOWEST score", choose=True),
    LoopCase("b", 9, 4, "choose = a chooser that picks the LOWEST score, the prompt longer than the window "
                        "(block_size=7)", choose=True),
    LoopCase("a", 4, 12, "a model that is not an nn.Module (a callable with .config, like chapter 7's cached model)",
             plain=True),
]

LOOP_MISTAKES = [(dict(window=_first), WINDOW_MISTAKES[0][1] + " (in last_logits)"),
                 (dict(window=_short), WINDOW_MISTAKES[1][1] + " (in last_logits)"),
                 (dict(pos=0), WINDOW_MISTAKES[2][1] + " (in last_logits)"),
                 (dict(grow=False), "the context never grows: append each chosen token to the ids before the next "
                                    "step"),
                 (dict(after_eos="drop"), "EOS not yielded: yield the end-of-text id, then stop"),
                 (dict(after_eos="continue"), "tokens generated after EOS: stop right after yielding an id in "
                                              "eos_ids")]
EOS_GENERATOR = ("eos_ids may be any iterable, a generator too, which can be read only once: `token in eos_ids` "
                 "reads it; make a set of it once, before the loop (eos = set(eos_ids))")
CHOOSE_ALL_IDS = ("choose gets ALL the ids so far (the prompt and every new token), not only the window the model "
                  "reads: chapter 6's repetition penalties look at them. Only last_logits cuts to the window")
# What token_stream runs of the learner's earlier cells.
USES_LAST_LOGITS = {"last_logits": "test_last_logits"}


def _lowest(logits, ids) -> int:
    return int(torch.argmin(logits))


@once
def _loop_case(case: LoopCase):
    """(hf, shape, prompt, eos_ids, choose, want) for a case: ``choose`` is this side's, to compute ``want``. Computed
    once: do not change what it returns."""
    hf, shape = _hf(case.shape), SHAPES[case.shape]
    block, vocab = shape.block_size, shape.vocab_size
    prompt = _ids(case.prompt_len, vocab, seed=7 * case.prompt_len + case.n + block)
    greedy = hf_generate(hf, prompt, case.n) if case.prompt_len + case.n <= block else hf_loop(hf, prompt, case.n)
    eos: set[int] | tuple[int, ...] | list[int] = []
    if case.eos in ("mid", "generator"):
        k = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])
        eos = [greedy[k]]
    elif case.eos == "first":
        eos = {greedy[0]}
    elif case.eos == "several":  # one that never comes, and one that comes at step k
        k = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])
        eos = (next(i for i in range(vocab) if i not in greedy), greedy[k])
    choose = _lowest if case.choose else _argmax
    if case.choose:
        want = hf_loop(hf, prompt, case.n, choose=choose)
    elif eos:
        want = hf_generate(hf, prompt, case.n, eos_ids=set(eos))
    else:
        want = greedy
    return hf, shape, prompt, eos, choose, want


EXTRA = 10  # ids read past max_new_tokens from a token stream that goes on: enough to tell what it does


GREEDY, EOS_IDS, CHOOSE, PLAIN_MODEL, LAZY, PROMPT = (
    "greedy tokens", "end-of-text ids", "choose and the ids it gets", "a model that is not an nn.Module",
    "a token as soon as it is chosen", "leaves the prompt list alone")


def _loop_part(case: LoopCase) -> str:
    return PLAIN_MODEL if case.plain else CHOOSE if case.choose else EOS_IDS if case.eos else GREEDY


@cell("test_token_stream", parts={GREEDY: 3, EOS_IDS: 2, CHOOSE: 1, PLAIN_MODEL: 1, LAZY: 1, PROMPT: 1})
def check_token_stream(token_stream):
    models = {}
    prompts = []  # (label, the prompt list given, on the learner's side, what it held) of each stream read
    for name in (GREEDY, EOS_IDS, CHOOSE, PLAIN_MODEL):
        with part(name):
            for case in LOOP_CASES:
                if _loop_part(case) == name:
                    _check_loop(token_stream, case, models, prompts)
    with part(LAZY):
        _check_lazy(token_stream)
    if not prompts:  # no stream could be read: whether it changed the prompt tells nothing
        return
    with part(PROMPT):
        for label, theirs, prompt in prompts:
            now = _read_back(theirs)
            if now != prompt:
                fail(f"{label}: the prompt list mutated: it was {show(prompt)}, it is now {show(now)}",
                     "token_stream must not change the caller's list: copy it first, ids = list(prompt_ids)")


def _check_loop(token_stream, case: LoopCase, models: dict, prompts: list) -> None:
    hf, shape, prompt, eos, choose, want = _loop_case(case)
    model = models[case.shape] = models.get(case.shape) or _model(case.shape)
    if case.plain:
        model = make("generation.NotAModule", model)
    block = shape.block_size
    theirs = make("generation.listed", prompt)  # the caller's list, on the learner's side
    chooser = make("generation.Lowest") if case.choose else None  # picks the lowest score, records its calls

    kwargs, shown = {}, {}
    if eos:
        kwargs["eos_ids"] = make("generation.generator_of", eos) if case.eos == "generator" else eos
        shown["eos_ids"] = f"<a generator of {show(eos)}>" if case.eos == "generator" else show(eos)
    if case.choose:
        kwargs["choose"], shown["choose"] = chooser, "<lowest score>"
    label = (f"token_stream(<{'model that is not an nn.Module' if case.plain else 'GPT'} with block_size={block}>,"
             f" <{len(prompt)} ids>, {case.n}" + "".join(f", {k}={v}" for k, v in shown.items())
             + f") ({case.what})")
    long = "a context longer than block_size is cut in last_logits" if len(prompt) + case.n > block else ""
    hint = _join(because_of(**USES_LAST_LOGITS), NOT_A_MODULE if case.plain else long)
    stream = call(token_stream, model, theirs, case.n, **kwargs, label=label, hint=hint)  # a generator: no step yet
    got = _drain(stream, case.n + EXTRA, label, hint)[0]
    prompts.append((label, theirs, prompt))
    if any(isinstance(t, bool) or not isinstance(t, int) for t in got):
        bad = next(t for t in got if isinstance(t, bool) or not isinstance(t, int))
        fail(f"{label} yielded {show(bad)} ({_type_name(bad)}); yield plain int ids",
             "yield what choose returns; int(torch.argmax(...)) for a tensor")
    if got != want:
        fail(f"{label} yielded {show(got)}; Hugging Face's GPT-2 gives {show(want)}",
             _join(because_of(**USES_LAST_LOGITS), _loop_hint(case, hf, prompt, eos, choose, got, want)))
    if case.choose:
        _check_choose_calls(label, chooser.seen, prompt, want, hf)


def _loop_hint(case, hf, prompt, eos, choose, got, want) -> str:
    if case.eos == "generator" and got == hf_loop(hf, prompt, case.n, set(eos), choose, after_eos="continue"):
        return EOS_GENERATOR
    for mistake, why in LOOP_MISTAKES:
        if hf_loop(hf, prompt, case.n, set(eos), choose, **mistake) == got != want:
            return why
    if case.choose and got == hf_loop(hf, prompt, case.n, set(eos)):
        return "token_stream ignored `choose`: call choose(logits, ids) to pick each token"
    if got == want[:len(got)] and len(got) == len(want) - 1:
        return f"one token short: yield max_new_tokens ({case.n}) tokens, unless an end-of-text id comes first"
    if got[:len(want)] == want and len(got) > len(want):
        if eos and want and want[-1] in eos:
            return "tokens generated after EOS: stop right after yielding an id in eos_ids"
        return f"too many tokens: at most max_new_tokens ({case.n})"
    return NOT_A_MODULE if case.plain else ""


def _check_choose_calls(label, seen, prompt, want, hf):
    if len(seen) != len(want):
        fail(f"{label}: choose was called {len(seen)} times for {len(want)} tokens", "call it once per new token")
    vocab, block = hf.config.vocab_size, hf.config.n_positions
    for k, (ids, logits) in enumerate(seen):
        if ids != prompt + want[:k]:
            hint = CHOOSE_ALL_IDS if ids == (prompt + want[:k])[-block:] else ""
            fail(f"{label}: at step {k}, choose got ids {show(ids)}, expected the prompt and the tokens so far, "
                 f"{show(prompt + want[:k])}", hint)
        window = (prompt + want[:k])[-block:]
        if not isinstance(logits, torch.Tensor) or logits.shape != (vocab,):
            got = f"a tensor of shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else show(logits)
            fail(f"{label}: at step {k}, choose got {got} as logits, expected a tensor of shape ({vocab},)",
                 "pass it last_logits(model, ids), the scores of the next token only (check test_last_logits)")
        if not close(logits.detach().float(), _hf_logits(hf, window), atol=ATOL, rtol=0):
            fail(f"{label}: at step {k}, choose got other logits than the model's after the ids so far: they "
                 f"differ {gap(logits.detach().float(), _hf_logits(hf, window))}",
                 _join(because_of(**USES_LAST_LOGITS), "pass last_logits(model, ids) to choose"))


def _check_lazy(token_stream):
    # The GPT's block 0 c_attn is the judge's (its weights only here): every forward pass the learner's side runs
    # is a request this process answers and counts, not a number the learner's side reports.
    qkv = serve(_models("a")[1].h[0].attn.c_attn)
    served = make("generation.served_gpt", qkv.id, "h.0.attn.c_attn", **_recipe("a"))
    n = 10
    label = f"token_stream(<GPT>, <3 ids>, {n})"
    hint = because_of(**USES_LAST_LOGITS)
    stream = call(token_stream, served, _ids(3, SHAPES["a"].vocab_size, seed=1), n, label=label, hint=hint)
    _drain(stream, 1, f"next({label})", hint)
    calls = len(qkv.take())
    if calls == 0:
        fail(f"{label} gave its first token without running the model", "each token comes from the model's "
             "scores of the ids so far: choose(last_logits(model, ids), ids)")
    if calls >= n:
        fail(f"{label} ran {calls} forward passes before giving its first token",
             "yield each token as soon as it is chosen (a generator), so the caller can show it at once")


STOP_ITERATION = ("next() found nothing there, and a StopIteration inside a generator ends it with \"RuntimeError: "
                  "generator raised StopIteration\". The usual cause: next(model.parameters()) on a model that has "
                  "none (the model may be any callable with .config; chapter 7's cached model is not a "
                  "torch.nn.Module): build the ids tensor with torch.tensor(...), on the CPU")


def _drain(iterable, limit: int, label: str, hint: str = "") -> tuple[list, bool]:
    """(up to ``limit`` items of the learner's iterable, whether it ended), read on its side in one request. A crash
    names the learner's line, with ``hint``; a StopIteration that a generator turned into "RuntimeError: generator
    raised StopIteration" comes back as the StopIteration it was, where it was raised."""
    try:
        return call(ask, "generation.drain", iterable, limit, label=f"list({label})" if limit > 1 else label)
    except AssertionError as failure:
        cause = failure.__cause__
        if cause is None:  # not written yet: said as it is
            raise
        stopped = getattr(cause, "type_name", type(cause).__name__) == "StopIteration"  # a LearnerError says its type
        fail(str(failure), _join(STOP_ITERATION if stopped else "", hint))


# ---------------------------------------------------------------- find_stop and held_back

FIND_STOP_CASES = [
    ("to be or not to be", ["not"]),
    ("stop at the start", ["stop"]),
    ("Hello\n\nWorld", ["\n\n"]),
    ("the end. THE END", ["THE END", "end"]),
    ("abcabc", ["cab", "bca"]),
    ("to be or not to be", ["be"]),
    ("aaa", ["aa"]),
    ("xyz", ["q", "r"]),
    ("nothing here", []),
    ("日本語のテキスト", ["テキ"]),
    ("party 🎉 time", ("time", "🎉")),
    ("Exit, pursued by a bear.\n", ("\n", "bear", "Exit")),
    # a stop string that ends the text; the whole text; no text; two that begin at the same place
    ("Hello\n\n", ["\n\n"]),
    ("to be", ("xyz", "be")),
    ("END", ["END"]),
    ("", ["\n"]),
    ("x\n\ny", ["\n\n", "\n"]),
    # one stop string the start of another, the longer listed first and found later
    ("ab then abc", ["abc", "ab"]),
]


def oracle_find_stop(text: str, stops) -> int | None:
    stops = list(stops)
    m = re.search("|".join(map(re.escape, stops)), text) if stops else None
    return m.start() if m else None


def oracle_held_back(text: str, stops) -> int:
    return max((n for n in range(len(text) + 1) for s in stops if n < len(s) and s.startswith(text[len(text) - n:])),
               default=0)


def _find_stop_hint(text, stops, got, want) -> str:
    found = [(text.find(s), s) for s in stops if s in text]
    if got == -1 and want is None:
        return "return None when no stop string occurs, not -1"
    if want == 0 and got is None:
        return "0 is a valid index: the stop string begins the text (test `is not None`, not truthiness)"
    if found and got == next(i for i, _ in found):
        return "you returned the first stop string in the list that occurs; return the EARLIEST occurrence in the text"
    if any(got == i + len(s) for i, s in found):
        return "return the index where the stop string BEGINS, not where it ends"
    if any(got == text.rfind(s) for _, s in found):
        return "return the FIRST occurrence, not the last"
    if got is None and any(text.endswith(s) for s in stops):
        return ("a stop string that ends the text counts too: the last place it can begin is len(text) - len(stop), "
                "so look up to range(len(text) - len(stop) + 1) (or use text.find)")
    return "the index where the earliest occurrence of any stop string begins, or None"


HELD_BACK_CASES = [
    ("Hello\n", ["\n\n"]),
    ("Hello", ["\n\n"]),
    ("", ["\n\n"]),
    ("the end. THE EN", ["THE END"]),
    ("Fin <EN", ["<END>"]),
    ("abz", ["xyz", "z!"]),
    ("aa", ["aab"]),
    ("Alas\n\n", ["\n\n\n"]),
    ("xab", ["abc", "b!"]),
    ("word ", ["Wor"]),
    ("🎉 par", ["party"]),
    ("abcab", ["abcabd"]),
    ("anything", []),
    ("ROMEO:\nO", ("JULIET:", "\nO, ")),
    # a whole stop string at the end is not held back, only a start of one (find_stop finds the whole ones)
    ("x\n\n", ["\n\n"]),
    ("THE END", ["THE END"]),
    ("a", ["ab"]),
    # several stop strings whose starts end the text, the shorter first: the longest is held back
    ("xab", ["b!", "abc"]),
]

HELD_BACK_MISTAKES = [
    (lambda text, stops: next((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                               if text.endswith(s[:n])), 0),
     "you stopped at the first stop string whose start ends the text; a later one may start with a longer end of it: "
     "look at every stop string and keep the LONGEST"),
    (lambda text, stops: oracle_held_back(text, stops[:1]),
     "you looked at the first stop string only; any of them may be starting"),
    (lambda text, stops: min((n for n in range(1, len(text) + 1) for s in stops
                              if n < len(s) and s.startswith(text[len(text) - n:])), default=0),
     "you held back the SHORTEST end of the text that starts a stop string; hold back the LONGEST"),
    (lambda text, stops: int(oracle_held_back(text, stops) > 0),
     "you held back at most one character; the end of the text may match several characters of a stop string"),
    (lambda text, stops: max((n for n in range(len(text) + 1) for s in stops
                              if n <= len(s) and s.startswith(text[len(text) - n:])), default=0),
     "a whole stop string is not held back (find_stop finds it): count only an end of the text that is SHORTER than "
     "the stop string it starts"),
]


@cell("test_stop_strings", parts={"find_stop": 1, "held_back": 1})
def check_stop_strings(find_stop, held_back):
    with part("find_stop"):
        for text, stops in FIND_STOP_CASES:
            got = call(find_stop, text, stops, name="find_stop")
            want = oracle_find_stop(text, stops)
            if got != want or isinstance(got, bool):
                fail(f"find_stop({show(text)}, {show(stops)}) returned {show(got)}, expected {show(want)}",
                     _find_stop_hint(text, stops, got, want))
    with part("held_back"):
        for text, stops in HELD_BACK_CASES:
            got = call(held_back, text, stops, name="held_back")
            want = oracle_held_back(text, stops)
            if got != want or isinstance(got, bool):
                hint = next((why for mistake, why in HELD_BACK_MISTAKES if mistake(text, list(stops)) == got), "")
                if isinstance(got, str):
                    hint = "return the number of characters to hold back, not the characters"
                fail(f"held_back({show(text)}, {show(stops)}) returned {show(got)}, expected {show(want)}",
                     hint or "the length of the longest end of the text that is the start (not the whole) of a "
                             "stop string")


# ---------------------------------------------------------------- TextStream

@functools.cache
def _encoding():
    return coursekit.gpt2_encoding()


TEXT, STOPS, CHARACTERS, ENDS, EARLY = ("the text, ids and finish_reason", "stop strings",
                                       "characters split across tokens", "end-of-text and max_new_tokens",
                                       "text as soon as it is written")


@dataclasses.dataclass(frozen=True)
class StreamCase:
    what: str
    pieces: tuple  # each str is encoded on its own (so tokens break between pieces); an int is an id
    stop: tuple[str, ...] | str = ()
    max_new: int | None = None  # None: the whole script
    given_max_new: bool = True  # False: max_new_tokens left out (TextStream's default, DEFAULT_MAX_NEW)
    prompt: str = "ROMEO:"
    eos_ids: tuple[int, ...] | None = None
    choose: tuple[str, ...] = ()  # pieces that a chooser writes, whatever the model says
    part: str = TEXT  # of test_text_stream

    def script(self) -> list[int]:
        enc = _encoding()
        return [i for p in self.pieces for i in ([p] if isinstance(p, int) else enc.encode(p))]


STREAM_CASES = [
    StreamCase("no stop string", (" Good", " morrow", ",", " cousin", ".")),
    StreamCase("the stop string '\\n\\n' split across two tokens", (" Go", " hence", ".", "\n", "\n", "Exit"),
               stop="\n\n", part=STOPS),
    StreamCase("a stop string split across three tokens", (" So", " it", " ends", ".", " THE", " EN", "D", " of"),
               stop=("THE END",), part=STOPS),
    StreamCase("a stop string split across four tokens", ("Fin", " <", "EN", "D", ">", " more"), stop=("<END>",),
               part=STOPS),
    StreamCase("the stop string is one token", (" I", " go", ".", "\n\n", "Next"), stop=("\n\n",), part=STOPS),
    StreamCase("a stop string that begins and ends inside tokens", (" Hello", " world", " again"), stop="lo wo",
               part=STOPS),
    StreamCase("several stop strings: the earliest in the text wins", (" Hello", " world", "!"),
               stop=("rld", "o w"), part=STOPS),
    StreamCase("a stop string never completed: what was held back is shown at the end",
               (" Fare", "well", ".", "\n"), stop=("\n\n",), part=STOPS),
    StreamCase("the start of a stop string that turns out not to be one", (" THE", " EN", "EMY", " comes"),
               stop=("THE END",), part=STOPS),
    StreamCase("an emoji and a CJK character split across tokens", (" Party 🎉 and 語 done",), part=CHARACTERS),
    StreamCase("the stop string is an emoji split across three tokens", (" Party 🎉 time",), stop=("🎉",),
               part=CHARACTERS),
    StreamCase("an incomplete character at the very end", (" cake", 12520, 235), part=CHARACTERS),
    StreamCase("an invalid byte in the middle", (" a", 236, " b"), part=CHARACTERS),
    StreamCase("the end-of-text token comes first", (50256, " never"), part=ENDS),
    StreamCase("an end-of-text token while the start of a stop string is held back",
               (" Good", "night", "\n", 50256, " more"), stop=("\n\n",), part=ENDS),
    StreamCase("an end-of-text token after half a character", (" cake", 12520, 50256, 235), part=ENDS),
    StreamCase("max_new_tokens=0", (" nothing",), max_new=0, part=ENDS),
    StreamCase("max_new_tokens cuts the script", (" one", " two", " three", " four"), max_new=2, part=ENDS),
    StreamCase("the stop string is completed by the last allowed token", (" a", "\n", "\n", " b"),
               stop=("\n\n",), max_new=3, part=STOPS),
    StreamCase("the prompt contains the stop string", (" C", "\n", "\n", "D"), stop=("\n\n",), prompt="A\n\nB",
               part=STOPS),
    StreamCase("eos_ids=(13,) ('.')", (" Yes", ".", " No"), eos_ids=(13,), part=ENDS),
    StreamCase("a chooser that writes its own tokens", (" model", " text"), choose=(" chosen", " words")),
    StreamCase("text before the stop string in the same token", (" So", " farewell", " then"), stop="well",
               part=STOPS),
    StreamCase("two stop strings complete in the same token: the earliest in the text wins",
               (" The", " end", ".", "\n\n", " More"), stop=("\n\n", ".\n"), part=STOPS),
    StreamCase("an end-of-text token as the last allowed token", (" Good", " night", 50256), part=ENDS),
    StreamCase("max_new_tokens left out: its default cuts a script of 70 tokens", (" la",) * 70,
               given_max_new=False, part=ENDS),
]
DEFAULT_MAX_NEW = 64  # TextStream's max_new_tokens when none is given
# What TextStream runs of the learner's earlier cells.
USES_STREAM = {"token_stream": "test_token_stream", "last_logits": "test_last_logits",
               "find_stop/held_back": "test_stop_strings"}


@dataclasses.dataclass
class Expected:
    ids: list[int]
    text: str
    finish_reason: str
    stop: str | None = None  # the stop string that ended it


def expected_stream(script: list[int], stops: list[str], eos_ids: set[int], max_new: int) -> Expected:
    """The oracle: tiktoken's decode of the ids written so far, checked for a stop string after each token."""
    enc = _encoding()
    for k in range(min(max_new, len(script))):
        ids = script[:k + 1]
        if ids[-1] in eos_ids:
            return Expected(ids, enc.decode(ids[:-1]), "eos")
        text = enc.decode(ids)
        cut = oracle_find_stop(text, stops)
        if cut is not None:
            stop = min((s for s in stops if text.find(s) == cut), key=len)
            return Expected(ids, text[:cut], "stop", stop)
    ids = script[:max_new]
    return Expected(ids, enc.decode(ids), "length")


@cell("test_text_stream", parts={TEXT: 2, STOPS: 3, CHARACTERS: 2, ENDS: 2, EARLY: 1})
def check_text_stream(TextStream):
    theirs = make("common.gpt2_encoding")  # the same encoding, on the learner's side
    for name in (TEXT, STOPS, CHARACTERS, ENDS):
        with part(name):
            for case in STREAM_CASES:
                if case.part == name:
                    _check_text_case(TextStream, theirs, case)
            if name == TEXT:  # the constructor is given: its checks count once TextStream writes text
                _check_arguments(TextStream, theirs)
    with part(EARLY):
        _check_streams_early(TextStream, theirs)


def _check_text_case(TextStream, theirs: Remote, case: StreamCase) -> None:
    enc = _encoding()
    eos_default = {enc.encode(END, allowed_special="all")[0]}
    script = case.script()
    prompt_ids = enc.encode(case.prompt)
    chooser_script = [i for p in case.choose for i in enc.encode(p)]
    model = make("generation.Scripted", len(prompt_ids), script)  # writes the script, whatever the context
    stops = [case.stop] if isinstance(case.stop, str) else list(case.stop)
    max_new = DEFAULT_MAX_NEW if not case.given_max_new else len(script) if case.max_new is None else case.max_new
    eos = eos_default if case.eos_ids is None else set(case.eos_ids)
    want = expected_stream(chooser_script or script, stops, eos, max_new)
    kwargs = {"stop": case.stop}
    if case.eos_ids is not None:
        kwargs["eos_ids"] = case.eos_ids
    if chooser_script:
        kwargs["choose"] = make("generation.Writer", len(prompt_ids), chooser_script)
    label = f"TextStream(<model>, <GPT-2 tokenizer>, {show(case.prompt)}" + \
        (f", {max_new}" if case.given_max_new else "") + f", stop={show(case.stop)}" + \
        (f", eos_ids={case.eos_ids}" if case.eos_ids is not None else "") + \
        (", choose=<writes its own tokens>" if chooser_script else "") + f") ({case.what})"
    cause = because_of(**USES_STREAM)  # the learner's functions of earlier cells that this runs, if they fail
    stream = call(TextStream, model, theirs, case.prompt, *((max_new,) if case.given_max_new else ()), **kwargs,
                  label=label, hint=cause)
    most = 2 * (max_new + len(want.text)) + 10  # pieces: more than that, and the stream never ends
    pieces = _drain(stream, most, label, cause)[0]
    _check_stream(label, case, stream, pieces, want, chooser_script or script, stops, max_new, cause)


def _check_stream(label, case, stream, pieces, want: Expected, script, stops, max_new: int, cause: str):
    """``cause``: which of the learner's functions of earlier cells that TextStream runs fail their own tests."""
    if not all(isinstance(p, str) for p in pieces):
        bad = next(p for p in pieces if not isinstance(p, str))
        fail(f"{label} yielded {show(bad)} ({_type_name(bad)}); yield pieces of text (str)")
    text = "".join(pieces)
    got_ids = getattr(stream, "ids", None)
    if isinstance(got_ids, list) and got_ids != script[:len(got_ids)]:
        fail(f"{label}: self.ids is {show(got_ids)}, but the model wrote {show(want.ids)}",
             _join(cause, "these are not the ids the model wrote: check token_stream and last_logits first "
                          "(test_token_stream)"))
    if "\ufffd" in text and "\ufffd" not in want.text:
        fail(f"{label}: stream emits broken UTF-8 (decoded each token on its own): pieces {show(pieces)}, "
             f"expected text {show(want.text)}",
             "a character can span several tokens: feed each token's bytes to one incremental UTF-8 decoder "
             "(codecs.getincrementaldecoder), which keeps incomplete bytes until the rest arrives")
    if END in text and END not in want.text:
        fail(f"{label}: the end-of-text token's text was shown: pieces {show(pieces)}",
             "stop at an id in eos_ids without decoding it (it is recorded in ids, never shown)")
    got_text = getattr(stream, "text", None)
    if got_text != text:
        fail(f"{label}: self.text is {show(got_text)} but the pieces joined are {show(text)}",
             "add every piece you yield to self.text")
    if text != want.text:
        fail(f"{label}: the text is {show(text)} (pieces {show(pieces)}), expected {show(want.text)}",
             _join(cause, _text_hint(case, stream, text, want, stops)))
    if got_ids != want.ids:
        fail(f"{label}: self.ids is {show(got_ids)}, expected {show(want.ids)}",
             _join(cause, _ids_hint(got_ids, want, script)))
    reason = getattr(stream, "finish_reason", None)
    if reason != want.finish_reason:
        hint = {"eos": "an end-of-text token ended it", "stop": "a stop string ended it",
                "length": "max_new_tokens tokens were written without an end-of-text token or a stop string"}[
            want.finish_reason]
        if want.finish_reason != "length" and len(want.ids) == max_new:
            hint += (", even on the last allowed token: a stop string or an end-of-text token decides finish_reason, "
                     "not the count of tokens")
        fail(f"{label}: finish_reason is {show(reason)}, expected {show(want.finish_reason)}", _join(cause, hint))


def _text_hint(case, stream, text, want: Expected, stops) -> str:
    ids = getattr(stream, "ids", None)
    if want.finish_reason == "stop":
        stop = want.stop
        if len(stops) > 1 and text == _cut_at_first_listed(want, stops):
            return ("with several stop strings, cut at the one that occurs EARLIEST in the text, not at the first "
                    "one in the list (and hold back text that may start any of them)")
        if text.startswith(want.text + stop) and ids == want.ids:
            return "stop string left in the output: show the text before it, not the stop string itself"
        if any(s in case.prompt for s in stops):
            return "stop strings are matched in the generated text only, not in the prompt"
        if stop in text:
            return (f"the stop string {stop!r} came split across tokens and was never found: stop checked only on "
                    "the newest token's text. Look for it in all the text not shown yet (held-back text included)")
        rest = text[len(want.text):] if text.startswith(want.text) else None
        if rest and stop.startswith(rest):
            return ("the start of the stop string was shown before the stop string was complete: hold back the text "
                    "that could be its start (held_back) until the next tokens tell")
        if want.text.startswith(text) and len(text) < len(want.text):
            return ("the text before the stop string was never shown: when a stop string is found, show what comes "
                    "before it (it may have come in the same token as the stop string), then end")
    if want.finish_reason == "stop" and isinstance(ids, list) and len(ids) > len(want.ids):
        return "generation went on after the stop string was complete: end the stream there"
    if want.text.startswith(text) and len(text) < len(want.text):
        missing = want.text[len(text):]
        if missing == "\ufffd" * len(missing):
            return ("the incomplete character at the very end was dropped: flush the decoder when generation ends "
                    '(decoder.decode(b"", final=True)), which gives "\\ufffd" as tiktoken\'s decode does')
        return "text held back at the end was never shown: when generation ends, flush what is left"
    if case.choose:
        return "pass self.choose to the token stream"
    if case.eos_ids is not None:
        return "use self.eos_ids, not a fixed end-of-text id"
    return f"this case: {case.what}"


def _cut_at_first_listed(want: Expected, stops) -> str | None:
    """The text cut at the first stop string in the list that occurs, when the stop string is found."""
    text = _encoding().decode(want.ids)
    return next((text[:text.find(s)] for s in stops if s in text), None)


def _ids_hint(got_ids, want: Expected, script) -> str:
    if not isinstance(got_ids, list):
        return "record every generated id in self.ids, a list"
    if got_ids[:len(want.ids)] == want.ids and len(got_ids) > len(want.ids):
        if want.finish_reason == "eos":
            return "tokens generated after EOS"
        if want.finish_reason == "stop":
            return "generation went on after the stop string was complete"
    if got_ids == want.ids[:-1] and want.finish_reason == "eos":
        return "record the end-of-text id in self.ids too"
    if got_ids == want.ids[:-1]:
        return "record every generated id in self.ids, the last one included"
    return ("these are not the ids the model wrote: check token_stream and last_logits first (test_token_stream)")


def _check_streams_early(TextStream, theirs: Remote):
    """Text must come out while it is written, not all at the end. ``theirs``: the encoding, on the learner's side."""
    # The random GPT's block 0 c_attn is the judge's (its weights only here): every token written is a forward pass
    # this process answers and counts. Its 97 ids are GPT-2's printable ASCII and a few more: its first token, "%",
    # is safe to show at once.
    qkv = serve(_models("a")[1].h[0].attn.c_attn)
    model = make("generation.served_gpt", qkv.id, "h.0.attn.c_attn", **_recipe("a"))
    n = 12
    label = f"TextStream(<GPT>, <GPT-2 tokenizer>, 'A', {n})"
    cause = because_of(**USES_STREAM)
    stream = call(TextStream, model, theirs, "A", n, label=label, hint=cause)
    first = _drain(stream, 1, f"next(iter({label}))", cause)[0]
    passes = len(qkv.take())
    if passes == 0:
        fail(f"TextStream gave its first piece {show(first[0] if first else None)} without running the model",
             "the text comes from the model's tokens: token_stream(model, ids, ...)")
    if passes >= n:
        fail(f"TextStream yielded its first piece {show(first[0] if first else None)} only after all {n} "
             "tokens were written",
             "yield text as soon as it is safe to show (no incomplete character, nothing that may start a stop "
             "string), like a chat window")


# Arguments the constructor (given in the notebook) refuses with a ValueError, as the notebook says.
BAD_ARGUMENTS = [
    (("ROMEO:", -1), {}, "a negative max_new_tokens"),
    (("ROMEO:", float("nan")), {}, "max_new_tokens=nan"),
    (("ROMEO:", 2.5), {}, "max_new_tokens that is not an int"),
    (("ROMEO:", 5), {"stop": ""}, "an empty stop string"),
    (("", 5), {}, "an empty prompt"),
    (([50257], 5), {}, "an id outside the vocabulary"),
]


def _check_arguments(TextStream, theirs: Remote):
    model = make("generation.Scripted", 2, [13])
    for (prompt, max_new), options, what in BAD_ARGUMENTS:
        label = f"TextStream(<model>, <GPT-2 tokenizer>, {show(prompt)}, {show(max_new)}" + \
            "".join(f", {k}={show(v)}" for k, v in options.items()) + f") ({what})"
        hint = "the constructor, given in the notebook, checks its arguments: put it back as it was"
        try:
            call(TextStream, model, theirs, prompt, max_new, **options, label=label)
        except AssertionError as failure:
            if isinstance(failure.__cause__, ValueError):
                continue
            fail(f"{failure}; expected ValueError", hint)
        fail(f"{label} made a stream; expected ValueError", hint)
