"""LayerNorm's fast kernels: row blocks on worker threads, BLAS or einsum row sums, numba rows.

`layer_norm(x, w, b, eps)` computes what `glassllm.functional.layer_norm`'s definition does,
for ``x (N, D)``, and returns ``(out, vjp)``; ``vjp(dy, need_x, need_w, need_b)`` gives
``(dx, dw, db)``. Which routine runs is chosen here, by dtype, shape and whether numba is on:
one compiled pass per row (`compiled`, to float32 rounding of the definition), else NumPy
passes over row blocks, their row sums through einsum where a split may happen and BLAS where
it cannot. Each row is computed on its own, so every thread count gives the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from glassllm.kernels import compiled
from glassllm.kernels.sums import ones_vector, sum_rows
from glassllm.threads import split_rows


def layer_norm(x2: np.ndarray, wd: np.ndarray | None, bd: np.ndarray | None, eps: float):
    """``(out, vjp)`` for rows ``x2 (N, D)`` (see the module docstring)."""
    mean = np.empty(len(x2), x2.dtype)  # (N,)
    rstd = np.empty(len(x2), x2.dtype)  # (N,)
    out = np.empty_like(x2, order="C")
    fused = compiled.kernels_for(x2.dtype)  # one compiled pass per row, or None: NumPy's
    row_sums = None if fused is not None else _row_sums(len(x2))
    if fused is not None:
        kernel = partial(fused.layer_norm_rows, wd, bd, eps)
        split_rows(kernel, x2, mean, rstd, out, min_rows=_MIN_ROWS_COMPILED)
    elif row_sums is _blas_row_sums:  # never split: no block bookkeeping on the decoding path
        _normalize_rows(row_sums, wd, bd, eps, x2, mean, rstd, out)
    else:
        kernel = partial(_normalize_rows, row_sums, wd, bd, eps)
        split_rows(kernel, x2, mean, rstd, out, min_rows=_MIN_ROWS, uses_blas=True)

    def vjp(dy: np.ndarray, need_x: bool, need_w: bool, need_b: bool) -> tuple:
        dx2 = dw = db = None
        if need_x or need_w:
            dy_centred = np.empty(x2.shape, x2.dtype)  # (N, D): dy (x - mu), dw's rows / rstd
            dx2 = np.empty(x2.shape, x2.dtype) if need_x else None
            if fused is not None:
                kernel = partial(fused.layer_norm_rows_vjp, wd)
                split_rows(kernel, dy, x2, mean, rstd, dy_centred, dx2, min_rows=_MIN_ROWS_COMPILED)
            else:
                kernel = partial(_normalize_rows_vjp, row_sums, wd, need_x)
                split_rows(
                    kernel, dy, x2, mean, rstd, dy_centred, dx2, min_rows=_MIN_ROWS, uses_blas=True
                )
        if need_w:
            dw = rstd @ dy_centred  # sum_rows(dy xhat)
        if need_b:
            db = sum_rows(dy)
        return dx2, dw, db

    return out, vjp


# why: below ~512 rows a hand-off to a worker costs more than half the passes save.
_MIN_ROWS = 512
# why: the compiled kernels do a block's rows ~5x faster, so a hand-off pays from more rows on:
# fwd + VJP on 2 threads, split vs whole, (1536, 256) 86 + 121 vs 53 + 104 us, (3072, 384)
# 138 + 331 vs 174 + 521 us.
_MIN_ROWS_COMPILED = 1024


def _row_sums(rows: int) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """``row_sums(a, w) = a @ w`` (``w`` None: ones) for a layer_norm over ``rows`` rows.

    Arrays that may be split into row blocks sum with ``einsum``, each row on its own, so any
    split gives the same bits; smaller ones, never split, use BLAS's gemv, faster per call
    (its rounding depends on where a block starts, which does not arise there). The choice
    depends on the shape only, never on the thread count.
    """
    return _einsum_row_sums if rows >= 2 * _MIN_ROWS else _blas_row_sums


def _einsum_row_sums(a: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    return np.einsum("ij->i", a) if w is None else np.einsum("ij,j->i", a, w)


def _blas_row_sums(a: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    return a @ (ones_vector(a.shape[-1], a.dtype) if w is None else w)


# why: NumPy's broadcasting multiply runs at about half the speed of a plain one (at (768, 128)
# float32: 20-23 vs 9-13 us), so scaling rows and then columns costs two slow passes (38.5 us).
# A matrix product of the vectors padded by a zero (k = 2: NumPy sends k = 1 to its own slow
# loop) writes the outer product in 8.8 us, and one plain multiply by it follows (22 us in all).
def _outer(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``rows[:, None] * cols[None, :]``, ``(n, D)``: each entry is ``r c + 0 * 0``, the product
    rounded once whatever the BLAS kernel, so the bits do not depend on where a block starts."""
    left = np.zeros((len(rows), 2), rows.dtype)
    left[:, 0] = rows
    right = np.zeros((2, len(cols)), rows.dtype)
    right[0] = cols
    return left @ right


