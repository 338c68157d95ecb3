"""``linear``'s decoding path: one row times a large matrix, streamed through ``einsum``.

`matmul_rows(x, w)` is ``x @ w`` for rows ``x (N, in)``: one BLAS call, except one row against
a matrix of at least 2^19 weights (a decoding step), whose outputs are each a sum in a fixed
order (see `_row_times_matrix`).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from glassllm.threads import row_blocks, run_blocks


def matmul_rows(x2: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x2 @ w`` for ``x2 (N, in)``, ``w (in, out)``: ``(N, out)``."""
    if len(x2) == 1 and x2.dtype == w.dtype and w.size >= _STREAMED:  # decoding
        return _row_times_matrix(x2[0], w)[None]  # (1, out)
    return x2 @ w


# why: one row times a matrix reads every weight once and is bound by memory bandwidth; NumPy's
# einsum loops stream it faster than OpenBLAS's gemv on one core: GPT-2 small's matrices
# (768 x 2304 ... 3072 x 768) 96-376 vs 119-489 us, its tied head (50257 x 768) 7.0 vs 10.3 ms.
# Small matrices stay in cache, where gemv wins (a tiny GPT decodes 5% faster with it).
_STREAMED = 1 << 19  # weights (2 MiB of float32): the smallest matrix one row goes through einsum
_MIN_BLOCK = 1 << 16  # weights per worker block


def _row_times_matrix(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w`` for one row ``x (in,)`` and ``w (in, out)``, each output a sum in a fixed order:
    a transposed ``w`` (a tied head's ``(out, in)`` table) splits its rows over the worker
    threads, the same bits on any thread count."""
    out = np.empty(w.shape[1], dtype=w.dtype)
    if w.flags.c_contiguous:
        # why: one thread; two threads each streaming half of every row were 2-3x slower.
        np.einsum("j,ji->i", x, w, out=out)
    elif w.T.flags.c_contiguous:  # a transposed (out, in) table, e.g. a tied output head
        table = w.T
        rows = row_blocks(table.shape[0], min_rows=-(-_MIN_BLOCK // max(1, table.shape[1])))
        kernel = lambda r: np.einsum("ij,j->i", table[r], x, out=out[r])  # noqa: E731
        run_blocks([partial(kernel, r) for r in rows])
    else:
        np.matmul(x, w, out=out)
    return out
