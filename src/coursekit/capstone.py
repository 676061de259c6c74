"""The capstone (chapter 11): your own minigpt, built from your notebooks, next to the real thing.

    pkg = load_package("..")       # export ../NN-topic/NN-topic.ipynb into a package of its own and import it
    compare(pkg)                   # each piece against an oracle on the course's model: a table of what matches
    generate_side_by_side(pkg)     # one prompt, one seed: your package, the course's reference, Hugging Face

The oracles are code neither you nor the course wrote: tiktoken for the tokenizer, PyTorch's functions, and
Hugging Face's ``GPT2LMHeadModel`` with its ``generate``, its logits processors and its KV cache, all on the
course's trained model. A piece is checked with its own code only: your loop, your samplers and your beam
search drive Hugging Face's model, not yours, so a bug in your transformer does not show up as a bug in your
loop. A piece that is built from earlier ones (your GPT from your embeddings and attention, your cache from
your GPT) waits for them instead of being blamed for their mistakes.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import html
import importlib
import importlib.util
import math
import shutil
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch
import torch.nn.functional as F

import coursekit
from coursekit import export, figures
from coursekit.testing import describe_call, show
from .testing import isolated, quiet_transformers

PACKAGE_NAME = "learner_minigpt"  # never "minigpt": the course's reference keeps its name
PROMPT = "Romeo.\n"  # how the corpus starts a speech
SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95)  # the side-by-side's settings
PROMPT_TOKENS, NEW_TOKENS, SLIDE_TOKENS = 12, 16, 5  # the checks' generations: short, for 2 CPU cores
ATOL = 1e-4  # float32 on the course's model: minigpt and Hugging Face agree to about 1e-5 (logits up to 12)

MATCHES, DIFFERS, NOT_WRITTEN, CRASHED, WAITS = "matches", "differs", "not written yet", "crashed", "waits"


# ---------------------------------------------------------------------------------------------- your package

def load_package(notebooks_dir: str | Path = "..", name: str = PACKAGE_NAME) -> ModuleType:
    """Export the chapter notebooks in ``notebooks_dir`` (as last saved) into a fresh package ``name``; import it."""
    if not Path(notebooks_dir).is_dir():
        raise ValueError(f"{notebooks_dir} is not a folder: give the one that holds your chapter folders "
                         "(01-tokens/, 02-embeddings/, ...)")
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    export.write_package(Path(notebooks_dir), folder / name)
    return import_package(folder / name)


def import_package(package_dir: str | Path) -> ModuleType:
    """Import the package in ``package_dir`` under its folder's name, replacing an earlier import of that name."""
    package_dir = Path(package_dir).resolve()
    name = package_dir.name
    if name == "minigpt":
        raise ValueError(f"{package_dir}: a package named minigpt would hide the course's reference; "
                         f"export it under another name, such as {PACKAGE_NAME}")
    if not (package_dir / "__init__.py").is_file():
        raise ValueError(f"{package_dir} is not a package (no __init__.py): export one with minigpt-export")
    for loaded in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
        del sys.modules[loaded]
    spec = importlib.util.spec_from_file_location(name, package_dir / "__init__.py",
                                                  submodule_search_locations=[str(package_dir)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


def reference_package() -> tuple[ModuleType | None, str]:
    """The course's reference minigpt, or None and why it cannot be used here."""
    try:
        import minigpt
    except ImportError as err:
        return None, f"the course's reference package is not installed here ({err})"
    folder = Path(minigpt.__file__).parent
    stubs = any("YOUR CODE HERE" in p.read_text(encoding="utf-8") for p in folder.glob("*.py"))
    if stubs or "exported from solutions/" not in (minigpt.__doc__ or ""):
        return None, (f"the minigpt installed here ({folder}) is built from learner notebooks, not the course's "
                      "reference: in this copy of the course it is your own package")
    return minigpt, ""


# ---------------------------------------------------------------------------------------------- the oracles

@dataclasses.dataclass
class Oracle:
    """The course's model in Hugging Face's GPT2LMHeadModel, tiktoken's GPT-2 encoding, and the text the checks read."""
    folder: Path
    hf: torch.nn.Module
    enc: object  # tiktoken.Encoding
    text: list[int]  # a page of a play the model never trained on: a full window and a little more
    generated: dict = dataclasses.field(default_factory=dict, repr=False)  # the oracle's generations, computed once
    # Bytes of Hugging Face's logits that HFModel may keep, for the same ids asked again: each package compared runs
    # the windows the last one ran (a full window's logits, 51 MB, take a quarter of a second). None kept unless
    # asked: a learner compares one package at a time; the course's tests compare a dozen.
    keep_logits: int = 0
    logits: dict = dataclasses.field(default_factory=dict, repr=False)  # (last_only, the ids) -> what HFModel gave

    @property
    def config(self):
        return self.hf.config

    @property
    def window(self) -> list[int]:
        return self.text[:self.config.n_positions]

    @functools.cached_property
    def run(self) -> SimpleNamespace:
        """Hugging Face's forward over the window: logits, hidden states, its KV cache and block 0's attention."""
        seen = {}

        def record(module, args, kwargs, output):
            seen["x"], seen["y"] = (args[0] if args else kwargs["hidden_states"]), output[0]

        hook = self.hf.transformer.h[0].attn.register_forward_hook(record, with_kwargs=True)
        try:
            with torch.no_grad():
                out = self.hf(torch.tensor([self.window]), use_cache=True, output_hidden_states=True)
        finally:
            hook.remove()
        return SimpleNamespace(logits=out.logits, hidden=out.hidden_states, cache=out.past_key_values,
                               attn_in=seen["x"], attn_out=seen["y"])

    def piece(self, token: int) -> str:
        """A token's text, for messages."""
        try:
            return self.enc.decode([token])
        except Exception:  # noqa: BLE001 (an id outside the vocabulary still gets a message)
            return "?"


def oracle(model_dir: str | Path | None = None) -> Oracle:
    """The oracles for the GPT-2 folder ``model_dir`` (the course's model by default), loaded once for each folder
    (``oracle()`` and ``oracle(None)`` are one)."""
    return _oracle(Path(model_dir or coursekit.shipped_model_dir()).resolve())


@functools.cache
def _oracle(folder: Path) -> Oracle:
    from transformers import GPT2LMHeadModel

    with quiet_transformers():
        # The course's checkpoint is float16 on disk; minigpt computes in float32, so Hugging Face must too.
        hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    enc = coursekit.gpt2_encoding()
    text = coursekit.shakespeare(("julius_caesar",))  # held out: the model never trained on it
    return Oracle(folder, hf, enc, enc.encode_ordinary(text[20_000:40_000])[:hf.config.n_positions + 8])


class HFModel(torch.nn.Module):
    """The oracle's Hugging Face model dressed as a minigpt GPT (``model(idx)`` gives logits,
    ``model.config.block_size``), so that your loop, samplers and beam search can be checked on numbers that do not
    come from your model. Logits it gave for the same ids are given again, a copy (``Oracle.keep_logits``)."""

    def __init__(self, o: Oracle, last_only: bool = False):
        super().__init__()
        self.o, self.hf = o, o.hf
        self.last_only = last_only  # the oracle's own loops need no other position
        c = o.hf.config
        self.config = SimpleNamespace(vocab_size=c.vocab_size, block_size=c.n_positions, n_layer=c.n_layer,
                                      n_head=c.n_head, n_embd=c.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        o = self.o
        key = None
        if o.keep_logits and isinstance(idx, torch.Tensor) and idx.device.type == "cpu" and \
                idx.dtype in (torch.int64, torch.int32) and not idx.requires_grad:
            key = (self.last_only, str(idx.dtype), tuple(idx.shape), idx.numpy().tobytes())
        logits = o.logits.get(key) if key else None
        if logits is None:
            with torch.no_grad():
                logits = self.hf(idx, use_cache=False, logits_to_keep=1 if self.last_only else 0).logits
            if key is None or sum(t.nbytes for t in o.logits.values()) + logits.nbytes > o.keep_logits:
                return logits
            o.logits[key] = logits
        return logits.clone()  # yours to change: the kept ones stay as Hugging Face gave them


def hf_generate(o: Oracle, prompt: list[int], n: int, seed: int | None = None, **settings) -> list[int]:
    """Hugging Face's generate: the new ids, up to and with an end-of-text. With a seed, drawn from torch's
    global generator seeded so (as a Sampler(seed=...) draws from its own), leaving your random state alone."""
    settings = {"eos_token_id": o.enc.eot_token, **settings}
    if settings.get("do_sample"):
        settings.setdefault("top_k", 0)  # no top-k unless asked: generate's default is 50
    key = (tuple(prompt), n, seed, repr(sorted(settings.items())))
    if key not in o.generated:  # the same answer for every package compared with this oracle
        with torch.random.fork_rng(devices=[]), torch.no_grad(), quiet_transformers():
            if seed is not None:
                torch.manual_seed(seed)
            out = o.hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=n, pad_token_id=o.enc.eot_token, **settings)
        o.generated[key] = _until_end(out[0, len(prompt):].tolist(), {o.enc.eot_token})
    return list(o.generated[key])


def hf_drive(o: Oracle, prompt: list[int], n: int) -> list[int]:
    """``drive`` with Hugging Face's model, greedy: the same answer for every package compared with this oracle."""
    key = ("drive", tuple(prompt), n)
    if key not in o.generated:
        o.generated[key] = drive(HFModel(o, last_only=True), prompt, n)
    return list(o.generated[key])


def drive(model, prompt: list[int], n: int, choose: Callable | None = None, end: int | None = None) -> list[int]:
    """Chapter 5's loop in its plainest form, so that a piece can be checked without your loop: ``n`` tokens,
    each chosen (greedily by default) from ``model``'s logits at the last position of the last block_size tokens."""
    ids, block = list(prompt), model.config.block_size
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids[-block:]]))[0, -1]
        ids.append(int(logits.argmax()) if choose is None else choose(logits, list(ids)))
        if ids[-1] == end:
            break
    return ids[len(prompt):]


