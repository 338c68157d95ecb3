"""GGUF tensors as float32 arrays in torch's layout, dequantized by llama.cpp's ``gguf`` package.

The ``gguf`` package is the optional ``gguf`` extra (``pip install -e '.[gguf]'`` in the
checkout), imported when the first tensor is read. A matrix stored in ggml order
``[ne0 = in, ne1 = out]`` comes out as ``(out, in)``, the shape transformers' ``nn.Linear``
weights have (rows of ``in`` weights, each row a whole number of blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm._install import install_hint
from glassllm.data.bpe import MissingDependencyError
from glassllm.gguf.header import GGUFHeader, TensorInfo
from glassllm.gguf.types import GGML_TYPES

INSTALL_HINT = install_hint("gguf")


def import_gguf() -> Any:
    """The ``gguf`` package, or a MissingDependencyError naming the extra to install."""
    try:
        import gguf
    except ImportError:
        gguf = None
    # why: a folder named gguf on the path (the working directory's, of model files) imports as
    # an empty namespace package when the real one is absent.
    if getattr(gguf, "__file__", None) is None:
        raise MissingDependencyError(f"GGUF files need llama.cpp's gguf package: {INSTALL_HINT}")
    return gguf


def dequantize(header: GGUFHeader, info: TensorInfo, rows: np.ndarray | None = None) -> np.ndarray:
    """The tensor ``info`` of the file as a new float32 array of shape ``info.shape``; with
    ``rows`` (indices along a matrix's first axis) only those rows, ``(len(rows), in)``."""
    gguf = import_gguf()
    kind = GGML_TYPES[info.ggml_type]  # the header admits only these
    *outer, inner = info.shape
    row_bytes = inner // kind.block_elements * kind.block_bytes
    raw = header.raw(info).reshape(-1, row_bytes)  # (rows, bytes per row), read-only
    if rows is not None:
        raw = raw[rows]
    shape = info.shape if rows is None else (len(raw), inner)
    qtype = gguf.GGMLQuantizationType(info.ggml_type)
    quant = getattr(gguf.quants, qtype.name, None)  # the block type's class, Q4_1 and the rest
    if not hasattr(quant, "dequantize_rows"):  # F32, F16, BF16: a view or one cast
        values = gguf.quants.dequantize(raw, qtype)
        if not values.flags.writeable or values.dtype != np.float32:
            values = np.array(values, dtype=np.float32)  # F32: a view of the mapped file
        return values.reshape(shape)
    # why: gguf.quants.dequantize runs its block arithmetic on groups of 16 rows and joins them;
    # the same arithmetic per block on chunks of 64K values written into the output gives the
    # same bits, SmolLM2's tensors in 0.40 s instead of 0.64 (fresh process). Chunks of 1M
    # values were slower (0.95 s): each chunk's temporaries, 4 MiB, are fresh pages to fault in.
    quant.init_grid()  # the lookup tables of the IQ types; nothing for the others
    out = np.empty((raw.shape[0], inner), dtype=np.float32)  # (rows, values per row)
    step = max(1, _CHUNK // inner)
    for start in range(0, raw.shape[0], step):
        out[start : start + step] = quant.dequantize_rows(raw[start : start + step])
    return out.reshape(shape)


_CHUNK = 1 << 16  # values per call of the block arithmetic (256 KiB of float32 each temporary)
