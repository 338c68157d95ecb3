"""Functions that rearrange values without arithmetic: concatenate, stack, where.

Their vector-Jacobian products route each gradient entry back to where its value came from.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from glassllm.functional._common import as_dtype, float_tensor
from glassllm.tensor import Tensor, as_tensor, normalize_axes, unbroadcast


def _tensor_list(tensors: Sequence[Any], name: str) -> list[Tensor]:
    if isinstance(tensors, (Tensor, np.ndarray)):
        raise TypeError(
            f"{name} takes a sequence of tensors, not a single {type(tensors).__name__}"
        )
    items = [as_tensor(t) for t in tensors]
    if not items:
        raise ValueError(f"{name} needs at least one tensor")
    return items


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing ``axis`` (``np.concatenate``).

    VJP: ``y = [x_1, ..., x_n]`` along ``axis``, so ``dL/dx_i`` is the slice of ``g`` that
    ``x_i`` occupies; the slices are views of ``g`` (no copy).

    >>> a = Tensor(np.ones((2, 3)), requires_grad=True)
    >>> b = Tensor(np.zeros((1, 3)), requires_grad=True)
    >>> concatenate([a, b], axis=0).shape
    (3, 3)
    """
    parts = _tensor_list(tensors, "concatenate")
    out = np.concatenate([p.data for p in parts], axis=axis)
    (axis,) = normalize_axes(operator.index(axis), out.ndim)  # NumPy has checked it
    bounds = np.cumsum([p.shape[axis] for p in parts])[:-1]

    def backward(grad: np.ndarray) -> tuple:
        pieces = np.split(grad, bounds, axis=axis)
        return tuple(
            as_dtype(piece, p.dtype) if p.requires_grad else None
            for piece, p in zip(pieces, parts, strict=True)
        )

    return Tensor.from_op(out, tuple(parts), backward).named("concatenate")


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join equally shaped tensors along a new ``axis`` (``np.stack``).

    VJP: ``y[..., i, ...] = x_i``, so ``dL/dx_i = g[..., i, ...]``, a view of ``g``.

    >>> parts = [Tensor(np.full(3, float(i)), requires_grad=True) for i in range(4)]
    >>> stack(parts, axis=-1).shape
    (3, 4)
    """
    parts = _tensor_list(tensors, "stack")
    out = np.stack([p.data for p in parts], axis=axis)
    (axis,) = normalize_axes(operator.index(axis), out.ndim)  # NumPy has checked it
    leading = (slice(None),) * axis

    def backward(grad: np.ndarray) -> tuple:
        return tuple(
            as_dtype(grad[leading + (i,)], p.dtype) if p.requires_grad else None
            for i, p in enumerate(parts)
        )

    return Tensor.from_op(out, tuple(parts), backward).named("stack")


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """Elementwise choice ``y = a if cond else b``, broadcasting ``cond``, ``a`` and ``b`` together.

    VJP: ``dL/da = unbroadcast(g * cond)``, ``dL/db = unbroadcast(g * (1 - cond))``; the
    masks are arithmetic (a bool times a float), which is faster than ``np.where``.
    ``cond`` is boolean data (an ndarray or a constant Tensor); a Python scalar ``a`` or
    ``b`` takes the other operand's dtype, so float32 stays float32.

    >>> x = Tensor(np.array([-1.0, 2.0]), requires_grad=True)
    >>> where(x.data > 0, x, 0.0).data
    array([0., 2.])
    """
    mask = cond.data if isinstance(cond, Tensor) else np.asarray(cond)
    if mask.dtype != np.bool_:
        raise TypeError(f"where: cond must be boolean, got dtype {mask.dtype}")
    dtype = next((x.dtype for x in (a, b) if isinstance(x, (Tensor, np.ndarray))), None)
    a = float_tensor(a, "where: a", dtype=dtype)
    b = float_tensor(b, "where: b", dtype=dtype)
    out = np.where(mask, a.data, b.data)

    def backward(grad: np.ndarray) -> tuple:
        grad_a = grad_b = None
        if a.requires_grad:
            grad_a = as_dtype(unbroadcast(grad * mask, a.shape), a.dtype)
        if b.requires_grad:
            grad_b = as_dtype(unbroadcast(grad * ~mask, b.shape), b.dtype)
        return grad_a, grad_b

    return Tensor.from_op(out, (a, b), backward).named("where")
