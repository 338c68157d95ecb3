"""Argument checks shared by the library: each returns the checked value or raises one error whose
message names the argument and shows what it got.

``bool`` is an ``int`` subclass in Python, so ``True`` would pass a plain ``isinstance(x, int)``;
here it never counts as a number (``Linear(True, 3)`` is almost certainly a mistake).

>>> check_int("in_features", 3, min=1)
3
>>> check_int("in_features", True, min=1)
Traceback (most recent call last):
...
ValueError: in_features must be a positive integer, got True
>>> check_probability("p", 0.1)
0.1
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from glassllm._text import shown


def is_integer(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer, a bool not counting as one."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer or float, a bool not counting as one."""
    return is_integer(value) or isinstance(value, (float, np.floating))


def check_int(name: str, value: Any, *, min: int | None = None) -> int:
    """``value`` as an ``int``, or ``ValueError`` if it is not an integer ``>= min``."""
    if not is_integer(value) or (min is not None and value < min):
        if min == 1:
            wanted = "a positive integer"
        elif min is None:
            wanted = "an integer"
        else:
            wanted = f"an integer >= {min}"
        raise ValueError(f"{name} must be {wanted}, got {shown(value)}")
    return int(value)


def check_float(name: str, value: Any) -> float:
    """``value`` as a finite Python ``float``: ``TypeError`` if it is not a number,
    ``ValueError`` if it is infinite, NaN or too large for a float (an int such as 10**400)."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {shown(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        got = shown(value) if is_integer(value) else result
        raise ValueError(f"{name} must be finite, got {got}")
    return result


def check_probability(name: str, value: Any) -> float:
    """``value`` as a float in ``[0, 1]``: ``TypeError`` if it is not a number, ``ValueError``
    if it is outside (``1`` is allowed, as in PyTorch: everything is dropped)."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number in [0, 1], got {shown(value)}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {shown(value)}")
    return float(value)


def check_float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` resolved to a NumPy floating dtype, or ``TypeError``."""
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a NumPy floating dtype, got {dtype!r}") from error
    if resolved.kind != "f":
        raise TypeError(f"parameters need a floating dtype (float32 or float64), got {resolved}")
    return resolved


def check_generator(name: str, value: Any) -> np.random.Generator | None:
    """``value`` itself if it is a ``numpy.random.Generator`` or None, else ``TypeError``."""
    if value is not None and not isinstance(value, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator or None, got {type(value).__name__}"
        )
    return value
