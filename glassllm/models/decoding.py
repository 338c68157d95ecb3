"""A decoding step on arrays: one new position through Llama-family blocks, the modules' own maths
without the engine's bookkeeping.

After the prompt, generation feeds one token at a time through every block with its key/value
cache. Through the modules that is ~450 Tensors, ~360 module calls and their argument checks a
token, none of which anything can see under ``no_grad`` with no hook attached: on SmolLM2-135M
(blocks kept as 4-bit blocks, 2 threads, an EPYC guest) that bookkeeping was a quarter to a third
of a token's time (bench/LOG.md). `next_position` runs the same step on the arrays: each
operation is the functional op's own forward on arrays (``rms_norm_array``,
``linear_array`` / ``quantized_linear_array``, `GPT`'s ``cached_heads`` rotation,
``KVCache.append``, ``attention_array``, ``swiglu_array``), the same kernels in the same order,
so the hidden states are the modules' bit for bit (tests/models/test_decoding.py checks it).

It is taken only where nothing could tell the difference, else the modules run: every module of
the exact classes mirrored here (a subclass may override ``forward``); RMSNorm, SwiGLU and rotary
attention without QK-norm, in sequence (no parallel residual); eval mode; and no hook on any
module or hook point (checked at every token: a hook may be added between two tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import glassllm.functional as F
import glassllm.nn as nn
from glassllm.nn import hooks as hook_state
from glassllm.tensor import Tensor

if TYPE_CHECKING:
    from glassllm.models.gpt import GPT, Block


def next_position(
    model: GPT, ids: np.ndarray, caches: list[nn.KVCache], modules: list[nn.Module]
) -> Tensor:
    """``model.hidden_states(ids, caches)`` for one new position, ``ids (B, 1)``: the final-norm
    output ``(B, 1, E)``, on arrays where `mirrors` allows. ``modules``: the model's modules
    other than its hook points (generation builds the list once), checked for hooks here."""
    if ids.shape[1] != 1 or not mirrors(model) or _hooked(modules):
        return model.hidden_states(ids, caches)
    if caches[0].length + 1 > model.config.block_size:  # hidden_states' error, unchanged
        return model.hidden_states(ids, caches)
    x = model.embed(ids, caches[0].length).data  # (B, 1, E)
    batch, _, width = x.shape
    x2 = x.reshape(batch, width)  # (B, E): one row per sequence
    for block, cache in zip(model.blocks, caches, strict=True):
        x2 = _block(block, x2, cache)
    norm = model.ln_f
    return Tensor(F.rms_norm_array(x2, norm.weight.data, norm.eps).reshape(batch, 1, width))


def mirrors(model: GPT) -> bool:
    """Whether `next_position` can run ``model`` on arrays: its modules are the classes it
    mirrors, configured as it computes them (see the module docstring)."""
    from glassllm.models.gpt import GPT, Block, SwiGLUMLP

    if type(model) is not GPT or model.training or type(model.ln_f) is not nn.RMSNorm:
        return False
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        if type(block) is not Block or block.parallel_residual or block.training:
            return False
        if type(attn) is not nn.CausalSelfAttention or type(mlp) is not SwiGLUMLP:
            return False
        if attn.rotary is None or attn.q_norm is not None or attn.packed:
            return False
        if not (type(block.ln_1) is type(block.ln_2) is nn.RMSNorm):
            return False
        for layer in (attn.qkv, attn.proj, mlp.gate, mlp.up, mlp.proj):
            if type(layer) not in (nn.Linear, nn.QuantizedLinear):
                return False
    return True


def _hooked(modules: list[nn.Module]) -> bool:
    if hook_state._point_hooks:  # a hook on some hook point (the count the layers read)
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _block(block: Block, x2: np.ndarray, cache: nn.KVCache) -> np.ndarray:
    """``Block.forward`` for one position ``x2 (B, E)`` on arrays: ``x + attn(ln_1 x)``, then
    ``+ mlp(ln_2 x)`` (dropout is the identity in eval mode)."""
    attn, mlp = block.attn, block.mlp
    h = F.rms_norm_array(x2, block.ln_1.weight.data, block.ln_1.eps)  # (B, E)
    x2 = x2 + _project(attn.proj, _attend(attn, _project(attn.qkv, h), cache))  # (B, E)
    h = F.rms_norm_array(x2, block.ln_2.weight.data, block.ln_2.eps)  # (B, E)
    hidden = F.swiglu_array(_project(mlp.gate, h), _project(mlp.up, h))  # (B, M)
    return x2 + _project(mlp.proj, hidden)  # (B, E)


def _attend(attn: nn.CausalSelfAttention, qkv2: np.ndarray, cache: nn.KVCache) -> np.ndarray:
    """`CausalSelfAttention.attend` with a cache for one position: ``(B, H hd)``."""
    batch = qkv2.shape[0]
    q, k, v = attn.cached_heads(qkv2.reshape(batch, 1, -1), start=cache.length)
    keys, values = cache.append(k, v)  # (B, KV, T_cached, hd)
    y = F.attention_array(q, keys, values, causal=True, **attn.attention_options())  # (B, H, 1, hd)
    return y.reshape(batch, -1)  # (B, H hd): merge_heads' layout with one position


def _project(layer: nn.Linear | nn.QuantizedLinear, x2: np.ndarray) -> np.ndarray:
    bias = None if layer.bias is None else layer.bias.data
    if type(layer) is nn.QuantizedLinear:
        return F.quantized_linear_array(x2, layer.blocks, bias)
    return F.linear_array(x2, layer.weight.data, bias)
