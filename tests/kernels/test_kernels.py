"""Each fast kernel (glassllm.kernels) held to its operation's plain definition in
glassllm.functional, on every path (NumPy blocks, numba) and thread count; the switch that
chooses between them."""

from __future__ import annotations

import contextlib
import math
from functools import partial

import numpy as np
import pytest
from conftest import on_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glassllm.functional as F
from glassllm import Tensor, kernels
from glassllm.functional.activations import _gelu_tanh_definition
from glassllm.functional.attention import (
    _attention_definition,
    _mask_bias,
    _probabilities_definition,
)
from glassllm.functional.normalization import _layer_norm_definition
from glassllm.functional.packed_attention import _packed_definition
from glassllm.kernels import attention as attention_kernels
from glassllm.kernels import linear as linear_kernels

DTYPES = [np.float32, np.float64]
# float rounding: the kernels' row sums add in another order than NumPy's pairwise sums
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _close(got, want, dtype, scale=1.0):
    """Equal to rounding; ``scale``: how much the op amplifies its inputs' rounding."""
    assert got.dtype == want.dtype == np.dtype(dtype)
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=tolerance["rtol"], atol=tolerance["atol"] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2, 3])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.sampled_from([1, 3, 700, 1100, 2100]),
    dim=st.integers(1, 40),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_kernel_matches_its_definition(
    kernel_path, dtype, count, rows, dim, affine, seed
):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, dim)) * 3 + 1).astype(dtype)
    dy = rng.standard_normal((rows, dim)).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype) if affine else None
    b = rng.standard_normal(dim).astype(dtype) if affine else None
    want, want_vjp = _layer_norm_definition(x, w, b, 1e-5)

    def run():
        out, vjp = kernels.layer_norm(x, w, b, 1e-5)
        return out, vjp(dy, True, affine, affine)

    out, grads = on_threads(count, run)
    # rstd = 1/std amplifies the rounding of x - mu (up to 1/sqrt(eps) for a constant row)
    rstd = 1.0 / np.sqrt(x.astype(np.float64).var(axis=-1).min() + 1e-5)
    amplified = rstd * rstd * (1.0 if w is None else float(np.abs(w).max()))
    _close(out, want, dtype, rstd)
    for got, expected in zip(grads, want_vjp(dy, True, affine, affine), strict=True):
        if expected is None:
            assert got is None
        else:
            _close(got, expected, dtype, amplified * rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2, 3])
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.sampled_from([0, 1, 7, 1000, 300_001]), seed=st.integers(0, 2**16))
def test_gelu_kernel_matches_its_definition(kernel_path, dtype, count, size, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * 4).astype(dtype)
    g = rng.standard_normal(size).astype(dtype)
    want, want_vjp = _gelu_tanh_definition(x)
    out, vjp = on_threads(count, lambda: kernels.gelu_tanh(x))
    _close(out, want, dtype)
    _close(on_threads(count, lambda: vjp(g)), want_vjp(g), dtype)


def test_gelu_definition_keeps_the_far_tails():
    """The definition's sigmoid form has the right limits where ``1 + tanh`` cancels."""
    x = np.array([-1e4, -30.0, 0.0, 30.0, 1e4], np.float32)
    y, vjp = _gelu_tanh_definition(x)
    assert y.dtype == np.float32 and np.isfinite(y).all()
    np.testing.assert_array_equal(y[[0, 2, 4]], [-0.0, 0.0, 1e4])
    assert np.isfinite(vjp(np.ones_like(x))).all()


