"""nn.init (statistics, bounds, dtypes, fans in our (in, out) layout, rng) and clip_grad_norm_."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import optional

import glassllm
import glassllm.nn as nn
from glassllm import Tensor
from glassllm.nn import init
from glassllm.nn.utils import clip_grad_norm_


def empty(*shape: int, dtype=np.float32) -> Tensor:
    return Tensor(np.full(shape, np.nan, dtype=dtype), requires_grad=True)


# ----------------------------------------------------------------------------- init


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_and_uniform_statistics_keep_dtype_and_write_in_place(dtype):
    rng = np.random.default_rng(0)
    t = empty(400, 100, dtype=dtype)
    array = t.data
    assert init.normal_(t, mean=2.0, std=0.5, rng=rng) is t
    assert t.data is array and t.dtype == dtype
    assert abs(t.data.mean() - 2.0) < 0.01 and abs(t.data.std() - 0.5) < 0.01
    init.uniform_(t, -3.0, 1.0, rng=rng)
    assert t.dtype == dtype and t.data.min() >= -3.0 and t.data.max() <= 1.0
    assert abs(t.data.mean() + 1.0) < 0.02 and abs(t.data.var() - 16.0 / 12.0) < 0.03


def test_constant_zeros_ones_and_float16():
    t = empty(3, 2)
    np.testing.assert_array_equal(init.zeros_(t).data, 0.0)
    np.testing.assert_array_equal(init.ones_(t).data, 1.0)
    np.testing.assert_array_equal(init.constant_(t, 0.25).data, 0.25)
    assert t.dtype == np.float32
    half = init.normal_(empty(10, dtype=np.float16), rng=np.random.default_rng(1))
    assert half.dtype == np.float16 and np.all(np.isfinite(half.data))


def test_fans_follow_the_in_out_layout():
    assert init.calculate_fan_in_and_fan_out((30, 10)) == (30, 10)  # torch would say (10, 30)
    assert init.calculate_fan_in_and_fan_out((3, 4, 5)) == (15, 20)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        init.xavier_uniform_(empty(5))


def test_xavier_and_kaiming_bounds_and_statistics():
    rng = np.random.default_rng(2)
    fan_in, fan_out = 500, 200
    t = empty(fan_in, fan_out)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    init.xavier_uniform_(t, rng=rng)
    assert np.abs(t.data).max() <= bound and np.abs(t.data).max() > 0.99 * bound
    init.xavier_normal_(t, gain=2.0, rng=rng)
    assert abs(t.data.std() - 2.0 * math.sqrt(2.0 / (fan_in + fan_out))) < 0.002
    init.kaiming_uniform_(t, nonlinearity="relu", rng=rng)
    relu_bound = math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
    assert np.abs(t.data).max() <= relu_bound and np.abs(t.data).max() > 0.99 * relu_bound
    init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu", rng=rng)
    assert abs(t.data.std() - math.sqrt(2.0 / fan_out)) < 0.002
    assert t.dtype == np.float32
    # PyTorch's Linear initialisation is kaiming_uniform_(a=sqrt(5)): U(+-1/sqrt(fan_in)).
    init.kaiming_uniform_(t, a=math.sqrt(5.0), rng=rng)
    assert abs(np.abs(t.data).max() - 1.0 / math.sqrt(fan_in)) < 1e-3 / math.sqrt(fan_in)
    with pytest.raises(ValueError, match="mode"):
        init.kaiming_normal_(t, mode="fan_avg")


def test_calculate_gain_matches_torch():
    torch = optional("torch")
    for name, param in [
        ("linear", None),
        ("tanh", None),
        ("relu", None),
        ("leaky_relu", None),
        ("leaky_relu", 0.2),
        ("selu", None),
        ("sigmoid", None),
    ]:
        assert init.calculate_gain(name, param) == pytest.approx(
            torch.nn.init.calculate_gain(name, param)
        )


def test_init_is_reproducible_and_checks_its_target():
    glassllm.manual_seed(7)
    a = init.normal_(empty(4, 4)).data.copy()
    glassllm.manual_seed(7)
    np.testing.assert_array_equal(init.normal_(empty(4, 4)).data, a)
    b = init.normal_(empty(4, 4), rng=np.random.default_rng(3)).data
    np.testing.assert_array_equal(init.normal_(empty(4, 4), rng=np.random.default_rng(3)).data, b)
    with pytest.raises(TypeError, match="floating"):
        init.normal_(Tensor(np.zeros(3, dtype=np.int64)))
    with pytest.raises(TypeError, match="Tensor or numpy ndarray"):
        init.normal_([1.0, 2.0])
    with pytest.raises(ValueError, match="std"):
        init.normal_(empty(3), std=-1.0)
    with pytest.raises(TypeError, match="Generator"):
        init.normal_(empty(3), rng=3)


# ----------------------------------------------------------------------------- clip_grad_norm_


def with_grads(*grads: np.ndarray | None) -> list[Tensor]:
    params = []
    for grad in grads:
        p = Tensor(np.zeros(1 if grad is None else grad.shape, np.float32), requires_grad=True)
        p.grad = grad
        params.append(p)
    return params


def test_clip_grad_norm_scales_in_place_and_returns_the_norm_before():
    a, b = np.full((2, 2), 3.0, np.float32), np.array([4.0, 0.0, 0.0, 0.0], np.float32)
    params = with_grads(a, None, b)
    total = clip_grad_norm_(params, max_norm=1.0)
    assert isinstance(total, float) and total == pytest.approx(math.sqrt(36.0 + 16.0))
    assert params[0].grad is a and a.dtype == np.float32  # in place, dtype kept
    assert params[1].grad is None  # skipped
    after = math.sqrt(float(np.sum(a.astype(np.float64) ** 2) + np.sum(b.astype(np.float64) ** 2)))
    assert after == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_leaves_small_gradients_alone():
    params = with_grads(np.array([0.3, 0.4]))
    assert clip_grad_norm_(params, 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(params[0].grad, [0.3, 0.4])
    assert clip_grad_norm_(with_grads(None), 1.0) == 0.0
    model = nn.Linear(2, 2)
    assert clip_grad_norm_(model.parameters(), 1.0) == 0.0  # no grads yet


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_matches_torch(norm_type):
    torch = optional("torch")
    rng = np.random.default_rng(4)
    grads = [
        rng.standard_normal((3, 5), dtype=np.float32),
        rng.standard_normal(7, dtype=np.float32),
    ]
    ours = with_grads(*(g.copy() for g in grads))
    theirs = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for t, g in zip(theirs, grads, strict=True):
        t.grad = torch.from_numpy(g.copy())
    total = clip_grad_norm_(ours, 0.5, norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type=norm_type)
    assert total == pytest.approx(float(expected), rel=1e-6)
    for p, t in zip(ours, theirs, strict=True):
        assert p.grad.dtype == np.float32
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_rejects_bad_arguments():
    with pytest.raises(TypeError, match="Tensors"):
        clip_grad_norm_([np.zeros(2)], 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_(with_grads(np.ones(2)), -1.0)
    params = with_grads(np.array([np.inf, 1.0]))
    with pytest.raises(RuntimeError, match="error_if_nonfinite"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert params[0].grad[1] == 1.0  # unchanged


# The 2-norm's fast path (a BLAS dot in the gradient's dtype) against float64 sums.


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_norm_matches_float64_sum_on_large_and_strided_gradients(dtype):
    rng = np.random.default_rng(0)
    grads = [
        rng.standard_normal((512, 128)).astype(dtype) * 3.0,  # 65K entries, as a GPT's MLP weight
        rng.standard_normal((64, 65)).astype(dtype).T,  # a transposed (non-contiguous) gradient
        np.full(1000, 1e-3, dtype=dtype),
    ]
    params = [Tensor(np.zeros(g.shape, dtype), requires_grad=True) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.copy()
    exact = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    total = clip_grad_norm_(params, max_norm=1.0)
    assert total == pytest.approx(exact, rel=1e-6)
    for p, g in zip(params, grads, strict=True):
        assert p.grad.dtype == dtype
        np.testing.assert_allclose(p.grad, g * (1.0 / (exact + 1e-6)), rtol=1e-5)


@pytest.mark.parametrize("value", [2e19, 1e-24])
def test_float32_gradients_whose_squares_overflow_or_underflow_are_normed_in_float64(value):
    w = Tensor(np.zeros(100, np.float32), requires_grad=True)
    w.grad = np.full(100, value, np.float32)
    exact = 10.0 * float(np.float32(value))  # sqrt(100 * value^2)
    total = clip_grad_norm_([w], max_norm=1.0)
    assert total == pytest.approx(exact, rel=1e-6)
    assert w.grad.dtype == np.float32
    if exact > 1.0:  # clipped to norm 1, not zeroed
        assert float(np.linalg.norm(w.grad.astype(np.float64))) == pytest.approx(1.0, rel=1e-5)


def test_infinite_gradient_still_gives_an_infinite_norm():
    w = Tensor(np.zeros(3, np.float32), requires_grad=True)
    w.grad = np.array([1.0, np.inf, 0.0], np.float32)
    assert math.isinf(clip_grad_norm_([w], max_norm=1.0))
