"""``linear``'s decoding path: one row times a tied output head, the same bits on any thread count.

`matmul_rows(x, w)` is ``x @ w`` for rows ``x (N, in)``: one BLAS call, except one row against a
transposed table of at least 2^19 weights (a tied head read as the rows of ``wte``, a decoding
step), which `_row_times_table` splits over the worker threads (see there).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from glassllm.threads import one_blas_thread, row_blocks, run_blocks


def matmul_rows(x2: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x2 @ w`` for ``x2 (N, in)``, ``w (in, out)``: ``(N, out)``."""
    transposed_table = w.T.flags.c_contiguous and not w.flags.c_contiguous
    if len(x2) == 1 and x2.dtype == w.dtype and w.size >= _STREAMED and transposed_table:
        return _row_times_table(x2[0], w.T)[None]  # (1, out)
    # why: one row times an (in, out) matrix is OpenBLAS's gemv, which streams the weights
    # faster than NumPy's einsum: 576 x 1536 with a cold cache 142-178 vs 240-246 us (AMD, 1-2
    # threads), 85 vs 235 us (Xeon). Its bits follow the BLAS, as every other product's do.
    return x2 @ w


_STREAMED = 1 << 19  # weights (2 MiB of float32): the smallest table split over the workers
_MIN_BLOCK = 1 << 16  # weights per worker block
# Block edges at multiples of this many rows. OpenBLAS's threaded gemv rounded the outputs at
# its own split points (and at the table's end) differently from one thread, so a split that
# moves with the thread count moves bits; blocks with edges at multiples of 64 rows, each on one
# thread, gave the bits of one whole gemv at every shape tried (tests/kernels checks them).
_ALIGN = 64


def _row_times_table(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table @ x`` for a C-contiguous ``table (out, in)`` and one row ``x (in,)``: ``(out,)``.

    The table's rows are split into blocks whose edges sit at multiples of `_ALIGN` rows, and
    each block is one gemv with BLAS on one thread, on glassllm's workers. Each output is then
    the same sum whichever block holds it, so the bits are those of one gemv on one thread, on
    any thread count. OpenBLAS's own threaded gemv splits the rows where the thread count
    falls: 2 of GPT-2's 50,257 logits came out differently at 1 and at 2 threads. (Timed, a
    cold 49,152 x 576 head: 4.4 ms in blocks, 4.5 threaded by OpenBLAS, 8.4-9.4 ms the earlier
    einsum blocks.) Where BLAS cannot be held to one thread, the blocks are NumPy's einsum,
    which also sums each output on its own.
    """
    out = np.empty(len(table), dtype=table.dtype)
    rows = row_blocks(len(table), min_rows=-(-_MIN_BLOCK // max(1, table.shape[1])), align=_ALIGN)
    with one_blas_thread() as limited:
        if limited:
            kernel = lambda r: np.matmul(table[r], x, out=out[r])  # noqa: E731
        else:
            kernel = lambda r: np.einsum("ij,j->i", table[r], x, out=out[r])  # noqa: E731
        run_blocks([partial(kernel, r) for r in rows], uses_blas=limited)
    return out
