"""A GGUF file's header (llama.cpp's format), read without trusting it.

Layout (little-endian; versions 2 and 3): the magic ``GGUF``, ``u32 version``, ``u64
tensor_count``, ``u64 kv_count``; ``kv_count`` metadata entries (a string key, a ``u32`` value
type, the value); ``tensor_count`` tensor entries (a string name, ``u32 n_dims``, ``n_dims`` x
``u64`` dimensions in ggml order, fastest first, ``u32 ggml_type``, ``u64 offset``); then, at the
next multiple of ``general.alignment`` (32 by default), the tensor data, each tensor at its offset
from there. A string is ``u64 length`` + UTF-8 bytes; an array ``u32 element type`` + ``u64 count``
+ the elements.

Every length and count is held to the bytes left in the file (and to the bounds below) before it
is read, so a hostile file costs no more than reading its header: a truncated file, a string of
2**60 bytes, an array of 2**60 elements or a tensor past the end raise `GGUFFormatError` (one
line naming the file and the field), never an allocation of what the file claims. Nothing here
imports the ``gguf`` package; dequantizing the tensors does (`glassllm.gguf.dequantize`).

Why not ``gguf.GGUFReader``: it checks no length against the file (a huge array count loops for
as long as it claims, a truncated file fails deep inside NumPy) and it builds a NumPy view per
string, ~3 s for SmolLM2's 98k tokens and merges; this parse takes a fraction of a second and is
tested to give the same fields and tensors on the real file.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from glassllm._text import listed, shown
from glassllm.gguf.types import GGML_TYPES, ggml_type_name, supported_type_names

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 counted in 32 bits; llama.cpp dropped it long ago
DEFAULT_ALIGNMENT = 32
# Bounds a real file stays far inside: keys and tensor names are short (llama.cpp caps tensor
# names at 63 bytes), a chat template is a few KB (the longest known ~100 KB), a vocabulary or
# merge table a few hundred thousand entries, a model a few thousand tensors.
MAX_NAME_BYTES = 1024
MAX_STRING_BYTES = 4 * 2**20
MAX_ARRAY_LENGTH = 2**23
MAX_KEYS = 2**16
MAX_TENSORS = 2**20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 2**20
MAX_PROBLEMS = 10  # named in one error; the rest counted

# metadata value types: the fixed-size ones as struct formats
_SCALARS = {
    0: "B",  # uint8
    1: "b",  # int8
    2: "H",  # uint16
    3: "h",  # int16
    4: "I",  # uint32
    5: "i",  # int32
    6: "f",  # float32
    7: "?",  # bool
    10: "Q",  # uint64
    11: "q",  # int64
    12: "d",  # float64
}
STRING, ARRAY = 8, 9
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8"}
_NUMPY |= {11: "<i8", 12: "<f8"}


class GGUFFormatError(ValueError):
    """A file that is not a GGUF glassllm can load. ``problems`` lists what was found; the
    message joins them on one line after the file's name."""

    def __init__(self, subject: str, problems: Iterable[str]) -> None:
        self.subject = subject
        self.problems = [" ".join(str(p).split()) for p in problems]
        super().__init__(f"{subject}: {'; '.join(self.problems)}")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` in torch order (slowest first: ``(out, in)`` for a
    matrix), its ggml type, and where its ``nbytes`` bytes are (``start``: from the file's
    beginning)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    start: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclasses.dataclass
class GGUFHeader:
    """What a GGUF file says: its metadata (keys to Python values: int, float, bool, str, or a
    list of them) and its tensors, checked against the file; the data stays memory-mapped."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data_start: int
    size: int
    _map: mmap.mmap = dataclasses.field(repr=False)

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The stored bytes of a tensor: a read-only uint8 view onto the mapped file."""
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.start)


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and check the header of the GGUF file ``path``; raises GGUFFormatError."""
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            raise GGUFFormatError(str(path), ["not a regular file"])
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 24:
                raise GGUFFormatError(
                    str(path), [f"truncated: {size} bytes, a GGUF header takes at least 24"]
                )
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        raise GGUFFormatError(str(path), [f"unreadable ({err.strerror or err})"]) from None
    if mapped[:4] != MAGIC:
        raise GGUFFormatError(
            str(path), [f"not a GGUF file (it starts with {shown(mapped[:4])}, not b'GGUF')"]
        )
    reader = _Reader(mapped, len(mapped), str(path))
    reader.pos = 4
    version = reader.scalar(4, "the version")
    if version not in VERSIONS:
        reader.fail(f"GGUF version {version} (glassllm reads versions 2 and 3)")
    tensor_count = reader.scalar(10, "the tensor count")
    kv_count = reader.scalar(10, "the metadata count")
    metadata = _read_metadata(reader, kv_count)
    entries = _read_tensor_entries(reader, tensor_count)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or not 1 <= alignment <= MAX_ALIGNMENT
        or alignment & (alignment - 1)
    ):
        reader.fail(
            f"general.alignment must be a power of two <= {MAX_ALIGNMENT}, got {alignment!r}"
        )
    data_start = -(-reader.pos // alignment) * alignment
    tensors = _check_tensors(entries, data_start, alignment, reader)
    return GGUFHeader(path, version, metadata, tensors, data_start, reader.size, mapped)


class _Reader:
    """A cursor over the mapped file that never reads past its end."""

    def __init__(self, data: mmap.mmap, size: int, subject: str) -> None:
        self.data, self.size, self.subject, self.pos = data, size, subject, 0

    def fail(self, problem: str) -> None:
        raise GGUFFormatError(self.subject, [problem])

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.size - self.pos:
            self.fail(
                f"{what} needs {nbytes:,} bytes at offset {self.pos:,} but the file ends at "
                f"{self.size:,} (truncated or corrupt)"
            )

    def scalar(self, value_type: int, what: str) -> Any:
        fmt = "<" + _SCALARS[value_type]
        width = struct.calcsize(fmt)
        self.need(width, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += width
        return value

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        length = self.scalar(10, what)
        if length > limit:
            self.fail(f"{what} is {length:,} bytes long, more than the {limit:,} allowed")
        self.need(length, what)
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8 text")
            raise AssertionError from None  # fail raised


def _read_metadata(reader: _Reader, count: int) -> dict[str, Any]:
    # the smallest entry: an empty key (8 bytes), its type (4) and a one-byte value
    if count > MAX_KEYS or count * 13 > reader.size - reader.pos:
        reader.fail(f"the header claims {count:,} metadata entries, more than the file can hold")
    metadata: dict[str, Any] = {}
    for index in range(count):
        key = reader.string(f"metadata key {index}", MAX_NAME_BYTES)
        if key in metadata:
            reader.fail(f"metadata key {shown(key)} is given twice")
        value_type = reader.scalar(4, f"the type of {key}")
        metadata[key] = _read_value(reader, value_type, key)
    return metadata


def _read_value(reader: _Reader, value_type: int, key: str) -> Any:
    if value_type in _SCALARS:
        return reader.scalar(value_type, key)
    if value_type == STRING:
        return reader.string(key)
    if value_type != ARRAY:
        reader.fail(f"{key} has value type {value_type}, which is not a GGUF type")
    element_type = reader.scalar(4, f"the element type of {key}")
    count = reader.scalar(10, f"the length of {key}")
    if count > MAX_ARRAY_LENGTH:
        reader.fail(
            f"{key} is an array of {count:,} elements, more than the {MAX_ARRAY_LENGTH:,} allowed"
        )
    if element_type in _NUMPY or element_type == 7:
        width = 1 if element_type == 7 else np.dtype(_NUMPY[element_type]).itemsize
        reader.need(count * width, key)
        dtype = "<u1" if element_type == 7 else _NUMPY[element_type]
        values = np.frombuffer(reader.data, dtype=dtype, count=count, offset=reader.pos)
        reader.pos += count * width
        return (values != 0).tolist() if element_type == 7 else values.tolist()
    if element_type != STRING:
        reader.fail(
            f"{key} is an array of type {element_type} (glassllm reads arrays of numbers "
            "and strings)"
        )
    reader.need(count * 8, key)  # each string takes at least its length field
    return [reader.string(f"{key}[{i}]") for i in range(count)]


def _read_tensor_entries(reader: _Reader, count: int) -> list[tuple[str, list[int], int, int]]:
    # the smallest entry: an empty name (8), n_dims (4), one dimension (8), type (4), offset (8)
    if count > MAX_TENSORS or count * 32 > reader.size - reader.pos:
        reader.fail(f"the header claims {count:,} tensors, more than the file can hold")
    entries = []
    for index in range(count):
        name = reader.string(f"the name of tensor {index}", MAX_NAME_BYTES)
        n_dims = reader.scalar(4, f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            reader.fail(
                f"tensor {shown(name)} has {n_dims:,} dimensions (GGUF allows 1 to {MAX_DIMS})"
            )
        dims = [reader.scalar(10, f"the dimensions of tensor {name}") for _ in range(n_dims)]
        ggml_type = reader.scalar(4, f"the type of tensor {name}")
        offset = reader.scalar(10, f"the offset of tensor {name}")
        entries.append((name, dims, ggml_type, offset))
    return entries


def _check_tensors(
    entries: list[tuple[str, list[int], int, int]], data_start: int, alignment: int, reader: _Reader
) -> dict[str, TensorInfo]:
    """The tensor table, every entry held to its type and to the file; all problems at once."""
    problems: list[str] = []
    tensors: dict[str, TensorInfo] = {}
    for name, dims, ggml_type, offset in entries:
        where = f"tensor {shown(name)}"
        if name in tensors:
            problems.append(f"{where} is given twice")
            continue
        kind = GGML_TYPES.get(ggml_type)
        if kind is None:
            problems.append(
                f"{where} has ggml type {ggml_type_name(ggml_type)}, which glassllm does not "
                f"read (it reads {supported_type_names()})"
            )
            continue
        if any(d < 1 for d in dims):
            problems.append(f"{where} has an empty dimension {dims}")
            continue
        elements = 1
        for d in dims:
            elements *= d
        if dims[0] % kind.block_elements:
            problems.append(
                f"{where}: its rows of {dims[0]:,} are not whole {kind.name} blocks of "
                f"{kind.block_elements}"
            )
            continue
        nbytes = elements // kind.block_elements * kind.block_bytes
        start = data_start + offset
        if offset % alignment:
            problems.append(
                f"{where}: its offset {offset:,} is not a multiple of the alignment {alignment}"
            )
        elif nbytes > reader.size - min(start, reader.size):
            problems.append(
                f"{where} ({listed(map(str, reversed(dims)), 4).replace(', ', ' x ')}, "
                f"{kind.name}) takes {nbytes:,} bytes from offset {start:,}, past the end of the "
                f"file ({reader.size:,} bytes)"
            )
        tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes)
    ordered = sorted(tensors.values(), key=lambda t: t.start)
    problems += [
        f"tensors {shown(a.name)} and {shown(b.name)} overlap"
        for a, b in zip(ordered, ordered[1:], strict=False)
        if a.start + a.nbytes > b.start
    ]
    if problems:
        shown_problems = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:
            shown_problems.append(f"and {len(problems) - MAX_PROBLEMS:,} more problems")
        raise GGUFFormatError(reader.subject, shown_problems)
    return tensors
