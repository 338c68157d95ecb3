"""Rotary embedding's kernel: each pair rotated straight into the output, no copy of ``x`` first.

`rotary(x, cos, sin, interleaved)` computes what `glassllm.functional.rotary`'s definition does
and returns ``(out, vjp)``. The definition copies ``x`` and writes each pair over the copy, with
two temporaries per member; here `rotate` writes ``a cos`` into the output and takes the other
product away in place (one temporary), copies only the pass-through features, and can write
into a strided view (the fused packed attention unrotates ``dq``, ``dk`` straight into its
``(B, T, (H + 2 KV) hd)`` gradient). The same float operations in the same order: the same bits
as the definition.
"""

from __future__ import annotations

import numpy as np


def _pairs(a: np.ndarray, half: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """The two members of each rotated pair, as views of ``a (..., D)``."""
    if interleaved:
        return a[..., 0 : 2 * half : 2], a[..., 1 : 2 * half : 2]
    return a[..., :half], a[..., half : 2 * half]


def rotate(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    interleaved: bool,
    inverse: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``x (..., T, D)`` with each pair ``(a, b)`` rotated by the angle (``out_a = a cos - b sin``,
    ``out_b = b cos + a sin``) or, ``inverse``, by minus it (the VJP: ``a cos + b sin``, ``b cos
    - a sin``); into ``out`` (any strides, not overlapping ``x``) or a new array."""
    half = cos.shape[-1]
    out = np.empty(x.shape, x.dtype) if out is None else out
    if 2 * half < x.shape[-1]:
        out[..., 2 * half :] = x[..., 2 * half :]  # the pass-through features
    first, second = _pairs(x, half, interleaved)
    out_first, out_second = _pairs(out, half, interleaved)
    other = second * sin
    np.multiply(first, cos, out=out_first)
    (np.add if inverse else np.subtract)(out_first, other, out=out_first)
    np.multiply(first, sin, out=other)
    np.multiply(second, cos, out=out_second)
    (np.subtract if inverse else np.add)(out_second, other, out=out_second)
    return out


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> tuple:
    """``(out, vjp)``, ``vjp(g) -> dx``: `rotate` forward, and by minus the angle back."""

    def vjp(g: np.ndarray) -> np.ndarray:
        return rotate(g, cos, sin, interleaved, inverse=True)

    return rotate(x, cos, sin, interleaved), vjp