def _on_blas_threads(count: int, fn):
    """``fn()`` with OpenBLAS on ``count`` threads (its count before restored)."""
    from glassllm.threads import openblas_thread_functions

    pairs = openblas_thread_functions()
    before = [get() for get, _ in pairs]
    for _, set_ in pairs:
        set_(count)
    try:
        return fn()
    finally:
        for (_, set_), count_before in zip(pairs, before, strict=True):
            set_(count_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fan_in", [512, 577])  # 577: rows not a multiple of a SIMD width
def test_decoding_row_times_table_has_the_bits_of_one_gemv_on_any_thread_count(dtype, fan_in):
    """One row against a transposed table of >= 2^19 weights (a tied head in a decoding step):
    ``x @ w`` to rounding, and bit for bit one gemv on one BLAS thread, whatever the worker
    and the BLAS thread counts (OpenBLAS's own threaded gemv is not: it rounds the outputs at
    its split points differently, e.g. 2 of GPT-2's 50,257 logits at 1 vs 2 threads)."""
    from glassllm.threads import one_blas_thread

    rng = np.random.default_rng(0)
    vocab = linear_kernels._STREAMED // fan_in + 67  # odd, and not a multiple of 64
    table = rng.standard_normal((vocab, fan_in)).astype(dtype)
    x = rng.standard_normal((1, fan_in)).astype(dtype)
    with one_blas_thread() as limited:
        want = table @ x[0]
    assert limited, "NumPy's OpenBLAS could not be held to one thread here"
    _close(want[None], x @ table.T, dtype)
    for blas_threads in (1, 2, 3):
        for workers in (1, 2, 3, 4):
            decode = partial(kernels.matmul_rows, x, table.T)
            got = _on_blas_threads(blas_threads, partial(on_threads, workers, decode))
            assert got.dtype == dtype and got.shape == (1, vocab)
            np.testing.assert_array_equal(got[0], want, err_msg=f"{blas_threads=} {workers=}")
    # the einsum blocks, where BLAS cannot be held to one thread: the same bits on any count
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linear_kernels, "one_blas_thread", lambda: _not_limited())
        fallback = [on_threads(n, lambda: kernels.matmul_rows(x, table.T)) for n in (1, 2, 3)]
    _close(fallback[0], x @ table.T, dtype)
    for other in fallback[1:]:
        np.testing.assert_array_equal(other, fallback[0])


@contextlib.contextmanager
def _not_limited():
    yield False


