"""Helpers shared by the fused functions: coercion, fast row/column sums, dtype checks.

Row and column sums go through a matrix-vector product with a vector of ones: BLAS gemv
beats ``ndarray.sum`` on the small, wide arrays of a GPT step by ~4x (issue 5 measured a
row sum at 28 us with ``sum`` and 6 us with ``@ ones``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from glassllm.tensor import Tensor, as_tensor


@lru_cache(maxsize=64)
def ones_vector(n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only vector of ``n`` ones in ``dtype``, cached because every step asks for the same few."""
    ones = np.ones(n, dtype=dtype)
    ones.flags.writeable = False
    return ones


def sum_last(a: np.ndarray, keepdims: bool = True) -> np.ndarray:
    """Sum over the last axis of ``a``: ``a @ ones`` on a 2-D view when ``a`` is a contiguous float array."""
    n = a.shape[-1]
    if a.dtype.kind == "f" and a.ndim >= 1 and a.size > 0 and a.flags.c_contiguous:
        row_sums = a.reshape(-1, n) @ ones_vector(n, a.dtype)
        return row_sums.reshape(a.shape[:-1] + ((1,) if keepdims else ()))
    return a.sum(axis=-1, keepdims=keepdims)


def sum_rows(a: np.ndarray) -> np.ndarray:
    """Column sums of a 2-D array (sum over axis 0) as ``ones @ a``."""
    if a.dtype.kind == "f" and a.shape[0] > 0:
        return ones_vector(a.shape[0], a.dtype) @ a
    return a.sum(axis=0)


def float_tensor(x: Any, name: str, dtype: np.dtype | None = None) -> Tensor:
    """``as_tensor(x)``, then insist on floating-point data (gradients of integers mean nothing)."""
    t = as_tensor(x, dtype=dtype)
    if t.dtype.kind != "f":
        raise TypeError(f"{name} must hold floating-point data, got dtype {t.dtype}")
    return t


def integer_array(x: Any, name: str) -> np.ndarray:
    """The integer ndarray behind ``x`` (an ndarray, a sequence or a constant Tensor)."""
    data = x.data if isinstance(x, Tensor) else np.asarray(x)
    if data.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {data.dtype}")
    return data


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)``; negative axes count from the end, as in NumPy."""
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


def as_dtype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype`` (no copy when it already is), so a gradient matches its parent's dtype."""
    return a if a.dtype == dtype else a.astype(dtype)
