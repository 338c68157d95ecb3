"""RMSNorm's fast kernel: row sums of squares as dot products, the scalings as one outer product.

`rms_norm(x, w, eps)` computes what `glassllm.functional.rms_norm`'s definition does for
``x (N, D)`` and returns ``(out, vjp)``; ``vjp(dy, need_x, need_w)`` gives ``(dx, dw)``. The
definition's passes (``x * x``, its mean, ``x r``, ``xhat w``; in the VJP ``dy w``,
``g xhat``, its mean, ...) each make an ``(N, D)`` temporary; here the row sums are ``einsum``
dot products (no temporary, each row on its own), the per-row ``r`` and per-column ``w`` are one
multiply by their outer product (`glassllm.kernels.layer_norm._outer`), and the VJP's row sums
and ``dw`` are matrix-vector products. Equal to the definition to float rounding.
"""

from __future__ import annotations

import numpy as np

from glassllm.kernels.layer_norm import _outer


def rms_norm(x2: np.ndarray, wd: np.ndarray | None, eps: float) -> tuple:
    """``(out, vjp)`` for rows ``x2 (N, D)`` (see the module docstring)."""
    inv_dim = 1.0 / x2.shape[-1]
    rstd = np.einsum("ij,ij->i", x2, x2)  # (N,) sums of squares, then 1/sqrt(mean + eps)
    rstd *= inv_dim
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.divide(1.0, rstd, out=rstd)
    out = x2 * (rstd[:, None] if wd is None else _outer(rstd, wd))  # (N, D) x r w

    def vjp(dy: np.ndarray, need_x: bool, need_w: bool) -> tuple:
        if not (need_x or need_w):
            return None, None
        dy_x = dy * x2  # (N, D): dw's rows / r, and mean(g xhat) / r
        dw = rstd @ dy_x if need_w else None  # sum_rows(dy xhat)
        if not need_x:
            return None, dw
        # dx = r g - x r^3 mean(g x), with g = dy w and mean(g x) = (dy x) @ w / D; r^3 mean(g x)
        # is taken as ((sum(g x) r) r) r / D, each factor near dx's own magnitude
        coef = np.einsum("ij->i", dy_x) if wd is None else dy_x @ wd  # (N,) sum(g x)
        with np.errstate(over="ignore", invalid="ignore"):
            for _ in range(3):
                coef *= rstd
        coef *= inv_dim
        if not np.isfinite(coef).all():  # rms < ~1e-13 with eps ~ 0: r^3 overflows; xhat form
            g = dy if wd is None else dy * wd
            xhat = x2 * rstd[:, None]
            return rstd[:, None] * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True)), dw
        dx = dy * (rstd[:, None] if wd is None else _outer(rstd, wd))
        dy_x = np.multiply(x2, coef[:, None], out=dy_x)
        dx -= dy_x
        return dx, dw

    return out, vjp
