"""Linear maps on the last axis: ``linear`` (x @ W + b) and ``embedding`` (a row lookup).

``embedding(ids, W)`` is ``onehot(ids) @ W`` computed as a gather; its gradient is the
matching scatter-add (`glassllm.kernels.embedding` does it by the faster of two exact methods
for the table's size).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm import kernels
from glassllm.functional._common import as_dtype, float_tensor, integer_array, sum_over
from glassllm.tensor import Tensor


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y = x @ W + b`` over the last axis of ``x``; ``W`` is ``(in, out)``, ``b`` is ``(out,)``.

    ``x`` of shape ``(..., in)`` is viewed as a matrix ``X (N, in)``, so the product is one
    2-D BLAS call (`glassllm.kernels.matmul_rows` streams one row against a large matrix, a
    decoding step, through ``einsum``). VJP with
    ``G = dL/dY (N, out)``:
    ``dX = G W^T``, ``dW = X^T G``, ``db = 1^T G`` (a row sum as a matrix-vector product).

    >>> x = Tensor(np.ones((2, 3, 4), dtype=np.float32))
    >>> w = Tensor(np.ones((4, 5), dtype=np.float32), requires_grad=True)
    >>> y = linear(x, w, Tensor(np.zeros(5, dtype=np.float32)))
    >>> y.shape, y.dtype, float(y.data[0, 0, 0])
    ((2, 3, 5), dtype('float32'), 4.0)
    """
    x = float_tensor(x, "linear: x")
    weight = float_tensor(weight, "linear: weight")
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (in, out), got shape {weight.shape}")
    fan_in, fan_out = weight.shape
    if x.ndim == 0 or x.shape[-1] != fan_in:
        raise ValueError(
            f"linear: the last axis of x {x.shape} must match the weight's first axis "
            f"(in={fan_in}, weight shape {weight.shape})"
        )
    if bias is not None:
        bias = float_tensor(bias, "linear: bias", dtype=weight.dtype)
        if bias.shape != (fan_out,):
            raise ValueError(f"linear: bias shape {bias.shape} must be ({fan_out},)")
    # why: one 2-D BLAS call; a 3-D @ 2-D matmul is ~1.6x slower.
    x2 = x.data.reshape(-1, fan_in)  # (N, in)
    out = kernels.select(np.matmul, kernels.matmul_rows)(x2, weight.data)  # (N, out)
    if bias is not None:
        out += bias.data
    out_shape = x.shape[:-1] + (fan_out,)

    def backward(grad: np.ndarray) -> tuple:
        g2 = grad.reshape(-1, fan_out)  # (N, out)
        dx = (g2 @ weight.data.T).reshape(x.shape) if x.requires_grad else None
        dw = as_dtype(x2.T @ g2, weight.dtype) if weight.requires_grad else None
        if bias is None:
            return dx, dw
        db = (
            as_dtype(sum_over(g2, (0,), keepdims=False), bias.dtype) if bias.requires_grad else None
        )
        return dx, dw, db

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor.from_op(out.reshape(out_shape), parents, backward).named("linear")


def linear_array(x2: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """`linear`'s forward on rows ``x2 (N, in)`` of plain arrays, for decoding under ``no_grad``
    (`glassllm.models.decoding`): the same product and the same bits, no Tensor, no checks."""
    out = kernels.select(np.matmul, kernels.matmul_rows)(x2, weight)  # (N, out)
    if bias is not None:
        out += bias
    return out


def _scatter_add_definition(ids: np.ndarray, grad_rows: np.ndarray, num_rows: int) -> np.ndarray:
    """``dW[v] = sum_{i: ids[i] = v} G[i]``, i.e. ``onehot(ids)^T G``: ``np.add.at`` adds every
    row into its table row, one after another, so repeated ids accumulate."""
    out = np.zeros((num_rows, grad_rows.shape[1]), dtype=grad_rows.dtype)
    np.add.at(out, ids, grad_rows)
    return out


def embedding(ids: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight (V, D)`` picked by integer ``ids`` of any shape: ``y[...] = W[ids[...]]``.

    Forward: a gather, ``y = onehot(ids) @ W`` without the one-hot. VJP:
    ``dW = onehot(ids)^T G``: each row ``v`` receives the sum of the upstream rows of every
    position holding ``v`` (a repeated id accumulates). ``ids`` (an integer ndarray or a
    constant Tensor) must lie in ``[0, V)``; negative ids are an error, not wrap-around.

    >>> w = Tensor(np.arange(6.0).reshape(3, 2), requires_grad=True)
    >>> y = embedding(np.array([2, 0, 2]), w)
    >>> y.sum().backward()
    >>> y.data.tolist(), w.grad.tolist()
    ([[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]], [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    """
    index = np.array(integer_array(ids, "embedding: ids"))  # a copy: the VJP must see these ids
    weight = float_tensor(weight, "embedding: weight")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got {weight.shape}")
    num_rows, dim = weight.shape
    if index.size and (index.min() < 0 or index.max() >= num_rows):
        bad = index[(index < 0) | (index >= num_rows)].flat[0]
        raise IndexError(
            f"embedding: id {bad} is outside [0, {num_rows}) (weight shape {weight.shape})"
        )
    out = np.take(weight.data, index, axis=0)  # (*ids.shape, D)

    def backward(grad: np.ndarray) -> tuple:
        flat_ids = index.reshape(-1)
        scatter_add = kernels.select(_scatter_add_definition, kernels.scatter_add_rows)
        return (scatter_add(flat_ids, grad.reshape(-1, dim), num_rows),)

    return Tensor.from_op(out, (weight,), backward).named("embedding")
