"""Scaled dot-product attention with a fused, numerically stable backward."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from glassllm.functional._common import exp_shift, float_tensor, sum_last
from glassllm.functional.regularization import check_probability, dropout_mask
from glassllm.tensor import Tensor, unbroadcast


@lru_cache(maxsize=32)
def _causal_bias(num_queries: int, num_keys: int, dtype: np.dtype) -> np.ndarray:
    """``(Tq, Tk)``: 0 where query ``i`` may see key ``j <= Tk - Tq + i``, ``-inf`` elsewhere."""
    bias = np.triu(
        np.full((num_queries, num_keys), -np.inf, dtype=dtype), k=num_keys - num_queries + 1
    )
    bias.flags.writeable = False
    return bias


def _mask_bias(
    num_queries: int, num_keys: int, causal: bool, mask: np.ndarray | None, dtype: np.dtype
) -> np.ndarray | None:
    """The additive mask: 0 where attending is allowed, ``-inf`` where not (None: no mask)."""
    bias = _causal_bias(num_queries, num_keys, dtype) if causal else None
    if mask is None:
        return bias
    user = np.zeros(mask.shape, dtype=dtype)
    user[~mask] = -np.inf
    return user if bias is None else user + bias


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Tensor:
    """Attention ``softmax(q k^T / sqrt(d) + M) v`` over ``(..., T, d)`` queries, keys, values.

    Leading (batch, head) axes broadcast as in ``np.matmul``. ``M`` is 0 where attending is
    allowed and ``-inf`` elsewhere: ``causal`` lets query ``i`` see keys ``j <= Tk - Tq + i``
    (aligned to the end, so a query appended after a key/value cache sees every cached key);
    ``mask``, a boolean array broadcastable to ``(..., Tq, Tk)``, allows where True. A query
    allowed no key at all attends to nothing: its output row and its gradients are 0 (PyTorch
    gives nan). ``dropout_p`` drops attention weights (``glassllm.rng.get_rng(rng)``); pass 0
    when not training.

    Forward: ``S = (q/sqrt d) k^T + M``, ``P = softmax(S)`` with the row maximum subtracted
    (a fully masked row is shifted by 0 and its zero sum replaced by 1), ``A = P * m_drop``,
    ``O = A v``. VJP with ``G = dL/dO``: ``dv = A^T G``, ``dP = (G v^T) * m_drop``,
    ``dS = P * (dP - rowsum(dP * P))``, where ``rowsum(dP * P) = rowsum(G * O)`` is computed
    on ``(Tq, dv)`` rather than ``(Tq, Tk)``; ``dq = dS k / sqrt d``, ``dk = dS^T q / sqrt d``.

    >>> q = k = v = Tensor(np.eye(2, dtype=np.float32)[None])  # (1, 2, 2)
    >>> out = scaled_dot_product_attention(q, k, v, causal=True)
    >>> out.shape, out.dtype, out.data[0, 0].tolist()  # query 0 sees only key 0
    ((1, 2, 2), dtype('float32'), [1.0, 0.0])
    """
    q = float_tensor(q, "attention: q")
    k = float_tensor(k, "attention: k")
    v = float_tensor(v, "attention: v")
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ValueError(
            "attention: q, k, v need at least 2 axes (..., T, d), "
            f"got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: q {q.shape} and k {k.shape} must share the last (head) axis")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"attention: k {k.shape} and v {v.shape} must have the same number of keys"
        )
    if mask is not None:
        mask = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(
                f"attention: mask must be boolean (True = attend), got dtype {mask.dtype}"
            )
    dropout_p = check_probability(dropout_p, "attention: dropout_p")
    num_queries, head_dim = q.shape[-2:]
    num_keys = k.shape[-2]
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0

    q_scaled = np.multiply(q.data, scale, dtype=dtype)  # (..., Tq, d): cheaper to scale than S
    scores = q_scaled @ np.swapaxes(k.data, -1, -2).astype(dtype, copy=False)  # (..., Tq, Tk)
    bias = _mask_bias(num_queries, num_keys, causal, mask, dtype)
    if bias is not None:
        if np.broadcast_shapes(scores.shape, bias.shape) == scores.shape:
            scores += bias
        else:
            scores = scores + bias  # the mask adds batch axes that q, k lack
    scores -= exp_shift(scores, (scores.ndim - 1,))  # (..., Tq, 1) row max, 0 if fully masked
    probs = np.exp(scores, out=scores)  # (..., Tq, Tk)
    row_sum = sum_last(probs)
    row_sum[row_sum == 0] = 1
    np.divide(1.0, row_sum, out=row_sum)
    probs *= row_sum
    drop = dropout_mask(probs.shape, dropout_p, dtype, rng) if dropout_p > 0 else None
    weights = probs if drop is None else probs * drop  # (..., Tq, Tk)
    out = weights @ v.data  # (..., Tq, dv)

    def vjp(grad: np.ndarray) -> tuple:
        dq = dk = dv = None
        if v.requires_grad:
            dv = unbroadcast(np.swapaxes(weights, -1, -2) @ grad, v.shape)
        if q.requires_grad or k.requires_grad:
            d_scores = grad @ np.swapaxes(v.data, -1, -2)  # (..., Tq, Tk) dA, then dP, then dS
            if drop is not None:
                d_scores *= drop
            row_dot = np.einsum("...j,...j->...", grad, out)[..., None]  # rowsum(dP * P)
            d_scores -= row_dot
            d_scores *= probs
            if q.requires_grad:
                dq = d_scores @ k.data
                dq *= scale
                dq = unbroadcast(dq, q.shape)
            if k.requires_grad:
                dk = unbroadcast(np.swapaxes(d_scores, -1, -2) @ q_scaled, k.shape)
        return dq, dk, dv

    return Tensor.from_op(out, (q, k, v), vjp)
