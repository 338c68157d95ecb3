"""Generation's last-position path: block_last_position and last_position_hidden give the full
forward's last position; CausalSelfAttention.prefill guards its inputs."""

from __future__ import annotations

import numpy as np
import pytest

import glassllm.nn as nn
from glassllm import Tensor, no_grad
from glassllm.models import GPT, GPTConfig
from glassllm.models.generation import block_last_position, last_position_hidden

CONFIG = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16)


@pytest.mark.parametrize("T", [1, 2, 8])
def test_block_last_position_equals_full_forward_last_position(T):
    model = GPT(CONFIG, rng=np.random.default_rng(0))
    x = Tensor(np.random.default_rng(1).standard_normal((3, T, 16)).astype(np.float32))
    with no_grad():
        full = model.blocks[1](x).data[:, -1:]
        last = block_last_position(model.blocks[1], x).data
    assert last.shape == (3, 1, 16) and last.dtype == np.float32
    np.testing.assert_allclose(last, full, rtol=1e-5, atol=1e-6)


def test_last_position_hidden_matches_and_generation_uses_it():
    model = GPT(CONFIG, rng=np.random.default_rng(0))
    idx = np.random.default_rng(2).integers(0, 17, size=(2, 8))
    with no_grad():
        full = model.hidden_states(idx).data[:, -1:]
        last = last_position_hidden(model, idx).data
    np.testing.assert_allclose(last, full, rtol=1e-5, atol=1e-6)
    # past block_size both generation modes take this path and agree token for token
    a = model.generate(idx, 5, rng=np.random.default_rng(3), use_cache=True)
    b = model.generate(idx, 5, rng=np.random.default_rng(3), use_cache=False)
    np.testing.assert_array_equal(a, b)


def test_prefill_rejects_grad_mode_and_non_caches():
    attn = nn.CausalSelfAttention(8, 2, rng=np.random.default_rng(0))
    x = Tensor(np.ones((1, 3, 8), dtype=np.float32))
    with pytest.raises(RuntimeError, match="prefill is for inference"):
        attn.prefill(x, nn.KVCache())
    with no_grad(), pytest.raises(TypeError, match="kv_cache must be an nn.KVCache"):
        attn.prefill(x, None)
    cache = nn.KVCache()
    with no_grad():
        attn.prefill(x, cache)
    assert cache.length == 3 and cache.keys.shape == (1, 2, 3, 4)
