"""The reference GPT (minigpt.transformer) against Hugging Face's GPT2LMHeadModel, the oracle for chapter 4.

Random-weight GPT-2s of several shapes stand in for downloads (DESIGN.md, invariant 5): they are saved to
local folders in Hugging Face's format and loaded both ways. The online path, `GPT.from_pretrained("org/name")`,
runs against a Hugging Face hub cache written in a temporary folder, offline.
"""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

from minigpt.transformer import GPT, GPTConfig, LayerNorm, gelu, state_dict_from_hf, state_dict_to_hf

LOGITS_ATOL = 1e-4

CONFIGS = {  # shapes unlike GPT-2 small in every way: odd vocabularies, one layer, many heads, eps
    "tiny": dict(vocab_size=101, n_positions=16, n_layer=1, n_head=1, n_embd=8, layer_norm_epsilon=1e-5),
    "wide": dict(vocab_size=317, n_positions=24, n_layer=3, n_head=6, n_embd=48, layer_norm_epsilon=1e-5),
    "deep": dict(vocab_size=257, n_positions=32, n_layer=6, n_head=4, n_embd=32, layer_norm_epsilon=1e-3),
}


def hf_model(seed: int, **shape) -> GPT2LMHeadModel:
    """A Hugging Face GPT-2 with random weights everywhere, LayerNorms and biases included (HF initialises
    those to 1 and 0, which would hide a LayerNorm or bias that is loaded into the wrong place)."""
    torch.manual_seed(seed)
    config = GPT2Config(**shape, activation_function="gelu_new", bos_token_id=None, eos_token_id=None,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "ln_" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3 if p.dim() == 1 or "wte" in name or "wpe" in name else 0.1)
    return model


