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

q, k, v and z are reshapes of what the fused op reads and writes, so hooks on them keep the
fused attention (the packed projection is rebuilt from the hooked q, k and v: the same numbers).
Scores and pattern are `HookPoint.side` points: computed beside the fused op for the hooks;
only a replacement of one of them makes ``z = pattern @ v`` the unfused product of the
replacement (dropout applied to it in training mode), whose numbers differ from the fused
op's by float rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import glassllm.functional as F
from glassllm.autograd import is_grad_enabled
from glassllm.functional.attention import _mask_bias, _scale
from glassllm.tensor import Tensor

if TYPE_CHECKING:
    from glassllm.nn.attention import CausalSelfAttention
    from glassllm.nn.kv_cache import KVCache


def hooked_attention(attn: CausalSelfAttention, x: Tensor, kv_cache: KVCache | None) -> Tensor:
    """``attn.forward(x, kv_cache)`` (x checked), with every hook point of ``attn`` called."""
    batch, steps, _ = x.shape
    H, KV, hd = attn.num_heads, attn.num_kv_heads, attn.head_size
    qkv = attn.qkv(x)  # (B, T, (H + 2 KV) hd)

    def group(first: int, count: int) -> Tensor:  # (B, T, count, hd): a view of qkv
        return qkv[:, :, first * hd : (first + count) * hd].reshape(batch, steps, count, hd)

    views = group(0, H), group(H, KV), group(H + KV, KV)
    q = attn.hook_q(views[0])  # (B, T, H, hd)
    k = attn.hook_k(views[1])  # (B, T, KV, hd)
    v = attn.hook_v(views[2])  # (B, T, KV, hd)
    # Without gradients and with q, k, v as they were, the fused op may read qkv itself; else
    # it reads the packed projection rebuilt from the hooked heads (the same numbers), which
    # also puts q, k and v on the graph (a metric's gradient reaches them)
    reuse = not is_grad_enabled() and all(a is b for a, b in zip((q, k, v), views, strict=True))
    dropout_p = attn.dropout if attn.training else 0.0
    options = attn.attention_options()
    start = 0 if kv_cache is None else kv_cache.length
    # (B, heads, T, hd), the layout the attention ops read (attn.heads' own steps)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.rotary is not None:
        q = attn.hook_rot_q(attn.rotary(q, start).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        k = attn.hook_rot_k(attn.rotary(k, start).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if kv_cache is not None:
        keys, values = kv_cache.append(k.data, v.data)  # (B, KV, Tk, hd)
        k, v = Tensor(keys), Tensor(values)
    pattern = None
    if attn.hook_attn_scores.active or attn.hook_pattern.active:
        pattern = _hooked_pattern(attn, q, k, options)  # None when neither was replaced
    if pattern is not None:
        if dropout_p:
            pattern = F.dropout(pattern, dropout_p, rng=attn.rng)
        groups = pattern.reshape(batch, KV, H // KV, steps, k.shape[2])  # per kv head
        heads = (groups @ v.reshape(batch, KV, 1, k.shape[2], hd)).reshape(batch, H, steps, hd)
    elif attn.packed and kv_cache is None:
        packed = qkv  # (B, T, 3 H hd)
        if not reuse:
            columns = [t.transpose(0, 2, 1, 3).reshape(batch, steps, -1) for t in (q, k, v)]
            packed = F.concatenate(columns, axis=-1)
        y = F.packed_attention(
            packed, H, causal=True, dropout_p=dropout_p, rng=attn.rng, **options
        )  # (B, T, H hd)
        heads = None
    else:
        heads = F.scaled_dot_product_attention(
            q, k, v, causal=True, dropout_p=dropout_p, rng=attn.rng, **options
        )  # (B, H, T, hd)
    z = (
        y.reshape(batch, steps, H, hd) if heads is None else heads.transpose(0, 2, 1, 3)
    )  # (B, T, H, hd)
    z = attn.hook_z(z).reshape(batch, steps, H * hd)
    return attn.resid_dropout(attn.proj(z))  # (B, T, E)


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
