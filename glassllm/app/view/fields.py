"""Checked fields of a JSON request: each bad value is an `ApiError` (400) naming the field."""

from __future__ import annotations

import math
from typing import Any

from glassllm._text import shown


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with HTTP ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def integer(body: dict[str, Any], name: str, default: Any, low: int, high: int) -> int:
    """``body[name]`` as an integer in [low, high] (``default`` when absent or null)."""
    value = body.get(name, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise bad(f"{name} must be between {low} and {high}, got {shown(value)}")
    return value


def optional_integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    if body.get(name) is None:
        return None
    return integer(body, name, None, low, high)


def number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    """``body[name]`` as a finite number in [low, high]."""
    value = body.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"{name} must be a number, got {shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float range, e.g. 10**400
        raise bad(f"{name} must be a finite number, got {shown(value)}") from None
    if not math.isfinite(value):
        raise bad(f"{name} must be a finite number, got {value}")
    if not low <= value <= high:
        raise bad(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return value


def optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    """``body[name]`` as a finite number in [low, high], None when absent or null."""
    if body.get(name) is None:
        return None
    return number(body, name, None, low, high)


def text(body: dict[str, Any], name: str, max_length: int) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise bad(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > max_length:
        raise bad(f"{name} is longer than {max_length} characters")
    return value


def token_ids(body: dict[str, Any], name: str, vocab_size: int, max_length: int) -> list[int]:
    """``body[name]`` as a non-empty list of token ids in [0, vocab_size)."""
    value = body.get(name)
    if not isinstance(value, list) or not value:
        raise bad(f"{name} must be a non-empty list of token ids")
    if len(value) > max_length:
        raise bad(f"{name} holds more than {max_length} tokens")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < vocab_size:
            raise bad(f"{name} must hold token ids in [0, {vocab_size}), got {shown(item)}")
    return list(value)
