"""Scaled dot-product attention: the definitions, forward and VJP in plain NumPy (the op over
one packed projection, `packed_attention`, is in `glassllm.functional.packed_attention`).

The fast kernels (causal tiles over worker threads, in-place writes into packed heads) are in
`glassllm.kernels.attention`; `glassllm.kernels.select` picks which one runs.
"""

from __future__ import annotations

import math

import numpy as np

from glassllm import kernels
from glassllm._checks import check_float, check_int, check_probability
from glassllm.functional._common import float_tensor
from glassllm.kernels import attention as fast
from glassllm.kernels import grouped_attention as grouped
from glassllm.kernels.attention import CAUSAL_TILE, _causal_bias, _window_bias, split_packed_heads
from glassllm.rng import dropout_mask
from glassllm.tensor import Tensor, unbroadcast

__all__ = [
    "CAUSAL_TILE",
    "attention_probabilities",
    "scaled_dot_product_attention",
    "split_packed_heads",
]


def _mask_bias(
    num_queries: int,
    num_keys: int,
    causal: bool,
    mask: np.ndarray | None,
    dtype: np.dtype,
    window: int | None = None,
) -> np.ndarray | None:
    """The additive mask: 0 where attending is allowed, ``-inf`` where not (None: no mask).
    ``window`` (with ``causal``): the band ``0 <= i - j < window`` of aligned positions."""
    if window is not None:
        bias = _window_bias(num_queries, num_keys, window, dtype)
    else:
        bias = _causal_bias(num_queries, num_keys, dtype) if causal else None
    if mask is None:
        return bias
    user = np.zeros(mask.shape, dtype=dtype)
    user[~mask] = -np.inf
    return user if bias is None else user + bias


def _check_window(name: str, causal: bool, window: int | None) -> int | None:
    if window is None:
        return None
    window = check_int(f"{name}: window", window, min=1)
    if not causal:
        raise ValueError(
            f"{name}: window={window} is a band below the diagonal; it needs causal=True"
        )
    return window


