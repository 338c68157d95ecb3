"""Layer normalization over the last axis, with its fused backward."""

from __future__ import annotations

import numpy as np

from glassllm.functional._common import as_dtype, float_tensor, ones_vector, sum_rows
from glassllm.tensor import Tensor


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Normalize each vector along the last axis of ``x`` (size ``D``), then scale and shift.

    Forward: ``mu = mean(x)``, ``var = mean((x - mu)^2)`` (biased, as PyTorch),
    ``rstd = 1/sqrt(var + eps)``, ``xhat = (x - mu) rstd``, ``y = xhat w + b``.
    The variance is taken of the centred ``x - mu`` (two passes), never as
    ``E[x^2] - E[x]^2``, which cancels catastrophically when ``|mu| >> std``.

    VJP, with ``g = dy * w``: ``dxhat/dx = rstd (I - 1/D - xhat xhat^T / D)``, so
    ``dx = rstd (g - mean(g) - xhat mean(g xhat))``; ``dw = sum_rows(dy xhat)``,
    ``db = sum_rows(dy)``. ``weight`` and ``bias`` have shape ``(D,)`` and are optional.

    >>> x = Tensor(np.array([[1.0, 2.0, 3.0]], dtype=np.float32))
    >>> [round(float(v), 4) for v in layer_norm(x).data[0]]
    [-1.2247, 0.0, 1.2247]
    """
    x = float_tensor(x, "layer_norm: x")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"layer_norm: x needs a non-empty last axis to normalize, got shape {x.shape}"
        )
    dim = x.shape[-1]
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and tuple(param.shape) != (dim,):
            raise ValueError(
                f"layer_norm: {name} shape {tuple(param.shape)} must be ({dim},), the size of "
                f"the last axis of x {x.shape}"
            )
    w = None if weight is None else float_tensor(weight, "layer_norm: weight", dtype=x.dtype)
    b = None if bias is None else float_tensor(bias, "layer_norm: bias", dtype=x.dtype)
    x2 = x.data.reshape(-1, dim)  # (N, D)
    inv_dim = 1.0 / dim
    ones = ones_vector(dim, x2.dtype)

    mean = x2 @ ones  # (N,)
    mean *= inv_dim
    xhat = np.subtract(x2, mean[:, None])  # (N, D) centred, normalized in place below
    var = np.einsum("ij,ij->i", xhat, xhat)  # (N,) row dot products, no temporary
    var *= inv_dim
    var += eps
    rstd = np.sqrt(var, out=var)
    np.divide(1.0, rstd, out=rstd)
    xhat *= rstd[:, None]
    out = xhat.copy() if w is None else np.multiply(xhat, w.data)
    if b is not None:
        out += b.data

    def backward(grad: np.ndarray) -> tuple:
        dy = grad.reshape(-1, dim)  # (N, D)
        scale = ones if w is None else w.data  # (D,): g = dy * scale
        need_w = w is not None and w.requires_grad
        dx = dw = db = None
        if x.requires_grad or need_w:
            dy_xhat = np.multiply(dy, xhat)  # (N, D): dw's rows, and g xhat = dy_xhat * w
        if need_w:
            dw = as_dtype(sum_rows(dy_xhat), w.dtype)
        if x.requires_grad:
            # Row means of g and g xhat as matrix-vector products with w: no (N, D) temporary.
            mean_g = dy @ scale  # (N,)
            mean_g *= inv_dim
            mean_gx = dy_xhat @ scale  # (N,)
            mean_gx *= inv_dim
            dx = np.multiply(xhat, mean_gx[:, None])  # (N, D) xhat mean(g xhat) + mean(g)
            dx += mean_g[:, None]
            g = dy if w is None else np.multiply(dy, scale, out=dy_xhat)  # reuse: dw is taken
            np.subtract(g, dx, out=dx)
            dx *= rstd[:, None]
            dx = dx.reshape(x.shape)
        if b is not None and b.requires_grad:
            db = as_dtype(sum_rows(dy), b.dtype)
        return (dx,) + ((dw,) if w is not None else ()) + ((db,) if b is not None else ())

    parents = (x,) + tuple(p for p in (w, b) if p is not None)
    return Tensor.from_op(out.reshape(x.shape), parents, backward)
