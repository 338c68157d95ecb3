"""From logits to (log-)probabilities: logsumexp, softmax, log_softmax.

All three subtract the maximum along the reduced axes before exponentiating, so every
exponent is <= 0, ``exp`` never overflows and the sum it feeds is >= 1 (one term is
exp(0)). A slice that is entirely ``-inf`` (fully masked) is shifted by 0 instead of by its
``-inf`` maximum, which would give ``-inf - -inf = nan``.
"""

from __future__ import annotations

import numpy as np

from glassllm.functional._common import exp_shift, float_tensor, sum_over
from glassllm.tensor import Tensor, normalize_axes


def _shifted_exp(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(e, m, s)`` with ``m`` the slice maxima (``exp_shift``), ``e = exp(x - m)``, ``s = sum e``.

    ``m`` and ``s`` keep the reduced axes (size 1). ``e`` is a fresh array the caller may
    overwrite.
    """
    m = exp_shift(x, axes)  # per-slice max, 0 for an all -inf slice
    e = np.subtract(x, m, out=np.empty_like(x))  # out=: NumPy returns scalars for 0-d input
    np.exp(e, out=e)
    s = sum_over(e, axes)
    return e, m, s


def logsumexp(x: Tensor, axis: int | tuple[int, ...] | None = -1, keepdims: bool = False) -> Tensor:
    """``y = log sum_i exp(x_i)`` over ``axis`` (an int, a tuple, or None for all axes).

    Forward: ``y = m + log sum_i exp(x_i - m)`` with ``m = max_i x_i`` (every exponent <= 0).
    VJP: ``dy/dx_i = exp(x_i - y) = softmax(x)_i``, so ``dL/dx = g * softmax(x)``, the
    softmax rebuilt from the stored ``exp(x - m) / sum`` (no second ``exp``). A slice of all
    ``-inf`` gives ``y = -inf`` and a zero gradient.

    >>> x = Tensor(np.array([1e4, 1e4], dtype=np.float32), requires_grad=True)
    >>> y = logsumexp(x)  # 1e4 + log 2, although exp(1e4) overflows float32
    >>> y.dtype, round(float(y.data) - 1e4, 3)
    (dtype('float32'), 0.693)
    """
    x = float_tensor(x, "logsumexp: x")
    axes = normalize_axes(axis, x.ndim)
    e, m, s = _shifted_exp(x.data, axes)
    with np.errstate(divide="ignore"):
        out = np.log(s)
    out += m
    if not keepdims:
        out = np.asarray(out.squeeze(axis=axes))

    def backward(grad: np.ndarray) -> tuple:
        scale = np.divide(grad.reshape(s.shape), s, where=s > 0, out=np.zeros_like(s))
        return (np.multiply(e, scale),)

    return Tensor.from_op(out, (x,), backward).named("logsumexp")


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``p_i = exp(x_i) / sum_j exp(x_j)`` along ``axis``.

    Forward: ``p = exp(x - m) / sum exp(x - m)``, ``m = max x``, so no ``exp`` overflows.
    VJP: ``dp_i/dx_j = p_i (delta_ij - p_j)``, so ``dL/dx = p * (g - sum(g * p))``
    (one temporary, reused in place). A slice of all ``-inf`` gives ``p = 0`` there.

    >>> p = softmax(Tensor(np.array([[0.0, 1e4], [3.0, 3.0]], dtype=np.float32)))
    >>> p.data.tolist()
    [[0.0, 1.0], [0.5, 0.5]]
    """
    x = float_tensor(x, "softmax: x")
    axes = normalize_axes(axis, x.ndim)
    p, _, s = _shifted_exp(x.data, axes)
    s[s == 0] = 1  # an all -inf slice: 0 / 1 = 0 rather than 0 / 0
    p /= s

    def backward(grad: np.ndarray) -> tuple:
        gp = np.multiply(grad, p, out=np.empty_like(p))  # out=: 0-d input gives a scalar
        dot = sum_over(gp, axes)
        np.subtract(grad, dot, out=gp)
        gp *= p
        return (gp,)

    return Tensor.from_op(p, (x,), backward).named("softmax")


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``y_i = x_i - logsumexp(x)`` along ``axis``.

    Forward: ``y = (x - m) - log sum exp(x - m)``: no ``exp`` overflows and no
    ``log(softmax)`` underflows to ``log 0``. VJP: ``dy_i/dx_j = delta_ij - p_j`` with
    ``p = exp(y)``, so ``dL/dx = g - exp(y) * sum(g)``. An all ``-inf`` slice gives ``-inf``.

    >>> y = log_softmax(Tensor(np.array([0.0, 1e4], dtype=np.float32)))
    >>> y.data.tolist()
    [-10000.0, 0.0]
    """
    x = float_tensor(x, "log_softmax: x")
    axes = normalize_axes(axis, x.ndim)
    e, m, s = _shifted_exp(x.data, axes)
    s[s == 0] = 1  # an all -inf slice: log 1 = 0 keeps it -inf rather than -inf - -inf = nan
    out = np.subtract(x.data, m, out=e)  # reuse the exp buffer: s already holds what we need
    out -= np.log(s)

    def backward(grad: np.ndarray) -> tuple:
        total = sum_over(grad, axes)
        dx = np.exp(out, out=np.empty_like(out))  # out=: 0-d input gives a scalar
        dx *= total
        np.subtract(grad, dx, out=dx)
        return (dx,)

    return Tensor.from_op(out, (x,), backward).named("log_softmax")
