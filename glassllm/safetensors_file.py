"""The one safetensors reader: a file's header checked strictly, then its tensors read once.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensors' bytes, offsets counted from the end of the header. Checkpoints read every tensor
(`read_tensors`); Hugging Face weights go tensor by tensor straight into the model's own arrays
(`read_into`: peak memory is the model, not model + file), widening BF16, which NumPy has no
type for: a bfloat16 is the top 16 bits of a float32. A malformed file raises `SafetensorsError`
(a ValueError); an OSError (a file that cannot be opened or read) passes through. Only a
regular file is opened, never waiting on a FIFO (`glassllm._files`).

Writing goes through the safetensors library behind the boundary of `glassllm._foreign`:
`serialize` (bytes in memory) turns whatever the library raises, a panic included, into a
`SafetensorsWriteError` (a ValueError); `write_file` (straight to a file) into an OSError naming
the file, so a full disk is errno ENOSPC, never the library's own exception type.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from glassllm._files import FileProblem, open_regular
from glassllm._foreign import foreign_call
from glassllm._text import listed, parse_json, shown

__all__ = [
    "FLOAT_DTYPES",
    "MAX_HEADER_BYTES",
    "NUMPY_DTYPES",
    "SafetensorsError",
    "SafetensorsWriteError",
    "TensorEntry",
    "read_header",
    "read_into",
    "read_tensors",
    "serialize",
    "write_file",
]

# safetensors dtype -> NumPy dtype of the stored bytes (little-endian), for the floats `read_into`
# converts (BF16's bits as uint16, widened there).
FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# safetensors dtype -> the NumPy dtype `read_tensors` returns: every one NumPy has (not BF16, F8).
NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "|i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "|u1", "BOOL": "|b1",
}  # fmt: skip
_ITEM_SIZES = {
    **{k: np.dtype(v).itemsize for k, v in {**NUMPY_DTYPES, **FLOAT_DTYPES}.items()},
    "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# The reference implementation refuses headers above 100 MB.
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """``path`` is not a valid safetensors file: ``problem`` says why, in one line."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path!r} is not a valid safetensors file: {problem}")


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

    @property
    def nbytes(self) -> int:
        return self.size * _ITEM_SIZES[self.dtype]


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """``({name: TensorEntry}, metadata)`` of a safetensors file, checked as the reference
    implementation checks it, and stricter: a JSON object of at most MAX_HEADER_BYTES with no key
    given twice, each entry a known dtype, a shape of non-negative integers and integer
    ``data_offsets`` holding exactly that many bytes, the entries' bytes tiling the data after the
    header with no gap and no overlap (so the tensors together are never larger than the file),
    ``__metadata__`` null or an object of strings. A malformed file raises SafetensorsError."""
    with _open_regular(path) as handle:
        return _header(handle, path, os.fstat(handle.fileno()).st_size)