def _scale(name: str, scale: float | None, head_dim: int) -> float:
    """``scale``, or ``1/sqrt(head_dim)`` when None (1 for an empty head)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    return check_float(f"{name}: scale", scale)


def _kv_groups(name: str, q_shape: tuple, k_shape: tuple, v_shape: tuple) -> int:
    """How many query heads share each key/value head: 1 when the leading axes broadcast (as
    ``np.matmul``'s do), else ``H // KV`` for ``q (..., H, Tq, d)`` and ``k, v (..., KV, Tk,
    d)`` with ``KV`` dividing ``H`` (grouped-query attention)."""
    try:
        np.broadcast_shapes(q_shape[:-2], k_shape[:-2], v_shape[:-2])
        return 1
    except ValueError:
        pass
    if min(len(q_shape), len(k_shape), len(v_shape)) >= 3 and k_shape[-3] == v_shape[-3]:
        heads, kv_heads = q_shape[-3], k_shape[-3]
        if kv_heads and heads % kv_heads == 0:
            try:
                np.broadcast_shapes(q_shape[:-3], k_shape[:-3], v_shape[:-3])
                return heads // kv_heads
            except ValueError:
                pass
    raise ValueError(
        f"{name}: q {q_shape}, k {k_shape} and v {v_shape} do not match: their leading axes "
        "must broadcast, or k and v must have KV heads on axis -3 dividing q's H heads "
        "(grouped-query attention)"
    )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
) -> Tensor:
    """Attention ``softmax(q k^T scale + M) v`` over ``(..., T, d)`` queries, keys, values.

    Leading (batch, head) axes broadcast as in ``np.matmul``; or, grouped-query attention, ``k``
    and ``v`` have ``KV`` heads on axis -3 where ``q`` has ``H`` (``KV`` dividing ``H``), and
    query head ``h`` reads key/value head ``h // (H // KV)`` (contiguous groups, transformers'
    ``repeat_kv``; the kernel multiplies each group's queries by its one k and v, no copy per
    query head). ``scale``: None is ``1/sqrt(d)``; GPT-Neo passes 1.0. ``M`` is 0 where
    attending is allowed and ``-inf`` elsewhere: ``causal`` lets query ``i`` see keys ``j <= Tk -
    Tq + i`` (aligned to the end, so a query appended after a key/value cache sees every cached
    key); ``window`` ``w`` (with ``causal``) keeps only ``0 <= (Tk - Tq + i) - j < w``, the ``w``
    latest keys (GPT-Neo's local layers, with or without a cache); ``mask``, a boolean array
    broadcastable to the scores ``(..., Tq, Tk)``, allows where True. A query
    allowed no key at all attends to nothing: its output row and its gradients are 0 (as
    PyTorch's scaled_dot_product_attention; a plain softmax of the masked scores gives nan).
    ``dropout_p`` drops attention weights (``glassllm.rng.get_rng(rng)``); pass 0
    when not training.

    Forward ``S = q k^T scale + M``, ``P = softmax(S)``, ``A = dropout(P)``, ``O = A v``; the
    definition, with its VJP and derivation, is `_attention_definition`;
    `glassllm.kernels.attention.attention` runs the same maths faster (to float rounding).

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
    groups = _kv_groups("attention", q.shape, k.shape, v.shape)
    mask = _check_mask("attention", mask)
    dropout_p = check_probability("attention: dropout_p", dropout_p)
    window = _check_window("attention", causal, window)
    if mask is not None:
        _check_mask_shape("attention", mask, _scores_shape(q.shape, k.shape, groups))
    out, vjp = _attend(q.data, k.data, v.data, groups, causal, mask, dropout_p, rng, scale, window)

    def backward(grad: np.ndarray) -> tuple:
        dq, dk, dv = vjp(grad, q.requires_grad, k.requires_grad, v.requires_grad)
        return (
            None if dq is None else unbroadcast(dq, q.shape),
            None if dk is None else unbroadcast(dk, k.shape),
            None if dv is None else unbroadcast(dv, v.shape),
        )

    return Tensor.from_op(out, (q, k, v), backward).named("scaled_dot_product_attention")


def attention_array(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool = False,
    *,
    scale: float | None = None,
    window: int | None = None,
) -> np.ndarray:
    """`scaled_dot_product_attention`'s forward on plain arrays, without dropout or a mask, for
    decoding under ``no_grad`` (`glassllm.models.decoding`): the same kernel and the same bits,
    no Tensor and no checks (the caller's shapes are the layer's own)."""
    groups = _kv_groups("attention", q.shape, k.shape, v.shape)
    return _attend(q, k, v, groups, causal, None, 0.0, None, scale, window)[0]


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    groups: int,
    causal: bool,
    mask: np.ndarray | None,
    dropout_p: float,
    rng: np.random.Generator | None,
    scale: float | None,
    window: int | None,
) -> tuple:
    """``(out, vjp)`` of the checked arguments: the mask as a bias, the kernel chosen."""
    num_queries, head_dim = q.shape[-2:]
    num_keys = k.shape[-2]
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    scale = _scale("attention", scale, head_dim)
    bias = _mask_bias(num_queries, num_keys, causal, mask, dtype, window)
    if groups > 1 and bias is not None and num_queries == 1 and mask is None and window is None:
        bias = None  # a decoding step: one query at the end sees every key (the bias is all 0)
    band = None  # the window of a causal self-attention with no other mask: tiles may run it
    if causal and mask is None and num_queries == num_keys and (groups > 1 or window):
        band = num_keys if window is None else window
    kernel = fast.attention if groups == 1 and band is None else grouped.attention
    attend = kernels.select(_attention_definition, kernel)
    return attend(q, k, v, scale, bias, dropout_p, rng, dtype, groups, band)


def _check_mask(name: str, mask: np.ndarray | None) -> np.ndarray | None:
    if mask is None:
        return None
    mask = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"{name}: mask must be boolean (True = attend), got dtype {mask.dtype}")
    return mask