def logits(model, idx) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def inputs(vocab_size: int, block_size: int, seed: int = 1) -> list[torch.Tensor]:
    """One position, a full context, and a batch of ragged-looking length."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, shape, generator=g) for shape in [(1, 1), (2, block_size), (3, 7)]]


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_hugging_face(tmp_path, name):
    shape = CONFIGS[name]
    hf = hf_model(seed=len(name), **shape)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    assert ours.config == GPTConfig(vocab_size=shape["vocab_size"], block_size=shape["n_positions"],
                                    n_layer=shape["n_layer"], n_head=shape["n_head"], n_embd=shape["n_embd"],
                                    layer_norm_epsilon=shape["layer_norm_epsilon"])
    for idx in inputs(shape["vocab_size"], shape["n_positions"]):
        got, want = logits(ours, idx), logits(hf, idx)
        assert got.shape == want.shape == (*idx.shape, shape["vocab_size"])
        torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny", "wide"])
def test_save_pretrained_loads_in_hugging_face_with_equal_logits(tmp_path, name):
    shape = CONFIGS[name]
    config = GPTConfig(vocab_size=shape["vocab_size"], block_size=shape["n_positions"], n_layer=shape["n_layer"],
                       n_head=shape["n_head"], n_embd=shape["n_embd"], layer_norm_epsilon=shape["layer_norm_epsilon"])
    torch.manual_seed(0)
    ours = GPT(config).eval()
    ours.save_pretrained(tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr(), "HF must tie the head too"
    for idx in inputs(config.vocab_size, config.block_size):
        torch.testing.assert_close(logits(ours, idx), logits(hf, idx), atol=LOGITS_ATOL, rtol=0)
    # ... and back: our own loader reads what we wrote, bit for bit.
    again = GPT.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), again.state_dict().values()))


def test_save_pretrained_in_half_precision(tmp_path):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    ours.save_pretrained(tmp_path, dtype=torch.bfloat16)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert hf.transformer.wte.weight.dtype == torch.float32
    idx = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(logits(GPT.from_pretrained(tmp_path), idx), logits(hf, idx), atol=LOGITS_ATOL, rtol=0)
    torch.testing.assert_close(logits(hf, idx), logits(ours, idx), atol=0.05, rtol=0.05)  # bfloat16 rounding


def test_weights_are_tied():
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=8))
    assert model.lm_head.weight is model.emb.wte.weight
    assert "lm_head.weight" not in state_dict_to_hf(model.state_dict())


def test_gpt2_small_has_as_many_parameters_as_hugging_face():
    """Counted on the meta device: the shapes without the memory."""
    with torch.device("meta"):
        ours, hf = GPT(GPTConfig()), GPT2LMHeadModel(GPT2Config())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731 (parameters() skips the tied copy)
    assert count(ours) == count(hf) == 124_439_808


def test_layer_norm_and_gelu_equal_torch():
    torch.manual_seed(0)
    ln = LayerNorm(12, eps=1e-3)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    x = torch.randn(3, 5, 12) * 4 + 2
    torch.testing.assert_close(ln(x), F.layer_norm(x, (12,), ln.weight, ln.bias, 1e-3), atol=1e-5, rtol=0)
    x = torch.linspace(-10, 10, 2001)
    # values up to 10, where a float32 ulp is 9.5e-7: tanh's implementations (vectorised per CPU) differ by an ulp or
    # two, so relative to the value (8 ulps) as well as 1e-6 near 0
    torch.testing.assert_close(gelu(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)


def test_layer_norm_far_from_zero_and_gelu_at_large_inputs():
    """Inputs with a mean of 300 (where mean(x^2) - mean^2 cancels in float32) and |x| up to 1e4 (where a tanh
    written with exp overflows): the reference agrees with torch, computed in float64, and has no nan."""
    g = torch.Generator().manual_seed(0)
    ln = LayerNorm(64)
    x = torch.randn(3, 7, 64, generator=g) + 300
    want = F.layer_norm(x.double(), (64,), ln.weight.double(), ln.bias.double(), 1e-5)
    torch.testing.assert_close(ln(x).double(), want, atol=1e-3, rtol=0)
    x = torch.tensor([-1e4, -100.0, -30.0, -12.0, 12.0, 20.0, 30.0, 100.0, 1e4])
    torch.testing.assert_close(gelu(x), F.gelu(x, approximate="tanh"), atol=1e-5, rtol=1e-5)


def test_window_of_block_size_and_one_more(tmp_path):
    """block_size ids give block_size positions of logits; one more raises a ValueError that names block_size."""
    shape = CONFIGS["tiny"]
    hf = hf_model(seed=3, **shape)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    n = shape["n_positions"]
    idx = torch.randint(0, shape["vocab_size"], (1, n + 1), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits(ours, idx[:, :n]), logits(hf, idx[:, :n]), atol=LOGITS_ATOL, rtol=0)
    with pytest.raises(ValueError, match="block_size"):
        logits(ours, idx)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
def test_ids_of_other_integer_dtypes(tmp_path, dtype):
    """The ids that chapter 2's Embeddings takes, whatever their dtype, give the logits of the same int64 ids; those
    it refuses, GPT refuses with the same error (the hidden checks ask for the dtypes Embeddings takes)."""
    from minigpt.embeddings import Embeddings

    shape = CONFIGS["tiny"]
    hf = hf_model(seed=4, **shape)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    idx = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    try:
        Embeddings(4, 2, 3)(torch.zeros(1, 2, dtype=dtype))
    except (ValueError, RuntimeError) as err:
        with pytest.raises(type(err)):
            logits(ours, idx.to(dtype))
        return
    torch.testing.assert_close(logits(ours, idx.to(dtype)), logits(hf, idx), atol=LOGITS_ATOL, rtol=0)


def test_float64_logits_and_gradients_equal_hugging_face(tmp_path):
    """What chapter 8 needs: after .double(), the logits are float64 and a loss on them gives every parameter the
    gradient that Hugging Face's model gives its own (Conv1D weights transposed; the tied head in wte's)."""
    shape = CONFIGS["deep"]
    hf = hf_model(seed=5, **shape)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path).double()
    hf = hf.double()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, shape["vocab_size"], (2, shape["n_positions"]), generator=g)
    r = torch.randn(2, shape["n_positions"], shape["vocab_size"], generator=g, dtype=torch.float64)
    got, want = ours(idx), hf(idx).logits
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    (got * r).sum().backward()
    (want * r).sum().backward()
    theirs = state_dict_from_hf({name: p.grad for name, p in hf.named_parameters()})
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name], atol=1e-9, rtol=1e-9, msg=name)


def test_config_round_trips_through_hugging_face():
    config = GPTConfig(vocab_size=300, block_size=20, n_layer=2, n_head=5, n_embd=40, layer_norm_epsilon=1e-4)
    assert GPTConfig.from_hf(config.to_hf()) == config
    hf = GPT2Config(**config.to_hf())
    assert (hf.vocab_size, hf.n_positions, hf.n_layer, hf.n_head, hf.n_embd, hf.layer_norm_epsilon) == \
        (300, 20, 2, 5, 40, 1e-4)
    assert GPTConfig.from_hf(GPT2Config().to_dict()) == GPTConfig()  # GPT-2 small, HF's defaults


@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_fast", "silu"])
def test_from_hf_rejects_an_activation_other_than_tanh_gelu(activation):
    hf = GPTConfig().to_hf() | {"activation_function": activation}
    with pytest.raises(ValueError, match=activation):
        GPTConfig.from_hf(hf)


@pytest.mark.parametrize("activation", ["gelu_new", "gelu_pytorch_tanh"])
def test_from_hf_accepts_both_names_of_tanh_gelu(activation):
    assert GPTConfig.from_hf(GPTConfig().to_hf() | {"activation_function": activation}) == GPTConfig()


def test_state_dict_round_trip():
    model = GPT(GPTConfig(vocab_size=40, block_size=6, n_layer=2, n_head=2, n_embd=8))
    back = state_dict_from_hf(state_dict_to_hf(model.state_dict()))
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


# ---------------------------------------------------------------- the online path, offline

REPO_ID = "some-org/tiny-gpt2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_hub_cache(cache, repo_id: str, commit: str, files: dict[str, bytes]) -> None:
    """Files as `huggingface_hub` keeps a download: content-addressed blobs, a snapshot folder of relative
    symlinks for the commit, and refs/main naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(os.path.join("..", "..", "blobs", blob))


