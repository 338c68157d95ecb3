"""Multi-head attention layers (Vaswani et al., 2017) on `functional.scaled_dot_product_attention`.

Two layers, both taking inputs ``(B, T, E)`` (batch first, ``E = embed_dim``) and splitting ``E``
into ``num_heads`` heads of size ``hs = E // num_heads``:

* `MultiHeadAttention`: general attention with separate query, key and value inputs, as
  ``torch.nn.MultiheadAttention(batch_first=True)`` computes it;
* `CausalSelfAttention`: the GPT block (nanoGPT's ``CausalSelfAttention``): one fused projection to
  queries, keys and values, a causal mask, and an optional `KVCache` for generation.

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
from glassllm._checks import check_generator, check_int, check_probability
from glassllm.autograd import is_grad_enabled
from glassllm.nn.dropout import Dropout
from glassllm.nn.kv_cache import KVCache
from glassllm.nn.linear import Linear
from glassllm.nn.module import Module
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

    ``qkv``: `Linear` ``(E, 3E)`` whose output columns are ``[queries | keys | values]`` (nanoGPT's
    ``c_attn`` transposed); ``proj``: `Linear` ``(E, E)`` (nanoGPT's ``c_proj``). ``dropout`` is
    used twice, as in nanoGPT: on the attention weights and on the block's output
    (``resid_dropout``).

    ``forward(x, kv_cache=None)`` with ``x`` ``(B, T, E)`` returns ``(B, T, E)``. With a `KVCache`
    (generation, under ``no_grad`` only), this call's keys and values are appended to the cache and
    the T new queries attend over every cached position, the causal mask aligned to the end: feeding
    a prompt and then one token at a time gives the same outputs as recomputing the whole sequence.

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
    ) -> None:
        super().__init__()
        self.head_size = _head_size(embed_dim, num_heads)
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.dropout = check_probability("dropout", dropout)
        self.rng = check_generator("rng", rng)
        init_rng = get_rng(self.rng)
        self.qkv = Linear(embed_dim, 3 * embed_dim, bias=bias, dtype=dtype, rng=init_rng)
        self.proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, rng=init_rng)
        self.resid_dropout = Dropout(self.dropout, rng=self.rng)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        x = _check_input(x, self.embed_dim, "x")
        dropout_p = self.dropout if self.training else 0.0
        if kv_cache is None:
            # One op splits the heads, attends and merges them again: its backward writes
            # dq, dk, dv into one (B, T, 3E) array (see F.packed_attention).
            y = F.packed_attention(
                self.qkv(x), self.num_heads, causal=True, dropout_p=dropout_p, rng=self.rng
            )  # (B, T, E)
            return self.resid_dropout(self.proj(y))  # (B, T, E)
        if not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be an nn.KVCache, got {type(kv_cache).__name__}")
        if is_grad_enabled():
            raise RuntimeError(
                "a KV cache is for inference: run the forward inside "
                "`with glassllm.no_grad():` (cached keys and values are plain arrays, "
                "so no gradient could flow through them)"
            )
        batch, steps, embed = x.shape
        qkv = F.split_packed_heads(self.qkv(x).data, self.num_heads)  # (3, B, nh, T, hs)
        keys, values = kv_cache.append(qkv[1], qkv[2])  # (B, nh, T_cached, hs)
        y = F.scaled_dot_product_attention(
            Tensor(qkv[0]),
            Tensor(keys),
            Tensor(values),
            causal=True,
            dropout_p=dropout_p,
            rng=self.rng,
        )  # (B, nh, T, hs)
        return self.resid_dropout(self.proj(merge_heads(y)))  # (B, T, E)

    def prefill(self, x: Tensor, kv_cache: KVCache) -> None:
        """Append the keys and values of ``x`` (B, T, E) to ``kv_cache`` without attending.

        For generation (under ``no_grad``): a later ``forward(x_new, kv_cache)`` then attends from
        ``x_new``'s queries over these positions too, so a caller that needs the output at a few
        positions only pays the queries, attention and projection for those.
        """
        x = _check_input(x, self.embed_dim, "x")
        if not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be an nn.KVCache, got {type(kv_cache).__name__}")
        if is_grad_enabled():
            raise RuntimeError(
                "prefill is for inference: call it inside `with glassllm.no_grad():`"
            )
        _, keys, values = F.split_packed_heads(self.qkv(x).data, self.num_heads)
        kv_cache.append(keys, values)  # (B, nh, T, hs) each

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
