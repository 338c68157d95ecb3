"""`glassllm.safetensors_file` for Hugging Face weights: the same reader, its errors (a malformed
file, and one that cannot be opened or read) as `HFFormatError`, as everything under ``hf``."""

from __future__ import annotations

import numpy as np

from glassllm.hf.untrusted import HFFormatError
from glassllm.safetensors_file import (
    FLOAT_DTYPES,
    MAX_HEADER_BYTES,
    SafetensorsError,
    TensorEntry,
)
from glassllm.safetensors_file import read_header as _read_header
from glassllm.safetensors_file import read_into as _read_into

__all__ = ["FLOAT_DTYPES", "MAX_HEADER_BYTES", "TensorEntry", "read_header", "read_into"]


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """`glassllm.safetensors_file.read_header`, raising HFFormatError."""
    try:
        return _read_header(path)
    except SafetensorsError as err:
        raise _as_hf(err) from None
    except OSError as err:
        raise _as_hf(SafetensorsError(path, f"unreadable ({err.strerror or err})")) from None


def read_into(entry: TensorEntry, out: np.ndarray) -> None:
    """`glassllm.safetensors_file.read_into`, raising HFFormatError for a file cut short."""
    try:
        _read_into(entry, out)
    except SafetensorsError as err:
        raise _as_hf(err) from None


def _as_hf(err: SafetensorsError) -> HFFormatError:
    return HFFormatError(f"{err.path!r} is not a valid safetensors file", [err.problem])