def read_tensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``({name: array}, metadata)`` of a safetensors file: its header checked as `read_header`
    does, then every tensor read from the same open file into a fresh, writable, C-ordered array
    of its own (a tensor stored under two names comes back as two arrays), in sorted name order.
    A dtype NumPy has no type for (BF16, F8) raises SafetensorsError, as does a malformed file.

    >>> import os, tempfile, numpy as np, safetensors.numpy
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> safetensors.numpy.save_file({"b": np.ones(2, np.float32)}, path, metadata={"k": "v"})
    >>> read_tensors(path)
    ({'b': array([1., 1.], dtype=float32)}, {'k': 'v'})
    """
    with _open_regular(path) as handle:
        entries, metadata = _header(handle, path, os.fstat(handle.fileno()).st_size)
        odd = [f"{name} ({entry.dtype})" for name, entry in entries.items()
               if entry.dtype not in NUMPY_DTYPES]  # fmt: skip
        if odd:
            raise SafetensorsError(path, f"NumPy has no dtype for tensors {listed(odd, 3)}")
        arrays = {}
        for name, entry in sorted(entries.items(), key=lambda item: item[1].offset):
            array = np.empty(entry.shape, dtype=NUMPY_DTYPES[entry.dtype])
            if array.size:
                handle.seek(entry.offset)
                _read_exactly(handle, memoryview(array).cast("B"), entry)
            arrays[name] = array
    return {name: arrays[name] for name in sorted(arrays)}, metadata


def _open_regular(path: str) -> BinaryIO:
    os.stat(path)  # a missing file: FileNotFoundError, as open() would raise
    try:  # a FIFO would block, a device never end
        return open_regular(path, repr(path))
    except FileProblem as err:
        if "not a regular file" in err.problem:
            raise SafetensorsError(path, f"not a regular file ({err.problem})") from None
        raise OSError(f"cannot read {path!r}: {err.problem}") from None


def _header(
    handle: BinaryIO, path: str, file_size: int
) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    prefix = handle.read(8)
    if len(prefix) < 8:
        raise SafetensorsError(path, "shorter than a safetensors header")
    length = int.from_bytes(prefix, "little")
    if length > min(MAX_HEADER_BYTES, file_size - 8):
        raise SafetensorsError(path, f"its header length {length} does not fit the file")
    try:
        header = parse_json(handle.read(length))
    except ValueError as err:
        raise SafetensorsError(path, f"its header: unreadable ({err})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, "its header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata  # null: none, as the reference reads it
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        problem = f"its __metadata__ {shown(metadata)} is not an object of strings"
        raise SafetensorsError(path, problem)
    data_size = file_size - 8 - length
    entries, spans, bad = {}, [], []
    for name, info in header.items():
        entry = _entry(path, 8 + length, data_size, info)
        if entry is None:
            bad.append(f"{name} {shown(info)}")
        else:
            entries[name] = entry
            spans.append((entry.offset, entry.offset + entry.nbytes))
    if bad:
        raise SafetensorsError(path, f"malformed entries for tensors {listed(bad, 3)}")
    position = 8 + length
    for begin, end in sorted(spans):
        if begin != position:
            why = "overlap" if begin < position else "leave a gap"
            at = begin - 8 - length
            raise SafetensorsError(path, f"its tensors' data_offsets {why} (at byte {at})")
        position = end
    if position != file_size:
        left = file_size - position
        raise SafetensorsError(path, f"its tensors do not cover the data ({left} bytes left over)")
    return entries, metadata


def _entry(path: str, data_start: int, data_size: int, info: object) -> TensorEntry | None:
    """The TensorEntry of one header entry, None when it is malformed."""
    if not isinstance(info, dict):
        return None
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ITEM_SIZES:
        return None
    if not isinstance(shape, list) or not all(_natural(n) for n in shape):
        return None
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_natural, offsets)):
        return None
    begin, end = offsets
    if not begin <= end <= data_size or end - begin != _nbytes(shape, dtype, data_size):
        return None
    return TensorEntry(path, dtype, tuple(shape), data_start + begin)


def _nbytes(shape: list[int], dtype: str, limit: int) -> int | None:
    """The bytes of a tensor of ``shape``, None when above ``limit`` (found without multiplying
    integers of thousands of digits)."""
    if 0 in shape:
        return 0
    total = _ITEM_SIZES[dtype]
    for n in shape:
        total *= n
        if total > limit:
            return None
    return total


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_into(entry: TensorEntry, out: np.ndarray) -> None:
    """Fill ``out`` (a C-contiguous float array of ``entry``'s shape) with the tensor's values,
    widened or converted to ``out``'s dtype. A float tensor only: the caller checks the dtype."""
    stored = np.dtype(FLOAT_DTYPES[entry.dtype])
    if entry.size == 0:
        return
    with _open_regular(entry.file) as handle:
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
            raise SafetensorsError(
                entry.file, "it ends inside a tensor's data (changed while read?)"
            )
        done += count


# ---------------------------------------------------------------------------------- writing


class SafetensorsWriteError(ValueError):
    """The safetensors library could not serialise these tensors: the message says why."""


def serialize(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (C-ordered NumPy arrays) and
    ``metadata``, made by the safetensors library (``safetensors.numpy.save``); anything it
    raises, a panic included, is a SafetensorsWriteError.

    >>> data = serialize({"w": np.zeros(2, np.float32)}, {"format": "pt"})
    >>> int.from_bytes(data[:8], "little") == len(data) - 8 - 8
    True
    """
    import safetensors.numpy

    with foreign_call(lambda why: SafetensorsWriteError(f"cannot serialise tensors ({why})")):
        return safetensors.numpy.save(
            dict(tensors), metadata=None if metadata is None else dict(metadata)
        )


def write_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` and ``metadata`` to ``path`` with the library's ``save_file`` (which
    streams the tensors to the file and leaves it mode 0o600). Whatever it raises, a panic
    included, is an OSError naming ``path`` (a full disk keeps its errno, ENOSPC), and a file it
    left half written is removed; callers that must never show a half-written file write into a
    temporary path (as ``glassllm.hf`` does)."""
    import safetensors.numpy

    path = os.fspath(path)
    try:
        with foreign_call(lambda why: _write_error(path, why)):
            safetensors.numpy.save_file(
                dict(tensors), path, metadata=None if metadata is None else dict(metadata)
            )
    except OSError:
        with contextlib.suppress(OSError):
            if os.path.isfile(path):
                os.unlink(path)
        raise


def _write_error(path: str, why: str) -> OSError:
    """An OSError for the library's failure ``why``, with the OS error number it names
    (``... (os error 28)``) when it names one."""
    found = re.search(r"(?:\bcode: |os error |\[Errno )(\d+)", why)
    if found is None:
        return OSError(f"cannot write {path!r} ({why})")
    return OSError(int(found.group(1)), f"cannot write ({why})", path)
