"""The reference attention (minigpt.attention) against PyTorch's and Hugging Face's, the oracles of chapter 3."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.attention import CausalSelfAttention, attention, causal_mask, softmax

# float32 attention on inputs of magnitude up to about 20: torch's kernels and ours sum the same short dot products
# (up to 64 terms) in other orders, a few ulps of the values apart (3.3e-6 at 19 measured under two CPU
# capabilities, a fifth of the tolerance there); the tolerance grows with the values, against mistakes of 1e-3.
ATOL = RTOL = 1e-5


def randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def full_causal(t_q, t_k):
    """The last t_q rows of the lower triangle over t_k positions."""
    return torch.tril(torch.ones(t_k, t_k, dtype=torch.bool))[t_k - t_q:]


# ---------------------------------------------------------------- causal_mask

@pytest.mark.parametrize("t_q, t_k", [(1, 1), (4, 4), (9, 9), (1, 5), (3, 8), (6, 7)])
def test_causal_mask_is_the_last_rows_of_the_lower_triangle(t_q, t_k):
    got = causal_mask(t_q, t_k)
    assert got.dtype == torch.bool
    assert torch.equal(got, full_causal(t_q, t_k))


def test_causal_mask_square_by_default_and_refuses_more_queries_than_keys():
    assert torch.equal(causal_mask(5), causal_mask(5, 5))
    with pytest.raises(ValueError):
        causal_mask(4, 3)
    with pytest.raises(ValueError):  # t_k=0 is no keys, not t_k left out
        causal_mask(3, 0)


def test_causal_mask_of_no_queries_is_empty():
    assert causal_mask(0, 4).shape == (0, 4) and causal_mask(0).shape == (0, 0)
    assert causal_mask(0, 4).dtype == torch.bool


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dim", [-1, 0, 1, 2, -2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_equals_torch(dim, dtype):
    x = randn(3, 4, 5, seed=1, dtype=dtype) * 20
    got = softmax(x, dim=dim)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.softmax(x, dim=dim), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("x", [
    torch.tensor([[1e4, 1e4 - 1.0, 0.0], [-1e4, -1e4 + 3.0, -1e4 + 1.0]]),
    torch.tensor([[0.5, -math.inf, 2.0], [-math.inf, -math.inf, 7.0]]),
    torch.tensor([[1e4, 1e4 - 1.0], [-1e4, 0.0]], dtype=torch.float64),
], ids=["large", "minus-inf", "large-float64"])
def test_softmax_is_stable(x):
    got = softmax(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.softmax(x, dim=-1), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_near_a_thousand_in_float32_agrees_with_every_correct_method(dim):
    """What the checks' tolerance allows for: exp(x - logsumexp(x)) is off by about |x| * eps in float32."""
    x = torch.tensor([[1000.0, 999.0, 995.0], [-1000.0, -998.0, -999.0], [1000.0, 1000.0, -math.inf]])
    want = torch.softmax(x, dim=dim)
    torch.testing.assert_close(softmax(x, dim=dim), want, atol=ATOL, rtol=RTOL)
    via_logsumexp = torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
    torch.testing.assert_close(via_logsumexp, want, atol=ATOL + 2 * torch.finfo(x.dtype).eps * 1000, rtol=0)


def test_softmax_of_one_entry_and_of_no_rows():
    assert torch.equal(softmax(torch.randn(4, 1) * 50), torch.ones(4, 1))
    assert softmax(torch.zeros(0, 5)).shape == (0, 5)


