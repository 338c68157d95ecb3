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


def dequantize(header: GGUFHeader, info: TensorInfo) -> np.ndarray:
    """The tensor ``info`` of the file as a new float32 array of shape ``info.shape``."""
    gguf = import_gguf()
    kind = GGML_TYPES[info.ggml_type]  # the header admits only these
    *outer, inner = info.shape
    row_bytes = inner // kind.block_elements * kind.block_bytes
    rows = header.raw(info).reshape(-1, row_bytes)  # (rows, bytes per row), read-only
    values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(info.ggml_type))
    if not values.flags.writeable or values.dtype != np.float32:
        values = np.array(values, dtype=np.float32)  # F32 is a view of the read-only mapped file
    return values.reshape(info.shape)