def test_from_pretrained_hub_name_resolves_through_the_hub_cache_offline(tmp_path):
    """`GPT.from_pretrained("org/name")` calls `snapshot_download`; with HF_HUB_OFFLINE=1 and a cache that
    holds the repo it must load from there without the network. The checkpoint is written as OpenAI's GPT-2
    repo stores it: GPT2Model names without the `transformer.` prefix, the causal-mask buffers `attn.bias`,
    no `lm_head.weight`. A fresh interpreter, so that huggingface_hub reads HF_HUB_CACHE as a user's would."""
    shape = CONFIGS["wide"]
    hf = hf_model(seed=7, **shape)
    n = shape["n_positions"]
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
    tensors = {k.removeprefix("transformer."): v.contiguous()
               for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    tensors |= {f"h.{i}.attn.bias": mask.clone() for i in range(shape["n_layer"])}
    weights = tmp_path / "weights.safetensors"
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.dumps(hf.config.to_dict()).encode()
    write_hub_cache(tmp_path / "hub", REPO_ID, COMMIT,
                    {"config.json": config, "model.safetensors": weights.read_bytes()})

    idx = inputs(shape["vocab_size"], shape["n_positions"])[1]
    torch.save(idx, tmp_path / "idx.pt")
    script = textwrap.dedent(f"""
        import torch
        from minigpt.transformer import GPT
        model = GPT.from_pretrained({REPO_ID!r})
        with torch.no_grad():
            torch.save(model(torch.load({str(tmp_path / 'idx.pt')!r})), {str(tmp_path / 'logits.pt')!r})
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), logits(hf, idx), atol=LOGITS_ATOL, rtol=0)


def test_from_pretrained_unknown_hub_name_fails_offline_without_network(tmp_path, monkeypatch):
    """An empty cache: offline, the hub name cannot be resolved, and the error says so (it is not a crash
    in minigpt's own code)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(LocalEntryNotFoundError):
        GPT.from_pretrained("some-org/not-in-the-cache")


def test_hidden_checks_pass_the_reference():
    """The checks the grader runs accept the reference: without this the grading tests could only fail. They
    judge stand-ins of the learner's objects, so they run as a hidden test cell runs them (the judge in this
    process, through the same plain data)."""
    from autograder.sandboxed.hidden import check
    from autograder.trusted import forget_here
    from minigpt.transformer import MLP, Block

    forget_here()
    check("test_layer_norm", LayerNorm)
    check("test_mlp", gelu, MLP)
    check("test_block", Block, GPTConfig)
    check("test_gpt", GPT, GPTConfig)
