"""Elementwise activations: gelu (tanh approximation or exact, via erf), relu, silu, and the
gated swiglu of Llama-family MLPs."""

from __future__ import annotations

import math

import numpy as np

from glassllm import kernels
from glassllm.functional._common import float_tensor
from glassllm.functional.special import erfc
from glassllm.tensor import Tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def relu(x: Tensor) -> Tensor:
    """``Tensor.relu`` (``max(x, 0)``, gradient ``[x > 0]``) for floating-point ``x``.

    >>> relu(Tensor(np.array([-1.0, 0.0, 2.0]))).data
    array([0., 0., 2.])
    """
    return float_tensor(x, "relu: x").relu()


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """Gaussian error linear unit ``y = x Phi(x)`` (Hendrycks and Gimpel, 2016).

    ``approximate="tanh"`` (GPT-2's): ``y = x (1 + tanh u)/2 = x s``, ``s = sigmoid(2u)``,
    ``u = c (x + 0.044715 x^3)``, ``c = sqrt(2/pi)``. VJP: ``ds/dx = 2 u' s (1 - s)``, so
    ``dy/dx = s (1 + 2 x u' (1 - s))``, ``2 x u' = 2c x (1 + 3 0.044715 x^2)``, with ``s`` kept
    from the forward. ``s = 1/(1 + exp(-2u))`` avoids the cancellation of ``1 + tanh u`` for
    ``x << 0``; ``exp`` overflowing to inf gives ``s = 0``, the right limit. The definition is
    `_gelu_tanh_definition`; `glassllm.kernels.gelu_tanh` runs the same operations in place, in
    chunks, on worker threads (numba loops with the ``fast`` extra): the same bits.

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
        out, vjp = kernels.select(_gelu_tanh_definition, kernels.gelu_tanh)(xd)

        def backward(grad: np.ndarray) -> tuple:
            return (vjp(grad),)

    elif approximate == "none":
        cdf = erfc(xd * -_INV_SQRT_2)
        cdf *= 0.5
        out = np.multiply(xd, cdf)

        def backward(grad: np.ndarray) -> tuple:
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

    return Tensor.from_op(out, (x,), backward).named("gelu")


def _gelu_tanh_definition(x: np.ndarray) -> tuple:
    """``gelu(x, approximate="tanh")`` in plain NumPy: ``(y, vjp)``, ``vjp(g) -> dx``. What the
    kernel computes (`glassllm.kernels.gelu_tanh`); ``kernels.use("reference")`` runs this."""
    u = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-2.0 * u))  # sigmoid(2u) = (1 + tanh u)/2
    y = x * s

    def vjp(g: np.ndarray) -> np.ndarray:
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * x * x)  # u'
        return g * s * (1.0 + 2.0 * x * du * (1.0 - s))

    return y, vjp


def silu(x: Tensor) -> Tensor:
    """Sigmoid linear unit (Elfwing et al., 2017; "swish"): ``y = x sigmoid(x)``.

    VJP: with ``s = sigmoid(x)`` (kept from the forward), ``ds/dx = s (1 - s)``, so
    ``dy/dx = s + x s (1 - s) = s (1 + x (1 - s))``. Stability: ``s = 1/(1 + exp(-x))``;
    ``exp`` overflowing to inf for ``x << 0`` gives ``s = 0``, the right limit (``y = -0``), and
    ``s`` rounds to 1 for ``x >> 0`` (``y = x``, slope 1). The definition is
    `_swiglu_definition` with no ``up``; `glassllm.kernels.swiglu` runs its operations in place,
    in chunks, on worker threads: the same bits.

    >>> y = silu(Tensor(np.array([-1e4, 0.0, 2.0], dtype=np.float32)))
    >>> y.data.astype(float).round(4).tolist(), y.dtype
    ([-0.0, 0.0, 1.7616], dtype('float32'))
    """
    x = float_tensor(x, "silu: x")
    out, vjp = kernels.select(_swiglu_definition, kernels.swiglu)(x.data, None)

    def backward(grad: np.ndarray) -> tuple:
        return (vjp(grad, True, False)[0],)

    return Tensor.from_op(out, (x,), backward).named("silu")


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """The gated linear unit of Llama-family MLPs (Shazeer, 2020): ``y = silu(gate) * up``.

    ``gate`` and ``up`` (same shape) are the two projections of the MLP's input; the MLP is
    ``down(swiglu(x W_gate, x W_up))`` (`glassllm.nn.SwiGLU`). One fused node: with
    ``s = sigmoid(gate)`` kept from the forward, ``d_up = dy silu(gate) = dy gate s`` and
    ``d_gate = dy up s (1 + gate (1 - s))`` (`silu`'s slope). Stability as `silu`. The kernel
    (`glassllm.kernels.swiglu`) gives the definition's bits.

    >>> gate, up = (Tensor(np.array(v, dtype=np.float32)) for v in ([0.0, 2.0], [5.0, 2.0]))
    >>> y = swiglu(gate, up)
    >>> y.data.astype(float).round(4).tolist(), y.dtype
    ([0.0, 3.5232], dtype('float32'))
    """
    gate = float_tensor(gate, "swiglu: gate")
    up = float_tensor(up, "swiglu: up")
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} must have the same shape")
    dtype = np.result_type(gate.dtype, up.dtype)
    gate_data, up_data = (t.data.astype(dtype, copy=False) for t in (gate, up))
    out, vjp = kernels.select(_swiglu_definition, kernels.swiglu)(gate_data, up_data)

    def backward(grad: np.ndarray) -> tuple:
        return vjp(grad, gate.requires_grad, up.requires_grad)

    return Tensor.from_op(out, (gate, up), backward).named("swiglu")


def swiglu_array(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """`swiglu`'s forward on plain arrays of one dtype and shape, for decoding under ``no_grad``
    (`glassllm.models.decoding`): the same kernel or definition, so the same bits."""
    return kernels.select(_swiglu_definition, kernels.swiglu)(gate, up)[0]


def _swiglu_definition(gate: np.ndarray, up: np.ndarray | None) -> tuple:
    """``silu(gate) * up`` (``up`` None: ``silu(gate)``) in plain NumPy: ``(y, vjp)``,
    ``vjp(g, need_gate, need_up) -> (d_gate, d_up)``."""
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-gate))  # sigmoid(gate); exp -> inf gives s = 0
    act = gate * s  # silu(gate)
    y = act if up is None else act * up

    def vjp(g: np.ndarray, need_gate: bool, need_up: bool) -> tuple:
        d_act = g if up is None else g * up
        d_gate = d_act * s * (1.0 + gate * (1.0 - s)) if need_gate else None
        d_up = g * act if need_up and up is not None else None
        return d_gate, d_up

    return y, vjp
