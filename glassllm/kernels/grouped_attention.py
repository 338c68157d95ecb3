"""Attention's kernels for grouped-query heads and for banded (sliding-window) causal attention.

`attention(q, k, v, scale, bias, dropout_p, rng, dtype, groups, band)` computes what
`glassllm.functional.attention`'s definition does when ``k`` and ``v`` have ``KV = H / groups``
heads (query head ``h`` reads kv head ``h // groups``), or when ``band`` says that ``bias`` is
the causal band of a self-attention. Nothing is repeated per query head: the ``groups`` query
heads that share a kv head are multiplied by its one k and v, either

- **stacked** (any shapes, any mask): ``q (..., H, Tq, d)`` reshaped to ``(..., KV, groups Tq,
  d)``, so each product is one GEMM per kv head, and ``dk = dS^T q``, ``dv = A^T G`` sum over
  the group inside it; or
- **in causal tiles** (self-attention ``(B, H, T, d)`` with no other mask: ``band``, the window,
  ``T`` for plain causal): q viewed as ``(B, KV, groups, T, d)`` against k, v ``(B, KV, 1, T,
  d)``, broadcast by ``np.matmul``, through `glassllm.kernels.attention`'s tiles, which skip
  the keys right of each tile and, with a window, the keys left of it; the backward sums each
  tile's ``dS^T q`` and ``A^T G`` over the group as one product of the stacked rows.

`packed_attention` is Llama's attention in one op (`glassllm.functional.packed_attention`):
the heads of ``qkv (B, T, (H + 2 KV) hd)`` as views, q and k rotated into new arrays, the causal
tiles, and a backward that writes ``dv`` into the packed gradient and ``dq``, ``dk`` rotated
back into it.

The scores are ``(..., H, Tq, Tk)`` in memory either way, so the dropout mask is the same draw
as the definition's. Equal to the definition to float rounding (``tests/kernels/``).
"""

from __future__ import annotations

import numpy as np

from glassllm.kernels.attention import (
    _attention_backward,
    _attention_forward,
    _banded_backward,
    _causal_backward,
    _causal_forward,
)
from glassllm.kernels.attention import attention as _attention
from glassllm.kernels.attention import attention_probabilities as _probabilities
from glassllm.kernels.rotary import rotate


