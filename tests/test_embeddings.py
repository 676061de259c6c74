"""The reference embeddings (minigpt.embeddings) against PyTorch and Hugging Face's GPT-2, the oracles for
chapter 2."""
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from autograder.checks.embeddings import gpt2_input_layer  # the grader's oracle: GPT-2's own input layer
from minigpt.embeddings import Embeddings, embedding_lookup, one_hot


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random-weight GPT-2 with the real vocabulary and context (n_embd and depth cut down), saved to local
    safetensors and loaded back the way a real checkpoint is."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2-random")
    GPT2Model(config).save_pretrained(folder)
    return GPT2Model.from_pretrained(folder).eval(), folder


@pytest.fixture(scope="module")
def emb(gpt2):
    """minigpt's Embeddings holding the checkpoint's own wte and wpe tables."""
    _, folder = gpt2
    tensors = load_file(folder / "model.safetensors")
    wte, wpe = tensors["wte.weight"], tensors["wpe.weight"]
    layer = Embeddings(vocab_size=wte.shape[0], block_size=wpe.shape[0], n_embd=wte.shape[1])
    layer.wte.weight.data.copy_(wte)
    layer.wpe.weight.data.copy_(wpe)
    return layer.eval()


def test_known_sizes(emb):
    assert emb.wte.weight.shape == (50257, 32) and emb.wpe.weight.shape == (1024, 32)


@pytest.mark.parametrize("B, T, offset", [(1, 1, 0), (2, 7, 0), (3, 5, 11), (1, 1024, 0), (2, 24, 1000),
                                          (1, 1, 1023), (4, 1, 500)])
def test_embeddings_equal_gpt2_input_layer(gpt2, emb, B, T, offset):
    model, _ = gpt2
    gen = torch.Generator().manual_seed(B * 10_000 + T + offset)
    idx = torch.randint(50257, (B, T), generator=gen)
    idx[0, 0] = 50256  # <|endoftext|>, the last row of wte
    want = gpt2_input_layer(model, idx, offset)
    with torch.no_grad():
        got = emb(idx, offset=offset)
        assert got.shape == (B, T, 32)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(emb(idx.int(), offset=offset), want, rtol=0, atol=1e-6)


def test_same_positions_for_every_row_of_a_batch(emb):
    idx = torch.tensor([[5, 6, 7], [5, 6, 7]])
    with torch.no_grad():
        out = emb(idx, offset=3)
    assert torch.equal(out[0], out[1])
    # one token at position 4 is the middle token of a sequence starting at 3
    with torch.no_grad():
        torch.testing.assert_close(emb(torch.tensor([[6]]), offset=4)[0, 0], out[0, 1], rtol=0, atol=0)


SHAPES = [(1,), (7,), (3, 4), (2, 3, 5), (1, 1), (0,), (2, 0)]


ID_DTYPES = [torch.long, torch.int32, torch.int16, torch.int8, torch.uint8]  # every dtype check_ids accepts


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ID_DTYPES)
def test_one_hot_equals_torch(shape, dtype):
    V = 13
    ids = torch.randint(V, shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
    got = one_hot(ids, V)
    assert got.dtype == torch.float32
    assert torch.equal(got, F.one_hot(ids.long(), V).float())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ID_DTYPES)
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float64])
def test_embedding_lookup_equals_torch_and_one_hot_product(shape, dtype, table_dtype):
    V, C = 17, 6
    gen = torch.Generator().manual_seed(len(shape))
    table = torch.randn(V, C, generator=gen).to(table_dtype)
    ids = torch.randint(V, shape, generator=gen).to(dtype)
    got = embedding_lookup(table, ids)
    assert got.shape == (*shape, C) and got.dtype == table_dtype
    assert torch.equal(got, F.embedding(ids.long(), table))
    # exact: every other product is a multiplication by zero
    assert torch.equal(got, one_hot(ids, V).to(table_dtype) @ table)


@pytest.mark.parametrize("dtype", ID_DTYPES)
def test_inputs_are_left_as_they_were(dtype):
    table, ids = torch.randn(9, 2), torch.tensor([[8, 0, 3]], dtype=dtype)
    before = table.clone(), ids.clone()
    one_hot(ids, 9)
    embedding_lookup(table, ids)
    Embeddings(9, 4, 2)(ids)
    assert torch.equal(table, before[0]) and torch.equal(ids, before[1]) and ids.shape == (1, 3)


