"""F.packed_attention with grouped-query heads and rotary positions (Llama's attention in one op):
finite differences in float64, the same values and gradients as the chain it fuses (split ->
F.rotary -> scaled_dot_product_attention -> merge), PyTorch as the oracle, float32 kept, errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

import glassllm.functional as F
from glassllm import Tensor, gradcheck

HEAD = 4


def leaf(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def tables(steps, half=HEAD // 2, dtype=np.float64):
    return F.rotary_cos_sin(np.arange(steps), F.rotary_frequencies(2 * half, 100.0))


def unfused(qkv, heads, kv_heads, cos=None, sin=None, interleaved=False, **kwargs):
    """The reference: the heads cut out of qkv with Tensor indexing, rotated, attended, merged."""
    batch, steps, _ = qkv.shape

    def group(first, count):
        columns = qkv[:, :, first * HEAD : (first + count) * HEAD]
        return columns.reshape(batch, steps, count, HEAD).transpose(0, 2, 1, 3)

    q, k, v = group(0, heads), group(heads, kv_heads), group(heads + kv_heads, kv_heads)
    if cos is not None:
        q, k = F.rotary(q, cos, sin, interleaved), F.rotary(k, cos, sin, interleaved)
    y = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return y.transpose(0, 2, 1, 3).reshape(batch, steps, heads * HEAD)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2), (3, 1)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rotary", [None, "half", "interleaved", "partial"])
def test_gradcheck(heads, kv_heads, causal, rotary, op_path):
    qkv = leaf((2, 3, (heads + 2 * kv_heads) * HEAD))
    cos = sin = None
    if rotary is not None:
        cos, sin = tables(3, 1 if rotary == "partial" else HEAD // 2)
    interleaved = rotary == "interleaved"
    fn = lambda t: F.packed_attention(  # noqa: E731
        t, heads, causal=causal, num_kv_heads=kv_heads, cos=cos, sin=sin, interleaved=interleaved
    )
    assert gradcheck(fn, [qkv])


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_matches_split_rotate_attend_merge(window, dropout_p):
    qkv_data = np.random.default_rng(1).standard_normal((3, 70, 8 * HEAD)).astype(np.float32)
    upstream = np.random.default_rng(2).standard_normal((3, 70, 4 * HEAD)).astype(np.float32)
    cos, sin = tables(70)
    results = []
    for fused in (True, False):
        qkv = Tensor(qkv_data.copy(), requires_grad=True)
        options = dict(causal=True, dropout_p=dropout_p, rng=np.random.default_rng(7))
        if fused:
            y = F.packed_attention(
                qkv, 4, num_kv_heads=2, cos=cos, sin=sin, window=window, **options
            )
        else:
            y = unfused(qkv, 4, 2, cos, sin, window=window, **options)
        y.backward(upstream)
        assert y.dtype == np.float32 and qkv.grad.dtype == np.float32
        results.append((y.data, qkv.grad))
    (y, g), (y_ref, g_ref) = results
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def test_matches_torch_sdpa_with_gqa_and_rope():
    torch = optional("torch")
    heads, kv_heads, steps = 4, 2, 6
    qkv = leaf((2, steps, (heads + 2 * kv_heads) * HEAD), seed=3)
    upstream = np.random.default_rng(4).standard_normal((2, steps, heads * HEAD))
    cos, sin = tables(steps)
    y = F.packed_attention(qkv, heads, causal=True, num_kv_heads=kv_heads, cos=cos, sin=sin)
    y.backward(upstream)

    t = torch.tensor(qkv.data, requires_grad=True)
    q, k, v = t.split([heads * HEAD, kv_heads * HEAD, kv_heads * HEAD], dim=-1)
    q, k, v = (a.reshape(2, steps, -1, HEAD).transpose(1, 2) for a in (q, k, v))
    c, s = (torch.tensor(np.concatenate([a, a], axis=-1), dtype=t.dtype) for a in (cos, sin))

    def rope(a):  # transformers' apply_rotary_pos_emb
        half = HEAD // 2
        return a * c + torch.cat([-a[..., half:], a[..., :half]], dim=-1) * s

    out = torch.nn.functional.scaled_dot_product_attention(
        rope(q), rope(k), v, is_causal=True, enable_gqa=True
    )
    out = out.transpose(1, 2).reshape(2, steps, heads * HEAD)
    out.backward(torch.tensor(upstream))
    np.testing.assert_allclose(y.data, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(qkv.grad, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_errors_name_the_problem():
    qkv = Tensor(np.ones((2, 3, 8 * HEAD)))
    with pytest.raises(ValueError, match="num_kv_heads=3 dividing num_heads=4"):
        F.packed_attention(qkv, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads=2 dividing"):
        F.packed_attention(Tensor(np.ones((2, 3, 7))), 4, num_kv_heads=2)
    cos, sin = tables(3)
    with pytest.raises(ValueError, match="both or neither"):
        F.packed_attention(qkv, 4, num_kv_heads=2, cos=cos)
    with pytest.raises(ValueError, match=r"must both be \(T=3, r/2\)"):
        F.packed_attention(qkv, 4, num_kv_heads=2, cos=cos[:2], sin=sin[:2])
    wide = tables(3, half=HEAD)
    with pytest.raises(ValueError, match="rotate 2 \\* 4 features of heads of 4"):
        F.packed_attention(qkv, 4, num_kv_heads=2, cos=wide[0], sin=wide[1])
