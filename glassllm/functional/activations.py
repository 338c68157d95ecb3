"""Elementwise activations: relu and gelu (tanh approximation or exact, via erf)."""

from __future__ import annotations

import math

import numpy as np

from glassllm.functional._common import float_tensor
from glassllm.functional.special import erfc
from glassllm.tensor import Tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def relu(x: Tensor) -> Tensor:
    """``y = max(x, 0)``.

    VJP: ``dy/dx = [x > 0]`` (0 at exactly 0, as in PyTorch), so ``dL/dx = g * [y > 0]``,
    an arithmetic mask rebuilt from the output.

    >>> relu(Tensor(np.array([-1.0, 0.0, 2.0]))).data
    array([0., 0., 2.])
    """
    x = float_tensor(x, "relu: x")
    out = np.maximum(x.data, 0)

    def vjp(grad: np.ndarray) -> tuple:
        return (np.multiply(grad, out > 0),)

    return Tensor.from_op(out, (x,), vjp)


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """Gaussian error linear unit ``y = x Phi(x)`` (Hendrycks and Gimpel, 2016).

    ``approximate="tanh"`` (GPT-2's): ``y = x (1 + t)/2``, ``t = tanh(u)``,
    ``u = c (x + 0.044715 x^3)``, ``c = sqrt(2/pi)``. VJP:
    ``dy/dx = (1 + t)/2 + x (1 - t^2) u'/2 = (1 + t)/2 (1 + x (1 - t) c (1 + 3 0.044715 x^2))``
    with ``t`` kept from the forward. ``tanh`` saturates, so no overflow for any ``x``.

    ``approximate="none"``: ``Phi(x) = erfc(-x/sqrt 2)/2`` (erfc, not ``1 + erf``, so no
    cancellation for very negative ``x``). VJP: ``dy/dx = Phi(x) + x phi(x)`` with
    ``phi(x) = exp(-x^2/2)/sqrt(2 pi)``.

    >>> y = gelu(Tensor(np.array([-1e4, 0.0, 1e4], dtype=np.float32)))
    >>> y.data.tolist(), y.dtype
    ([-0.0, 0.0, 10000.0], dtype('float32'))
    """
    x = float_tensor(x, "gelu: x")
    xd = x.data
    if approximate == "tanh":
        # out= everywhere: for 0-d input NumPy would return immutable scalars
        t = np.multiply(xd, xd, out=np.empty_like(xd))  # then u = x (c + c 0.044715 x^2), then tanh(u)
        t *= _SQRT_2_OVER_PI * _GELU_CUBIC
        t += _SQRT_2_OVER_PI
        t *= xd
        np.tanh(t, out=t)
        out = np.add(t, 1.0, out=np.empty_like(t))
        out *= xd
        out *= 0.5

        def vjp(grad: np.ndarray) -> tuple:
            slope = np.multiply(xd, xd, out=np.empty_like(xd))  # x c (1 + 3 0.044715 x^2)
            slope *= 3.0 * _GELU_CUBIC * _SQRT_2_OVER_PI
            slope += _SQRT_2_OVER_PI
            slope *= xd
            half_one_plus_t = np.subtract(1.0, t, out=np.empty_like(t))  # 1 - t, then (1 + t)/2
            slope *= half_one_plus_t
            slope += 1.0
            np.multiply(t, 0.5, out=half_one_plus_t)
            half_one_plus_t += 0.5
            slope *= half_one_plus_t
            slope *= grad
            return (slope,)

    elif approximate == "none":
        cdf = erfc(xd * -_INV_SQRT_2)
        cdf *= 0.5
        out = np.multiply(xd, cdf)

        def vjp(grad: np.ndarray) -> tuple:
            slope = np.multiply(xd, xd, out=np.empty_like(xd))  # x phi(x) + Phi(x)
            slope *= -0.5
            np.exp(slope, out=slope)
            slope *= _INV_SQRT_2PI
            slope *= xd
            slope += cdf
            slope *= grad
            return (slope,)

    else:
        raise ValueError(f'gelu: approximate must be "tanh" or "none", got {approximate!r}')

    return Tensor.from_op(out, (x,), vjp)
