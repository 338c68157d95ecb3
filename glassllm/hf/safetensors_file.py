"""Read a safetensors file tensor by tensor, straight into the arrays that will hold the weights.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensors' bytes, offsets counted from the end of the header. Reading it here rather than
through ``safetensors.numpy`` lets a float32 tensor go from the file into the model's own array
with no intermediate copy (peak memory is the model, not model + file), and widens BF16, which
NumPy has no type for: a bfloat16 is the top 16 bits of a float32.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

# safetensors dtype -> NumPy dtype of the stored bytes (little-endian).
FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_ITEM_SIZES = {
    **{k: np.dtype(v).itemsize for k, v in FLOAT_DTYPES.items()},
    "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# The reference implementation refuses headers above 100 MB.
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: ``file`` at byte ``offset``, ``dtype`` as safetensors names
    it, and its ``shape``."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """``({name: TensorEntry}, metadata)`` of a safetensors file, every entry checked against the
    file's size; a malformed file raises ValueError."""
    try:
        file_size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError("shorter than a safetensors header")
            length = int.from_bytes(prefix, "little")
            if length > min(MAX_HEADER_BYTES, file_size - 8):
                raise ValueError(f"its header length {length} does not fit the file")
            header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path!r} is not a safetensors file (its header: {err})") from None
    except ValueError as err:
        raise ValueError(f"{path!r} is not a safetensors file ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path!r} is not a safetensors file (its header is not an object)")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + length
    entries = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if dtype not in _ITEM_SIZES or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError
            if not 0 <= begin <= end <= file_size - data_start:
                raise ValueError
            if end - begin != math.prod(shape) * _ITEM_SIZES[dtype]:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path!r} has a malformed entry for tensor {name!r}: {info!r}"
            ) from None
        entries[name] = TensorEntry(path, dtype, shape, data_start + begin)
    return entries, metadata


def read_into(entry: TensorEntry, out: np.ndarray) -> None:
    """Fill ``out`` (a C-contiguous float array of ``entry``'s shape) with the tensor's values,
    widened or converted to ``out``'s dtype. A float tensor only: the caller checks the dtype."""
    stored = np.dtype(FLOAT_DTYPES[entry.dtype])
    if entry.size == 0:
        return
    with open(entry.file, "rb") as handle:
        handle.seek(entry.offset)
        if out.dtype == stored and out.flags.c_contiguous:
            _read_exactly(handle, memoryview(out).cast("B"), entry)  # no copy at all
            return
        raw = np.empty(entry.shape, dtype=stored)
        _read_exactly(handle, memoryview(raw).cast("B"), entry)
    if entry.dtype == "BF16":  # the top half of a float32's bits
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    np.copyto(out, raw, casting="unsafe" if entry.dtype == "F64" else "same_kind")


def _read_exactly(handle, buffer: memoryview, entry: TensorEntry) -> None:
    done = 0
    while done < len(buffer):
        count = handle.readinto(buffer[done:])
        if not count:
            raise ValueError(f"{entry.file!r} ends inside a tensor's data")
        done += count
