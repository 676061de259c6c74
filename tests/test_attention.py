"""The reference attention (minigpt.attention) against PyTorch's and Hugging Face's, the oracles of chapter 3."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minigpt.attention import CausalSelfAttention, attention, causal_mask, softmax

ATOL = 1e-5


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


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dim", [-1, 0, 1, 2, -2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_equals_torch(dim, dtype):
    x = randn(3, 4, 5, seed=1, dtype=dtype) * 20
    got = softmax(x, dim=dim)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.softmax(x, dim=dim), atol=ATOL, rtol=0)


@pytest.mark.parametrize("x", [
    torch.tensor([[1e4, 1e4 - 1.0, 0.0], [-1e4, -1e4 + 3.0, -1e4 + 1.0]]),
    torch.tensor([[0.5, -math.inf, 2.0], [-math.inf, -math.inf, 7.0]]),
    torch.tensor([[1e4, 1e4 - 1.0], [-1e4, 0.0]], dtype=torch.float64),
], ids=["large", "minus-inf", "large-float64"])
def test_softmax_is_stable(x):
    got = softmax(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.softmax(x, dim=-1), atol=ATOL, rtol=0)


# ---------------------------------------------------------------- attention

SHAPES = [(2, 5, 8), (2, 3, 7, 5), (1, 1, 1, 4), (3, 2, 2, 16, 12)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_causal_attention_equals_sdpa(shape):
    q, k, v = (randn(*shape, seed=s) for s in (10, 11, 12))
    out, weights = attention(q, k, v, causal_mask(shape[-2]))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=ATOL, rtol=0)
    eye = torch.eye(shape[-2]).expand(*shape[:-1], shape[-2])  # with v = I, SDPA's output is its weights
    torch.testing.assert_close(weights, F.scaled_dot_product_attention(q, k, eye, is_causal=True),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unmasked_attention_equals_sdpa(shape):
    q, k, v = (randn(*shape, seed=s) for s in (20, 21, 22))
    out, _ = attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=ATOL, rtol=0)


def test_explicit_mask_and_other_value_size_equal_sdpa():
    q, k = randn(2, 3, 6, 10, seed=30), randn(2, 3, 6, 10, seed=31)
    v = randn(2, 3, 6, 4, seed=32)
    mask = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(33)) < 0.6
    mask[..., 0] = True  # every query sees at least one key
    out, _ = attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=ATOL, rtol=0)


@pytest.mark.parametrize("t_q, t_k", [(1, 9), (3, 9), (8, 9)])
def test_last_queries_equal_the_last_rows_of_full_causal_attention(t_q, t_k):
    """What chapter 7's KV cache relies on: the last t_q queries against all t_k keys give the last t_q rows."""
    q, k, v = (randn(2, 4, t_k, 6, seed=s) for s in (40, 41, 42))
    out, _ = attention(q[..., -t_q:, :], k, v, causal_mask(t_q, t_k))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, full[..., -t_q:, :], atol=ATOL, rtol=0)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q[..., -t_q:, :], k, v,
                                                                   attn_mask=full_causal(t_q, t_k)),
                               atol=ATOL, rtol=0)


def test_float64_attention_equals_sdpa():
    q, k, v = (randn(2, 2, 11, 7, seed=s, dtype=torch.float64) for s in (50, 51, 52))
    out, weights = attention(q, k, v, causal_mask(11))
    assert out.dtype == weights.dtype == torch.float64
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12, rtol=0)


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
        torch.testing.assert_close(layer(x), want, atol=ATOL, rtol=0)


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
        torch.testing.assert_close(layer(x), want, atol=ATOL, rtol=0)
        q, k, v = (layer.split_heads(t) for t in layer.c_attn(x).split(n_embd, dim=2))
        _, weights = attention(q, k, v, causal_mask(T))
        torch.testing.assert_close(weights, want_weights, atol=ATOL, rtol=0)


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
        torch.testing.assert_close(layer(changed)[:, :t + 1], layer(x)[:, :t + 1], atol=ATOL, rtol=0)
