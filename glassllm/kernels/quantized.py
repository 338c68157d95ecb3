"""``quantized_linear``'s kernels: one row summed on the 4-bit blocks, more rows by BLAS.

A decoding step multiplies one row by each matrix, so it is bound by reading the weights: 425 MB
of float32 for SmolLM2-135M a token, 80 MB as blocks. `q4_matmul` sums one row on the blocks
(`_numba_kernels.q4_row_product`, the ``fast`` extra): on a Xeon guest, at 1536 x 576 with the
weights coming from memory, 131-147 us on one thread against 284-310 for OpenBLAS's gemv on the
float32 matrix (bench/LOG.md). A few rows run it per row; more dequantize the matrix and take
one BLAS product, where the arithmetic, not the memory, is what costs.

The bits: each output is one lane's sum in a fixed order, on one thread, so they do not depend on
the thread count; they differ from BLAS's (another order of the same sum) by float32 rounding.
Both need numba (the ``fast`` extra); without it `glassllm.functional.quantized` runs its
definition (dequantize in NumPy, then BLAS).
"""

from __future__ import annotations

import numpy as np

from glassllm.kernels import compiled

# Rows up to which the row kernel runs per row; above, dequantize + BLAS. At 1536 x 576 one row
# on the blocks is ~0.14 ms and a dequantization ~0.4 ms before its BLAS product.
ROWS_ON_BLOCKS = 2


def q4_matmul(
    x2: np.ndarray, scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray
) -> np.ndarray:
    """``x2 @ W`` for rows ``x2 (N, in)`` and the blocks of ``W (in, out)``: ``(N, out)``."""
    fused = compiled.kernels()
    if x2.dtype == np.float32 and len(x2) <= ROWS_ON_BLOCKS:
        out = np.empty((len(x2), nibbles.shape[2]), np.float32)
        for row, result in zip(x2, out, strict=True):
            fused.q4_row_product(scales, offsets, nibbles, np.ascontiguousarray(row), result)
        return out
    w = dequantize_q4(scales, offsets, nibbles)
    return x2 @ (w if x2.dtype == w.dtype else w.astype(x2.dtype))


def dequantize_q4(scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """The float32 matrix ``(in, out)`` of the blocks, a new array (the definition's bits)."""
    blocks, half, outputs = nibbles.shape
    out = np.empty((blocks * 2 * half, outputs), np.float32)
    compiled.kernels().dequantize_q4(scales, offsets, nibbles, out)
    return out