def _until_end(ids: list[int], ends: set[int]) -> list[int]:
    end = next((i for i, t in enumerate(ids) if t in ends), None)
    return ids if end is None else ids[:end + 1]


# ---------------------------------------------------------------------------------------------- comparing

class Verdict(Exception):
    """How a check ended when not with "matches"; the message says what was found, in the notebook's words."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def differs(message: str):
    raise Verdict(DIFFERS, message)


class Probe:
    """Runs a check's calls into one package, remembering which call is running, so that a crash can name it."""

    def __init__(self, package: ModuleType):
        self.package, self.doing = package, "the check"

    def module(self, name: str) -> ModuleType:
        self.doing = f"importing {name}.py"
        try:
            module = importlib.import_module(f"{self.package.__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{self.package.__name__}.{name}":
                raise
            raise Verdict(NOT_WRITTEN, f"there is no {name}.py in your package: its notebook is missing or has no "
                                       "#| export cells") from None
        self.doing = "the check"
        return module

    def call(self, fn, *args, label: str | None = None, **kwargs):
        self.doing = label or describe_call(getattr(fn, "__qualname__", repr(fn)), args, kwargs)
        result = fn(*args, **kwargs)
        self.doing = "the check"  # a crash from here on is the check's, not the call's
        return result

    def verdict(self, err: BaseException) -> tuple[str, str]:
        """(status, message) for an exception raised by a check."""
        if isinstance(err, Verdict):
            return err.status, str(err)
        where = self.learner_frame(err)
        if isinstance(err, NotImplementedError):
            return NOT_WRITTEN, f"{where[0] if where else self.doing} is not written yet"
        text = " ".join(str(err).split())
        text = text if len(text) <= 200 else text[:200] + "..."
        if where and self.doing.startswith("importing ") and not self.doing.endswith(" " + where[1]):
            return CRASHED, f"{self.doing} failed in {where[1]}, line {where[2]}: {type(err).__name__}: {text}"
        place = f" (in {where[0]}, {where[1]} line {where[2]})" if where else ""
        return CRASHED, f"{self.doing} raised {type(err).__name__}: {text}{place}"

    def learner_frame(self, err: BaseException) -> tuple[str, str, int] | None:
        """(function, file, line) of the innermost frame of the traceback in the package's own files."""
        folder = str(Path(self.package.__file__).resolve().parent) + "/"
        found, tb = None, err.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if str(Path(code.co_filename).resolve()).startswith(folder):
                found = (code.co_qualname, Path(code.co_filename).name, tb.tb_lineno)
            tb = tb.tb_next
        if isinstance(err, SyntaxError) and str(Path(err.filename or "/").resolve()).startswith(folder):
            found = ("<module>", Path(err.filename).name, err.lineno or 0)  # the file that could not be compiled
        return found


def close(got, want: torch.Tensor, what: str, oracle_name: str, atol: float = ATOL) -> None:
    """Raise a "differs" verdict unless tensor ``got`` is ``want`` to within ``atol``; say by how much and where:
    the first row of a (rows, V) tensor, the first position (dimension -2) of a (B, T, C) or (B, H, T, D) one."""
    if not isinstance(got, torch.Tensor):
        differs(f"{what} is a {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}")
    if got.shape != want.shape:
        differs(f"{what} has shape {tuple(got.shape)}; {oracle_name} has {tuple(want.shape)}")
    diff = (got.detach().float() - want).abs()
    bad = ~(diff <= atol + 1e-5 * want.abs())  # NaN counts as wrong
    if bad.any():
        first = bad.nonzero()[0].tolist()
        where = "" if len(first) < 2 else f" at row {first[0]}" if len(first) == 2 else f" at position {first[-2]}"
        if len(first) >= 3 and want.shape[0] > 1:
            where += f" of row {first[0]}"
        size = "NaN" if diff.isnan().any() else f"up to {diff.nan_to_num(0).max().item():.3g}"
        differs(f"{what} differs from {oracle_name} by {size}, first{where}")


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter one's length if one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def same_ids(got, want: list[int], what: str, oracle_name: str, o: Oracle) -> None:
    """Raise a "differs" verdict unless the token ids ``got`` are ``want``; name the first token that departs."""
    got = list(got) if isinstance(got, (list, tuple)) else got
    if not isinstance(got, list):
        differs(f"{what} gave a {type(got).__name__}, expected a list of token ids")
    if got == want:
        return
    i = first_difference(got, want)
    if i == len(got) or i == len(want):
        differs(f"{what} gives {len(got)} tokens, {oracle_name} {len(want)} (the first {i} agree)")
    differs(f"{what} departs from {oracle_name} at token {i}: {got[i]} ({o.piece(got[i])!r}) "
            f"instead of {want[i]} ({o.piece(want[i])!r})")


# ---------------------------------------------------------------------------------------------- the checks
# Each check takes (probe, oracle) and returns what it found when everything matches.

TOKENIZER_TEXTS = [PROMPT, "I'll pay 100 ducats, won't I?\n\n   Yes!", "naïve café, ’tis 🙂 ☃",
                   "<|endoftext|>Romeo.\nGood morrow."]


def check_tokenizer(probe: Probe, o: Oracle) -> str:
    tokens = probe.module("tokens")
    tok = probe.call(tokens.gpt2_tokenizer)
    texts = TOKENIZER_TEXTS + [o.enc.decode(o.window)]
    tokens_checked = 0
    for text in texts:
        want = o.enc.encode(text, allowed_special="all")
        tokens_checked += len(want)
        got = probe.call(tok.encode, text, allowed_special="all", label=f"Tokenizer.encode({show(text)})")
        if got != want:
            shown = (f"{got}, tiktoken gives {want}" if max(len(got), len(want)) <= 12 else
                     _ids_difference(got, want))
            differs(f"{show(text)} encodes to {shown}")
        back = probe.call(tok.decode, want, label=f"Tokenizer.decode(tiktoken's ids of {show(text)})")
        if back != text:
            differs(f"Tokenizer.decode(tiktoken's ids of {show(text)}) gives {show(back)}")
    return f"{len(texts)} texts ({tokens_checked} tokens) encode and decode as tiktoken's gpt2 does"


def _ids_difference(got: list[int], want: list[int]) -> str:
    i = first_difference(got, want)
    return f"{len(got)} ids, tiktoken {len(want)}; from id {i} on yours are {got[i:i + 6]}, tiktoken's {want[i:i + 6]}"


def check_embeddings(probe: Probe, o: Oracle) -> str:
    embeddings, c = probe.module("embeddings"), o.config
    ids = torch.tensor([o.window])
    table = o.hf.transformer.wte.weight.detach()
    close(probe.call(embeddings.one_hot, ids[0, :6], c.vocab_size, label="one_hot(6 ids, 50257)"),
          F.one_hot(ids[0, :6], c.vocab_size).float(), "one_hot(6 ids, 50257)", "torch's one_hot")
    close(probe.call(embeddings.embedding_lookup, table, ids, label="embedding_lookup(wte, ids of a window)"),
          F.embedding(ids, table), "embedding_lookup(wte, ids of a window)", "torch's embedding")
    emb = probe.call(embeddings.Embeddings, c.vocab_size, c.n_positions, c.n_embd)
    probe.call(emb.load_state_dict, {"wte.weight": table, "wpe.weight": o.hf.transformer.wpe.weight.detach()},
               label="Embeddings.load_state_dict(the model's wte and wpe)")
    close(probe.call(emb, ids, label="Embeddings(ids of a full window)"), o.run.hidden[0],
          "your embeddings of a full window", "Hugging Face's")
    with torch.no_grad():  # the same 8 tokens at positions 40 .. 47, as the KV cache of chapter 7 asks
        want = o.hf(ids[:, :8], position_ids=torch.arange(40, 48)[None], output_hidden_states=True).hidden_states[0]
    close(probe.call(emb, ids[:, :8], offset=40, label="Embeddings(8 ids, offset=40)"), want,
          "your embeddings at offset 40", "Hugging Face's at positions 40 to 47")
    return "one_hot, embedding_lookup and the token and position vectors of a full window equal torch's and " \
           "Hugging Face's"


def check_attention(probe: Probe, o: Oracle) -> str:
    attention, c = probe.module("attention"), o.config
    for t_q, t_k in [(5, 5), (2, 6)]:  # query i sits at position t_k - t_q + i and may read keys 0 .. that
        want = torch.tensor([[j <= t_k - t_q + i for j in range(t_k)] for i in range(t_q)])
        got = probe.call(attention.causal_mask, t_q, t_k)
        if not (isinstance(got, torch.Tensor) and got.dtype == torch.bool and torch.equal(got, want)):
            differs(f"causal_mask({t_q}, {t_k}) gives {_mask_rows(got)}, expected {_mask_rows(want)} "
                    "(True where a query may read a key)")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, generator=g) * 30
    x[:, -2:] = float("-inf")  # masked entries get weight 0
    close(probe.call(attention.softmax, x, -1, label="softmax(scores with -inf, dim=-1)"), torch.softmax(x, -1),
          "softmax(scores with -inf)", "torch.softmax", atol=1e-6)
    q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g).unbind(0)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    got = probe.call(attention.attention, q, k, v, mask, label="attention(q, k, v, causal mask)")
    if not (isinstance(got, tuple) and len(got) == 2):
        differs(f"attention(q, k, v, mask) returned a {type(got).__name__}, expected (output, weights)")
    close(got[0], F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "attention(q, k, v, causal mask)",
          "PyTorch's scaled_dot_product_attention", atol=1e-5)
    attn = probe.call(attention.CausalSelfAttention, c.n_embd, c.n_head)
    hf = o.hf.transformer.h[0].attn  # Hugging Face's Conv1D layers store weights as (in, out): transpose them
    probe.call(attn.load_state_dict, {"c_attn.weight": hf.c_attn.weight.t(), "c_attn.bias": hf.c_attn.bias,
                                      "c_proj.weight": hf.c_proj.weight.t(), "c_proj.bias": hf.c_proj.bias},
               label="CausalSelfAttention.load_state_dict(block 0's weights)")
    with torch.no_grad():
        got = probe.call(attn, o.run.attn_in, label="CausalSelfAttention(block 0's input over a full window)")
    want = o.run.attn_out
    try:
        close(got, want, "your CausalSelfAttention on block 0 of the course's model", "Hugging Face's")
    except Verdict as verdict:
        last_agrees = isinstance(got, torch.Tensor) and got.shape == want.shape and \
            torch.allclose(got[:, -1].float(), want[:, -1], atol=ATOL)
        raise Verdict(DIFFERS, str(verdict) + ("; the last position agrees, so earlier positions read later ones: "
                                               "is the causal mask applied?" if last_agrees else "")) from None
    return "causal_mask, softmax, attention and the multi-head CausalSelfAttention of the model's block 0 equal " \
           "PyTorch's and Hugging Face's"