def test_softmax_leaves_its_input_alone_and_passes_gradients():
    x = randn(3, 4, 5, seed=3, dtype=torch.float64) * 5
    before = x.clone()
    xr = x.clone().requires_grad_(True)
    r = randn(3, 4, 5, seed=4, dtype=torch.float64)
    (softmax(xr, dim=1) * r).sum().backward()
    assert torch.equal(x, before)
    want = x.clone().requires_grad_(True)
    (torch.softmax(want, dim=1) * r).sum().backward()
    torch.testing.assert_close(xr.grad, want.grad, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- attention

SHAPES = [(2, 5, 8), (2, 3, 7, 5), (1, 1, 1, 4), (3, 2, 2, 16, 12)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_causal_attention_equals_sdpa(shape):
    q, k, v = (randn(*shape, seed=s) for s in (10, 11, 12))
    out, weights = attention(q, k, v, causal_mask(shape[-2]))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=ATOL, rtol=RTOL)
    eye = torch.eye(shape[-2]).expand(*shape[:-1], shape[-2])  # with v = I, SDPA's output is its weights
    torch.testing.assert_close(weights, F.scaled_dot_product_attention(q, k, eye, is_causal=True),
                               atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unmasked_attention_equals_sdpa(shape):
    q, k, v = (randn(*shape, seed=s) for s in (20, 21, 22))
    out, _ = attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=ATOL, rtol=RTOL)


def test_explicit_mask_and_other_value_size_equal_sdpa():
    q, k = randn(2, 3, 6, 10, seed=30), randn(2, 3, 6, 10, seed=31)
    v = randn(2, 3, 6, 4, seed=32)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(33)) < 0.6
    mask[..., 0] = True  # every query sees at least one key
    out, _ = attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("t_q, t_k", [(1, 9), (3, 9), (8, 9)])
def test_last_queries_equal_the_last_rows_of_full_causal_attention(t_q, t_k):
    """What chapter 7's KV cache relies on: the last t_q queries against all t_k keys give the last t_q rows."""
    q, k, v = (randn(2, 4, t_k, 6, seed=s) for s in (40, 41, 42))
    out, _ = attention(q[..., -t_q:, :], k, v, causal_mask(t_q, t_k))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, full[..., -t_q:, :], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q[..., -t_q:, :], k, v,
                                                                   attn_mask=full_causal(t_q, t_k)),
                               atol=ATOL, rtol=RTOL)


def test_float64_attention_equals_sdpa():
    q, k, v = (randn(2, 2, 11, 7, seed=s, dtype=torch.float64) for s in (50, 51, 52))
    out, weights = attention(q, k, v, causal_mask(11))
    assert out.dtype == weights.dtype == torch.float64
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12, rtol=0)


def test_attention_of_scores_in_the_thousands_equals_sdpa():
    """A plain exp overflows there (above 709 in float64): attention computes its weights with softmax."""
    q, k = (randn(2, 2, 6, 4, seed=s, dtype=torch.float64) * 40 for s in (53, 54))
    v = randn(2, 2, 6, 4, seed=55, dtype=torch.float64)
    assert (q @ k.transpose(-2, -1) / 2).abs().max() > 1000
    out, weights = attention(q, k, v, causal_mask(6))
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-9, rtol=0)


def test_attention_gradients_equal_sdpa():
    """Chapter 8 trains through attention: the gradients reach q, k and v, as through SDPA."""
    q, k, v = (randn(2, 2, t, 5, seed=s, dtype=torch.float64) for s, t in ((56, 4), (57, 7), (58, 7)))
    r = randn(2, 2, 4, 5, seed=59, dtype=torch.float64)
    ours = [t.clone().requires_grad_(True) for t in (q, k, v)]
    theirs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    (attention(*ours, causal_mask(4, 7))[0] * r).sum().backward()
    (F.scaled_dot_product_attention(*theirs, attn_mask=full_causal(4, 7)) * r).sum().backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=0)


# ---------------------------------------------------------------- CausalSelfAttention

def layer_with_random_weights(n_embd, n_head, seed):
    torch.manual_seed(seed)
    layer = CausalSelfAttention(n_embd, n_head).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return layer


