"""Multi-head attention layers (Vaswani et al., 2017) on `functional.scaled_dot_product_attention`.

Two layers, both taking inputs ``(B, T, E)`` (batch first, ``E = embed_dim``) and splitting ``E``
into ``num_heads`` heads of size ``hs = E // num_heads``:

* `MultiHeadAttention`: general attention with separate query, key and value inputs, as
  ``torch.nn.MultiheadAttention(batch_first=True)`` computes it;
* `CausalSelfAttention`: the GPT block (nanoGPT's ``CausalSelfAttention``): one fused projection to
  queries, keys and values, a causal mask, and an optional `KVCache` for generation; with the
  choices of the modern families (grouped-query heads, a free head size, QK-norm, rotary
  positions, a scale, a local window), each off by default.

Masks are boolean with **True = may attend** (the convention of `scaled_dot_product_attention`);
note that ``torch.nn.MultiheadAttention``'s boolean ``attn_mask`` means the opposite.

>>> import numpy as np
>>> from glassllm import Tensor
>>> attn = CausalSelfAttention(embed_dim=8, num_heads=2, rng=np.random.default_rng(0))
>>> attn(Tensor(np.ones((2, 5, 8), dtype=np.float32))).shape
(2, 5, 8)
"""

from __future__ import annotations

from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_float, check_generator, check_int, check_probability
from glassllm.autograd import is_grad_enabled
from glassllm.nn.attention_hooks import hooked_attention
from glassllm.nn.dropout import Dropout
from glassllm.nn.hooks import HookPoint, any_active
from glassllm.nn.kv_cache import KVCache
from glassllm.nn.linear import Linear
from glassllm.nn.module import Module
from glassllm.nn.normalization import RMSNorm
from glassllm.nn.rotary import RotaryEmbedding
from glassllm.rng import get_rng
from glassllm.tensor import Tensor, as_tensor


def _head_size(embed_dim: int, num_heads: int) -> int:
    embed_dim = check_int("embed_dim", embed_dim, min=1)
    num_heads = check_int("num_heads", num_heads, min=1)
    if embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}): "
            f"each head gets embed_dim // num_heads features"
        )
    return embed_dim // num_heads


