"""Attention over one packed projection ``qkv``: the definitions, forward and VJP in plain NumPy.

`packed_attention` splits the heads, attends and merges them in one op (GPT-2's; with grouped
heads and rotary positions, Llama's), so that the split is a view and the backward writes ``dq,
dk, dv`` into one packed gradient. The kernels are `glassllm.kernels.attention.packed_attention`
and `glassllm.kernels.grouped_attention.packed_attention`.
"""

from __future__ import annotations

import numpy as np

from glassllm import kernels
from glassllm._checks import check_int, check_probability
from glassllm.autograd import is_grad_enabled
from glassllm.functional._common import float_tensor
from glassllm.functional.attention import (
    _attention_definition,
    _check_window,
    _mask_bias,
    _scale,
)
from glassllm.functional.rotary import _rotary_definition
from glassllm.kernels import attention as fast
from glassllm.kernels import grouped_attention as grouped
from glassllm.kernels.attention import split_packed_heads
from glassllm.tensor import Tensor

__all__ = ["packed_attention"]


def packed_attention(
    qkv: Tensor,
    num_heads: int,
    causal: bool = False,
    dropout_p: float = 0.0,
    rng: np.random.Generator | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
    num_kv_heads: int | None = None,
    cos: np.ndarray | None = None,
    sin: np.ndarray | None = None,
    interleaved: bool = False,
) -> Tensor:
    """Multi-head attention over one packed projection: ``qkv (B, T, 3E) -> (B, T, E)``.

    The last axis of ``qkv`` is ``[q | k | v]``, each split into ``num_heads`` heads of
    ``hs = E / num_heads`` features; the output puts the heads' outputs side by side again.
    The same numbers as splitting ``q, k, v`` into ``(B, nh, T, hs)``, calling
    `scaled_dot_product_attention` and merging the heads, but the split is a view and the
    merge a strided write. ``scale`` and ``window`` as in `scaled_dot_product_attention`. The
    definition is `_packed_definition`; the kernel (`glassllm.kernels.attention.packed_attention`)
    writes ``dq, dk, dv`` straight into one ``(B, T, 3E)`` gradient and runs causal attention in
    tiles over the worker threads.

    The modern families' choices (Llama's attention in one op): ``num_kv_heads`` KV dividing H,
    grouped-query heads, ``qkv (B, T, (H + 2 KV) hd) -> (B, T, H hd)`` packed ``[q | k | v]``
    (query head ``h`` reads kv head ``h // (H / KV)``); ``cos``, ``sin`` (`rotary_cos_sin`,
    ``(T, r/2)``): q and k rotated first, as `rotary` does (``interleaved`` pairs or not). The
    definition is `_grouped_packed_definition` (split, rotate, attend, merge); the kernel,
    `glassllm.kernels.grouped_attention.packed_attention`, attends in the causal tiles and
    writes the gradient of the rotated q and k, rotated back, into the one packed gradient.

    >>> qkv = Tensor(np.ones((2, 5, 12), dtype=np.float32))  # E = 4, two heads of 2
    >>> y = packed_attention(qkv, num_heads=2, causal=True)
    >>> y.shape, y.dtype
    ((2, 5, 4), dtype('float32'))
    """
    qkv = float_tensor(qkv, "attention: qkv")
    num_heads = check_int("attention: num_heads", num_heads, min=1)
    if num_kv_heads is not None or cos is not None or sin is not None:
        return _grouped_packed(
            qkv, num_heads, num_kv_heads, causal, dropout_p, rng, scale, window, cos, sin,
            interleaved,
        )  # fmt: skip
    if qkv.ndim != 3 or qkv.shape[-1] % (3 * num_heads) != 0:
        raise ValueError(
            f"attention: qkv must have shape (B, T, 3E) with E divisible by num_heads="
            f"{num_heads}, got {qkv.shape}"
        )
    dropout_p = check_probability("attention: dropout_p", dropout_p)
    window = _check_window("attention", causal, window)
    head_size = qkv.shape[-1] // 3 // num_heads
    scale = _scale("attention", scale, head_size)
    heads = split_packed_heads(qkv.data, num_heads)  # (3, B, nh, T, hs) views
    attend = kernels.select(_packed_definition, fast.packed_attention)
    keep = is_grad_enabled() and qkv.requires_grad  # residuals only when a backward will run
    out, vjp = attend(heads, scale, causal, dropout_p, rng, keep, window)

    def backward(grad: np.ndarray) -> tuple:
        return (vjp(grad),)

    return Tensor.from_op(out, (qkv,), backward).named("packed_attention")


