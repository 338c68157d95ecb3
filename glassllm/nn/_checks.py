"""Argument checks shared by the layers: one clear error per bad constructor argument."""

from __future__ import annotations

from typing import Any

import numpy as np


def positive_int(value: Any, name: str) -> int:
    # bool is an int subclass; Linear(True, 3) is almost certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def float_dtype(dtype: Any) -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a NumPy floating dtype, got {dtype!r}") from error
    if resolved.kind != "f":
        raise TypeError(f"parameters need a floating dtype (float32 or float64), got {resolved}")
    return resolved
