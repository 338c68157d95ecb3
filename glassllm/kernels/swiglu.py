"""SwiGLU's (and SiLU's) fast kernel: the definition's passes in place, in chunks, on threads.

`swiglu(gate, up)` computes what `glassllm.functional.swiglu`'s definition does (``up`` None:
`silu`) and returns ``(out, vjp)``, ``vjp(g, need_gate, need_up) -> (d_gate, d_up)``. The same
float operations in the same order as the definition, each written in place over cache-sized
chunks of the flat arrays, split over the worker threads when large (GELU's runner,
`glassllm.kernels.gelu._elementwise`): the same bits, without the definition's five
full-size temporaries forward and seven backward.
"""

from __future__ import annotations

import numpy as np

from glassllm.kernels.gelu import _elementwise


def swiglu(gate: np.ndarray, up: np.ndarray | None) -> tuple:
    """``(out, vjp)`` for ``silu(gate) * up`` (see the module docstring)."""
    s, out = np.empty_like(gate), np.empty_like(gate)
    if up is None:
        _elementwise(_silu, gate, s, out)
    else:
        _elementwise(_swiglu, gate, up, s, out)

    def vjp(g: np.ndarray, need_gate: bool, need_up: bool) -> tuple:
        d_gate = np.empty_like(gate)
        if up is None:
            _elementwise(_silu_slope, gate, s, g, d_gate)
            return (d_gate if need_gate else None), None
        d_up = np.empty_like(gate)
        _elementwise(_swiglu_slope, gate, up, s, g, d_gate, d_up)
        return (d_gate if need_gate else None), (d_up if need_up else None)

    return out, vjp


def _sigmoid(gate: np.ndarray, s: np.ndarray) -> None:
    """``s = 1/(1 + exp(-gate))`` in place (``exp`` overflowing to inf gives ``s = 0``)."""
    np.negative(gate, out=s)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    np.divide(1.0, s, out=s)


def _silu(gate: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    _sigmoid(gate, s)
    np.multiply(gate, s, out=out)


def _swiglu(gate: np.ndarray, up: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    _silu(gate, s, out)
    out *= up


def _slope_factor(gate: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """``out = 1 + gate (1 - s)``: silu's slope over ``s``."""
    np.subtract(1.0, s, out=out)
    out *= gate
    out += 1.0


def _silu_slope(gate: np.ndarray, s: np.ndarray, g: np.ndarray, d_gate: np.ndarray) -> None:
    """``d_gate = (g s) (1 + gate (1 - s))``, the definition's products in its order."""
    scaled = np.multiply(g, s)  # a chunk-sized temporary
    _slope_factor(gate, s, d_gate)
    d_gate *= scaled


def _swiglu_slope(
    gate: np.ndarray,
    up: np.ndarray,
    s: np.ndarray,
    g: np.ndarray,
    d_gate: np.ndarray,
    d_up: np.ndarray,
) -> None:
    """``d_gate = ((g up) s) (1 + gate (1 - s))`` and ``d_up = g (gate s)``."""
    np.multiply(g, up, out=d_up)  # dL/d silu(gate), then times s
    d_up *= s
    _slope_factor(gate, s, d_gate)
    d_gate *= d_up
    np.multiply(gate, s, out=d_up)  # silu(gate), then times g
    d_up *= g
