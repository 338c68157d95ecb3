"""GELU's (tanh approximation) fast kernels: chunked in-place passes on worker threads, numba.

`gelu_tanh(x)` computes what `glassllm.functional.gelu`'s definition does and returns
``(out, vjp)``, ``vjp(grad) -> dx``. The passes are the definition's operations, each written in
place, over cache-sized chunks of the flat arrays, split over the worker threads when large;
with numba on (`compiled`), the passes around ``exp`` run as compiled loops of the same
operations. Elementwise throughout: the same bits for any split and either path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from glassllm.kernels import compiled
from glassllm.threads import split_rows

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def gelu_tanh(xd: np.ndarray) -> tuple:
    """``(out, vjp)`` for ``gelu(x, approximate="tanh")`` (see the module docstring)."""
    s, out = np.empty_like(xd), np.empty_like(xd)
    fused = compiled.kernels_for(xd.dtype)  # the same passes in compiled loops, or None
    _elementwise(_gelu_tanh, xd, s, out, fused=fused)

    def vjp(grad: np.ndarray) -> np.ndarray:
        slope = np.empty_like(xd)
        _elementwise(_gelu_tanh_slope, xd, s, grad, slope, fused=fused)
        return slope

    return out, vjp


# why: below ~64K elements a hand-off to a worker costs more than half the passes save.
_MIN_BLOCK = 1 << 16
# why: a chain of passes over 128K-element chunks (512 KiB of float32) keeps each chunk and its
# temporaries in the cache: GELU at (12*256, 1536) on one core, forward 7.0 -> 6.7 ms and VJP
# 7.1 -> 5.6 ms; the VJP's temporary is one chunk, not a fourth (N, 4E) array at the step's
# peak. Smaller chunks pay more per call (64K: VJP 6.0 ms), larger ones gain nothing.
_CHUNK = 1 << 17


def _elementwise(kernel: Callable[..., None], *arrays: np.ndarray, fused: Any = None) -> None:
    """``kernel(*arrays)``; on C-contiguous arrays of one shape, over their flat views, in
    consecutive chunks split over the worker threads when they are large (elementwise kernels
    give the same bits either way). ``fused``: `compiled.kernels_for(dtype)`; when given, such
    arrays go through the kernel's compiled form (the same bits: see `_numba_kernels`)."""
    if not all(a.flags.c_contiguous and a.shape == arrays[0].shape for a in arrays):
        kernel(*arrays)
        return
    if fused is not None:
        kernel = partial(_COMPILED[kernel], fused)
    flat = tuple(a.reshape(-1) for a in arrays)  # views: the results land in ``arrays``
    if flat[0].size >= 2 * _MIN_BLOCK:
        split_rows(partial(_in_chunks, kernel), *flat, min_rows=_MIN_BLOCK)
    else:
        kernel(*flat)


def _in_chunks(kernel: Callable[..., None], *arrays: np.ndarray) -> None:
    """``kernel`` on consecutive `_CHUNK`-element slices of the 1-D ``arrays``."""
    for start in range(0, len(arrays[0]), _CHUNK):
        kernel(*(a[start : start + _CHUNK] for a in arrays))


def _gelu_tanh(x: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """``s = sigmoid(2u) = (1 + tanh u)/2`` and ``out = x s`` (see `gelu`), written in place."""
    # (1 + tanh u)/2 = sigmoid(2u) = 1/(1 + exp(-2u)): no cancellation in 1 + tanh u -> 0
    # for x << 0 (float32 loses every digit there at x ~ -5), and exp overflow -> s = 0.
    # out= everywhere: for 0-d input NumPy would return immutable scalars.
    np.multiply(x, x, out=s)  # -2u = x (-2c - 2c 0.044715 x^2), then s
    s *= -2.0 * _SQRT_2_OVER_PI * _GELU_CUBIC
    s -= 2.0 * _SQRT_2_OVER_PI
    s *= x
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    np.divide(1.0, s, out=s)
    np.multiply(x, s, out=out)


def _gelu_tanh_slope(x: np.ndarray, s: np.ndarray, grad: np.ndarray, slope: np.ndarray) -> None:
    """``slope = grad * dy/dx = grad s (1 + 2 x u' (1 - s))`` (see `gelu`), written in place."""
    np.multiply(x, x, out=slope)  # 2 x u' = 2c x (1 + 3 0.044715 x^2)
    slope *= 6.0 * _GELU_CUBIC * _SQRT_2_OVER_PI
    slope += 2.0 * _SQRT_2_OVER_PI
    slope *= x
    slope *= np.subtract(1.0, s)
    slope += 1.0
    slope *= s
    slope *= grad


def _gelu_tanh_compiled(fused: Any, x: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """`_gelu_tanh` on 1-D arrays: its passes before and after the exponential compiled into one
    loop each, NumPy's ``exp`` between (NumPy's is vectorised; a compiled loop's would not be)."""
    dtype = x.dtype.type
    fused.gelu_tanh_exponent(
        x, dtype(-2.0 * _SQRT_2_OVER_PI * _GELU_CUBIC), dtype(2.0 * _SQRT_2_OVER_PI), s
    )
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    fused.gelu_tanh_finish(x, s, out)


def _gelu_tanh_slope_compiled(
    fused: Any, x: np.ndarray, s: np.ndarray, grad: np.ndarray, slope: np.ndarray
) -> None:
    """`_gelu_tanh_slope` on 1-D arrays in one compiled loop."""
    dtype = x.dtype.type
    fused.gelu_tanh_slope(
        x, s, grad, dtype(6.0 * _GELU_CUBIC * _SQRT_2_OVER_PI), dtype(2.0 * _SQRT_2_OVER_PI), slope
    )


_COMPILED = {_gelu_tanh: _gelu_tanh_compiled, _gelu_tanh_slope: _gelu_tanh_slope_compiled}
