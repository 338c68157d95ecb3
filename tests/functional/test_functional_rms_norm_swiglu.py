"""F.rms_norm, F.silu and F.swiglu: finite differences in float64, PyTorch and transformers'
formulas as oracles, float32 kept, stability at extreme inputs, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.functional as F
from glassllm import Tensor, gradcheck


def leaf(shape, seed=0, dtype=np.float64, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    return Tensor((rng.standard_normal(shape) * scale + offset).astype(dtype), requires_grad=True)


# ------------------------------------------------------------------ rms_norm


def test_gradcheck_rms_norm(op_path):
    x, w = leaf((2, 3, 5)), leaf((5,), 1)
    assert gradcheck(lambda x, w: F.rms_norm(x, w), [x, w])
    assert gradcheck(lambda x: F.rms_norm(x, eps=1e-3), [x])
    assert gradcheck(lambda x, w: F.rms_norm(x, w), [leaf((5,), 2), w])  # 1-D input
    assert gradcheck(lambda x, w: F.rms_norm(x, w), [leaf((1, 1), 3), leaf((1,), 4)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_matches_torch_and_transformers_llama_rms_norm(op_path, dtype):
    torch = optional("torch")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 4, 16)) * 2).astype(dtype)
    w = rng.uniform(0.5, 1.5, 16).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    # transformers' LlamaRMSNorm.forward, line for line (float32 in, float32 throughout)
    variance = tx.pow(2).mean(-1, keepdim=True)
    want = tw * (tx * torch.rsqrt(variance + 1e-5))
    want.backward(torch.tensor(dy))
    gx, gw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    got = F.rms_norm(gx, gw, eps=1e-5)
    got.backward(dy)
    tol = dict(rtol=1e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    assert got.dtype == gx.grad.dtype == gw.grad.dtype == dtype
    np.testing.assert_allclose(got.data, want.detach().numpy(), **tol)
    np.testing.assert_allclose(gx.grad, tx.grad.numpy(), **tol)
    np.testing.assert_allclose(gw.grad, tw.grad.numpy(), **tol)
    builtin = torch.nn.functional.rms_norm(torch.tensor(x), (16,), torch.tensor(w), 1e-5)
    np.testing.assert_allclose(got.data, builtin.numpy(), **tol)


def test_rms_norm_is_scale_invariant_and_finite_on_zero_rows(op_path):
    x = np.array([[1e-20, -2e-20, 3e-20], [0.0, 0.0, 0.0], [3e15, -4e15, 1e15]], np.float32)
    y = F.rms_norm(Tensor(x, requires_grad=True), eps=0.0 + 1e-30)
    assert np.isfinite(y.data).all() and y.dtype == np.float32
    np.testing.assert_array_equal(y.data[1], 0.0)
    ref = x[2] / np.sqrt(np.mean(x[2].astype(np.float64) ** 2))
    np.testing.assert_allclose(y.data[2], ref, rtol=1e-6)
    y.backward(np.ones(x.shape, np.float32))


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), weighted=st.booleans())
def test_rms_norm_keeps_the_shape_and_unit_root_mean_square(shape, weighted):
    x = leaf(tuple(shape), dtype=np.float32, scale=3.0)
    w = Tensor(np.full(shape[-1], 2.0, np.float32)) if weighted else None
    y = F.rms_norm(x, w, eps=0.0)
    assert y.shape == x.shape and y.dtype == np.float32
    rms = np.sqrt((y.data.astype(np.float64) ** 2).mean(axis=-1))
    np.testing.assert_allclose(rms, 2.0 if weighted else 1.0, rtol=1e-5)


# ------------------------------------------------------------------ silu, swiglu


@pytest.mark.parametrize("shape", [(), (2, 3), (1, 4, 1)])
def test_gradcheck_silu_and_swiglu(shape, op_path):
    assert gradcheck(F.silu, [leaf(shape, scale=3.0)])
    assert gradcheck(F.swiglu, [leaf(shape, 1, scale=3.0), leaf(shape, 2)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu_and_swiglu_match_torch(op_path, dtype):
    torch = optional("torch")
    rng = np.random.default_rng(1)
    gate = (rng.standard_normal((3, 5, 8)) * 4).astype(dtype)
    up = rng.standard_normal((3, 5, 8)).astype(dtype)
    dy = rng.standard_normal(gate.shape).astype(dtype)
    tg, tu = torch.tensor(gate, requires_grad=True), torch.tensor(up, requires_grad=True)
    want = torch.nn.functional.silu(tg) * tu  # transformers' LlamaMLP: act_fn(gate) * up
    want.backward(torch.tensor(dy))
    g, u = Tensor(gate, requires_grad=True), Tensor(up, requires_grad=True)
    got = F.swiglu(g, u)
    got.backward(dy)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    assert got.dtype == g.grad.dtype == u.grad.dtype == dtype
    np.testing.assert_allclose(got.data, want.detach().numpy(), **tol)
    np.testing.assert_allclose(g.grad, tg.grad.numpy(), **tol)
    np.testing.assert_allclose(u.grad, tu.grad.numpy(), **tol)
    s = F.silu(Tensor(gate))
    np.testing.assert_allclose(s.data, torch.nn.functional.silu(torch.tensor(gate)).numpy(), **tol)


def test_silu_extreme_inputs_are_finite_with_the_right_limits():
    x = Tensor(np.array([-1e4, -100.0, 0.0, 100.0, 1e4], np.float32), requires_grad=True)
    y = F.silu(x)
    y.backward(np.ones(5, np.float32))
    assert y.dtype == x.grad.dtype == np.float32
    np.testing.assert_array_equal(y.data, [-0.0, -0.0, 0.0, 100.0, 1e4])
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.5, 1.0, 1.0])
    assert np.isfinite(x.grad).all()


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call,error,words",
    [
        (
            lambda: F.rms_norm(Tensor(np.ones((2, 3))), Tensor(np.ones(2))),
            ValueError,
            "weight shape",
        ),
        (lambda: F.rms_norm(Tensor(np.ones((2, 0)))), ValueError, "non-empty last axis"),
        (lambda: F.rms_norm(Tensor(np.ones(3)), eps=-1.0), ValueError, "eps"),
        (lambda: F.rms_norm(Tensor(np.arange(3))), TypeError, "floating-point"),
        (lambda: F.silu(Tensor(np.arange(3))), TypeError, "floating-point"),
        (lambda: F.swiglu(Tensor(np.ones((2, 3))), Tensor(np.ones((2, 4)))), ValueError, "shape"),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)