def _scores_shape(q_shape: tuple, k_shape: tuple, groups: int) -> tuple:
    """The shape of the scores ``(..., [H,] Tq, Tk)`` for these q and k."""
    if groups == 1:
        lead = np.broadcast_shapes(q_shape[:-2], k_shape[:-2])
    else:
        lead = np.broadcast_shapes(q_shape[:-3], k_shape[:-3]) + (q_shape[-3],)
    return lead + (q_shape[-2], k_shape[-2])


def _check_mask_shape(name: str, mask: np.ndarray, scores_shape: tuple) -> None:
    try:
        np.broadcast_shapes(mask.shape, scores_shape)
    except ValueError:
        raise ValueError(
            f"{name}: mask of shape {mask.shape} does not broadcast to the scores' shape "
            f"{scores_shape} (..., Tq, Tk)"
        ) from None


def attention_probabilities(
    q: Tensor | np.ndarray,
    k: Tensor | np.ndarray,
    causal: bool = False,
    mask: np.ndarray | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
) -> np.ndarray:
    """The attention weights ``P = softmax(q k^T scale + M)``, ``(..., Tq, Tk)``: the matrix
    that `scaled_dot_product_attention` (and `packed_attention`, per head) multiplies ``v`` by,
    before dropout. For looking inside a model: a NumPy array in the dtype the fused op computes
    in, outside the autograd graph.

    ``q (..., Tq, d)`` and ``k (..., Tk, d)`` (arrays or Tensors; ``k`` may have fewer heads,
    grouped-query attention), ``causal``, ``mask``, ``scale`` and ``window`` as in
    `scaled_dot_product_attention`: each row sums to 1, masked entries are exactly 0, and a
    query allowed no key has a row of zeros. The arithmetic is the fused forward's (scale k,
    subtract the row maximum, exponentiate, multiply by the reciprocal row sum), so ``P @ v``
    is the fused op's output up to float rounding.

    >>> q = k = np.eye(2, dtype=np.float32)[None]  # (1, 2, 2)
    >>> attention_probabilities(q, k, causal=True)[0].astype(float).round(3).tolist()
    [[1.0, 0.0], [0.33, 0.67]]
    """
    name = "attention_probabilities"
    q_data = float_tensor(q, f"{name}: q").data
    k_data = float_tensor(k, f"{name}: k").data
    if min(q_data.ndim, k_data.ndim) < 2 or q_data.shape[-1] != k_data.shape[-1]:
        raise ValueError(
            f"{name}: q and k need shapes (..., Tq, d) and (..., Tk, d), got "
            f"{q_data.shape} and {k_data.shape}"
        )
    groups = _kv_groups(name, q_data.shape, k_data.shape, k_data.shape)
    mask = _check_mask(name, mask)
    window = _check_window(name, causal, window)
    if mask is not None:
        _check_mask_shape(name, mask, _scores_shape(q_data.shape, k_data.shape, groups))
    dtype = np.result_type(q_data.dtype, k_data.dtype)
    num_queries, head_dim = q_data.shape[-2:]
    scale = _scale(name, scale, head_dim)
    bias = _mask_bias(num_queries, k_data.shape[-2], causal, mask, dtype, window)
    kernel = fast.attention_probabilities if groups == 1 else grouped.attention_probabilities
    probabilities = kernels.select(_probabilities_definition, kernel)
    return probabilities(q_data, k_data, scale, bias, dtype, groups)


