"""Linear maps on the last axis: ``linear`` (x @ W + b) and ``embedding`` (a row lookup).

``embedding(ids, W)`` is ``onehot(ids) @ W`` computed as a gather; its gradient is the
matching scatter-add, done with whichever of two exact methods is faster for the vocabulary
size (see ``_scatter_add_rows``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm import kernels
from glassllm.functional._common import as_dtype, float_tensor, integer_array, sum_rows
from glassllm.tensor import Tensor

# why: below this many rows in the table, dW = onehot(ids)^T @ g (one BLAS call) beats
# sorting the ids and summing runs with np.add.reduceat; above it, the V x N one-hot costs more
# than the sort. Measured on the 2-core dev box (N=768 ids, D=128, float32): V=32: 97 vs 112 us,
# V=65: ~110-190 vs ~140 us, V=128: 344 vs 198 us, V=1024: 11 ms vs 1.3 ms. np.add.at: 870 us.
ONE_HOT_MAX_ROWS = 64


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
        db = as_dtype(sum_rows(g2), bias.dtype) if bias.requires_grad else None
        return dx, dw, db

    parents = (x, weight) if bias is None else (x, weight, bias)
    return Tensor.from_op(out.reshape(out_shape), parents, backward).named("linear")


def _scatter_add_rows(ids: np.ndarray, grad_rows: np.ndarray, num_rows: int) -> np.ndarray:
    """``out[v] = sum_{i: ids[i] = v} grad_rows[i]``: the embedding VJP, exact for repeated ids.

    Small tables: ``onehot(ids)^T @ grad_rows`` (one BLAS call). Large tables: sort the ids,
    sum each run of equal ids with ``np.add.reduceat`` and write one row per distinct id.
    Both beat ``np.add.at`` several times over (see ``ONE_HOT_MAX_ROWS``).
    """
    count, dim = grad_rows.shape
    if num_rows <= ONE_HOT_MAX_ROWS:
        one_hot = np.zeros((num_rows, count), dtype=grad_rows.dtype)  # (V, N)
        one_hot[ids, np.arange(count)] = 1
        return one_hot @ grad_rows
    out = np.zeros((num_rows, dim), dtype=grad_rows.dtype)
    if count == 0:
        return out
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    run_starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out[sorted_ids[run_starts]] = np.add.reduceat(grad_rows[order], run_starts, axis=0)
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
        return (_scatter_add_rows(flat_ids, grad.reshape(-1, dim), num_rows),)

    return Tensor.from_op(out, (weight,), backward).named("embedding")
