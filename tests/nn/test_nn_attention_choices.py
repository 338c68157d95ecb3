"""CausalSelfAttention's modern choices (GQA, free head_dim, separate biases, QK-norm, rotary,
scale, window) against a plain composite of the same maths, finite differences in float64, and
its own KV cache."""

from __future__ import annotations

import numpy as np
import pytest

import glassllm.functional as F
import glassllm.nn as nn
from glassllm import Tensor, gradcheck, no_grad

CHOICES = dict(num_kv_heads=2, head_dim=6, qkv_bias=True, out_bias=False, qk_norm=True,
               rotary_dim=4, rope_theta=100.0, scale=0.3, window=3)  # fmt: skip


def layer(dtype=np.float32, **choices) -> nn.CausalSelfAttention:
    attn = nn.CausalSelfAttention(8, 4, dtype=dtype, rng=np.random.default_rng(0), **choices)
    rng = np.random.default_rng(1)
    for p in attn.parameters():  # norms off their ones, biases off zero
        p.data += (0.3 * rng.standard_normal(p.shape)).astype(dtype)
    return attn


def reference(attn: nn.CausalSelfAttention, x: np.ndarray) -> np.ndarray:
    """The same layer in plain NumPy: project, split, RMSNorm q and k, rotate, repeat each kv
    head for its group of query heads, masked softmax, merge, project."""
    B, T, _ = x.shape
    H, KV, hd = attn.num_heads, attn.num_kv_heads, attn.head_size
    qkv = x @ attn.qkv.weight.data + (0 if attn.qkv.bias is None else attn.qkv.bias.data)
    q, k, v = np.split(qkv, [H * hd, (H + KV) * hd], axis=-1)
    q, k, v = (a.reshape(B, T, -1, hd).transpose(0, 2, 1, 3) for a in (q, k, v))
    if attn.q_norm is not None:

        def rms(a, w):
            return a / np.sqrt((a * a).mean(-1, keepdims=True) + attn.q_norm.eps) * w

        q, k = rms(q, attn.q_norm.weight.data), rms(k, attn.k_norm.weight.data)
    if attn.rotary is not None:
        r = attn.rotary.rotary_dim
        # the layer's float32 tables (F.rotary_cos_sin, tested against transformers' own)
        cos, sin = (table.astype(np.float64) for table in attn.rotary.tables(0, T))

        def rotate(a):
            a1, a2 = a[..., : r // 2], a[..., r // 2 : r]
            return np.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin, a[..., r:]], -1)

        q, k = rotate(q), rotate(k)
    k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)  # contiguous groups
    scale = attn.scale if attn.scale is not None else 1 / np.sqrt(hd)
    scores = q @ k.transpose(0, 1, 3, 2) * scale
    i, j = np.indices((T, T))
    allowed = (j <= i) & ((i - j) < (attn.window or T + 1))
    scores = np.where(allowed, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    y = y.transpose(0, 2, 1, 3).reshape(B, T, H * hd)
    return y @ attn.proj.weight.data + (0 if attn.proj.bias is None else attn.proj.bias.data)


@pytest.mark.parametrize("choice", ["all", *CHOICES])
def test_each_choice_matches_the_plain_maths(choice):
    choices = CHOICES if choice == "all" else {choice: CHOICES[choice]}
    if choice in ("rotary_dim", "rope_theta"):  # heads of 8 / 4 = 2 features
        choices = {"rotary_dim": 2, "rope_theta": CHOICES["rope_theta"]}
    attn = layer(np.float64, **choices)
    x = np.random.default_rng(2).standard_normal((2, 7, 8))
    # the fused packed op serves a free head size, separate biases, a scale and a window
    assert attn.packed == (choice in ("head_dim", "qkv_bias", "out_bias", "scale", "window"))
    np.testing.assert_allclose(attn(Tensor(x)).data, reference(attn, x), atol=1e-12)


def test_gpt2_keeps_the_packed_fast_path():
    attn = layer()
    assert attn.packed and attn.q_norm is None and attn.rotary is None
    x = np.random.default_rng(2).standard_normal((2, 7, 8)).astype(np.float32)
    np.testing.assert_allclose(attn(Tensor(x)).data, reference(attn, x), atol=1e-5)


def test_gradients_of_every_choice_match_finite_differences():
    attn = layer(np.float64, **CHOICES)
    x = Tensor(np.random.default_rng(3).standard_normal((2, 6, 8)), requires_grad=True)
    assert gradcheck(lambda *_: attn(x), [x, *attn.parameters()], rng=np.random.default_rng(4))


def test_the_cache_holds_kv_heads_and_gives_the_full_outputs():
    attn = layer(**CHOICES)
    x = np.random.default_rng(5).standard_normal((2, 9, 8)).astype(np.float32)
    with no_grad():
        full = attn(Tensor(x)).data
        cache = nn.KVCache()
        attn.prefill(Tensor(x[:, :3]), cache)
        parts = [attn(Tensor(x[:, 3:5]), kv_cache=cache).data]
        parts += [attn(Tensor(x[:, t : t + 1]), kv_cache=cache).data for t in range(5, 9)]
    assert cache.keys.shape == (2, 2, 9, 6)  # (B, KV, T, hd): two kv heads, not four
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full[:, 3:], atol=1e-5)


def test_heads_normalise_before_rotating():
    attn = layer(qk_norm=True, rotary_dim=2)
    qkv = Tensor(np.random.default_rng(6).standard_normal((1, 4, 24)).astype(np.float32))
    q, k, _ = attn.heads(qkv, start=2)
    raw = qkv.data[..., :8].reshape(1, 4, 4, 2).transpose(0, 2, 1, 3)
    normed = F.rms_norm(Tensor(raw), attn.q_norm.weight, eps=attn.q_norm.eps)
    np.testing.assert_array_equal(q.data, attn.rotary(normed, 2).data)


@pytest.mark.parametrize(
    "choices, message",
    [
        (dict(num_kv_heads=3), r"num_kv_heads \(3\) must divide num_heads \(4\)"),
        (dict(num_kv_heads=0), "num_kv_heads must be a positive integer"),
        (dict(head_dim=0), "head_dim must be a positive integer"),
        (dict(window=0), "window must be a positive integer"),
        (dict(scale=-1.0), "scale must be positive"),
    ],
)
def test_bad_choices_are_named(choices, message):
    with pytest.raises(ValueError, match=message):
        nn.CausalSelfAttention(8, 4, **choices)