def _attention_definition(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dropout_p: float,
    rng: np.random.Generator | None,
    dtype: np.dtype,
    groups: int = 1,
    band: int | None = None,
) -> tuple:
    """Attention in plain NumPy: ``(O, vjp)``, ``vjp(G, need_q, need_k, need_v) -> (dq, dk, dv)``.
    (``band``, a hint for the kernels, that ``bias`` is a causal band they may tile, is unused.)

    Forward, with ``scale`` (default ``1/sqrt(d)``) and ``M`` the additive mask (``bias``)::

        S = q k^T scale + M                  (..., Tq, Tk) scores
        P = softmax(S)   along each row      (a row allowed no key: P = 0)
        A = P * D                            D: the dropout mask, 1/(1-p) or 0 (none: A = P)
        O = A v                              (..., Tq, dv)

    VJP, with ``G = dL/dO``: ``O = A v`` gives ``dv = A^T G`` and ``dA = G v^T``; ``A = P * D``
    gives ``dP = dA * D``; the softmax's Jacobian ``dP_j/dS_i = P_j ([i = j] - P_i)`` gives
    ``dS = P * (dP - rowsum(dP * P))``; ``M`` is a constant; ``S = q k^T scale`` gives
    ``dq = dS k scale`` and ``dk = dS^T q scale``. (``rowsum(dP * P) = rowsum(G * O)``: the
    kernels take it on ``(Tq, dv)``, not ``(Tq, Tk)``.)

    Grouped-query attention (``groups = H / KV > 1``): each k and v head is repeated for the
    ``groups`` query heads that read it (``k_h = k[h // groups]``); the VJP of a repeat is the
    sum over the copies, ``dk[j] = sum_{h // groups = j} dk_h`` (the same for ``dv``).
    """
    q, k, v = (np.asarray(a, dtype=dtype) for a in (q, k, v))
    if groups > 1:
        k, v = np.repeat(k, groups, axis=-3), np.repeat(v, groups, axis=-3)  # (..., H, Tk, d)
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        scores = scores + bias
    probs = _softmax_rows(scores)
    drop = dropout_mask(probs.shape, dropout_p, dtype, rng) if dropout_p > 0 else None
    weights = probs if drop is None else probs * drop
    out = weights @ v

    def vjp(grad: np.ndarray, need_q: bool, need_k: bool, need_v: bool) -> tuple:
        dv = np.swapaxes(weights, -1, -2) @ grad
        d_weights = grad @ np.swapaxes(v, -1, -2)
        d_probs = d_weights if drop is None else d_weights * drop
        d_scores = probs * (d_probs - (d_probs * probs).sum(axis=-1, keepdims=True))
        dq = d_scores @ k * scale
        dk = np.swapaxes(d_scores, -1, -2) @ q * scale
        if groups > 1:  # the sum over each group's copies
            dk, dv = _sum_groups(dk, groups), _sum_groups(dv, groups)
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None)

    return out, vjp


def _sum_groups(d: np.ndarray, groups: int) -> np.ndarray:
    """``d (..., H, Tk, d)`` summed over each group of ``groups`` heads: ``(..., KV, Tk, d)``."""
    lead, (heads, keys, width) = d.shape[:-3], d.shape[-3:]
    return d.reshape(lead + (heads // groups, groups, keys, width)).sum(axis=-3)


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """``exp(S - m) / rowsum(exp(S - m))`` with ``m`` the row maximum (no overflow); a row with
    no finite score (fully masked) is shifted by 0 and divided by 1, so it is all zeros."""
    shift = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    shift[~np.isfinite(shift)] = 0
    exps = np.exp(scores - shift)
    total = exps.sum(axis=-1, keepdims=True)
    total[total == 0] = 1
    return exps / total


def _probabilities_definition(
    q: np.ndarray,
    k: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dtype: np.dtype,
    groups: int = 1,
) -> np.ndarray:
    """``P = softmax(q k^T scale + M)`` in plain NumPy (see `_attention_definition`)."""
    q, k = (np.asarray(a, dtype=dtype) for a in (q, k))
    if groups > 1:
        k = np.repeat(k, groups, axis=-3)
    scores = q @ np.swapaxes(k, -1, -2) * scale
    return _softmax_rows(scores if bias is None else scores + bias)
