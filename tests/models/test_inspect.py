"""glassllm.models.inspect: the recorded insides are those of GPT.forward."""

import numpy as np
import pytest

import glassllm
import glassllm.functional as F
from glassllm.functional.attention import attention_probabilities
from glassllm.models import GPT, GPTConfig
from glassllm.models.inspect import LENS_TOP, inspect, top_k


def tiny_gpt(block_size=96, bias=False, seed=1):
    config = GPTConfig(
        vocab_size=23, block_size=block_size, n_layer=3, n_head=4, n_embd=32, bias=bias
    )
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
    seen = inspect(model, ids, full_lens=True)
    expected = F.softmax(model(ids[None])[0], axis=-1).data[0]
    np.testing.assert_allclose(seen.lens.full[-1], expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(seen.lens.full.sum(-1), 1.0, atol=1e-5)
    assert seen.lens.full.shape == (4, 20, 23)
    assert inspect(model, ids).lens.full is None  # the full lens is opt-in


def test_lens_rows_read_each_stream_through_ln_f_and_the_tied_head():
    model = tiny_gpt()
    ids = ids_of(12)
    seen = inspect(model, ids, full_lens=True)
    w = model.wte.weight.data.astype(np.float64)
    g = model.ln_f.weight.data.astype(np.float64)
    for layer in range(4):
        x = seen.residual[layer].astype(np.float64)  # (T, E)
        xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
        logits = (xhat * g) @ w.T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(seen.lens.full[layer], p, rtol=0, atol=1e-5)
        # What is kept by default: the top tokens and the actual next token's probability.
        expected = np.argsort(-p, axis=-1, kind="stable")[:, :LENS_TOP]
        assert np.array_equal(seen.lens.top_ids[layer], expected)
        np.testing.assert_allclose(
            seen.lens.top_p[layer], np.take_along_axis(p, expected, -1), rtol=0, atol=1e-5
        )
        np.testing.assert_allclose(
            seen.lens.next_p[layer], p[np.arange(11), ids[1:]], rtol=0, atol=1e-5
        )
    assert seen.lens.top_ids.shape == (4, 12, LENS_TOP) and seen.lens.next_p.shape == (4, 11)


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


def test_top_k_is_a_sorted_partial_sort():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, 5, 40)).astype(np.float32)
    ids, top = top_k(values, 6)
    assert np.array_equal(ids, np.argsort(-values, axis=-1, kind="stable")[..., :6])
    assert np.array_equal(top, np.take_along_axis(values, ids, -1)) and top.dtype == np.float32
    ties = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]])
    assert top_k(ties, 3)[0].tolist() == [[1, 2, 4]]  # equal values: the lower index first
    assert top_k(ties, 9)[0].tolist() == [[1, 2, 4, 0, 3]]  # k > n: all of them


def test_the_lens_of_a_large_vocabulary_stays_small():
    """A GPT-2-sized vocabulary: the pass keeps top-k per cell, never (L + 1, T, V) at once."""
    import tracemalloc

    config = GPTConfig(vocab_size=50257, block_size=64, n_layer=8, n_head=2, n_embd=16)
    model = GPT(config, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 50257, 64)
    logits = 64 * 50257 * 4  # bytes of the (T, V) logits; the whole lens is 9 times that
    tracemalloc.start()
    try:
        seen = inspect(model, ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen.lens.full is None and seen.lens.top_ids.shape == (9, 64, LENS_TOP)
    assert peak < 2.5 * logits, f"peak {peak / 2**20:.1f} MiB"
    assert seen.nbytes < 1.2 * logits  # what a cache holds: the logits, and small arrays


# ---------------------------------------------------------------------- attention_probabilities


@pytest.mark.parametrize("causal, masked", [(False, False), (True, False), (True, True)])
def test_attention_probabilities_are_what_the_fused_op_multiplies_v_by(causal, masked):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 7, 8)).astype(np.float32) for _ in range(3))
    mask = None
    if masked:
        mask = rng.random((7, 7)) < 0.7
        mask[4] = False  # a query allowed no key: a row of zeros, as the fused op's output
    p = attention_probabilities(q, k, causal=causal, mask=mask)
    fused = F.scaled_dot_product_attention(
        glassllm.Tensor(q), glassllm.Tensor(k), glassllm.Tensor(v), causal=causal, mask=mask
    )
    assert p.shape == (2, 3, 7, 7) and p.dtype == np.float32
    np.testing.assert_allclose(p @ v, fused.data, rtol=0, atol=1e-6)
    scores = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / np.sqrt(8)
    allowed = np.ones((7, 7), dtype=bool) if mask is None else mask.copy()
    if causal:
        allowed &= np.tril(np.ones((7, 7), dtype=bool))
    scores = np.where(allowed, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        ref = np.exp(scores - scores.max(-1, keepdims=True))
        ref = np.nan_to_num(ref / ref.sum(-1, keepdims=True))
    np.testing.assert_allclose(p, ref, rtol=0, atol=1e-6)
    assert np.all(p[..., ~allowed] == 0)


@pytest.mark.parametrize("steps", [5, 96])  # 96 > 64: the fused op's tiled causal path
def test_attention_probabilities_per_head_of_packed_attention(steps):
    qkv = np.random.default_rng(4).standard_normal((1, steps, 3 * 12)).astype(np.float32)
    heads = qkv.reshape(1, steps, 3, 3, 4).transpose(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
    p = attention_probabilities(heads[0], heads[1], causal=True)  # (B, nh, T, T)
    merged = (p @ heads[2]).transpose(0, 2, 1, 3).reshape(1, steps, 12)
    with glassllm.no_grad():
        fused = F.packed_attention(glassllm.Tensor(qkv), num_heads=3, causal=True)
    np.testing.assert_allclose(merged, fused.data, rtol=0, atol=1e-6)


def test_attention_probabilities_reject_bad_input():
    with pytest.raises(ValueError, match="attention_probabilities: q and k"):
        attention_probabilities(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(TypeError, match="boolean"):
        attention_probabilities(np.ones((2, 3)), np.ones((2, 3)), mask=np.ones((2, 2)))