def test_embedding_lookup_passes_gradients_to_the_table():
    table = torch.randn(5, 3, requires_grad=True)
    embedding_lookup(table, torch.tensor([[1, 1], [4, 1]])).sum().backward()
    assert torch.equal(table.grad[:, 0], torch.tensor([0.0, 3.0, 0.0, 0.0, 1.0]))


@pytest.mark.parametrize("ids, name", [([0, 13], "13"), ([-1, 2], "-1"), ([[3], [99]], "99")])
def test_ids_outside_the_vocabulary_raise_naming_the_id(ids, name):
    ids = torch.tensor(ids)
    for fn in (lambda: one_hot(ids, 13), lambda: embedding_lookup(torch.zeros(13, 2), ids),
               lambda: Embeddings(13, 4, 2)(ids.reshape(1, -1))):
        with pytest.raises(ValueError, match=f"token id {name} "):
            fn()


@pytest.mark.parametrize("ids", [torch.tensor([1.0, 2.0]), torch.tensor([True, False]), [1, 2]])
def test_ids_that_are_not_an_integer_tensor_raise(ids):
    with pytest.raises(ValueError, match="integer tensor"):
        one_hot(ids, 5)
    with pytest.raises(ValueError, match="integer tensor"):
        embedding_lookup(torch.zeros(5, 2), ids)
    if isinstance(ids, torch.Tensor):
        with pytest.raises(ValueError, match="integer tensor"):
            Embeddings(5, 4, 2)(ids[None])


@pytest.mark.parametrize("dtype", ID_DTYPES)
@pytest.mark.parametrize("B, T, offset", [(2, 3, 1), (1, 4, 0), (2, 0, 0), (0, 3, 1), (3, 1, 3)])
def test_embeddings_take_every_id_dtype_and_empty_batches(dtype, B, T, offset):
    layer = Embeddings(vocab_size=20, block_size=4, n_embd=3)
    idx = torch.randint(20, (B, T), generator=torch.Generator().manual_seed(B * 10 + T)).to(dtype)
    want = layer.wte.weight[idx.long()] + layer.wpe.weight[offset:offset + T]
    torch.testing.assert_close(layer(idx, offset=offset), want, rtol=0, atol=0)


def test_embeddings_in_float64_and_their_gradients():
    layer = Embeddings(vocab_size=6, block_size=4, n_embd=2).double()
    idx = torch.tensor([[1, 1, 5], [0, 1, 2]])
    out = layer(idx, offset=1)
    assert out.dtype == torch.float64
    out.sum().backward()
    assert torch.equal(layer.wte.weight.grad[:, 0], torch.tensor([1.0, 3.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.equal(layer.wpe.weight.grad[:, 0], torch.tensor([0.0, 2.0, 2.0, 2.0], dtype=torch.float64))


@pytest.mark.parametrize("T, offset", [(5, 0), (1, 4), (3, 2), (2, -1)])
def test_positions_outside_the_block_raise(T, offset):
    layer = Embeddings(vocab_size=10, block_size=4, n_embd=2)
    with pytest.raises(ValueError, match="block_size 4"):
        layer(torch.zeros(1, T, dtype=torch.long), offset=offset)
    layer(torch.zeros(1, 4 - max(offset, 0), dtype=torch.long), offset=max(offset, 0))  # a full block fits


def test_embeddings_wants_a_batch():
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        Embeddings(10, 4, 2)(torch.tensor([1, 2]))


def test_hidden_checks_pass_the_reference():
    """The checks the grader runs accept the reference: without this the grading tests could only fail. They
    judge stand-ins of the learner's objects, so they run as a hidden test cell runs them (the judge in this
    process, through the same plain data)."""
    from autograder.sandboxed.hidden import check
    from autograder.trusted import forget_here

    forget_here()
    check("test_one_hot", one_hot)
    check("test_embedding_lookup", embedding_lookup)
    check("test_embeddings", Embeddings)
