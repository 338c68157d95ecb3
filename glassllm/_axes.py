"""Axis bookkeeping for the reductions: which axes, and how a gradient comes back over them."""

from __future__ import annotations

import numpy as np

Axis = int | tuple[int, ...] | None


def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """``axis`` (an int, a tuple or ``None`` for all) as sorted axes in ``[0, ndim)``; out of
    range raises NumPy's ``AxisError``, a repeat ``ValueError``, as NumPy's reductions do."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    normalized = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise np.exceptions.AxisError(ax, ndim)
        normalized.append(int(ax) % ndim)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"duplicate value in 'axis': {axis}")
    return tuple(sorted(normalized))


def expand_reduced(g: np.ndarray, axes: tuple[int, ...], keepdims: bool, shape: tuple[int, ...]):
    """Broadcast a reduction's upstream gradient back over the reduced axes (a read-only view)."""
    if not keepdims and axes:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)