def _check_input(x: Any, embed_dim: int, what: str) -> Tensor:
    x = as_tensor(x)
    if x.ndim != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"{what} must have shape (B, T, {embed_dim}), got {x.shape}")
    return x


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, T, E) -> (B, nh, T, hs)``: each head's features become its own sequence."""
    batch, steps, embed = x.shape
    return x.reshape(batch, steps, num_heads, embed // num_heads).transpose(0, 2, 1, 3)


def merge_heads(y: Tensor) -> Tensor:
    """``(B, nh, T, hs) -> (B, T, E)``: the heads' outputs side by side again."""
    batch, heads, steps, head_size = y.shape
    return y.transpose(0, 2, 1, 3).reshape(batch, steps, heads * head_size)


class MultiHeadAttention(Module):
    """Attention of ``query`` (B, Tq, E) over ``key``, ``value`` (B, Tk, E); output (B, Tq, E).

    Sub-layers, all `Linear` ``(E, E)`` (names as in Hugging Face models): ``q_proj``, ``k_proj``,
    ``v_proj`` project the inputs, ``out_proj`` mixes the heads' outputs. To load the weights of a
    ``torch.nn.MultiheadAttention``: ``q_proj.weight = in_proj_weight[:E].T``, ``k_proj.weight =
    in_proj_weight[E:2E].T``, ``v_proj.weight = in_proj_weight[2E:].T``, the biases split the same
    way, ``out_proj.weight = out_proj.weight.T``.

    ``forward(query, key=None, value=None, mask=None)``: ``key`` defaults to ``query``
    (self-attention) and ``value`` to ``key``. ``mask``: boolean, broadcastable to ``(B, num_heads,
    Tq, Tk)``, True = may attend (the opposite of torch's boolean ``attn_mask``). ``causal=True``
    adds a causal mask aligned to the end of the keys. ``dropout`` drops attention weights in
    training mode. Returns the output only (no attention weights, unlike torch's ``(output,
    weights)`` pair).

    ``dtype`` sets the parameters' dtype (float32 by default); ``rng`` draws the initial weights
    and the dropout masks (default: `glassllm.rng.get_rng()`, read when each is drawn).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        self.head_size = _head_size(embed_dim, num_heads)
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.dropout = check_probability("dropout", dropout)
        self.causal = bool(causal)
        self.rng = check_generator("rng", rng)
        init_rng = get_rng(self.rng)
        self.q_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, rng=init_rng)
        self.k_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, rng=init_rng)
        self.v_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, rng=init_rng)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, rng=init_rng)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: np.ndarray | None = None,
    ) -> Tensor:
        query = _check_input(query, self.embed_dim, "query")
        key = query if key is None else _check_input(key, self.embed_dim, "key")
        value = key if value is None else _check_input(value, self.embed_dim, "value")
        if key.shape != value.shape or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"key {key.shape} and value {value.shape} must match, with the batch of query "
                f"{query.shape}"
            )
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, nh, Tq, hs)
        k = split_heads(self.k_proj(key), self.num_heads)  # (B, nh, Tk, hs)
        v = split_heads(self.v_proj(value), self.num_heads)  # (B, nh, Tk, hs)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            causal=self.causal,
            mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            rng=self.rng,
        )  # (B, nh, Tq, hs)
        return self.out_proj(merge_heads(y))  # (B, Tq, E)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"causal={self.causal}"
        )


class CausalSelfAttention(Module):
    """The GPT attention block: each position attends to itself and the positions before it.

    ``qkv``: `Linear` ``(E, (H + 2 KV) hd)`` whose output columns are ``[queries | keys |
    values]``, each group head-major (nanoGPT's ``c_attn`` transposed when ``KV = H``); ``proj``:
    `Linear` ``(H hd, E)`` (nanoGPT's ``c_proj``). ``dropout`` is used twice, as in nanoGPT: on
    the attention weights and on the block's output (``resid_dropout``).

    The choices of the modern families, each off by default (GPT-2):

    * ``num_kv_heads`` KV < H: grouped-query attention, query head ``h`` reads kv head
      ``h // (H // KV)``; a `KVCache` then stores KV heads;
    * ``head_dim``: features per head, free of ``embed_dim`` (default ``E // H``);
    * ``bias`` for both projections, or ``qkv_bias`` / ``out_bias`` for each;
    * ``qk_norm``: `RMSNorm` ``(hd,)`` of each head's queries and keys (``q_norm``, ``k_norm``,
      eps ``norm_eps``), before the rotary embedding (Qwen3);
    * ``rotary_dim``: rotary position embedding of the first ``rotary_dim`` features of each head
      (`RotaryEmbedding` with ``rope_theta``, ``rope_scaling``, ``rotary_interleaved``) at
      positions ``start, start + 1, ...``, ``start`` the cache's length;
    * ``scale`` of the scores (default ``1/sqrt(hd)``; GPT-Neo 1.0); ``window``: a query sees
      only the last ``window`` positions, itself included (local attention).

    ``forward(x, kv_cache=None)`` with ``x`` ``(B, T, E)`` returns ``(B, T, E)``. With a `KVCache`
    (generation, under ``no_grad`` only), this call's keys and values are appended to the cache and
    the T new queries attend over every cached position, the causal mask aligned to the end: feeding
    a prompt and then one token at a time gives the same outputs as recomputing the whole sequence.
    Without a cache or QK-norm, the fused `F.packed_attention` runs (GPT-2's fast path, and
    GPT-Neo's and Llama's too).

    Hook points (TransformerLens's; `glassllm.nn.attention_hooks`, which runs the layer while
    one has a hook): ``hook_q``, ``hook_k``, ``hook_v``, ``hook_rot_q`` and ``hook_rot_k``
    (rotary), ``hook_attn_scores``, ``hook_pattern``, ``hook_z``. `prefill` calls none of them.

    ``dtype`` sets the parameters' dtype (float32 by default); ``rng`` draws the initial weights
    and the dropout masks (default: `glassllm.rng.get_rng()`, read when each is drawn).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        out_bias: bool | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        rotary_dim: int | None = None,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        rotary_interleaved: bool = False,
        scale: float | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        if head_dim is None:
            self.head_size = _head_size(embed_dim, num_heads)
        else:
            check_int("embed_dim", embed_dim, min=1)
            self.head_size = check_int("head_dim", head_dim, min=1)
        self.embed_dim, self.num_heads = int(embed_dim), check_int("num_heads", num_heads, min=1)
        kv = (
            self.num_heads
            if num_kv_heads is None
            else check_int("num_kv_heads", num_kv_heads, min=1)
        )
        if self.num_heads % kv != 0:
            raise ValueError(f"num_kv_heads ({kv}) must divide num_heads ({self.num_heads})")
        self.num_kv_heads = kv
        self.dropout = check_probability("dropout", dropout)
        self.scale = None if scale is None else check_float("scale", scale)
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"scale must be positive, got {self.scale}")
        self.window = None if window is None else check_int("window", window, min=1)
        self.rng = check_generator("rng", rng)
        init_rng = get_rng(self.rng)
        width = self.num_heads * self.head_size  # of the queries, and of what proj reads
        packed = width + 2 * kv * self.head_size
        qkv_bias, out_bias = (
            bias if qkv_bias is None else qkv_bias,
            bias if out_bias is None else out_bias,
        )
        self.qkv = Linear(embed_dim, packed, bias=qkv_bias, dtype=dtype, rng=init_rng)
        self.q_norm = RMSNorm(self.head_size, eps=norm_eps, dtype=dtype) if qk_norm else None
        self.k_norm = RMSNorm(self.head_size, eps=norm_eps, dtype=dtype) if qk_norm else None
        self.rotary = (
            None
            if rotary_dim is None
            else RotaryEmbedding(rotary_dim, rope_theta, rope_scaling, rotary_interleaved)
        )
        self.proj = Linear(width, embed_dim, bias=out_bias, dtype=dtype, rng=init_rng)
        self.resid_dropout = Dropout(self.dropout, rng=self.rng)
        # The fused op that splits, attends and merges in one serves every layer whose heads
        # are plain slices of qkv: GPT-2's, and GPT-Neo's (scale, window) too
        self.packed = kv == self.num_heads and not qk_norm and self.rotary is None
        # ... and, given the grouped heads and the rotary tables, Llama's (not QK-norm's)
        self.fused = not qk_norm
        # TransformerLens's sites (glassllm.nn.attention_hooks); forward takes the hooked path
        # only when one of them has a hook
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if self.rotary is not None:
            self.hook_rot_q, self.hook_rot_k = HookPoint(side=True), HookPoint(side=True)
        self.hook_attn_scores = HookPoint(side=True)
        self.hook_pattern = HookPoint(side=True)
        self.hook_z = HookPoint()
        points = [point for point in self.children() if isinstance(point, HookPoint)]
        object.__setattr__(self, "_hook_points", tuple(points))

    def split_groups(self, qkv: Any) -> tuple[Any, Any, Any]:
        """``qkv (B, T, (H + 2 KV) hd)``, a Tensor or an array, as views ``q (B, H, T, hd)``,
        ``k, v (B, KV, T, hd)``: its column groups, head-major, heads moved before positions."""
        batch, steps, _ = qkv.shape
        H, KV, hd = self.num_heads, self.num_kv_heads, self.head_size

        def group(first: int, count: int) -> Any:  # (B, T, count hd) -> (B, count, T, hd)
            columns = qkv[:, :, first * hd : (first + count) * hd]
            return columns.reshape(batch, steps, count, hd).transpose(0, 2, 1, 3)

        return group(0, H), group(H, KV), group(H + KV, KV)

    def heads(self, qkv: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """The packed projection ``qkv (B, T, (H + 2 KV) hd)`` as heads, ready to attend:
        ``q (B, H, T, hd)``, ``k, v (B, KV, T, hd)``, q and k normalised (``qk_norm``) and then
        rotated (``rotary_dim``) for positions ``start, start + 1, ...``."""
        q, k, v = self.split_groups(qkv)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, over hd
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        return q, k, v

    def cached_heads(
        self, qkv: np.ndarray, start: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`heads` on arrays, without QK-norm, for the key/value cache path (under ``no_grad``:
        nothing to differentiate): the same views and the same rotary arithmetic, so the same
        bits, without a Tensor per operation (about a third of a SmolLM2 decoding step's)."""
        q, k, v = self.split_groups(qkv)
        if self.rotary is not None:
            cos, sin = self.rotary.tables(start, qkv.shape[1])  # (T, r/2)
            q = F.rotary_array(q, cos, sin, self.rotary.interleaved)
            k = F.rotary_array(k, cos, sin, self.rotary.interleaved)
        return q, k, v

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        x = _check_input(x, self.embed_dim, "x")
        if kv_cache is not None:
            _check_cache(kv_cache, "a KV cache is for inference: run the forward inside")
        if any_active(self._hook_points):
            return hooked_attention(self, x, kv_cache)
        return self.resid_dropout(self.proj(self.attend(self.qkv(x), kv_cache)))  # (B, T, E)

    def attend(self, qkv: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        """The heads' outputs side by side, ``(B, T, H hd)``, for the packed projection ``qkv
        (B, T, (H + 2 KV) hd)``: what ``proj`` reads (the hooked path calls it too)."""
        dropout_p = self.dropout if self.training else 0.0
        if kv_cache is None and self.fused:
            # One op splits the heads, attends and merges them again: its backward writes
            # dq, dk, dv into one (B, T, (H + 2 KV) hd) array (see F.packed_attention).
            return F.packed_attention(
                qkv,
                self.num_heads,
                causal=True,
                dropout_p=dropout_p,
                rng=self.rng,
                **self.attention_options(),
                **self.packed_options(qkv.shape[1]),
            )  # (B, T, H hd)
        if kv_cache is None:
            q, k, v = self.heads(qkv)  # (B, H, T, hd), (B, KV, T, hd) x 2
        else:
            if self.packed:  # GPT-2: the packed heads as views, as before the choices existed
                heads = F.split_packed_heads(qkv.data, self.num_heads)  # (3, B, H, T, hd)
                q, k, v = Tensor(heads[0]), heads[1], heads[2]
            elif self.q_norm is None:  # the same views and rotation, no Tensor per op
                q, k, v = self.cached_heads(qkv.data, start=kv_cache.length)
                q = Tensor(q)
            else:
                q, k, v = self.heads(qkv, start=kv_cache.length)
                k, v = k.data, v.data
            keys, values = kv_cache.append(k, v)  # (B, KV, T_cached, hd)
            k, v = Tensor(keys), Tensor(values)
        y = F.scaled_dot_product_attention(
            q, k, v, causal=True, dropout_p=dropout_p, rng=self.rng, **self.attention_options()
        )  # (B, H, T, hd)
        return merge_heads(y)  # (B, T, H hd)

    def attention_options(self) -> dict[str, Any]:
        """The keyword arguments of the choices to `F.scaled_dot_product_attention` and
        `F.packed_attention` (none for GPT-2, so its calls stay those before the choices)."""
        options: dict[str, Any] = {}
        if self.scale is not None:
            options["scale"] = self.scale
        if self.window is not None:
            options["window"] = self.window
        return options

    def packed_options(self, steps: int) -> dict[str, Any]:
        """The grouped heads and the rotary tables of ``steps`` positions as `F.packed_attention`
        takes them (none for GPT-2, so its call stays the one before the choices)."""
        options: dict[str, Any] = {}
        if self.num_kv_heads != self.num_heads:
            options["num_kv_heads"] = self.num_kv_heads
        if self.rotary is not None:
            options["cos"], options["sin"] = self.rotary.tables(0, steps)  # (T, r/2)
            options["interleaved"] = self.rotary.interleaved
        return options

    def prefill(self, x: Tensor, kv_cache: KVCache) -> None:
        """Append the keys and values of ``x`` (B, T, E) to ``kv_cache`` without attending.

        For generation (under ``no_grad``): a later ``forward(x_new, kv_cache)`` then attends from
        ``x_new``'s queries over these positions too, so a caller that needs the output at a few
        positions only pays the queries, attention and projection for those.
        """
        x = _check_input(x, self.embed_dim, "x")
        _check_cache(kv_cache, "prefill is for inference: call it inside")
        if self.packed:
            _, keys, values = F.split_packed_heads(self.qkv(x).data, self.num_heads)
        else:
            _, keys, values = self.heads(self.qkv(x), start=kv_cache.length)
            keys, values = keys.data, values.data
        kv_cache.append(keys, values)  # (B, KV, T, hd) each

    def extra_repr(self) -> str:
        choices = ""
        if self.num_kv_heads != self.num_heads:
            choices += f", num_kv_heads={self.num_kv_heads}"
        if self.head_size * self.num_heads != self.embed_dim:
            choices += f", head_dim={self.head_size}"
        if self.scale is not None:
            choices += f", scale={self.scale}"
        if self.window is not None:
            choices += f", window={self.window}"
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
            + choices
        )


def _check_cache(kv_cache: Any, grad_message: str) -> None:
    if not isinstance(kv_cache, KVCache):
        raise TypeError(f"kv_cache must be an nn.KVCache, got {type(kv_cache).__name__}")
    if is_grad_enabled():
        raise RuntimeError(
            f"{grad_message} `with glassllm.no_grad():` (cached keys and values are plain "
            "arrays, so no gradient could flow through them)"
        )