@pytest.mark.parametrize("n_embd, n_head, T", [(16, 4, 6), (24, 8, 7), (30, 5, 1), (8, 1, 5)])
def test_layer_equals_torch_multi_head_attention(n_embd, n_head, T):
    layer = layer_with_random_weights(n_embd, n_head, seed=n_embd)
    x = randn(2, T, n_embd, seed=60)
    mha = torch.nn.MultiheadAttention(n_embd, n_head, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(layer.c_attn.weight)
        mha.in_proj_bias.copy_(layer.c_attn.bias)
        mha.out_proj.weight.copy_(layer.c_proj.weight)
        mha.out_proj.bias.copy_(layer.c_proj.bias)
        want, _ = mha(x, x, x, attn_mask=~causal_mask(T), need_weights=False)  # True = hidden, for torch
        torch.testing.assert_close(layer(x), want, atol=ATOL, rtol=RTOL)


def test_layer_equals_hugging_face_gpt2_attention():
    """GPT-2's own attention, with its Conv1D weights (the transpose of ours): output and per-head weights."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    n_embd, n_head, T = 24, 4, 9
    config = GPT2Config(n_embd=n_embd, n_head=n_head, n_positions=16, attn_pdrop=0.0, resid_pdrop=0.0)
    config._attn_implementation = "eager"  # the implementation that returns the weights
    hf = GPT2Attention(config, layer_idx=0).eval()
    layer = layer_with_random_weights(n_embd, n_head, seed=7)
    x = randn(2, T, n_embd, seed=70)
    additive = torch.zeros(T, T).masked_fill(~causal_mask(T), -math.inf)[None, None]
    with torch.no_grad():
        for name in ("c_attn", "c_proj"):
            getattr(hf, name).weight.copy_(getattr(layer, name).weight.t())
            getattr(hf, name).bias.copy_(getattr(layer, name).bias)
        want, want_weights = hf(x, attention_mask=additive)[:2]
        torch.testing.assert_close(layer(x), want, atol=ATOL, rtol=RTOL)
        q, k, v = (layer.split_heads(t) for t in layer.c_attn(x).split(n_embd, dim=2))
        _, weights = attention(q, k, v, causal_mask(T))
        torch.testing.assert_close(weights, want_weights, atol=ATOL, rtol=RTOL)


def test_split_and_merge_heads_are_inverse_and_slice_the_channels():
    layer = CausalSelfAttention(12, 3)
    x = randn(2, 5, 12, seed=80)
    heads = layer.split_heads(x)
    assert heads.shape == (2, 3, 5, 4)
    for h in range(3):  # head h holds the channels 4h .. 4h + 3 of every position
        assert torch.equal(heads[:, h], x[..., 4 * h:4 * h + 4])
    assert torch.equal(layer.merge_heads(heads), x)


def test_n_embd_must_be_a_multiple_of_n_head():
    with pytest.raises(ValueError):
        CausalSelfAttention(10, 3)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(T=st.integers(2, 12), n_head=st.sampled_from([1, 2, 4]), data=st.data())
def test_no_position_reads_the_future(T, n_head, data):
    """Changing the inputs after position t leaves every output at positions <= t as it was."""
    t = data.draw(st.integers(0, T - 2), label="t")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    layer = layer_with_random_weights(8, n_head, seed=seed)
    x = randn(2, T, 8, seed=seed)
    changed = x.clone()
    changed[:, t + 1:] = randn(2, T - t - 1, 8, seed=seed + 1) * 3
    with torch.no_grad():
        torch.testing.assert_close(layer(changed)[:, :t + 1], layer(x)[:, :t + 1], atol=ATOL, rtol=RTOL)


def test_one_layer_reads_sequences_of_any_length_in_turn():
    """Generation calls the same layer with a longer sequence at each step: each call makes its own mask."""
    layer = layer_with_random_weights(16, 4, seed=11)
    x = randn(2, 9, 16, seed=12)
    with torch.no_grad():
        full = layer(x)
        for T in (3, 7, 1, 9, 5):
            torch.testing.assert_close(layer(x[:, :T]), full[:, :T], atol=ATOL, rtol=RTOL)


def test_layer_gradients_reach_its_parameters_and_its_input():
    """Chapter 8 trains this layer: a loss on its output has a gradient for c_attn, c_proj and x, those of torch's
    multi-head attention with the same weights."""
    layer = layer_with_random_weights(12, 3, seed=13).double()
    x = randn(2, 5, 12, seed=14, dtype=torch.float64).requires_grad_(True)
    r = randn(2, 5, 12, seed=15, dtype=torch.float64)
    (layer(x) * r).sum().backward()
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(layer.c_attn.weight)
        mha.in_proj_bias.copy_(layer.c_attn.bias)
        mha.out_proj.weight.copy_(layer.c_proj.weight)
        mha.out_proj.bias.copy_(layer.c_proj.bias)
    x2 = x.detach().clone().requires_grad_(True)
    want, _ = mha(x2, x2, x2, attn_mask=~causal_mask(5), need_weights=False)
    (want * r).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    for ours, theirs in ((layer.c_attn.weight, mha.in_proj_weight), (layer.c_attn.bias, mha.in_proj_bias),
                         (layer.c_proj.weight, mha.out_proj.weight), (layer.c_proj.bias, mha.out_proj.bias)):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-10, rtol=0)