def attention(
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
    """``(O, vjp)``, ``vjp(G, need_q, need_k, need_v) -> (dq, dk, dv)`` (see the module)."""
    tiled = (
        band is not None
        and q.ndim == k.ndim == v.ndim == 4
        and k.shape[:2] == v.shape[:2] == (q.shape[0], q.shape[1] // groups)  # no broadcasting
        and q.shape[-2] == k.shape[-2]
    )
    if tiled:
        return _banded_attention(q, k, v, scale, band, dropout_p, rng, dtype, groups)
    if groups == 1:  # a band the tiles cannot take (other shapes): the bias holds it
        return _attention(q, k, v, scale, bias, dropout_p, rng, dtype)
    return _stacked_attention(q, k, v, scale, bias, dropout_p, rng, dtype, groups)


def attention_probabilities(
    q: np.ndarray,
    k: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dtype: np.dtype,
    groups: int = 1,
) -> np.ndarray:
    """``softmax(q k^T scale + bias)``, ``(..., H, Tq, Tk)``, each group's query heads stacked
    on its one k head."""
    lead, (heads, steps, _) = q.shape[:-3], q.shape[-3:]
    stacked = np.asarray(q).reshape(lead + (heads // groups, groups * steps, -1))
    probs = _probabilities(stacked, k, scale, _group_bias(bias, heads, groups, steps), dtype)
    return probs.reshape(probs.shape[:-3] + (heads, steps, probs.shape[-1]))


# why: up to 16 stacked query rows per kv head (a decoding step of up to 16 heads per group) the
# product with a transposed view of k beats copying k^T (see `_attention_forward`).
_FEW_ROWS = 16


def _stacked_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray | None,
    dropout_p: float,
    rng: np.random.Generator | None,
    dtype: np.dtype,
    groups: int,
) -> tuple:
    """Query heads ``h = j groups + g`` stacked as row block ``g`` of kv head ``j``: ``(...,
    KV, groups Tq, d)`` (a reshape), then `_attention_forward` and its backward as they are."""
    lead, (heads, steps, _) = q.shape[:-3], q.shape[-3:]
    stacked = np.asarray(q, dtype=dtype).reshape(lead + (heads // groups, groups * steps, -1))
    few = groups * steps <= _FEW_ROWS  # a decoding step: no copy of the cache's k^T
    out, residuals = _attention_forward(
        stacked,
        k,
        v,
        scale,
        _group_bias(bias, heads, groups, steps),
        dropout_p,
        rng,
        dtype,
        few_queries=few,
    )
    out_shape = out.shape[:-3] + (heads, steps, out.shape[-1])

    def vjp(grad: np.ndarray, need_q: bool, need_k: bool, need_v: bool) -> tuple:
        grad = grad.reshape(out.shape)  # (..., KV, groups Tq, dv)
        dq, dk, dv = _attention_backward(grad, residuals, scale, need_q, need_k, need_v)
        return (None if dq is None else dq.reshape(out_shape[:-1] + (dq.shape[-1],)), dk, dv)

    return out.reshape(out_shape), vjp


def _group_bias(bias: np.ndarray | None, heads: int, groups: int, steps: int) -> np.ndarray | None:
    """The scores' bias ``(..., H or 1, Tq or 1, Tk)`` in the stacked layout ``(..., KV or 1,
    groups Tq, Tk)``; one without a head axis is stacked ``groups`` times (``(groups Tq, Tk)``:
    each query head of a group sees the same positions)."""
    if bias is None:
        return None
    bias = np.broadcast_to(bias, bias.shape[:-2] + (steps, bias.shape[-1]))
    if bias.ndim < 3 or bias.shape[-3] == 1:
        return np.concatenate([bias] * groups, axis=-2)
    return np.ascontiguousarray(bias).reshape(
        bias.shape[:-3] + (heads // groups, groups * steps, bias.shape[-1])
    )


def _banded_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    window: int,
    dropout_p: float,
    rng: np.random.Generator | None,
    dtype: np.dtype,
    groups: int,
) -> tuple:
    """Causal self-attention with a ``window`` (``T``: none) of ``q (B, H, T, d)`` and ``k, v
    (B, KV, T, d)`` in tiles: q viewed as ``(B, KV, groups, T, d)``, k and v as ``(B, KV, 1,
    T, d)``."""
    batch, heads, steps, width = q.shape
    kv_heads = heads // groups
    q5 = np.asarray(q, dtype=dtype).reshape(batch, kv_heads, groups, steps, width)
    k5, v5 = (np.asarray(a, dtype=dtype)[:, :, None] for a in (k, v))  # (B, KV, 1, T, .)
    out = np.empty((batch, kv_heads, groups, steps, v.shape[-1]), dtype)
    residuals = _causal_forward(q5, k5, v5, scale, dropout_p, rng, out, keep=True, window=window)

    def vjp(grad: np.ndarray, need_q: bool, need_k: bool, need_v: bool) -> tuple:
        dq = np.empty(q5.shape, dtype)
        dk, dv = np.empty(k.shape, dtype), np.empty(v.shape, dtype)  # (B, KV, T, .)
        grad5 = np.asarray(grad, dtype=dtype).reshape(out.shape)
        _banded_backward(grad5, residuals, scale, dq, dk, dv)
        return (
            dq.reshape(q.shape) if need_q else None,
            dk if need_k else None,
            dv if need_v else None,
        )

    return out.reshape(batch, heads, steps, v.shape[-1]), vjp


def _split(a: np.ndarray, heads: int, groups: int, width: int, write: bool = False) -> np.ndarray:
    """``(B, T, heads width)`` as ``(B, heads / groups, groups, T, width)``; a view (``write``:
    one for sure, to be written through)."""
    batch, steps = a.shape[:2]
    view = np.reshape(
        a, (batch, steps, heads // groups, groups, width), copy=False if write else None
    )
    return view.transpose(0, 2, 3, 1, 4)


def packed_attention(
    qkv: np.ndarray,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    causal: bool,
    dropout_p: float,
    rng: np.random.Generator | None,
    keep: bool,
    window: int | None,
    cos: np.ndarray | None,
    sin: np.ndarray | None,
    interleaved: bool,
) -> tuple:
    """``(y (B, T, H hd), vjp)``, ``vjp(G) -> dqkv (B, T, (H + 2 KV) hd)`` (see the module).

    Causal: q as ``(B, KV, groups, T, hd)`` against k, v ``(B, KV, 1, T, hd)`` in the tiles of
    `glassllm.kernels.attention` (one query head per kv head: the 4-D tiles GPT-2 runs), the
    output written merged. Otherwise grouped `attention` on the heads, then merged."""
    batch, steps, _ = qkv.shape
    H, KV, groups, dtype = num_heads, num_kv_heads, num_heads // num_kv_heads, qkv.dtype
    hd = qkv.shape[-1] // (H + 2 * KV)
    q, k, v = (  # (B, KV, groups or 1, T, hd) views
        _split(qkv[..., lo * hd : hi * hd], hi - lo, groups if lo == 0 else 1, hd)
        for lo, hi in ((0, H), (H, H + KV), (H + KV, H + 2 * KV))
    )
    if cos is not None:
        q, k = rotate(q, cos, sin, interleaved), rotate(k, cos, sin, interleaved)
    merged = np.empty((batch, steps, H * hd), dtype)
    if causal:
        out = _split(merged, H, groups, hd, write=True)
        tiles = (q, k, v) if groups > 1 else (q[:, :, 0], k[:, :, 0], v[:, :, 0])
        outs = out if groups > 1 else out[:, :, 0]
        residuals = _causal_forward(*tiles, scale, dropout_p, rng, outs, keep=keep, window=window)
    else:
        flat = [a.reshape(batch, -1, steps, hd) for a in (q, k, v)]  # (B, heads, T, hd)
        y, heads_vjp = attention(*flat, scale, None, dropout_p, rng, dtype, groups)
        _split(merged, H, groups, hd, write=True)[...] = y.reshape(batch, KV, groups, steps, hd)

    def vjp(grad: np.ndarray) -> np.ndarray:
        d_qkv = np.empty(qkv.shape, dtype)
        dq, dk, dv = (
            _split(d_qkv[..., lo * hd : hi * hd], hi - lo, groups if lo == 0 else 1, hd, True)
            for lo, hi in ((0, H), (H, H + KV), (H + KV, H + 2 * KV))
        )
        # rotated q and k: their gradients first into arrays of their own, rotated back below
        dq_rot, dk_rot = (
            (dq, dk) if cos is None else (np.empty(q.shape, dtype), np.empty(k.shape, dtype))
        )
        grad5 = _split(grad, H, groups, hd)
        if not causal:
            flat = (grad5.reshape(batch, H, steps, hd), True, True, True)
            for d, part in zip((dq_rot, dk_rot, dv), heads_vjp(*flat), strict=True):
                d[...] = part.reshape(d.shape)
        elif groups > 1 or window is not None:
            squeeze = (lambda a: a) if groups > 1 else (lambda a: a[:, :, 0])
            _banded_backward(
                squeeze(grad5), residuals, scale, squeeze(dq_rot), dk_rot[:, :, 0], dv[:, :, 0]
            )
        else:
            _causal_backward(
                grad5[:, :, 0], residuals, scale, dq_rot[:, :, 0], dk_rot[:, :, 0], dv[:, :, 0]
            )
        if cos is not None:
            rotate(dq_rot, cos, sin, interleaved, inverse=True, out=dq)
            rotate(dk_rot, cos, sin, interleaved, inverse=True, out=dk)
        return d_qkv

    return merged, vjp
