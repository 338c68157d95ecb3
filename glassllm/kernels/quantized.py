"""``quantized_linear``'s kernels: one row summed on the blocks, more rows by BLAS.

A decoding step multiplies one row by each matrix, so it is bound by reading the weights: 425 MB
of float32 for SmolLM2-135M's projections a token, 80 MB as 4-bit blocks, and 113 MB for its tied
head, 32 MB as 8-bit blocks. `q4_matmul` and `q8_matmul` sum one row on the blocks
(`_numba_kernels.q4_row_product`, ``q8_row_product``, the ``fast`` extra), along the outputs: the
blocks are stored transposed (``(nb, 16 or 32, out)``), so the inner loop runs over the outputs,
each its own vector lane and its own sum, with one block's scale and offset applied once to the
block's sum (``d sum(q x) + m sum(x)``) instead of to every weight. On an EPYC guest at 1536 x
576 with the weights coming from memory: 63 us on one thread, against 127 for the same kernel
summing ``(q d + m) x`` per weight in lanes of 16 outputs, and 164 (one thread) / 120 (two) for
OpenBLAS's gemv on the float32 matrix (bench/LOG.md). The 49,152 x 576 head: 1.8 ms on one
thread, 0.94 on two, against 4.0 for BLAS on the float32 table. A few rows run the row kernel
per row; more dequantize the matrix and take one BLAS product, where the arithmetic, not the
memory, is what costs.

One row's product is shared with the row helpers (`glassllm.kernels.row_pool`: native loops
handed a part in about a microsecond, where a `glassllm.threads` worker took ~58 us), by blocks,
or by outputs for a wide matrix; on the guest above, 1536 x 576 from memory: 42 us on two threads.

The bits: each output is one sum in a fixed order, whoever runs which part, so they do not
depend on the thread count; they differ from BLAS's (another order of the same sum) by float32
rounding. Both need numba (the ``fast`` extra); without it `glassllm.functional.quantized` runs
its definition (dequantize in NumPy, then BLAS).
"""

from __future__ import annotations

import numpy as np

from glassllm.kernels import compiled
from glassllm.kernels.row_pool import Q4, Q8, row_product

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
            row_product(fused, Q4, scales, offsets, nibbles, np.ascontiguousarray(row), result)
        return out
    w = dequantize_q4(scales, offsets, nibbles)
    return x2 @ (w if x2.dtype == w.dtype else w.astype(x2.dtype))


def dequantize_q4(scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """The float32 matrix ``(in, out)`` of the blocks, a new array (the definition's bits)."""
    blocks, half, outputs = nibbles.shape
    out = np.empty((blocks * 2 * half, outputs), np.float32)
    compiled.kernels().dequantize_q4(scales, offsets, nibbles, out)
    return out


def q8_matmul(
    x2: np.ndarray, scales: np.ndarray, quants: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """``x2 @ W`` for rows ``x2 (N, in)`` and the 8-bit blocks of ``W (in, out)`` (with
    ``offsets``, ``q d + m``): ``(N, out)``."""
    fused = compiled.kernels()
    if x2.dtype == np.float32 and len(x2) <= ROWS_ON_BLOCKS:
        out = np.empty((len(x2), quants.shape[2]), np.float32)
        m = NO_OFFSETS if offsets is None else offsets
        for row, result in zip(x2, out, strict=True):
            row_product(fused, Q8, scales, m, quants, np.ascontiguousarray(row), result)
        return out
    w = dequantize_q8(scales, quants, offsets)
    return x2 @ (w if x2.dtype == w.dtype else w.astype(x2.dtype))


def dequantize_q8(
    scales: np.ndarray, quants: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """The float32 matrix ``(in, out)`` of the 8-bit blocks, a new array (the definition's bits)."""
    blocks, size, outputs = quants.shape
    out = np.empty((blocks * size, outputs), np.float32)
    m = NO_OFFSETS if offsets is None else offsets
    compiled.kernels().dequantize_q8(scales, m, quants, out)
    return out


# what the compiled 8-bit kernels take for a weight without offsets (they test for rows)
NO_OFFSETS = np.zeros((0, 0), np.float32)
NO_OFFSETS.flags.writeable = False