def _packed_definition(
    heads: np.ndarray,
    scale: float,
    causal: bool,
    dropout_p: float,
    rng: np.random.Generator | None,
    keep: bool,
    window: int | None = None,
) -> tuple:
    """`packed_attention` in plain NumPy: ``(y, vjp)``, ``vjp(G (B, T, E)) -> dqkv (B, T, 3E)``.

    ``heads = split_packed_heads(qkv)``, ``(3, B, nh, T, hs)``: attention per head
    (`_attention_definition`), the heads' outputs merged side by side ``(B, T, nh hs)``. The VJP
    splits ``G`` into heads the same way and puts ``dq, dk, dv`` back side by side, ``[dq | dk |
    dv]`` per position. ``keep`` (whether a backward will run) changes nothing here.
    """
    _, batch, num_heads, steps, head_size = heads.shape
    bias = _mask_bias(steps, steps, causal, None, heads.dtype, window)
    out, vjp_heads = _attention_definition(*heads, scale, bias, dropout_p, rng, heads.dtype)
    embed = num_heads * head_size

    def vjp(grad: np.ndarray) -> np.ndarray:
        grad_heads = grad.reshape(batch, steps, num_heads, head_size).transpose(0, 2, 1, 3)
        d_heads = np.stack(vjp_heads(grad_heads, True, True, True))  # (3, B, nh, T, hs)
        return d_heads.transpose(1, 3, 0, 2, 4).reshape(batch, steps, 3 * embed)

    return out.transpose(0, 2, 1, 3).reshape(batch, steps, embed), vjp


def _grouped_packed(
    qkv: Tensor,
    num_heads: int,
    num_kv_heads: int | None,
    causal: bool,
    dropout_p: float,
    rng: np.random.Generator | None,
    scale: float | None,
    window: int | None,
    cos: np.ndarray | None,
    sin: np.ndarray | None,
    interleaved: bool,
) -> Tensor:
    """`packed_attention` with grouped heads and rotary positions: the checks, then the op."""
    kv = num_heads if num_kv_heads is None else check_int("attention: num_kv_heads", num_kv_heads)
    heads = num_heads + 2 * kv
    if kv < 1 or num_heads % kv or qkv.ndim != 3 or qkv.shape[-1] % heads:
        raise ValueError(
            f"attention: qkv must have shape (B, T, (H + 2 KV) hd) with num_kv_heads={kv} "
            f"dividing num_heads={num_heads}, got {qkv.shape}"
        )
    head_size, steps = qkv.shape[-1] // heads, qkv.shape[1]
    if (cos is None) != (sin is None):
        raise ValueError("attention: cos and sin go together (both or neither)")
    if cos is not None:
        cos, sin = (np.asarray(a).astype(qkv.dtype, copy=False) for a in (cos, sin))
        if cos.shape != sin.shape or cos.ndim != 2 or cos.shape[0] != steps:
            raise ValueError(
                f"attention: cos {cos.shape} and sin {sin.shape} must both be (T={steps}, r/2)"
            )
        if not 0 < 2 * cos.shape[1] <= head_size:
            raise ValueError(
                f"attention: cos/sin rotate 2 * {cos.shape[1]} features of heads of {head_size}"
            )
    dropout_p = check_probability("attention: dropout_p", dropout_p)
    window = _check_window("attention", causal, window)
    scale = _scale("attention", scale, head_size)
    attend = kernels.select(_grouped_packed_definition, grouped.packed_attention)
    keep = is_grad_enabled() and qkv.requires_grad  # residuals only when a backward will run
    out, vjp = attend(
        qkv.data, num_heads, kv, scale, causal, dropout_p, rng, keep, window, cos, sin,
        bool(interleaved),
    )  # fmt: skip

    def backward(grad: np.ndarray) -> tuple:
        return (vjp(grad),)

    return Tensor.from_op(out, (qkv,), backward).named("packed_attention")


def _grouped_packed_definition(
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
    """`packed_attention` with grouped heads and rotary positions in plain NumPy: ``(y, vjp)``,
    ``vjp(G (B, T, H hd)) -> dqkv (B, T, (H + 2 KV) hd)``.

    Split ``qkv`` into ``q (B, H, T, hd)``, ``k, v (B, KV, T, hd)``; rotate q and k
    (`_rotary_definition`); attend with ``groups = H / KV`` (`_attention_definition`); merge.
    The VJP runs back the same way: the attention's VJP, then the rotations' (by minus the
    angle), and ``[dq | dk | dv]`` side by side per position. ``keep`` changes nothing here.
    """
    batch, steps, _ = qkv.shape
    head_size = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
    bounds = np.cumsum([0, num_heads, num_kv_heads, num_kv_heads]) * head_size
    q, k, v = (  # (B, heads, T, hd) views
        qkv[..., lo:hi].reshape(batch, steps, -1, head_size).transpose(0, 2, 1, 3)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    )
    if cos is not None:
        q, rotate_back_q = _rotary_definition(q, cos, sin, interleaved)
        k, rotate_back_k = _rotary_definition(k, cos, sin, interleaved)
    bias = _mask_bias(steps, steps, causal, None, qkv.dtype, window)
    groups = num_heads // num_kv_heads
    out, vjp_heads = _attention_definition(q, k, v, scale, bias, dropout_p, rng, qkv.dtype, groups)

    def vjp(grad: np.ndarray) -> np.ndarray:
        grad_heads = grad.reshape(batch, steps, num_heads, head_size).transpose(0, 2, 1, 3)
        dq, dk, dv = vjp_heads(grad_heads, True, True, True)
        if cos is not None:
            dq, dk = rotate_back_q(dq), rotate_back_k(dk)
        merged = [d.transpose(0, 2, 1, 3).reshape(batch, steps, -1) for d in (dq, dk, dv)]
        return np.concatenate(merged, axis=-1)

    return out.transpose(0, 2, 1, 3).reshape(batch, steps, num_heads * head_size), vjp
