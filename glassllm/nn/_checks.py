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


def probability(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}")
    # p == 1 is allowed, as in PyTorch: everything is dropped and the gradient is zero.
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


def generator(rng: Any) -> np.random.Generator | None:
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    return rng
