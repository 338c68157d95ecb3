"""Normalization over the last axis, with fused backwards: layer_norm and rms_norm."""

from __future__ import annotations

import numpy as np

from glassllm import kernels
from glassllm.functional._common import as_dtype, float_tensor
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
    The VJP keeps ``mu`` and ``rstd`` per row and rebuilds ``xhat = (x - mu) rstd`` from ``x``
    (PyTorch keeps the same), not an ``(N, D)`` copy of ``xhat``. The definition below is the
    maths; `glassllm.kernels.layer_norm` runs it fast (row blocks on worker threads, one
    compiled pass per row with the ``fast`` extra), equal to it to float rounding.

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
    wd = None if w is None else w.data
    bd = None if b is None else b.data
    out, vjp = kernels.select(_layer_norm_definition, kernels.layer_norm)(x2, wd, bd, eps)

    def backward(grad: np.ndarray) -> tuple:
        need_w = w is not None and w.requires_grad
        need_b = b is not None and b.requires_grad
        dx, dw, db = vjp(grad.reshape(-1, dim), x.requires_grad, need_w, need_b)
        dx = None if dx is None else dx.reshape(x.shape)
        dw = None if dw is None else as_dtype(dw, w.dtype)
        db = None if db is None else as_dtype(db, b.dtype)
        return (dx,) + ((dw,) if w is not None else ()) + ((db,) if b is not None else ())

    parents = (x,) + tuple(p for p in (w, b) if p is not None)
    return Tensor.from_op(out.reshape(x.shape), parents, backward).named("layer_norm")


def _layer_norm_definition(
    x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float
) -> tuple:
    """`layer_norm` on rows ``x (N, D)`` in plain NumPy: ``(y, vjp)``, ``vjp(dy, need_x,
    need_w, need_b) -> (dx, dw, db)``. What the kernels compute (`glassllm.kernels.layer_norm`);
    ``glassllm.kernels.use("reference")`` runs this instead."""
    mu = x.mean(axis=-1, keepdims=True)  # (N, 1)
    centred = x - mu
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)  # (N, 1)
    xhat = centred * rstd  # (N, D)
    y = xhat if w is None else xhat * w
    y = y if b is None else y + b

    def vjp(dy: np.ndarray, need_x: bool, need_w: bool, need_b: bool) -> tuple:
        g = dy if w is None else dy * w  # dL/dxhat
        dx = None
        if need_x:
            dx = rstd * (
                g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)
            )
        dw = (dy * xhat).sum(axis=0) if need_w else None
        db = dy.sum(axis=0) if need_b else None
        return dx, dw, db

    return y, vjp


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Root-mean-square normalization over the last axis (Zhang and Sennrich, 2019), then scale.

    Forward, per row of ``D`` values: ``r = 1/sqrt(mean(x^2) + eps)``, ``xhat = x r``,
    ``y = xhat w`` (transformers' ``LlamaRMSNorm`` order: normalise, then multiply by the
    weight; no centring, no bias). ``weight`` ``(D,)`` is optional.

    VJP, with ``g = dy * w``: ``dr/dx_j = -r^3 x_j / D``, so ``dxhat_i/dx_j = r ([i = j] -
    xhat_i xhat_j / D)`` (symmetric) and ``dx = r (g - xhat mean(g xhat))``;
    ``dw = sum_rows(dy xhat)``. Stability: ``mean(x^2)`` is a sum of squares, nothing cancels;
    ``eps > 0`` keeps an all-zero row finite (``y = 0``). The VJP keeps ``r`` per row and
    rebuilds ``xhat`` from ``x``. The definition is `_rms_norm_definition`;
    `glassllm.kernels.rms_norm` runs it with BLAS row sums, equal to float rounding.

    >>> x = Tensor(np.array([[3.0, 4.0]], dtype=np.float32))
    >>> y = rms_norm(x, eps=0.0)
    >>> [round(float(v), 4) for v in y.data[0]], y.dtype
    ([0.8485, 1.1314], dtype('float32'))
    """
    x = float_tensor(x, "rms_norm: x")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"rms_norm: x needs a non-empty last axis to normalize, got shape {x.shape}"
        )
    if not float(eps) >= 0.0:
        raise ValueError(f"rms_norm: eps must be >= 0, got {eps!r}")
    dim = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (dim,):
        raise ValueError(
            f"rms_norm: weight shape {tuple(weight.shape)} must be ({dim},), the size of the "
            f"last axis of x {x.shape}"
        )
    w = None if weight is None else float_tensor(weight, "rms_norm: weight", dtype=x.dtype)
    x2 = x.data.reshape(-1, dim)  # (N, D)
    wd = None if w is None else w.data
    out, vjp = kernels.select(_rms_norm_definition, kernels.rms_norm)(x2, wd, float(eps))

    def backward(grad: np.ndarray) -> tuple:
        need_w = w is not None and w.requires_grad
        dx, dw = vjp(grad.reshape(-1, dim), x.requires_grad, need_w)
        dx = None if dx is None else dx.reshape(x.shape)
        dw = None if dw is None else as_dtype(dw, w.dtype)
        return (dx,) + ((dw,) if w is not None else ())

    parents = (x,) if w is None else (x, w)
    return Tensor.from_op(out.reshape(x.shape), parents, backward).named("rms_norm")


def rms_norm_array(x2: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """`rms_norm`'s forward on rows ``x2 (N, D)`` of a plain array, for decoding under
    ``no_grad`` (`glassllm.models.decoding`): the same kernel or definition, so the same bits,
    no Tensor and no checks."""
    return kernels.select(_rms_norm_definition, kernels.rms_norm)(x2, weight, float(eps))[0]


def _rms_norm_definition(x: np.ndarray, w: np.ndarray | None, eps: float) -> tuple:
    """`rms_norm` on rows ``x (N, D)`` in plain NumPy: ``(y, vjp)``, ``vjp(dy, need_x, need_w)
    -> (dx, dw)``. What `glassllm.kernels.rms_norm` computes; ``kernels.use("reference")``
    runs this instead."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (N, 1)
    xhat = x * rstd  # (N, D)
    y = xhat if w is None else xhat * w

    def vjp(dy: np.ndarray, need_x: bool, need_w: bool) -> tuple:
        g = dy if w is None else dy * w  # dL/dxhat
        dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True)) if need_x else None
        dw = (dy * xhat).sum(axis=0) if need_w else None
        return dx, dw

    return y, vjp