@pytest.mark.parametrize("rows", [1, 3])
def test_row_times_an_in_out_matrix_is_one_blas_call(rows):
    """An ``(in, out)`` matrix, or several rows, go to BLAS as they are: exactly ``x @ w``."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, linear_kernels._STREAMED // 512 + 3)).astype(np.float32)
    x = rng.standard_normal((rows, 512)).astype(np.float32)
    np.testing.assert_array_equal(kernels.matmul_rows(x, w), x @ w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2, 3])
@settings(max_examples=12, deadline=None)
@given(
    batch=st.sampled_from([(), (1,), (3,), (2, 3)]),
    queries=st.integers(1, 9),
    extra_keys=st.integers(0, 4),
    head_dim=st.integers(1, 8),
    causal=st.booleans(),
    masked=st.booleans(),
    dropout_p=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_attention_kernel_matches_its_definition(
    dtype, count, batch, queries, extra_keys, head_dim, causal, masked, dropout_p, seed
):
    """`kernels.attention.attention` (scaled keys, reciprocal row sums, rowsum(G * O)) is the
    definition to rounding, with dropout drawn from the same generator as the same mask."""
    rng = np.random.default_rng(seed)
    keys = queries + extra_keys
    q = (rng.standard_normal(batch + (queries, head_dim)) * 2).astype(dtype)
    k = (rng.standard_normal(batch + (keys, head_dim)) * 2).astype(dtype)
    v = rng.standard_normal(batch + (keys, 3)).astype(dtype)
    g = rng.standard_normal(batch + (queries, 3)).astype(dtype)
    mask = rng.random((queries, keys)) > 0.3 if masked else None  # some rows fully masked
    bias = _mask_bias(queries, keys, causal, mask, np.dtype(dtype))
    scale = 1.0 / math.sqrt(head_dim)  # a Python float, as the op passes
    want, want_vjp = _attention_definition(
        q, k, v, scale, bias, dropout_p, np.random.default_rng(1), dtype
    )
    out, vjp = on_threads(
        count,
        lambda: attention_kernels.attention(
            q, k, v, scale, bias, dropout_p, np.random.default_rng(1), dtype
        ),
    )
    _close(out, want, dtype, 10.0)
    for got, expected in zip(vjp(g, True, True, True), want_vjp(g, True, True, True), strict=True):
        _close(got, expected, dtype, 10.0 * keys)
    assert vjp(g, False, True, False)[::2] == (None, None)
    probabilities = attention_kernels.attention_probabilities(q, k, scale, bias, dtype)
    _close(probabilities, _probabilities_definition(q, k, scale, bias, dtype), dtype, 10.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 2, 3])
@settings(max_examples=10, deadline=None)
@given(
    batch=st.integers(1, 5),
    steps=st.sampled_from([1, 2, 7, attention_kernels.CAUSAL_TILE + 1, 140]),
    num_heads=st.integers(1, 3),
    head_size=st.integers(1, 6),
    causal=st.booleans(),
    dropout_p=st.sampled_from([0.0, 0.3]),
    keep=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_attention_kernel_matches_its_definition(
    dtype, count, batch, steps, num_heads, head_size, causal, dropout_p, keep, seed
):
    """`kernels.attention.packed_attention` (causal tiles over blocks of the batch on worker
    threads, heads written in place) is the definition to rounding, the same dropout mask."""
    rng = np.random.default_rng(seed)
    embed = num_heads * head_size
    qkv = (rng.standard_normal((batch, steps, 3 * embed)) * 2).astype(dtype)
    g = rng.standard_normal((batch, steps, embed)).astype(dtype)
    heads = F.split_packed_heads(qkv, num_heads)
    scale = 1.0 / math.sqrt(head_size)
    want, want_vjp = _packed_definition(
        heads, scale, causal, dropout_p, np.random.default_rng(1), keep
    )
    out, vjp = on_threads(
        count,
        lambda: attention_kernels.packed_attention(
            heads, scale, causal, dropout_p, np.random.default_rng(1), keep
        ),
    )
    _close(out, want, dtype, 10.0)
    if keep:
        _close(on_threads(count, lambda: vjp(g)), want_vjp(g), dtype, 10.0 * steps)


def test_reference_mode_runs_the_definitions_and_comes_back():
    x = Tensor(np.random.default_rng(0).standard_normal((4, 6)), requires_grad=True)
    fast = F.layer_norm(F.gelu(x)).data
    assert not kernels.reference()
    with kernels.use("reference"):
        assert kernels.reference()
        reference = F.layer_norm(F.gelu(x))
        assert reference.op == "layer_norm"
    assert not kernels.reference()
    np.testing.assert_allclose(reference.data, fast, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="mode must be one of"):
        with kernels.use("quick"):
            pass


def test_environment_selects_the_reference_definitions(run_python):
    import os

    code = "from glassllm import kernels; print(kernels.reference())"
    os.environ["GLASSLLM_KERNELS"] = "reference"
    try:
        result = run_python("-c", code)
    finally:
        del os.environ["GLASSLLM_KERNELS"]
    assert result.stdout.strip() == "True", result.stderr


def test_old_compiled_import_path_is_the_same_switch():
    from glassllm.functional import compiled as old
    from glassllm.kernels import compiled as new

    assert old.set_enabled is new.set_enabled and old.kernels_for is new.kernels_for
    before = new.enabled()
    old.set_enabled(False)
    try:
        assert not new.enabled() and new.kernels_for(np.dtype(np.float32)) is None
    finally:
        new.set_enabled(before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows", [1, 5, 64, 65, 300])  # one-hot below 65 rows, sort above
@pytest.mark.parametrize("count", [0, 1, 40])
def test_scatter_add_kernel_matches_its_definition(dtype, num_rows, count):
    from glassllm.functional.affine import _scatter_add_definition
    from glassllm.kernels.embedding import scatter_add_rows

    rng = np.random.default_rng(num_rows + count)
    ids = rng.integers(0, min(num_rows, 4), count)  # few distinct ids: many repeats
    grad_rows = rng.standard_normal((count, 7)).astype(dtype)
    want = _scatter_add_definition(ids, grad_rows, num_rows)
    got = scatter_add_rows(ids, grad_rows, num_rows)
    _close(got, want, dtype, scale=4.0)  # both exact sums of up to 40 rows, in another order


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape, axes",
    [((5, 9), (1,)), ((5, 9), (-1,)), ((5, 9), (0,)), ((2, 3, 4), (2,)), ((2, 3, 4), (0, 2)),
     ((2, 3, 4), (1,)), ((4,), (0,)), ((0, 3), (1,)), ((3, 0), (0,))],
)  # fmt: skip
@pytest.mark.parametrize("keepdims", [True, False])
def test_sum_axes_kernel_matches_numpy_sum(dtype, shape, axes, keepdims):
    a = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    got = kernels.sum_axes(a, axes, keepdims)
    want = a.sum(axis=axes, keepdims=keepdims)
    assert got.shape == want.shape
    _close(np.asarray(got), np.asarray(want), dtype)
