"""`CausalSelfAttention` with its hook points: the path a layer takes when a hook is attached
to one of them (`CausalSelfAttention.forward` checks; with none attached it never comes here).

The sites and their shapes are TransformerLens's (B batch, T this call's positions, Tk the keys
seen, cached ones included; H query heads, KV key/value heads, hd features per head):

* ``hook_q`` (B, T, H, hd), ``hook_k`` and ``hook_v`` (B, T, KV, hd): the projections, biases
  included, before QK-norm and rotary positions. With grouped-query attention (KV < H) keys
  and values keep their KV heads, as TransformerLens's ``GroupedQueryAttention`` hooks them
  (it repeats them per query head only after the hooks). With a KV cache they hold this
  call's positions only, before they join the cache;
* ``hook_rot_q`` (B, T, H, hd), ``hook_rot_k`` (B, T, KV, hd): after QK-norm and the rotary
  embedding (rotary models only);
* ``hook_attn_scores`` (B, H, T, Tk): ``q k^T * scale``, masked with ``-inf`` where a query may
  not look (causal, local window) before the hook, as TransformerLens;
* ``hook_pattern`` (B, H, T, Tk): the softmax of the scores (a row of all ``-inf`` gives 0s);
* ``hook_z`` (B, T, H, hd): each head's ``pattern @ v``, before the output projection.

q, k, v and z are reshapes of what `CausalSelfAttention.attend` (the layer's computation
without hooks, fused or not) reads and writes, so hooks on them keep it: the packed projection
is rebuilt from the hooked q, k and v (the same numbers when none was edited). The rotated
q and k, the scores and the pattern are `HookPoint.side` points: computed beside ``attend``
for the hooks; only a replacement of one of them makes the layer compute the unfused maths of
the replacement (``z = pattern @ v``, dropout applied to the pattern in training mode), whose
numbers differ from ``attend``'s by float rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import glassllm.functional as F
from glassllm.autograd import is_grad_enabled
from glassllm.functional.attention import _mask_bias, _scale
from glassllm.nn.hooks import any_active
from glassllm.tensor import Tensor

if TYPE_CHECKING:
    from glassllm.nn.attention import CausalSelfAttention
    from glassllm.nn.kv_cache import KVCache


def hooked_attention(attn: CausalSelfAttention, x: Tensor, kv_cache: KVCache | None) -> Tensor:
    """``attn.forward(x, kv_cache)`` (x and the cache checked), with every hook point of
    ``attn`` called. Unless a side point (rotated q/k, scores, pattern) was replaced, the heads'
    outputs come from ``attn.attend``, the very computation of the forward without hooks."""
    batch, steps, _ = x.shape
    H, KV, hd = attn.num_heads, attn.num_kv_heads, attn.head_size
    qkv = attn.qkv(x)  # (B, T, (H + 2 KV) hd)

    def group(first: int, count: int) -> Tensor:  # (B, T, count, hd): a view of qkv
        return qkv[:, :, first * hd : (first + count) * hd].reshape(batch, steps, count, hd)

    views = group(0, H), group(H, KV), group(H + KV, KV)
    q = attn.hook_q(views[0])  # (B, T, H, hd)
    k = attn.hook_k(views[1])  # (B, T, KV, hd)
    v = attn.hook_v(views[2])  # (B, T, KV, hd)
    # Without gradients and with q, k, v as they were, attend reads qkv itself; else the packed
    # projection rebuilt from the hooked heads (the same numbers when none was edited), which
    # also puts q, k and v on the graph (a metric's gradient reaches them)
    packed = qkv
    if is_grad_enabled() or any(a is not b for a, b in zip((q, k, v), views, strict=True)):
        packed = F.concatenate([t.reshape(batch, steps, -1) for t in (q, k, v)], axis=-1)
    side = [attn.hook_attn_scores, attn.hook_pattern]
    if attn.rotary is not None:
        side += [attn.hook_rot_q, attn.hook_rot_k]
    if not any_active(tuple(side)):
        y = attn.attend(packed, kv_cache)  # (B, T, H hd)
    else:
        y = _attend_shown(attn, q, k, v, kv_cache, packed)
    z = attn.hook_z(y.reshape(batch, steps, H, hd))  # (B, T, H, hd)
    return attn.resid_dropout(attn.proj(z.reshape(batch, steps, H * hd)))  # (B, T, E)


def _attend_shown(
    attn: CausalSelfAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: KVCache | None,
    qkv: Tensor,
) -> Tensor:
    """The heads' outputs (B, T, H hd) when a side point has a hook: the rotated queries and
    keys and the scores and pattern are computed and shown; if none was replaced, ``attend``
    still computes the output from the packed ``qkv``, else the unfused maths of the
    replacements."""
    batch, steps, H, hd = q.shape
    KV = k.shape[2]
    start = 0 if cache is None else cache.length
    # (B, heads, T, hd), the layout the attention ops read (attn.heads' own steps)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    replaced = False
    if attn.rotary is not None:
        rotated = (
            attn.rotary(q, start).transpose(0, 2, 1, 3),
            attn.rotary(k, start).transpose(0, 2, 1, 3),
        )  # (B, T, heads, hd), as TransformerLens shows them
        shown = attn.hook_rot_q(rotated[0]), attn.hook_rot_k(rotated[1])
        replaced = any(a is not b for a, b in zip(shown, rotated, strict=True))
        q, k = (t.transpose(0, 2, 1, 3) for t in shown)
    keys, values = k, v  # every key and value attended to: the cached ones first
    if cache is not None and cache.length:
        keys = Tensor(np.concatenate([cache.keys, k.data], axis=2))
        values = Tensor(np.concatenate([cache.values, v.data], axis=2))
    pattern = None
    if attn.hook_attn_scores.active or attn.hook_pattern.active:
        pattern = _hooked_pattern(attn, q, keys, attn.attention_options())
    if pattern is None and not replaced:
        return attn.attend(qkv, cache)  # the forward's own numbers
    if cache is not None:
        cache.append(k.data, v.data)
    dropout_p = attn.dropout if attn.training else 0.0
    if pattern is None:
        heads = F.scaled_dot_product_attention(
            q, keys, values, causal=True, dropout_p=dropout_p, rng=attn.rng,
            **attn.attention_options(),
        )  # fmt: skip
    else:
        if dropout_p:
            pattern = F.dropout(pattern, dropout_p, rng=attn.rng)
        tk = keys.shape[2]
        groups = pattern.reshape(batch, KV, H // KV, steps, tk)  # per kv head
        heads = (groups @ values.reshape(batch, KV, 1, tk, hd)).reshape(batch, H, steps, hd)
    return heads.transpose(0, 2, 1, 3).reshape(batch, steps, H * hd)  # (B, T, H hd)


def _hooked_pattern(
    attn: CausalSelfAttention, q: Tensor, k: Tensor, options: dict
) -> Tensor | None:
    """Scores and pattern of ``q (B, H, T, hd)`` over ``k (B, KV, Tk, hd)`` shown to their hook
    points; the pattern to multiply ``v`` by when a hook replaced either, else None (the fused
    op then computes the output, as without hooks)."""
    batch, heads, steps, hd = q.shape
    kv, keys = k.shape[1], k.shape[2]
    scale = _scale("attention", options.get("scale"), hd)
    grouped = q.reshape(batch, kv, heads // kv, steps, hd)
    scores = (grouped @ k.reshape(batch, kv, 1, keys, hd).transpose(0, 1, 2, 4, 3)) * scale
    bias = _mask_bias(steps, keys, True, None, scores.dtype, options.get("window"))
    scores = scores.reshape(batch, heads, steps, keys) + bias  # (B, H, T, Tk), -inf masked
    shown_scores = attn.hook_attn_scores(scores)
    pattern = F.softmax(shown_scores, axis=-1)  # a row of all -inf gives 0s
    shown = attn.hook_pattern(pattern)
    if shown_scores is scores and shown is pattern:
        return None
    return shown
