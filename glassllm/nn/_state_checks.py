"""The checks behind `Module.check_state_dict`: what makes a value unloadable, and how an
unexpected key is described."""

from __future__ import annotations

from typing import Any

import numpy as np


def value_problems(key: str, value: Any, target: np.ndarray) -> list[str]:
    """Why ``value`` cannot be copied into ``target`` (the array stored under ``key``)."""
    if not isinstance(value, np.ndarray):
        return [f"{key}: expected a numpy ndarray, got {type(value).__name__}"]
    problems = []
    if value.shape != target.shape:
        problems.append(f"{key}: shape mismatch, checkpoint {value.shape} vs model {target.shape}")
    if value.dtype != target.dtype:
        problems.append(f"{key}: dtype mismatch, checkpoint {value.dtype} vs model {target.dtype}")
    if not target.flags.writeable:
        problems.append(f"{key}: the model's array is read-only and cannot be loaded into")
    return problems


def describe_unexpected(keys: list[str], aliases: dict[str, str]) -> list[str]:
    return [
        f"{key} (tied to {aliases[key]}; a shared parameter is stored once, under its first name)"
        if key in aliases
        else (key if isinstance(key, str) else repr(key))
        for key in keys
    ]
