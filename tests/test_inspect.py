"""glassllm.models.inspect: the recorded insides are those of GPT.forward."""

import numpy as np
import pytest

import glassllm
import glassllm.functional as F
from glassllm.models import GPT, GPTConfig
from glassllm.models.inspect import inspect


def tiny_gpt(block_size=96, bias=False, seed=1):
    config = GPTConfig(vocab_size=23, block_size=block_size, n_layer=3, n_head=4, n_embd=32,
                       bias=bias)
    return GPT(config, rng=np.random.default_rng(seed))


def ids_of(length, seed=0):
    return np.random.default_rng(seed).integers(0, 23, length)


@pytest.mark.parametrize("length", [1, 7, 64, 96])  # 96 > 64: the tiled no-grad attention path
def test_logits_equal_the_forward(length):
    model = tiny_gpt()
    ids = ids_of(length)
    seen = inspect(model, ids)
    with glassllm.no_grad():
        logits, _ = model(ids[None])
    assert np.array_equal(seen.logits, logits.data[0])
    # With the graph recorded the attention takes another (untiled) path: float32 rounding only.
    logits_graph, _ = model(ids[None])
    np.testing.assert_allclose(seen.logits, logits_graph.data[0], rtol=0, atol=1e-5)
    assert seen.logits.dtype == np.float32


@pytest.mark.parametrize("bias", [False, True])
def test_last_lens_row_is_softmax_of_the_logits(bias):
    model = tiny_gpt(bias=bias)
    ids = ids_of(20)
    seen = inspect(model, ids)
    expected = F.softmax(model(ids[None])[0], axis=-1).data[0]
    np.testing.assert_allclose(seen.lens[-1], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(seen.lens.sum(-1), 1.0, atol=1e-5)
    assert seen.lens.shape == (4, 20, 23)


def test_lens_rows_read_each_stream_through_ln_f_and_the_tied_head():
    model = tiny_gpt()
    seen = inspect(model, ids_of(12))
    w = model.wte.weight.data.astype(np.float64)
    g = model.ln_f.weight.data.astype(np.float64)
    for layer in range(4):
        x = seen.residual[layer].astype(np.float64)  # (T, E)
        xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
        logits = (xhat * g) @ w.T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(seen.lens[layer], p, rtol=0, atol=1e-5)


def test_attention_rows_sum_to_one_with_a_zero_upper_triangle():
    model = tiny_gpt()
    seen = inspect(model, ids_of(30))
    assert seen.attention.shape == (3, 4, 30, 30)
    np.testing.assert_allclose(seen.attention.sum(-1), 1.0, atol=1e-5)
    upper = np.triu(np.ones((30, 30), dtype=bool), k=1)
    assert np.all(seen.attention[..., upper] == 0)
    assert np.all(seen.attention >= 0)
    # Recomputed P @ V equals the fused attention's output.
    assert seen.attention_check <= 1e-6


def test_attention_matches_a_float64_reference_from_the_weights():
    model = tiny_gpt()
    ids = ids_of(10)
    seen = inspect(model, ids)
    block = model.blocks[1]
    x = seen.residual[1].astype(np.float64)
    ln = block.ln_1.weight.data.astype(np.float64)
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * ln
    qkv = h @ block.attn.qkv.weight.data.astype(np.float64)  # (T, 3E)
    q, k, _ = np.split(qkv, 3, axis=-1)
    q = q.reshape(10, 4, 8).transpose(1, 0, 2)
    k = k.reshape(10, 4, 8).transpose(1, 0, 2)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(8)
    scores[:, np.triu(np.ones((10, 10), dtype=bool), k=1)] = -np.inf
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(seen.attention[1], p, rtol=0, atol=1e-5)


def test_residual_and_mlp_come_from_the_modules():
    model = tiny_gpt()
    ids = ids_of(9)
    seen = inspect(model, ids)
    embedding = model.wte.weight.data[ids] + model.wpe.weight.data[:9]
    assert np.array_equal(seen.residual[0], embedding)
    with glassllm.no_grad():
        x = glassllm.Tensor(seen.residual[0][None])
        for layer, block in enumerate(model.blocks):
            gelu = block.mlp.gelu(block.mlp.fc(block.ln_2(x + block.attn(block.ln_1(x)))))
            assert np.array_equal(seen.mlp[layer], gelu.data[0])
            x = block(x)
            assert np.array_equal(seen.residual[layer + 1], x.data[0])
    assert seen.mlp.shape == (3, 9, 128)


def test_model_is_left_as_it_was():
    model = tiny_gpt()
    model.train()
    inspect(model, ids_of(5))
    assert all(m.training for m in model.modules())
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert glassllm.is_grad_enabled()
    # The model still trains normally (no recording left behind).
    logits, loss = model(ids_of(5)[None], ids_of(5, seed=1)[None])
    loss.backward()
    assert model.wte.weight.grad is not None


def test_recording_is_removed_when_the_forward_raises():
    model = tiny_gpt(block_size=8)
    with pytest.raises(ValueError, match="exceeds block_size"):
        inspect(model, ids_of(9))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        inspect(model, [1, 99])
    with pytest.raises(ValueError, match="1-D"):
        inspect(model, [[1, 2]])
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert glassllm.is_grad_enabled()
