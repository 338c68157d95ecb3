"""The ``fast`` extra's compiled kernels (glassllm.kernels.compiled) held to their NumPy
definitions: GELU's and Adam's give NumPy's bits exactly (they do the same operations in the same
order); LayerNorm's sum each row in another order, so they agree to float32 rounding, keep the
two-pass variance's accuracy and give every row the same bits whatever block it is in."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glassllm.functional as F
from glassllm import Tensor
from glassllm.functional import compiled
from glassllm.optim import Adam, AdamW


@pytest.fixture(autouse=True)
def _numba():
    optional("numba")
    before = compiled.enabled()
    yield
    compiled.set_enabled(before)


def _on_both_paths(run):
    """``(compiled result, NumPy result)`` of ``run()``."""
    results = []
    for flag in (True, False):
        compiled.set_enabled(flag)
        assert compiled.enabled() is flag
        results.append(run())
    return results


def _forward_backward(op, x, grad, *params):
    leaves = [Tensor(x.copy(), requires_grad=True)]
    leaves += [None if p is None else Tensor(p.copy(), requires_grad=True) for p in params]
    with np.errstate(all="ignore"):
        out = op(*leaves)
        out.backward(grad.copy())
    return [out.data] + [t.grad for t in leaves if t is not None]


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=40)
floats = st.sampled_from([np.float32, np.float64])


@settings(max_examples=60, deadline=None)
@given(shape=shapes, dtype=floats, seed=st.integers(0, 2**32 - 1))
def test_gelu_gives_numpys_bits(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 6).astype(dtype)
    grad = rng.standard_normal(shape).astype(dtype)
    compiled_result, numpy_result = _on_both_paths(lambda: _forward_backward(F.gelu, x, grad))
    for a, b in zip(compiled_result, numpy_result, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_gives_numpys_bits_at_the_edges_and_on_the_split_path(dtype):
    """inf, nan, huge and subnormal inputs, in an array large enough to be split over threads."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(300_001) * 4).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    x[:9] = [np.inf, -np.inf, np.nan, 1e4, -1e4, -12.0, tiny, -tiny, 0.0]
    grad = rng.standard_normal(x.shape).astype(dtype)
    compiled_result, numpy_result = _on_both_paths(lambda: _forward_backward(F.gelu, x, grad))
    for a, b in zip(compiled_result, numpy_result, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "optimizer, options",
    [
        (AdamW, dict(weight_decay=0.1)),
        (AdamW, dict(weight_decay=0.0)),
        (Adam, dict(weight_decay=0.01)),
        (Adam, dict()),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_gives_numpys_bits(optimizer, options, dtype):
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(shape).astype(dtype) for shape in [(300, 200), (7,), (70_000,)]]
    grads = [
        [(rng.standard_normal(p.shape) * 10.0 ** rng.integers(-4, 3)).astype(dtype) for p in start]
        for _ in range(4)
    ]
    grads[1][0][:] = 0.0  # a zero gradient: the update is m / (sqrt(v) + eps) of the moments
    transposed = rng.standard_normal((40, 30)).astype(dtype).T  # not contiguous: NumPy's loop

    def train():
        params = [Tensor(p.copy(), requires_grad=True) for p in start]
        params.append(Tensor(transposed.copy().T, requires_grad=True))
        assert not params[-1].data.flags.c_contiguous
        opt = optimizer(params, lr=1e-2, betas=(0.9, 0.99), **options)
        for step_grads in grads:
            for p, g in zip(params, step_grads + [transposed.T * 0.5], strict=True):
                p.grad = g
            opt.step()
        moments = [opt.state[name][key] for name in opt.state for key in ("exp_avg", "exp_avg_sq")]
        return [p.data for p in params] + moments

    compiled_result, numpy_result = _on_both_paths(train)
    for a, b in zip(compiled_result, numpy_result, strict=True):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40),
    dtype=floats,
    affine=st.sampled_from(["both", "weight", "none"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_layer_norm_agrees_with_numpy_to_rounding(shape, dtype, affine, seed):
    rng = np.random.default_rng(seed)
    dim = shape[-1]
    x = (rng.standard_normal(shape) * 3 + rng.standard_normal()).astype(dtype)
    grad = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype) if affine != "none" else None
    b = rng.standard_normal(dim).astype(dtype) if affine == "both" else None
    params = [p for p in (w, b) if p is not None]
    op = lambda *t: F.layer_norm(t[0], *t[1:])  # noqa: E731
    compiled_result, numpy_result = _on_both_paths(lambda: _forward_backward(op, x, grad, *params))
    # Both paths round terms of size |dy| |w| rstd before they cancel (rstd = 316 for a row of
    # one value), so the difference scales with those terms, not with the result.
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt(x64.var(axis=-1) + 1e-5).min()
    terms = 1.0 + np.abs(grad).max() * rstd * (1.0 if w is None else np.abs(w).max())
    eps = np.finfo(dtype).eps
    for a, b_ in zip(compiled_result, numpy_result, strict=True):
        assert a.dtype == dtype
        scale = max(terms, float(np.abs(b_).max()))
        np.testing.assert_allclose(a, b_, rtol=0, atol=64 * eps * scale * dim**0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_layer_norm_keeps_the_two_pass_variance(dtype):
    """A large offset does not cancel, and a constant row normalises to 0 with rstd = eps^-1/2."""
    compiled.set_enabled(True)
    offset = Tensor(np.array([[1e4 + 1.0, 1e4 + 2.0, 1e4 + 3.0]], dtype=dtype))
    y = F.layer_norm(offset, eps=0.0)
    np.testing.assert_allclose(y.data, [[-1.2247449, 0.0, 1.2247449]], rtol=1e-6)
    constant = Tensor(np.full((2, 5), 5.0, dtype=dtype), requires_grad=True)
    y = F.layer_norm(constant, eps=1e-4)
    y.backward(np.arange(10.0, dtype=dtype).reshape(2, 5))
    np.testing.assert_array_equal(y.data, np.zeros((2, 5)))
    # dx = rstd (g - mean(g)) with rstd = 100 when x - mu = 0
    expected = 100.0 * (np.arange(10.0).reshape(2, 5) - [[2.0], [7.0]])
    np.testing.assert_allclose(constant.grad, expected, rtol=1e-5)


def test_compiled_layer_norm_gives_a_row_the_same_bits_in_any_block():
    """Each row is computed on its own: a row's result does not depend on its neighbours."""
    compiled.set_enabled(True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 96), dtype=np.float32) * 2 + 1
    w, b = rng.standard_normal(96, dtype=np.float32), rng.standard_normal(96, dtype=np.float32)
    whole = F.layer_norm(Tensor(x), Tensor(w), Tensor(b)).data
    for start, stop in [(0, 1), (7, 8), (13, 41), (49, 50)]:
        part = F.layer_norm(Tensor(x[start:stop].copy()), Tensor(w), Tensor(b)).data
        np.testing.assert_array_equal(part, whole[start:stop])


def test_the_kernels_load_lazily_and_can_be_turned_off(run_python):
    """``import glassllm`` does not import numba; GLASSLLM_NUMBA=0 keeps NumPy alone."""
    code = (
        "import sys, glassllm, glassllm.functional as F, glassllm.optim\n"
        "print('numba' in sys.modules)\n"
        "from glassllm.functional import compiled\n"
        "print(compiled.enabled(), 'numba' in sys.modules)\n"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]
    import os

    os.environ["GLASSLLM_NUMBA"] = "0"
    try:
        done = run_python("-c", code)
    finally:
        del os.environ["GLASSLLM_NUMBA"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble, ">f4", ">f8"])
def test_other_float_types_keep_to_numpy(dtype):
    """The kernels are compiled for float32 and float64 in the machine's byte order; float16,
    longdouble and big-endian floats (as a file may hold them) take NumPy's routines (the same
    results as with the kernels turned off), in their own dtype."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8)).astype(dtype)
    grad = rng.standard_normal((5, 8)).astype(dtype)
    x.flags.writeable = False  # read-only input (a loaded checkpoint's arrays can be)

    def run():
        outs = _forward_backward(F.gelu, x, grad) + _forward_backward(F.layer_norm, x, grad)
        p = Tensor(x.copy(), requires_grad=True)
        p.grad = grad.copy()
        with np.errstate(all="ignore"):  # float16: eps = 1e-8 rounds to 0
            AdamW([p], lr=1e-2).step()
        return outs + [p.data]

    compiled_result, numpy_result = _on_both_paths(run)
    for a, b in zip(compiled_result, numpy_result, strict=True):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)
