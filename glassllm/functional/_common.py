"""Helpers shared by the fused functions: coercion, dtype checks, `sum_over` (a sum whose kernel
goes through BLAS) and the softmax shift (`exp_shift`, which the kernels use too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm import kernels
from glassllm.kernels.sums import exp_shift
from glassllm.tensor import Tensor, as_tensor

__all__ = [
    "as_dtype",
    "exp_shift",
    "float_tensor",
    "integer_array",
    "sum_over",
]


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


def as_dtype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype`` (no copy when it already is), so a gradient matches its parent's dtype."""
    return a if a.dtype == dtype else a.astype(dtype)


def _numpy_sum(a: np.ndarray, axes: tuple[int, ...], keepdims: bool = True) -> np.ndarray:
    return np.asarray(a.sum(axis=axes, keepdims=keepdims))


def sum_over(a: np.ndarray, axes: tuple[int, ...], keepdims: bool = True) -> np.ndarray:
    """``a.sum(axis=axes, keepdims=keepdims)``; its kernel (`glassllm.kernels.sum_axes`) sums a
    row or a column as a product with a vector of ones, several times faster on a GPT's rows."""
    return kernels.select(_numpy_sum, kernels.sum_axes)(a, axes, keepdims)