def _normalize_rows(
    row_sums: Callable,
    w: np.ndarray | None,
    b: np.ndarray | None,
    eps: float,
    x: np.ndarray,
    mean: np.ndarray,
    rstd: np.ndarray,
    out: np.ndarray,
) -> None:
    """The forward of `layer_norm` for a block of rows ``x (n, D)``, into ``mean, rstd, out``.

    ``row_sums``: see `_row_sums`.
    """
    inv_dim = 1.0 / x.shape[-1]
    np.multiply(row_sums(x, None), inv_dim, out=mean)  # (n,)
    np.subtract(x, mean[:, None], out=out)  # centred, then xhat, then y, in place
    var = np.einsum("ij,ij->i", out, out)  # (n,) row dot products, no temporary
    var *= inv_dim
    var += eps
    np.sqrt(var, out=var)
    np.divide(1.0, var, out=rstd)
    out *= rstd[:, None] if w is None else _outer(rstd, w)  # xhat w
    if b is not None:
        out += b


def _normalize_rows_vjp(
    row_sums: Callable,
    w: np.ndarray | None,
    need_x: bool,
    dy: np.ndarray,
    x: np.ndarray,
    mean: np.ndarray,
    rstd: np.ndarray,
    dy_centred: np.ndarray,
    dx: np.ndarray | None,
) -> None:
    """The VJP of `layer_norm` for a block of rows: ``dy_centred = dy (x - mu)`` (``dw``'s rows
    times ``1/rstd``) and, when ``need_x``, ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` with
    ``g = dy w``, written as ``g rstd - (rstd mean(g) + (x - mu) rstd^2 mean(g xhat))``."""
    centred = dx if need_x else dy_centred  # x - mu, rebuilt in place
    np.subtract(x, mean[:, None], out=centred)
    np.multiply(dy, centred, out=dy_centred)
    if not need_x:
        return
    inv_dim = 1.0 / dy.shape[-1]
    # Row means of g and g xhat as row reductions with w: no (n, D) temporary.
    mean_g = row_sums(dy, w)  # (n,)
    mean_g *= inv_dim
    mean_g *= rstd  # rstd mean(g)
    centred_coef = row_sums(dy_centred, w)  # rstd^2 mean(g xhat) = rstd^3 mean(g (x - mu))
    centred_coef *= rstd * rstd * rstd * inv_dim
    dx *= centred_coef[:, None]  # rstd ((x - mu) rstd mean(g xhat) + mean(g))
    dx += mean_g[:, None]
    if w is None:
        g_rstd = dy * rstd[:, None]  # rstd g
    else:
        g_rstd = _outer(rstd, w)  # the one (n, D) temporary, as dy * w was
        g_rstd *= dy
    np.subtract(g_rstd, dx, out=dx)
