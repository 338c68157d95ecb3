"""clip_grad_norm_'s 2-norm fast path (a BLAS dot in the gradient's dtype) against float64 sums."""

from __future__ import annotations

import math

import numpy as np
import pytest

from glassllm import Tensor
from glassllm.nn.utils import clip_grad_norm_


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
