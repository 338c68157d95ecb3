"""F.packed_attention: finite-difference gradients, and the same values and gradients as the
split -> scaled_dot_product_attention -> merge chain it fuses (dropout included), float32 kept."""

from __future__ import annotations

import numpy as np
import pytest

import glassllm.functional as F
import glassllm.kernels.attention as attention
from glassllm import Tensor, gradcheck


def leaf(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def unfused(qkv: Tensor, num_heads: int, **kwargs) -> Tensor:
    """The reference: split the packed heads with Tensor indexing, attend, merge."""
    batch, steps, three_embed = qkv.shape
    head_size = three_embed // 3 // num_heads
    heads = qkv.reshape(batch, steps, 3, num_heads, head_size).transpose(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(heads[0], heads[1], heads[2], **kwargs)
    return y.transpose(0, 2, 1, 3).reshape(batch, steps, three_embed // 3)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(causal, op_path):
    qkv = leaf((2, 3, 12))  # E = 4, two heads of 2
    assert gradcheck(lambda t: F.packed_attention(t, 2, causal=causal), [qkv])


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_matches_split_attend_merge(dropout_p):
    qkv_data = np.random.default_rng(1).standard_normal((3, 5, 24)).astype(np.float32)
    upstream = np.random.default_rng(2).standard_normal((3, 5, 8)).astype(np.float32)
    results = []
    for fn in (F.packed_attention, unfused):
        qkv = Tensor(qkv_data.copy(), requires_grad=True)
        rng = np.random.default_rng(7)  # the same dropout mask on both sides
        y = fn(qkv, 2, causal=True, dropout_p=dropout_p, rng=rng)
        y.backward(upstream)
        assert y.dtype == np.float32 and qkv.grad.dtype == np.float32
        results.append((y.data, qkv.grad))
    (y, g), (y_ref, g_ref) = results
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match=r"qkv must have shape \(B, T, 3E\)"):
        F.packed_attention(Tensor(np.ones((2, 3, 10))), 2)
    with pytest.raises(ValueError, match="qkv must have shape"):
        F.packed_attention(Tensor(np.ones((3, 12))), 2)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        F.packed_attention(Tensor(np.ones((2, 3, 12))), 0)


@pytest.mark.parametrize("steps", [attention.CAUSAL_TILE + 1, 2 * attention.CAUSAL_TILE + 7])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_causal_tiles_match_the_untiled_attention(steps, dropout_p):
    """Several query tiles: values and gradients as the split -> sdpa -> merge chain (one
    (T, T) softmax), with and without a graph, dropout drawn as the same (T, T) mask."""
    qkv_data = np.random.default_rng(3).standard_normal((2, steps, 12)).astype(np.float32) * 3
    upstream = np.random.default_rng(4).standard_normal((2, steps, 4)).astype(np.float32)
    results = []
    for fn in (F.packed_attention, unfused):
        qkv = Tensor(qkv_data.copy(), requires_grad=True)
        y = fn(qkv, 2, causal=True, dropout_p=dropout_p, rng=np.random.default_rng(7))
        y.backward(upstream)
        assert y.dtype == np.float32 and qkv.grad.dtype == np.float32
        results.append((y.data, qkv.grad))
    (y, g), (y_ref, g_ref) = results
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)  # |g| up to ~5: float32 sums
    untracked = F.packed_attention(
        Tensor(qkv_data), 2, causal=True, dropout_p=dropout_p, rng=np.random.default_rng(7)
    )
    assert untracked.dtype == np.float32 and not untracked.requires_grad
    np.testing.assert_array_equal(untracked.data, y)


def test_causal_tiles_gradcheck(monkeypatch, op_path):
    monkeypatch.setattr(attention, "CAUSAL_TILE", 2)  # 7 steps: tiles of 2, 2, 2 and 1 queries
    qkv = leaf((2, 7, 12))
    assert gradcheck(lambda t: F.packed_attention(t, 2, causal=True), [qkv])
