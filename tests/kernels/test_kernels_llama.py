"""The kernels of Llama's attention against their definitions: the rotary kernel (the same bits),
and the packed attention with grouped heads and rotary positions (float rounding), on every
thread count, across tile edges."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_threads

from glassllm import kernels
from glassllm.functional.packed_attention import _grouped_packed_definition
from glassllm.functional.rotary import _rotary_definition
from glassllm.kernels import attention as attention_kernels
from glassllm.kernels import compiled
from glassllm.kernels import grouped_attention as grouped_kernels

DTYPES = [np.float32, np.float64]
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


def tables(steps, half, dtype, seed=0):
    angles = np.random.default_rng(seed).uniform(-4, 4, (steps, half))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("half", [1, 3])  # of heads of 6 features: partial, then all of them
@pytest.mark.parametrize("strided", [False, True])
def test_rotary_kernel_gives_the_definitions_bits(kernel_path, dtype, interleaved, half, strided):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 12 if strided else 6)).astype(dtype)
    g = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    if strided:
        x = x[..., 3:9]  # a view into a wider array, as q inside qkv
    cos, sin = tables(5, half, dtype)
    want, want_vjp = _rotary_definition(x, cos, sin, interleaved)
    got, got_vjp = kernels.rotary(x, cos, sin, interleaved)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_vjp(g), want_vjp(g))
    assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["packed", "transposed", "2-d", "3-d"])
def test_rotate_into_views_gives_the_definitions_bits(
    monkeypatch, kernel_path, dtype, interleaved, layout
):
    """`rotate` from and into the views the packed attention hands it (heads of a ``(B, T,
    (H + 2 KV) hd)`` array as ``(B, KV, groups, T, hd)``), into one no reshape can flatten, and on
    2-D and 3-D arrays: the definition's bits, nothing outside ``out`` written."""
    from glassllm.kernels.rotary import rotate

    rng = np.random.default_rng(3)
    batch, steps, hd, kv, groups = 2, 5, 8, 2, 3
    cos, sin = tables(steps, 3, dtype)  # partial: 6 of 8 features rotated
    if layout == "packed":
        wide = rng.standard_normal((batch, steps, 4 * kv * groups * hd)).astype(dtype)
        x = wide[..., : kv * groups * hd].reshape(batch, steps, kv, groups, hd)
        x = x.transpose(0, 2, 3, 1, 4)
        target = np.empty_like(wide)
        out = target[..., hd : hd + kv * groups * hd].reshape(batch, steps, kv, groups, hd)
        out = out.transpose(0, 2, 3, 1, 4)
    elif layout == "transposed":  # (B, groups, KV, T, hd) over (B, T, KV, groups, hd): not 4-D
        x = rng.standard_normal((batch, steps, kv, groups, hd)).astype(dtype)
        x = x.transpose(0, 3, 2, 1, 4)
        target = np.empty((batch, steps, kv, groups, hd), dtype)
        out = target.transpose(0, 3, 2, 1, 4)
    else:
        x = rng.standard_normal((steps, hd) if layout == "2-d" else (kv, steps, hd)).astype(dtype)
        target = np.empty((2, *x.shape), dtype)
        out = target[1]
    calls = []
    if kernel_path == "compiled":  # the compiled pass runs wherever out reads as 4-D
        fused = compiled.kernels()
        monkeypatch.setattr(fused, "rotate_pairs", _counted(fused.rotate_pairs, calls))
    for inverse in (False, True):
        target[...] = np.nan
        rotate(x, cos, sin, interleaved, inverse=inverse, out=out)
        want, want_vjp = _rotary_definition(np.ascontiguousarray(x), cos, sin, interleaved)
        np.testing.assert_array_equal(out, want_vjp(np.ascontiguousarray(x)) if inverse else want)
        assert np.isnan(target).sum() == target.size - out.size  # nothing else written
    assert len(calls) == (2 if kernel_path == "compiled" and layout != "transposed" else 0)


def _counted(function, calls):
    def counted(*args):
        calls.append(1)
        return function(*args)

    return counted


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3), (6, 2), (3, 1)])
@pytest.mark.parametrize("causal,window", [(True, None), (True, 3), (False, None)])
@pytest.mark.parametrize("rotary", [None, "half", "interleaved", "partial"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_grouped_packed_attention_kernel_matches_its_definition(
    monkeypatch, dtype, count, heads, kv_heads, causal, window, rotary, dropout_p
):
    monkeypatch.setattr(attention_kernels, "CAUSAL_TILE", 3)  # tiles of 3 over 7 positions
    rng = np.random.default_rng(2)
    batch, steps, head_size = 3, 7, 4
    qkv = rng.standard_normal((batch, steps, (heads + 2 * kv_heads) * head_size)).astype(dtype)
    g = rng.standard_normal((batch, steps, heads * head_size)).astype(dtype)
    cos = sin = None
    if rotary is not None:
        cos, sin = tables(steps, 1 if rotary == "partial" else 2, dtype)
    options = (heads, kv_heads, 0.7, causal, dropout_p)
    tail = (True, window, cos, sin, rotary == "interleaved")
    want, want_vjp = _grouped_packed_definition(qkv, *options, np.random.default_rng(5), *tail)

    def run():
        out, vjp = grouped_kernels.packed_attention(qkv, *options, np.random.default_rng(5), *tail)
        return out, vjp(g)

    got, got_grad = on_threads(count, run)
    assert got.dtype == got_grad.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    want_grad = want_vjp(g)
    np.testing.assert_allclose(
        got_grad, want_grad, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * 10
    )