def _mask_rows(mask) -> str:
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return show(mask)
    return "[" + ", ".join("".join("1" if x else "0" for x in row.tolist()) for row in mask) + "]"


def check_transformer(probe: Probe, o: Oracle) -> str:
    transformer, c, run = probe.module("transformer"), o.config, o.run
    model = probe.call(transformer.GPT.from_pretrained, o.folder, label="GPT.from_pretrained(the course's model)")
    ln = o.hf.transformer.h[0].ln_1
    close(probe.call(model.h[0].ln_1, run.hidden[0], label="LayerNorm (block 0's ln_1)"),
          F.layer_norm(run.hidden[0], (c.n_embd,), ln.weight, ln.bias, c.layer_norm_epsilon),
          "your LayerNorm (block 0's ln_1)", "torch's layer_norm")
    z = torch.linspace(-6, 6, 101)
    close(probe.call(transformer.gelu, z, label="gelu(-6 .. 6)"), F.gelu(z, approximate="tanh"),
          "gelu(-6 .. 6)", "torch's gelu(approximate='tanh')", atol=1e-6)
    for i in range(c.n_layer - 1):  # Hugging Face's last hidden state has ln_f applied: the logits check that one
        close(probe.call(model.h[i], run.hidden[i], label=f"Block {i}"), run.hidden[i + 1],
              f"block {i} of your GPT", f"Hugging Face's block {i}")
    close(probe.call(model, torch.tensor([o.window]), label="GPT(ids of a full window)"), run.logits,
          "your GPT's logits over a full window", "Hugging Face's GPT2LMHeadModel")
    batch = torch.tensor([o.window[:32], o.window[100:132]])
    with torch.no_grad():
        want = o.hf(batch).logits
    close(probe.call(model, batch, label="GPT(a batch of 2 rows)"), want, "your GPT's logits for a batch of 2",
          "Hugging Face's")
    return f"LayerNorm, gelu, the blocks and the logits of a full window and of a batch equal torch's and Hugging " \
           f"Face's GPT2LMHeadModel to {ATOL:g}"


