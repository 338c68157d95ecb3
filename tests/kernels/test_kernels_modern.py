"""The kernels of the modern-model ops (RMSNorm; grouped-query attention) held to their plain
definitions in glassllm.functional, on every thread count."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import on_threads
from hypothesis import given, settings
from hypothesis import strategies as st

from glassllm import kernels
from glassllm.functional.activations import _swiglu_definition
from glassllm.functional.attention import (
    _attention_definition,
    _mask_bias,
    _probabilities_definition,
)
from glassllm.functional.normalization import _rms_norm_definition
from glassllm.functional.packed_attention import _packed_definition
from glassllm.kernels import attention as attention_kernels
from glassllm.kernels import grouped_attention as grouped_kernels

DTYPES = [np.float32, np.float64]
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _close(got, want, dtype, scale=1.0):
    assert got.dtype == want.dtype == np.dtype(dtype)
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2])
@settings(max_examples=15, deadline=None)
@given(
    rows=st.sampled_from([1, 3, 700, 2100]),
    dim=st.integers(1, 40),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_kernel_matches_its_definition(dtype, count, rows, dim, weighted, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, dim)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((rows, dim)).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype) if weighted else None
    want, want_vjp = _rms_norm_definition(x, w, 1e-5)

    def run():
        got, got_vjp = kernels.rms_norm(x, w, 1e-5)
        return got, got_vjp(dy, True, weighted)

    got, grads = on_threads(count, run)
    _close(got, want, dtype)
    for g, h in zip(grads, want_vjp(dy, True, weighted), strict=True):
        assert (g is None) == (h is None)
        if g is not None:
            _close(g, h, dtype, scale=np.sqrt(rows))


@pytest.mark.parametrize("need_x,need_w", [(True, False), (False, True), (False, False)])
def test_rms_norm_kernel_computes_only_the_gradients_asked_for(need_x, need_w):
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    _, vjp = kernels.rms_norm(x, np.ones(6, np.float32), 1e-6)
    dx, dw = vjp(np.ones_like(x), need_x, need_w)
    assert (dx is not None) == need_x and (dw is not None) == need_w


def test_rms_norm_kernel_stays_finite_where_r_cubed_overflows():
    """Rows of rms 1e-20 with eps 0: r^3 mean(g x) overflows float32; the VJP takes the xhat
    form there and matches the definition."""
    x = np.array([[1e-20, -2e-20, 3e-20], [1.0, 2.0, 3.0]], np.float32)
    dy = np.array([[1.0, 0.5, -1.0], [0.3, 0.2, 0.1]], np.float32)
    w = np.array([1.0, 2.0, 0.5], np.float32)
    want = _rms_norm_definition(x, w, 0.0)[1](dy, True, True)
    got = kernels.rms_norm(x, w, 0.0)[1](dy, True, True)
    for g, h in zip(got, want, strict=True):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, h, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2])
@settings(max_examples=15, deadline=None)
@given(
    batch=st.sampled_from([(), (2,)]),
    kv_heads=st.integers(1, 3),
    groups=st.integers(2, 3),
    queries=st.integers(1, 6),
    extra_keys=st.integers(0, 4),
    mask=st.sampled_from(["none", "causal", "window", "heads", "padding"]),
    dropout_p=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_grouped_attention_kernel_matches_its_definition(
    dtype, count, batch, kv_heads, groups, queries, extra_keys, mask, dropout_p, seed
):
    """`kernels.attention.attention` with ``groups > 1`` (each group's query heads stacked on
    its one k and v) is the definition (k and v repeated per query head) to rounding, with the
    same dropout draw, under every kind of bias: causal, a window, per-head and padding masks."""
    rng = np.random.default_rng(seed)
    heads, keys = kv_heads * groups, queries + extra_keys
    q = (rng.standard_normal(batch + (heads, queries, 4)) * 2).astype(dtype)
    k = (rng.standard_normal(batch + (kv_heads, keys, 4)) * 2).astype(dtype)
    v = rng.standard_normal(batch + (kv_heads, keys, 3)).astype(dtype)
    user = {
        "heads": rng.random((heads, queries, keys)) > 0.3,
        "padding": rng.random((2, 1, 1, keys)) > 0.3,
    }.get(mask)
    causal = mask in ("causal", "window")
    window = 2 if mask == "window" else None
    bias = _mask_bias(queries, keys, causal, user, np.dtype(dtype), window)
    band = (window or keys) if causal and not extra_keys else None  # tiles where they apply
    want, want_vjp = _attention_definition(
        q, k, v, 0.5, bias, dropout_p, np.random.default_rng(1), dtype, groups
    )
    out, vjp = on_threads(
        count,
        lambda: grouped_kernels.attention(
            q, k, v, 0.5, bias, dropout_p, np.random.default_rng(1), dtype, groups, band
        ),
    )
    _close(out, want, dtype, 10.0)
    g = rng.standard_normal(out.shape).astype(dtype)  # a padding mask adds a batch axis
    for got, expected in zip(vjp(g, True, True, True), want_vjp(g, True, True, True), strict=True):
        _close(got, expected, dtype, 10.0 * keys * groups)
    assert vjp(g, False, True, False)[::2] == (None, None)
    probabilities = grouped_kernels.attention_probabilities(q, k, 0.5, bias, dtype, groups)
    want_probabilities = _probabilities_definition(q, k, 0.5, bias, dtype, groups)
    _close(probabilities, want_probabilities, dtype, 10.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups,window", [(1, 3), (2, 3), (3, 1), (2, None)])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_banded_tiles_match_the_definition_across_tile_edges(
    monkeypatch, dtype, groups, window, dropout_p
):
    """Causal tiles of 2 queries over 7 steps: with a window each tile skips the keys left of
    its band as well as those right of it; grouped heads add dk, dv over the group."""
    monkeypatch.setattr(attention_kernels, "CAUSAL_TILE", 2)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 2 * groups, 7, 4)).astype(dtype)
    k = rng.standard_normal((2, 2, 7, 4)).astype(dtype)
    v = rng.standard_normal((2, 2, 7, 3)).astype(dtype)
    g = rng.standard_normal((2, 2 * groups, 7, 3)).astype(dtype)
    bias = _mask_bias(7, 7, True, None, np.dtype(dtype), window)
    args = (0.5, bias, dropout_p)  # each call draws its dropout from its own generator(1)
    want, want_vjp = _attention_definition(q, k, v, *args, np.random.default_rng(1), dtype, groups)
    out, vjp = grouped_kernels.attention(
        q, k, v, *args, np.random.default_rng(1), dtype, groups, window or 7
    )
    _close(out, want, dtype, 10.0)
    for got, expected in zip(vjp(g, True, True, True), want_vjp(g, True, True, True), strict=True):
        _close(got, expected, dtype, 100.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 2, 5])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_packed_attention_kernel_with_a_window_matches_its_definition(
    monkeypatch, dtype, window, dropout_p
):
    monkeypatch.setattr(attention_kernels, "CAUSAL_TILE", 2)
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((2, 7, 3 * 2 * 4)).astype(dtype)
    g = rng.standard_normal((2, 7, 8)).astype(dtype)
    heads = attention_kernels.split_packed_heads(qkv, 2)
    results = []
    for fn in (_packed_definition, attention_kernels.packed_attention):
        out, vjp = fn(heads, 0.7, True, dropout_p, np.random.default_rng(1), True, window)
        results.append((out, vjp(g)))
    (want, want_grad), (got, got_grad) = results
    _close(got, want, dtype, 10.0)
    _close(got_grad, want_grad, dtype, 100.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", [(), (3, 5), (300, 1000), (2, 3, 7)])
def test_swiglu_kernel_gives_the_definitions_bits(dtype, count, gated, shape):
    """The same operations in the same order, in place, in chunks on threads: equal bits (the
    large case is split over threads and chunks; the strided one runs unchunked)."""
    rng = np.random.default_rng(0)
    gate = (rng.standard_normal(shape) * 6).astype(dtype)
    up = rng.standard_normal(shape).astype(dtype) if gated else None
    g = rng.standard_normal(shape).astype(dtype)
    if len(shape) == 3:  # a strided view
        gate, g = gate[:, ::2], g[:, ::2]
        up = None if up is None else up[:, ::2]
    want, want_vjp = _swiglu_definition(gate, up)

    def run():
        out, vjp = kernels.swiglu(gate, up)
        return out, vjp(g, True, gated)

    got, grads = on_threads(count, run)
    np.testing.assert_array_equal(got, want)
    for ours, theirs in zip(grads, want_vjp(g, True, gated), strict=True):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert ours.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(ours, theirs)
