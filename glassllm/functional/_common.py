"""Helpers shared by the fused functions: coercion, dtype checks; the fast row and column sums
and the softmax shift (`exp_shift`, which the kernels use too) come from `glassllm.kernels.sums`."""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm.kernels.sums import exp_shift, ones_vector, sum_last, sum_rows
from glassllm.tensor import Tensor, as_tensor

__all__ = [
    "as_dtype",
    "exp_shift",
    "float_tensor",
    "integer_array",
    "ones_vector",
    "sum_last",
    "sum_rows",
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
