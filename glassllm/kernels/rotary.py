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

from glassllm.kernels import compiled


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
    if _compiled_rotate(x, cos, sin, inverse, interleaved, out):
        return out
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


def _compiled_rotate(x, cos, sin, inverse: bool, interleaved: bool, out: np.ndarray) -> bool:
    """`rotate` in one compiled pass (the ``fast`` extra) where it applies: one dtype
    throughout, tables ``(T, half)``, and an ``out`` that reads as 4-D without a copy; False
    (nothing written) elsewhere. At Llama-tiny's q (12, 4, 64, 32): 57 us against 362 in
    NumPy's five passes over half-rows (one thread, bench/LOG.md)."""
    fused = compiled.kernels_for(x.dtype)
    tables_fit = cos.ndim == 2 and cos.shape == sin.shape and cos.shape[0] == x.shape[-2]
    if fused is None or x.ndim < 2 or x.size == 0 or not tables_fit:
        return False
    if len({x.dtype, cos.dtype, sin.dtype, out.dtype}) != 1:
        return False
    # (B, heads, T, D): q's heads inside a packed (B, KV, groups, T, hd) view merge into one axis
    shape = (*x.shape[:1], -1, *x.shape[-2:]) if x.ndim > 2 else (1, 1, *x.shape)
    rows = _view(out, shape)
    if rows is None:
        return False
    source = _view(x, shape)
    source = x.reshape(shape) if source is None else source  # a copy only for an odd view
    fused.rotate_pairs(source, cos, sin, inverse, interleaved, rows)
    return True


def _view(a: np.ndarray, shape: tuple) -> np.ndarray | None:
    """``a`` as ``shape`` without a copy, or None where that needs one."""
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        return None
    except TypeError:  # NumPy 2.0: no copy argument yet
        view = a.view()
        try:
            view.shape = shape
        except AttributeError:
            return None
        return view


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> tuple:
    """``(out, vjp)``, ``vjp(g) -> dx``: `rotate` forward, and by minus the angle back."""

    def vjp(g: np.ndarray) -> np.ndarray:
        return rotate(g, cos, sin, interleaved, inverse=True)

    return rotate(x, cos, sin, interleaved), vjp