def check_generation(probe: Probe, o: Oracle) -> str:
    generation, model = probe.module("generation"), HFModel(o)
    prompt, n = o.window[:PROMPT_TOKENS], NEW_TOKENS
    call = f"generate(model, tiktoken, prompt, {n})"
    want = hf_generate(o, prompt, n, do_sample=False)
    got = probe.call(generation.generate, model, o.enc, prompt, n, label=call)
    same_ids(got.ids, want, call, "Hugging Face's greedy generate", o)
    text = o.enc.decode([t for t in want if t != o.enc.eot_token])
    if got.text != text:
        differs(f"{call}.text is {show(got.text)}; the ids decode to {show(text)}")
    stop = text[len(text) // 2:len(text) // 2 + 3]  # from the middle of the text: it may also occur earlier
    call = f"generate(model, tiktoken, prompt, {n}, stop={stop!r})"
    cut = probe.call(generation.generate, model, o.enc, prompt, n, stop=stop, label=call)
    if stop and (cut.text, cut.finish_reason) != (text[:text.find(stop)], "stop"):
        differs(f"{call} gives text {show(cut.text)} and finish_reason {cut.finish_reason!r}; expected "
                f"{show(text[:text.find(stop)])} and 'stop'")
    ids, block = o.text, o.config.n_positions  # 8 tokens more than the window holds
    call = f"last_logits(model, {len(ids)} ids)"
    close(probe.call(generation.last_logits, model, ids, label=call),
          o.hf(torch.tensor([ids[-block:]]), logits_to_keep=1).logits[0, -1], call,
          f"Hugging Face's logits after the last {block}")
    prompt = o.window[:block - 2]  # 2 tokens fill the window, the next ones slide it
    call = f"token_stream(model, a prompt of block_size - 2 tokens, {SLIDE_TOKENS})"
    got = probe.call(lambda: list(generation.token_stream(model, prompt, SLIDE_TOKENS)), label=call)
    same_ids(got, hf_drive(o, prompt, SLIDE_TOKENS), call, "Hugging Face's model on the last block_size tokens", o)
    return "greedy ids and text equal Hugging Face's generate, a stop string cuts the text, and the window " \
           "slides past block_size"


def check_samplers(probe: Probe, o: Oracle) -> str:
    from transformers import (MinPLogitsWarper, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    samplers = probe.module("samplers")
    ids = torch.tensor([o.window[:64], o.window[64:128]])  # two rows of real text, with repeated pairs
    with torch.no_grad():
        logits = o.hf(ids, logits_to_keep=1).logits[:, -1]  # (2, V)
    cases = [("apply_temperature", (0.7,), TemperatureLogitsWarper(0.7)),
             ("top_k_filter", (40,), TopKLogitsWarper(40)),
             ("top_p_filter", (0.9,), TopPLogitsWarper(0.9)),
             ("min_p_filter", (0.05,), MinPLogitsWarper(0.05)),
             ("apply_repetition_penalty", (ids, 1.3), RepetitionPenaltyLogitsProcessor(1.3)),
             ("ban_repeated_ngrams", (ids, 2), NoRepeatNGramLogitsProcessor(2))]
    for name, args, processor in cases:
        label = f"{name}(logits, {', '.join('ids' if isinstance(a, torch.Tensor) else repr(a) for a in args)})"
        got = probe.call(getattr(samplers, name), logits.clone(), *args, label=label)
        _same_filtered(got, processor(ids, logits.clone()), label, f"Hugging Face's {type(processor).__name__}")
    settings = dict(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2)
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    choose = probe.call(samplers.Sampler, do_sample=True, seed=0, **settings)
    call = f"Sampler(do_sample=True, {shown}, seed=0) choosing {NEW_TOKENS} tokens"
    got = probe.call(drive, HFModel(o, last_only=True), o.window[:PROMPT_TOKENS], NEW_TOKENS, choose,
                     o.enc.eot_token, label=call)
    want = hf_generate(o, o.window[:PROMPT_TOKENS], NEW_TOKENS, 0, do_sample=True, **settings)
    try:
        same_ids(got, want, call, "Hugging Face's generate after torch.manual_seed(0)", o)
    except Verdict as verdict:
        raise Verdict(DIFFERS, f"{verdict}; the filters match, so look at sample_from_logits") from None
    return "temperature, top-k, top-p, min-p, the repetition penalty and n-gram bans equal Hugging Face's logits " \
           "processors, and seeded sampling draws the tokens generate draws"


def _same_filtered(got, want: torch.Tensor, what: str, oracle_name: str) -> None:
    """Logits after a filter: the same tokens removed (-inf), the others equal."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        for row, (g, w) in enumerate(zip(got.detach().float(), want)):
            kept_got, kept_want = ~torch.isneginf(g), ~torch.isneginf(w)
            if not torch.equal(kept_got, kept_want):
                extra = (kept_got & ~kept_want).nonzero().flatten().tolist()
                more = f", such as token {extra[0]}, which it removes" if extra else ""
                differs(f"{what} keeps {int(kept_got.sum())} tokens of row {row}; {oracle_name} keeps "
                        f"{int(kept_want.sum())}{more}")
        got = got.masked_fill(torch.isneginf(want), 0.0)
        want = want.masked_fill(torch.isneginf(want), 0.0)
    close(got, want, what, oracle_name)


def check_beam_search(probe: Probe, o: Oracle) -> str:
    samplers, prompt = probe.module("samplers"), o.window[:PROMPT_TOKENS]
    ends = [o.enc.eot_token, o.enc.encode("\n")[0]]  # a line break ends a hypothesis too: some end early
    call = f"beam_search(model, prompt, {NEW_TOKENS}, num_beams=3, length_penalty=1.0, eos_ids=[eot, newline])"
    want = hf_generate(o, prompt, NEW_TOKENS, do_sample=False, num_beams=3, length_penalty=1.0, eos_token_id=ends)
    got = probe.call(samplers.beam_search, HFModel(o), prompt, NEW_TOKENS, 3, 1.0, ends, label=call)
    same_ids(got, _until_end(want, set(ends)), call, "Hugging Face's generate(num_beams=3)", o)
    return "the best of 3 beams equals Hugging Face's beam search, with hypotheses that end early"


def check_kv_cache(probe: Probe, o: Oracle) -> str:
    kv_cache, c, run = probe.module("kv_cache"), o.config, o.run
    model = probe.call(probe.module("transformer").GPT.from_pretrained, o.folder,
                       label="GPT.from_pretrained(the course's model)")
    idx, prefill = torch.tensor([o.window[:40]]), 37
    cache = probe.call(kv_cache.KVCache, c.n_layer)
    close(probe.call(kv_cache.forward_with_cache, model, idx[:, :prefill], cache,
                     label=f"forward_with_cache(model, {prefill} tokens, an empty cache)"),
          run.logits[:, :prefill], "the prefill's logits", "Hugging Face's")
    for layer in range(c.n_layer):
        hf_layer = run.cache.layers[layer]
        close(cache.keys[layer], hf_layer.keys[:, :, :prefill], f"KVCache.keys[{layer}] after the prefill",
              "Hugging Face's cache")
        close(cache.values[layer], hf_layer.values[:, :, :prefill], f"KVCache.values[{layer}] after the prefill",
              "Hugging Face's cache")
    for step, t in enumerate(range(prefill, 40), start=1):
        got = probe.call(kv_cache.forward_with_cache, model, idx[:, t:t + 1], cache,
                         label=f"forward_with_cache(model, 1 token, the cache) at decode step {step}")
        close(got, run.logits[:, t:t + 1], f"the logits of decode step {step} (position {t})", "Hugging Face's")
    for prompt, n, where in [(o.window[:PROMPT_TOKENS], NEW_TOKENS, ""),
                             (o.window[:c.n_positions - 2], SLIDE_TOKENS, " past the window")]:
        cached = probe.call(drive, probe.call(kv_cache.CachedModel, model), prompt, n, None, o.enc.eot_token,
                            label=f"greedy generation{where} through CachedModel")
        same_ids(cached, drive(model, prompt, n, None, o.enc.eot_token), f"cached generation{where}",
                 "uncached generation of the same model", o)
        if not where:
            same_ids(cached, hf_generate(o, prompt, n, do_sample=False), "cached generation",
                     "Hugging Face's generate with its own cache", o)
    held = sum(layer.keys.nbytes + layer.values.nbytes for layer in run.cache.layers)
    got = probe.call(kv_cache.kv_cache_bytes, model.config, len(o.window))
    if got != held:
        differs(f"kv_cache_bytes(config, {len(o.window)}) is {got}; Hugging Face's cache of {len(o.window)} "
                f"tokens holds {held} bytes")
    return "the prefill fills Hugging Face's keys and values, decode steps give its logits, CachedModel generates " \
           "what the model does without it (past the window too), and kv_cache_bytes is what the cache holds"


def check_training(probe: Probe, o: Oracle) -> str:
    import copy

    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
    from transformers import GPT2Config, GPT2LMHeadModel

    training = probe.module("training")
    window = torch.tensor(o.window)
    logits, targets = o.run.logits[:, :-1], window[None, 1:]  # (1, T, V): each position and the token after it
    got = probe.call(training.cross_entropy, logits, targets, label="cross_entropy(logits of a window, its next ids)")
    close(got, F.cross_entropy(logits.flatten(0, 1), targets.flatten()), "cross_entropy(logits, targets)",
          "torch.nn.functional.cross_entropy")

    ids = torch.arange(1000)  # id i at position i: a window shows where it was cut
    call = "get_batch(ids, 8, 16, generator)"
    x, y = probe.call(training.get_batch, ids, 8, 16, torch.Generator().manual_seed(0), label=call)
    for name, t in (("windows", x), ("targets", y)):
        if not isinstance(t, torch.Tensor) or t.shape != (8, 16) or t.dtype != torch.long:
            differs(f"{call}'s {name} should be a long tensor of shape (8, 16), got "
                    f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if not (torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long)) and x.min() >= 0
            and x.max() < len(ids)):
        differs(f"{call} gives windows that are not runs of consecutive ids of the text (first: {x[0].tolist()})")
    if not torch.equal(y, x + 1):
        differs(f"{call}'s targets are not the windows moved one token on (first window starts at {int(x[0, 0])}, "
                f"its targets at {int(y[0, 0])})")

    schedule = dict(max_lr=6e-4, min_lr=6e-5, warmup_steps=10, max_steps=100)
    param = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([param], lr=schedule["max_lr"])
    torch_lr = SequentialLR(sgd, [LinearLR(sgd, 1 / 10, 1.0, total_iters=9), CosineAnnealingLR(sgd, 90, 6e-5)], [10])
    for step in range(101):
        got = probe.call(training.lr_at, step, **schedule, label=f"lr_at({step}, max_lr=6e-4, min_lr=6e-5, "
                                                                  "warmup_steps=10, max_steps=100)")
        want = sgd.param_groups[0]["lr"]
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-6):
            differs(f"lr_at({step}, ...) is {got!r}; PyTorch's LinearLR then CosineAnnealingLR give {want:.4g}")
        sgd.step()
        torch_lr.step()

    config = GPT2Config(vocab_size=o.config.vocab_size, n_positions=16, n_embd=32, n_layer=1, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    # In float64: AdamW divides by |gradient| + 1e-8, so a float32 gradient that is rounding noise (the keys' bias
    # gets none in exact arithmetic) moves its weight by up to lr = 1e-3, past ATOL; float64's noise stays far below
    # 1e-8 (a correct step agrees to 1e-13 measured, 3e-6 in float32)
    with torch.random.fork_rng(devices=[]), quiet_transformers():
        torch.manual_seed(0)
        theirs = GPT2LMHeadModel(config).double()
    yours = copy.deepcopy(theirs)
    x, y = window[:32].view(2, 16), window[1:33].view(2, 16)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    opt_yours = torch.optim.AdamW(yours.parameters(), lr=1e-3)
    with torch.enable_grad():
        for step in (1, 2):
            loss = F.cross_entropy(theirs(x).logits.flatten(0, 1), y.flatten())
            opt_theirs.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
            opt_theirs.step()
            call = f"train_step(model, AdamW, x, y) (step {step})"
            got = probe.call(training.train_step, TrainableHF(yours), opt_yours, x, y, label=call)
            if not isinstance(got, float) or not math.isclose(got, loss.item(), rel_tol=1e-4):
                differs(f"{call} returned {got!r}; the batch's loss before the step is {loss.item():.4f}")
            for (name, mine), want in zip(yours.named_parameters(), theirs.parameters()):
                close(mine.detach(), want.detach(), f"the weight {name} after {call}",
                      "PyTorch's step (cross-entropy, backward, gradients clipped to norm 1, AdamW)")
    return "cross_entropy equals PyTorch's, get_batch cuts windows with their next tokens, lr_at is PyTorch's " \
           "warm-up and cosine schedulers, and train_step takes the step PyTorch takes, gradients clipped"


class TrainableHF(torch.nn.Module):
    """A Hugging Face model that train_step can train: ``model(idx)`` gives logits, with gradients."""

    def __init__(self, hf: torch.nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(idx, use_cache=False).logits


CONSTRAINED_PATTERN = "(red|green|blue)( and (red|green|blue))?"
CONSTRAINED_WORDS = [a + b for a in ("red", "green", "blue") for b in ("", " and red", " and green", " and blue")]
CONSTRAINED_CHOICES = ["ROMEO", "Roméo", "Romeo"]  # é is two bytes: GPT-2 may spell it across two tokens
CONSTRAINED_PROMPT = "Name three colours: "


@functools.cache
def gpt2_bytes() -> tuple[list[bytes | None], dict[bytes, list[int]]]:
    """tiktoken's bytes of each GPT-2 id (None for the end-of-text), and the ids of each byte string."""
    enc = coursekit.gpt2_encoding()
    vocab = [None if i == enc.eot_token else enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
    ids: dict[bytes, list[int]] = {}
    for i, piece in enumerate(vocab):
        if piece is not None:
            ids.setdefault(piece, []).append(i)
    return vocab, ids


def allowed_by_prefix(written: bytes, words: list[bytes]) -> torch.Tensor:
    """The oracle's mask: the tokens after which the bytes written are still the start of a word (each token
    whose bytes begin what is left of a word), and the end of text once they are a whole word."""
    vocab, ids = gpt2_bytes()
    allowed = torch.zeros(len(vocab), dtype=torch.bool)
    for word in words:
        if word.startswith(written):
            rest = word[len(written):]
            for k in range(1, len(rest) + 1):
                allowed[ids.get(rest[:k], [])] = True
    allowed[coursekit.gpt2_encoding().eot_token] = written in words
    return allowed


def _constrained_oracle_mask(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Hugging Face's prefix_allowed_tokens_fn for the check's pattern (module-level: hf_generate caches by it)."""
    vocab, _ = gpt2_bytes()
    new = ids[len(coursekit.gpt2_encoding().encode_ordinary(CONSTRAINED_PROMPT)):].tolist()
    written = b"".join(vocab[i] or b"" for i in new)
    return allowed_by_prefix(written, [w.encode() for w in CONSTRAINED_WORDS]).nonzero().flatten().tolist()


def check_constrained(probe: Probe, o: Oracle) -> str:
    import re

    constrained, V, eos = probe.module("constrained"), o.config.vocab_size, o.enc.eot_token
    want_vocab, _ = gpt2_bytes()
    vocab = probe.call(constrained.vocabulary, o.enc, V, label=f"vocabulary(tiktoken's gpt2, {V})")
    if not isinstance(vocab, list) or len(vocab) != V:
        differs(f"vocabulary(...) should be a list of {V} entries, got {type(vocab).__name__} of "
                f"{len(vocab) if hasattr(vocab, '__len__') else '?'}")
    bad = next((i for i in range(V) if vocab[i] != want_vocab[i]), None)
    if bad is not None:
        differs(f"vocabulary(...)[{bad}] is {vocab[bad]!r}; tiktoken's bytes for that id are {want_vocab[bad]!r}")

    choices = probe.call(constrained.Constraint.choices, CONSTRAINED_CHOICES, o.enc,
                         label=f"Constraint.choices({CONSTRAINED_CHOICES!r}, tiktoken's gpt2)")
    rom = o.enc.encode_ordinary("Rom")
    for ids in ([], rom, rom + [o.enc.encode_single_token(b"\xc3")]):  # the last ends inside the bytes of é
        written = b"".join(want_vocab[i] for i in ids)
        got = probe.call(choices.allowed, ids, label=f"Constraint.choices(...).allowed(the ids of {written!r})")
        _same_mask(got, allowed_by_prefix(written, [w.encode() for w in CONSTRAINED_CHOICES]),
                   f"Constraint.choices({CONSTRAINED_CHOICES!r}).allowed after {written!r}", o)

    constraint = probe.call(constrained.Constraint.regex, CONSTRAINED_PATTERN, o.enc,
                            label=f"Constraint.regex({CONSTRAINED_PATTERN!r}, tiktoken's gpt2)")
    prompt = o.enc.encode_ordinary(CONSTRAINED_PROMPT)
    want = hf_generate(o, prompt, 12, do_sample=False, prefix_allowed_tokens_fn=_constrained_oracle_mask)
    text = o.enc.decode([t for t in want if t != eos])
    if not re.fullmatch(CONSTRAINED_PATTERN, text):  # the oracle itself: its words are the pattern's language
        raise AssertionError(f"the oracle wrote {text!r}, which {CONSTRAINED_PATTERN!r} does not match")
    call = f"constrained_generate(model, tokenizer, {CONSTRAINED_PROMPT!r}, Constraint.regex(...), 12, " \
           "use_cache=False)"
    out = probe.call(constrained.constrained_generate, HFModel(o), o.enc, prompt, constraint, 12, use_cache=False,
                     label=call)
    same_ids(getattr(out, "ids", out), want, call, "Hugging Face's generate, masked by prefix_allowed_tokens_fn", o)
    return "the vocabulary is tiktoken's bytes, masks allow exactly the tokens that keep the bytes a prefix of an " \
           "answer (inside a character too), and constrained greedy decoding writes what Hugging Face's generate " \
           "writes with the same masks"


def _same_mask(got, want: torch.Tensor, what: str, o: Oracle) -> None:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.bool:
        differs(f"{what} should be a bool tensor of shape {tuple(want.shape)}, got "
                f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
    extra, missing = (got & ~want).nonzero().flatten().tolist(), (want & ~got).nonzero().flatten().tolist()
    if extra:
        differs(f"{what}: {len(extra)} token(s) allowed that no answer starts with, such as {extra[0]} "
                f"({o.piece(extra[0])!r})")
    if missing:
        differs(f"{what}: {len(missing)} token(s) refused that an answer starts with, such as {missing[0]} "
                f"({o.piece(missing[0])!r})")


BATCH_PROMPTS = [PROMPT, "Friends, Romans, countrymen, lend me your ears;", "O"]  # 3, 11 and 1 tokens


def check_batching(probe: Probe, o: Oracle) -> str:
    batching, eot = probe.module("batching"), o.enc.eot_token
    model = probe.call(probe.module("transformer").GPT.from_pretrained, o.folder,
                       label="GPT.from_pretrained(the course's model)")
    prompts = [o.enc.encode(p) for p in BATCH_PROMPTS]
    T = max(map(len, prompts))
    ids = torch.tensor([[eot] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    call = f"left_pad(<{len(prompts)} prompts of {', '.join(str(len(p)) for p in prompts)} tokens>, {eot})"
    got = probe.call(batching.left_pad, prompts, eot, label=call)
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
            and got[0].shape == ids.shape and got[1].shape == mask.shape
            and torch.equal(got[0], ids) and torch.equal(got[1].long(), mask)):
        differs(f"{call} gives {show(got)}; the prompts padded on the left are {ids.tolist()}, the mask "
                f"{mask.tolist()}")
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # Hugging Face's own positions for padding
    want = o.hf(ids, attention_mask=mask, position_ids=positions).logits
    call = "forward_padded(model, the padded prompts, mask)"
    logits = probe.call(batching.forward_padded, model, ids, mask, label=call)
    for b, p in enumerate(prompts):
        row = logits[b, -len(p):] if isinstance(logits, torch.Tensor) and logits.dim() == 3 else logits
        close(row, want[b, -len(p):], f"{call}: the logits of row {b}'s tokens", "Hugging Face's on the same batch")
    call = f"generate_batch(model, tiktoken, <the {len(prompts)} prompts>, {NEW_TOKENS})"
    generations = probe.call(batching.generate_batch, model, o.enc, prompts, NEW_TOKENS, label=call)
    for b, p in enumerate(prompts):
        same_ids(generations[b].ids, hf_generate(o, p, NEW_TOKENS, do_sample=False), f"row {b} of {call}",
                 "Hugging Face's greedy generate of that prompt alone", o)
    return "left padding and its mask, each row's logits in a padded batch equal Hugging Face's, and every row " \
           "of a batched greedy generation is what Hugging Face writes for its prompt alone"


@dataclasses.dataclass(frozen=True)
class Piece:
    name: str
    chapter: str  # the notebook to reopen
    check: Callable[[Probe, Oracle], str]
    needs: tuple[str, ...] = ()  # earlier pieces this one is built from


PIECES = [
    Piece("tokenizer", "01-tokens", check_tokenizer),
    Piece("embeddings", "02-embeddings", check_embeddings),
    Piece("attention", "03-attention", check_attention),
    Piece("transformer", "04-transformer", check_transformer, needs=("embeddings", "attention")),
    Piece("generation loop", "05-generation", check_generation),
    Piece("samplers", "06-samplers", check_samplers),
    Piece("beam search", "06-samplers", check_beam_search, needs=("generation loop",)),  # it calls last_logits
    Piece("kv-cache", "07-kv-cache", check_kv_cache, needs=("transformer",)),
    Piece("training", "08-training", check_training),
    # constrained_generate runs the loop of chapter 5 with the Sampler of chapter 6
    Piece("constrained decoding", "09-constrained", check_constrained, needs=("generation loop", "samplers")),
    # generate_batch runs the transformer through the cache, with the loop's Row and a Sampler per row
    Piece("batching", "10-batching", check_batching, needs=("transformer", "kv-cache", "generation loop", "samplers")),
]


# ---------------------------------------------------------------------------------------------- the report

@dataclasses.dataclass
class PieceResult:
    piece: str
    chapter: str
    status: str  # matches | differs | not written yet | crashed | waits
    message: str  # one line, in the notebook's words
    waits_for: tuple[str, ...] = ()  # for "waits": the pieces to fix first


@isolated()
def compare(package: ModuleType, model_dir: str | Path | None = None,
            pieces: list[str] | None = None) -> "Report":
    """Check each piece of ``package`` against its oracle on the GPT-2 folder ``model_dir`` (the course's model
    by default). ``pieces`` names the pieces to check (all by default); the pieces they need are checked too."""
    o = oracle(model_dir)
    wanted = _with_needs(pieces)
    results: dict[str, PieceResult] = {}
    for piece in PIECES:
        if piece.name not in wanted:
            continue
        blockers = [root for need in piece.needs for root in
                    (results[need].waits_for if results[need].status == WAITS else
                     () if results[need].status == MATCHES else (need,))]
        if blockers:
            blockers = tuple(dict.fromkeys(blockers))
            results[piece.name] = PieceResult(piece.name, piece.chapter, WAITS, f"waits for: {', '.join(blockers)}",
                                              waits_for=blockers)
            continue
        probe = Probe(package)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                status, message = MATCHES, piece.check(probe, o)
        except Exception as err:  # noqa: BLE001 (whatever your code raises is part of the report)
            status, message = probe.verdict(err)
        results[piece.name] = PieceResult(piece.name, piece.chapter, status, message)
    return Report(results.values())


def _with_needs(names: list[str] | None) -> set[str]:
    by_name = {p.name: p for p in PIECES}
    if names is None:
        return set(by_name)
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ValueError(f"no piece named {', '.join(map(repr, unknown))}; the pieces are {', '.join(by_name)}")
    wanted, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(by_name[name].needs)
    return wanted


_STYLE = {MATCHES: ("✓", "#1a7f37"), DIFFERS: ("✗", "#cf222e"), CRASHED: ("!", "#cf222e"),
          NOT_WRITTEN: ("○", "#6e7781"), WAITS: ("…", "#9a6700")}


class Report(list):
    """compare's results, one PieceResult per piece in course order; a notebook shows it as a table."""

    @property
    def status(self) -> dict[str, str]:
        return {r.piece: r.status for r in self}

    def result(self, piece: str) -> PieceResult:
        found = [r for r in self if r.piece == piece]
        if not found:
            raise KeyError(f"no piece {piece!r} in this report (it has {', '.join(r.piece for r in self)})")
        return found[0]

    def next_steps(self) -> str:
        """What to do about each piece that does not match yet, chapter by chapter."""
        lines = []
        for r in self:
            notebook = f"{r.chapter}/{r.chapter}.ipynb"
            if r.status == WAITS:
                verb = "matches" if len(r.waits_for) == 1 else "match"
                line = f"{r.piece}: checked once {' and '.join(r.waits_for)} {verb}."
            elif r.status == NOT_WRITTEN:
                line = f"{r.piece}: finish {notebook} ({r.message})."
            elif r.status != MATCHES:
                line = f"{r.piece} {r.status} (reopen {notebook} and run its test cells): {r.message}"
            else:
                continue
            lines.append(textwrap.fill(line, 76, initial_indent="- ", subsequent_indent="  "))
        if not lines:
            return ("Every piece matches: your package is GPT-2, from text to tokens to text, and it writes what "
                    "Hugging Face writes, token for token.")
        return ("Save each notebook you change, then run this notebook again from the top.\n" + "\n".join(lines))

    def _repr_html_(self) -> str:
        rows = []
        for r in self:
            mark, colour = _STYLE[r.status]
            rows.append(f"<tr><td data-label='piece'>{html.escape(r.piece)}</td>"
                        f"<td data-label='chapter'>{r.chapter}</td>"
                        f"<td data-label='status' style='color:{colour};white-space:nowrap'><b>{mark}</b> "
                        f"{r.status}</td>"
                        f"<td data-label='what the check found' style='text-align:left'>{html.escape(r.message)}</td>"
                        "</tr>")
        head = "".join(f"<th style='text-align:left'>{h}</th>"
                       for h in ["piece", "chapter", "status", "what the check found"])
        # class reflow: on the book's pages at a phone's width each row is a block, each cell a line of it headed by
        # its column's name (book/_theme/layout.css), instead of a message column squeezed to a word a line
        return f"<table class='reflow'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


_WORST_FIRST = [CRASHED, DIFFERS, NOT_WRITTEN, WAITS, MATCHES]
_FILL = {MATCHES: "#d7f5d0", DIFFERS: "#ffd7d5", CRASHED: "#ffd7d5", NOT_WRITTEN: "#eaeef2", WAITS: "#fff1c2",
         None: "#ddf4ff"}


def draw_pipeline(report: Report | None = None, prompt: str = PROMPT, model_dir: str | Path | None = None,
                  model=None):
    """The pieces as one token goes through them, with the shapes of the course's model for ``prompt``; each
    box coloured by the report's status of its pieces (a box of several pieces takes the worst). A Figure.
    ``model``, a GPT holding the course's weights (``model(idx)`` gives logits, ``model.config`` its shape), picks
    the next token shown instead of Hugging Face's oracle, which is then not loaded (nor transformers imported)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if model is None:
        o = oracle(model_dir)
        c, enc, piece = o.config, o.enc, o.piece
        forward = lambda idx: o.hf(idx).logits
    else:
        c, enc, forward = model.config, coursekit.gpt2_encoding(), model
        piece = lambda token: enc.decode([token])
    ids = enc.encode(prompt, allowed_special="all")
    with torch.no_grad():
        next_id = int(forward(torch.tensor([ids]))[0, -1].argmax())
    status = report.status if report is not None else {}

    def fill(*pieces):
        found = [status[p] for p in pieces if p in status]
        return _FILL[min(found, key=_WORST_FIRST.index) if found else None]

    # Top to bottom, as narrow as a phone's screen (coursekit.figures): a box a piece, the shapes on the arrows.
    fig = plt.figure(figsize=figures.size(5.6))
    ax = fig.add_axes((0.025, 0, 0.95, 1), xlim=(-0.1, 10), ylim=(0.4, 14.4))  # savefig pads 0.1 inch around
    ax.axis("off")
    arrow, x = dict(arrowstyle="->", color="#555"), 4.3  # the boxes' middle line
    boxes = [(12.1, "tokenizer, ch. 1", ("tokenizer",)), (10.1, "embeddings, ch. 2", ("embeddings",)),
             (7.6, f"{c.n_layer} blocks:\nattention, ch. 3,\nand MLP, ch. 4", ("attention", "transformer")),
             (5.0, "ln_f, lm_head, ch. 4", ("transformer",)), (3.0, "sampler, ch. 6", ("samplers", "beam search"))]
    for y, label, pieces in boxes:
        high = 0.5 + 0.35 * label.count("\n")
        ax.add_patch(FancyBboxPatch((x - 2.4, y - high), 4.8, 2 * high, boxstyle="round,pad=0.05",
                                    fc=fill(*pieces), ec="#555"))
        ax.text(x, y, label, ha="center", va="center", fontsize=9)
    shapes = [f"{len(ids)} ids", f"(1, {len(ids)}, {c.n_embd})", f"(1, {len(ids)}, {c.n_embd})",
              f"logits (1, {len(ids)}, {c.vocab_size:,})"]
    ends = [(y + 0.6 + 0.35 * label.count("\n"), y - 0.6 - 0.35 * label.count("\n")) for y, label, _ in boxes]
    for (_, bottom), (top, _), shape in zip(ends, ends[1:], shapes):
        ax.annotate("", (x, top), (x, bottom), arrowprops=arrow)
        ax.text(x + 0.25, (top + bottom) / 2, shape, ha="left", va="center", fontsize=8, color="#333")
    ax.text(x, 13.8, f"text: {prompt!r}"[:40], ha="center", va="center", fontsize=9, family="monospace")
    ax.annotate("", (x, ends[0][0]), (x, 13.4), arrowprops=arrow)
    ax.annotate("", (x, 1.6), (x, ends[-1][1]), arrowprops=arrow)
    ax.text(x, 1.2, f"next token: {piece(next_id)!r}", ha="center", va="center", fontsize=9, color="#333")
    # The cache sits beside the blocks; the loop takes the chosen token back to the embeddings.
    ax.add_patch(FancyBboxPatch((7.55, 6.4), 2.35, 2.4, boxstyle="round,pad=0.05", fc=fill("kv-cache"), ec="#555"))
    ax.text(8.72, 7.6, f"KV cache,\nch. 7: {c.n_layer} layers\nof keys and\nof values, each\n(1, {c.n_head}, T, "
            f"{c.n_embd // c.n_head})", ha="center", va="center", fontsize=8)
    ax.annotate("", (7.5, 7.6), (x + 2.47, 7.6), arrowprops=dict(arrowstyle="<->", color="#555"))
    ax.plot([x - 2.47, 0.55, 0.55], [3.0, 3.0, 10.1], color="#555", lw=1)
    ax.annotate("", (x - 2.47, 10.1), (0.55, 10.1), arrowprops=arrow)
    ax.text(0.55, 6.55, "generation loop, ch. 5:\nappend the token, run again", ha="center", va="center",
            rotation=90, fontsize=8, bbox=dict(boxstyle="round,pad=0.3", fc=fill("generation loop"), ec="#555"))
    plt.close(fig)  # shown once, as the value of the cell, not again by the inline backend
    return fig


# ---------------------------------------------------------------------------------------------- side by side

@dataclasses.dataclass
class Column:
    name: str
    ids: list[int] | None  # the new tokens; None when this column could not write
    text: str  # what it wrote, or why it could not


@dataclasses.dataclass
class SideBySide:
    prompt: str
    seed: int
    settings: dict
    columns: list[Column]  # the last one is Hugging Face's, which the others are compared with
    piece: Callable[[int], str] = dataclasses.field(repr=False)

    def agreement(self, name: str) -> int | None:
        """How many tokens of column ``name``, from the first, equal Hugging Face's; None if it wrote nothing."""
        col, hf = next(c for c in self.columns if c.name == name), self.columns[-1].ids
        if col.ids is None or hf is None:
            return None
        return first_difference(col.ids, hf)

    def _repr_html_(self) -> str:
        hf = self.columns[-1]
        cells, notes = [], []
        for col in self.columns:
            prompt = f"<span style='color:#6e7781'>{_visible(self.prompt)}</span>"
            if col.ids is None:
                cells.append(f"<em style='color:#6e7781'>{html.escape(col.text)}</em>")
                notes.append("")
                continue
            agree = self.agreement(col.name)
            cells.append(prompt + "".join(
                f"<span title='id {t}'{_DEPARTED if i >= agree else ''}>{_visible(self.piece(t))}</span>"
                for i, t in enumerate(col.ids)))
            notes.append("the oracle" if col is hf else
                         f"all {len(col.ids)} tokens as Hugging Face's" if col.ids == hf.ids else
                         f"departs from Hugging Face at token {agree}")
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        names = [html.escape(c.name, quote=True) for c in self.columns]
        # one row, a column's note under its text; on the book's pages at a phone's width the columns stack, each
        # headed by its name (class reflow: book/_theme/layout.css)
        cell = "<td data-label=\"{}\" style='vertical-align:top;text-align:left'>"
        return (f"<table class='reflow' style='width:100%;table-layout:fixed'>"
                f"<thead><tr>{''.join(f'<th>{n}</th>' for n in names)}</tr></thead><tbody><tr>"
                + "".join(cell.format(name) + f"<div style='font-family:monospace;font-size:85%'>{c}</div>"
                          f"<em>{note}</em></td>" for name, c, note in zip(names, cells, notes))
                + "</tr></tbody></table>"
                f"<p style='font-size:85%'>seed {self.seed}, {settings}; tokens on red depart from Hugging Face's.</p>")


_DEPARTED = " style='background:#ffd7d5'"


def _visible(text: str) -> str:
    return html.escape(text).replace("\n", "↵<br>")


@isolated()
def generate_side_by_side(package: ModuleType, prompt: str = PROMPT, max_new_tokens: int = 40, seed: int = 0,
                          model_dir: str | Path | None = None, name: str = "your package", **settings) -> SideBySide:
    """Sample a continuation of ``prompt`` with one seed three times: with all of ``package`` (its tokenizer, its
    GPT with the course's weights behind its CachedModel, its samplers and loop), with the course's reference
    package where it is installed, and with Hugging Face's generate. ``settings`` default to SAMPLING; ``name``
    heads the package's column."""
    settings = {**SAMPLING, **settings}
    o = oracle(model_dir)
    reference, why = reference_package()
    columns = [_package_column(name, package, o, prompt, max_new_tokens, seed, settings),
               _reference_column(reference, o, prompt, max_new_tokens, seed, settings)
               if reference else Column("the course's reference", None, why)]
    ids = hf_generate(o, o.enc.encode(prompt, allowed_special="all"), max_new_tokens, seed, do_sample=True, **settings)
    columns.append(Column("Hugging Face", ids, o.enc.decode([t for t in ids if t != o.enc.eot_token])))
    return SideBySide(prompt, seed, settings, columns, o.piece)


def _reference_column(reference: ModuleType, o: Oracle, prompt: str, n: int, seed: int, settings: dict) -> Column:
    """The course's reference package's column, written once for each prompt, length, seed and settings with this
    oracle: the same beside every package."""
    key = ("reference column", reference.__file__, prompt, n, seed, repr(sorted(settings.items())))
    if key not in o.generated:
        o.generated[key] = _package_column("the course's reference", reference, o, prompt, n, seed, settings)
    column = o.generated[key]
    return Column(column.name, None if column.ids is None else list(column.ids), column.text)


def _package_column(name: str, package: ModuleType, o: Oracle, prompt: str, n: int, seed: int,
                    settings: dict) -> Column:
    probe = Probe(package)
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = probe.call(probe.module("tokens").gpt2_tokenizer)
            gpt = probe.call(probe.module("transformer").GPT.from_pretrained, o.folder,
                             label="GPT.from_pretrained(the course's model)")
            model = probe.call(probe.module("kv_cache").CachedModel, gpt)
            out = probe.call(probe.module("samplers").generate, model, tokenizer, prompt, n, do_sample=True, seed=seed,
                             **settings, label=f"generate(CachedModel(GPT), tokenizer, {prompt!r}, {n}, ...)")
        return Column(name, list(out.ids), out.text)
    except Exception as err:  # noqa: BLE001 (a piece that does not work yet is shown, not raised)
        status, message = probe.verdict(err)
        return Column(name, None, message if status == NOT_WRITTEN else f"{status}: {message}")
