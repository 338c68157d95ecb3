"""Attention layers and the KV cache: shapes, finite differences, PyTorch, cache exactness."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

import glassllm.nn as nn
from glassllm import Tensor, gradcheck, no_grad


def rand(rng: np.random.Generator, *shape: int, dtype=np.float64, grad: bool = False) -> Tensor:
    return Tensor(rng.standard_normal(shape, dtype=dtype), requires_grad=grad)


def randomize(module: nn.Module, rng: np.random.Generator) -> nn.Module:
    """Random values for every parameter, so zero biases cannot hide a mistake."""
    for p in module.parameters():
        p.data[...] = rng.standard_normal(p.shape, dtype=p.dtype) * 0.5
    return module


def reference_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(hs) where mask else -inf) v in NumPy, (B, nh, Tq, hs)."""
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, steps, embed = x.shape
    return x.reshape(batch, steps, num_heads, embed // num_heads).transpose(0, 2, 1, 3)


def merge(y: np.ndarray) -> np.ndarray:
    batch, num_heads, steps, head_size = y.shape
    return y.transpose(0, 2, 1, 3).reshape(batch, steps, num_heads * head_size)


# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize("layer", [nn.MultiHeadAttention, nn.CausalSelfAttention])
def test_embed_dim_must_divide_into_heads(layer):
    with pytest.raises(ValueError, match=r"embed_dim \(10\) must be divisible by num_heads \(4\)"):
        layer(10, 4)
    with pytest.raises(ValueError, match="dropout"):
        layer(8, 2, dropout=1.5)


def test_parameter_names_and_dtypes():
    csa = nn.CausalSelfAttention(8, 2)
    assert [name for name, _ in csa.named_parameters()] == [
        "qkv.weight",
        "qkv.bias",
        "proj.weight",
        "proj.bias",
    ]
    assert csa.qkv.weight.shape == (8, 24) and csa.qkv.weight.dtype == np.float32
    mha = nn.MultiHeadAttention(8, 2, bias=False, dtype=np.float64)
    assert [name for name, _ in mha.named_parameters()] == [
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "out_proj.weight",
    ]
    assert mha.q_proj.weight.dtype == np.float64


def test_input_shape_is_checked():
    csa = nn.CausalSelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(B, T, 8\)"):
        csa(Tensor(np.ones((2, 3, 6), dtype=np.float32)))
    mha = nn.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="must match"):
        mha(Tensor(np.ones((1, 2, 8))), Tensor(np.ones((1, 3, 8))), Tensor(np.ones((1, 4, 8))))


# ----------------------------------------------------------------------------- CausalSelfAttention


def csa_reference(csa: nn.CausalSelfAttention, x: np.ndarray) -> np.ndarray:
    E, nh = csa.embed_dim, csa.num_heads
    qkv = x @ csa.qkv.weight.data + csa.qkv.bias.data  # (B, T, 3E): [q | k | v]
    q, k, v = (heads(qkv[..., i * E : (i + 1) * E], nh) for i in range(3))
    T = x.shape[1]
    y = reference_attention(q, k, v, np.tril(np.ones((T, T), dtype=bool)))
    return merge(y) @ csa.proj.weight.data + csa.proj.bias.data


def test_causal_self_attention_forward_float32_and_causality():
    rng = np.random.default_rng(0)
    csa = randomize(nn.CausalSelfAttention(8, 2, rng=rng), rng)
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    out = csa(Tensor(x))
    assert out.shape == (2, 5, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out.data, csa_reference(csa, x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert all(p.grad.dtype == np.float32 for p in csa.parameters())
    changed = x.copy()
    changed[:, 3:] += 1.0  # the future must not affect earlier positions
    np.testing.assert_array_equal(csa(Tensor(changed)).data[:, :3], out.data[:, :3])


def test_causal_self_attention_gradcheck():
    rng = np.random.default_rng(1)
    csa = randomize(nn.CausalSelfAttention(4, 2, dtype=np.float64, rng=rng), rng)
    x = rand(rng, 2, 3, 4, grad=True)
    assert gradcheck(lambda x, *params: csa(x), [x, *csa.parameters()])


def test_causal_self_attention_matches_torch_nanogpt_block():
    torch = optional("torch")
    rng = np.random.default_rng(2)
    E, nh = 8, 2
    csa = randomize(nn.CausalSelfAttention(E, nh, dtype=np.float64, rng=rng), rng)
    x = rng.standard_normal((2, 5, E))
    # nanoGPT's CausalSelfAttention with c_attn = qkv transposed, c_proj = proj transposed.
    c_attn = torch.nn.Linear(E, 3 * E, dtype=torch.float64)
    c_proj = torch.nn.Linear(E, E, dtype=torch.float64)
    with torch.no_grad():
        c_attn.weight.copy_(torch.from_numpy(csa.qkv.weight.data.T))
        c_attn.bias.copy_(torch.from_numpy(csa.qkv.bias.data))
        c_proj.weight.copy_(torch.from_numpy(csa.proj.weight.data.T))
        c_proj.bias.copy_(torch.from_numpy(csa.proj.bias.data))
    tx = torch.tensor(x, requires_grad=True)
    B, T, _ = tx.shape
    q, k, v = c_attn(tx).split(E, dim=2)
    q, k, v = (t.view(B, T, nh, E // nh).transpose(1, 2) for t in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = c_proj(y.transpose(1, 2).contiguous().view(B, T, E))
    gx = Tensor(x, requires_grad=True)
    out = csa(gx)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    upstream = rng.standard_normal(out.shape)
    out.backward(upstream)
    expected.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(gx.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    for ours, theirs in ((csa.qkv, c_attn), (csa.proj, c_proj)):
        np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy().T, rtol=1e-9)
        # atol: the key bias's gradient is zero up to rounding (softmax ignores a shift per query)
        np.testing.assert_allclose(ours.bias.grad, theirs.bias.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_attention_dropout_train_eval_and_reproducibility():
    x = Tensor(np.random.default_rng(3).standard_normal((2, 6, 8), dtype=np.float32))
    outputs = []
    for _ in range(2):
        csa = nn.CausalSelfAttention(8, 2, dropout=0.5, rng=np.random.default_rng(4))
        outputs.append(csa(x).data)
    np.testing.assert_array_equal(outputs[0], outputs[1])  # same generator, same masks
    plain = nn.CausalSelfAttention(8, 2, rng=np.random.default_rng(4))
    assert not np.allclose(outputs[0], plain(x).data)  # dropout did something in training
    csa.eval()
    np.testing.assert_allclose(csa(x).data, plain(x).data, rtol=1e-6)  # eval: identity


# ----------------------------------------------------------------------------- KV cache


def test_kv_cache_matches_full_recomputation():
    rng = np.random.default_rng(5)
    csa = randomize(nn.CausalSelfAttention(8, 2, rng=rng), rng)
    csa.eval()
    x = rng.standard_normal((2, 9, 8), dtype=np.float32)
    with no_grad():
        full = csa(Tensor(x)).data
        cache = nn.KVCache(capacity=2)
        pieces = [csa(Tensor(x[:, :4]), kv_cache=cache).data]  # the prompt at once
        for t in range(4, 7):
            pieces.append(csa(Tensor(x[:, t : t + 1]), kv_cache=cache).data)  # one token
        pieces.append(csa(Tensor(x[:, 7:]), kv_cache=cache).data)  # two more at once
    assert cache.length == 9 and cache.keys.shape == (2, 2, 9, 4)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-5, atol=1e-6)


def test_kv_cache_requires_no_grad():
    csa = nn.CausalSelfAttention(8, 2)
    cache = nn.KVCache()
    with pytest.raises(RuntimeError, match="no_grad"):
        csa(Tensor(np.ones((1, 2, 8), dtype=np.float32)), kv_cache=cache)
    assert cache.length == 0  # nothing appended
    with no_grad(), pytest.raises(TypeError, match="KVCache"):
        csa(Tensor(np.ones((1, 2, 8), dtype=np.float32)), kv_cache={})


def test_kv_cache_grows_by_doubling_and_validates():
    cache = nn.KVCache(capacity=2)
    assert cache.keys is None and cache.capacity == 0
    capacities = []
    for step in range(9):
        keys, values = cache.append(
            np.full((1, 2, 1, 3), step, np.float32), np.zeros((1, 2, 1, 3), np.float32)
        )
        capacities.append(cache.capacity)
    assert capacities == [2, 2, 4, 4, 8, 8, 8, 8, 16]
    np.testing.assert_array_equal(cache.keys[0, 0, :, 0], np.arange(9))
    assert cache.values.dtype == np.float32
    with pytest.raises(ValueError, match="reset"):
        cache.append(np.zeros((1, 3, 1, 3), np.float32), np.zeros((1, 3, 1, 3), np.float32))
    with pytest.raises(ValueError, match="one shape"):
        cache.append(np.zeros((1, 2, 1, 3)), np.zeros((1, 2, 2, 3)))
    assert cache.length == 9
    cache.reset()
    assert cache.length == 0 and cache.keys is None
    with pytest.raises(ValueError, match="capacity"):
        nn.KVCache(capacity=0)


# ----------------------------------------------------------------------------- MultiHeadAttention


def mha_reference(mha: nn.MultiHeadAttention, q, k, v, mask) -> np.ndarray:
    def project(layer, x):
        return heads(x @ layer.weight.data + layer.bias.data, mha.num_heads)

    y = reference_attention(
        project(mha.q_proj, q), project(mha.k_proj, k), project(mha.v_proj, v), mask
    )
    return merge(y) @ mha.out_proj.weight.data + mha.out_proj.bias.data


def test_multi_head_attention_self_cross_masked_and_causal():
    rng = np.random.default_rng(6)
    mha = randomize(nn.MultiHeadAttention(8, 2, dtype=np.float64, rng=rng), rng)
    query, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    everything = np.ones((3, 3), dtype=bool)
    np.testing.assert_allclose(
        mha(Tensor(query)).data, mha_reference(mha, query, query, query, everything), rtol=1e-10
    )
    mask = rng.random((2, 1, 3, 5)) < 0.7
    mask[..., 0] = True  # every query sees at least one key
    out = mha(Tensor(query), Tensor(memory), mask=mask)
    np.testing.assert_allclose(
        out.data, mha_reference(mha, query, memory, memory, mask), rtol=1e-10
    )
    causal = nn.MultiHeadAttention(8, 2, causal=True, dtype=np.float64)
    causal.load_state_dict(mha.state_dict())
    aligned_to_end = np.tril(np.ones((3, 5), dtype=bool), k=2)  # query i sees keys j <= 2 + i
    np.testing.assert_allclose(
        causal(Tensor(query), Tensor(memory)).data,
        mha_reference(mha, query, memory, memory, aligned_to_end),
        rtol=1e-10,
    )


def test_multi_head_attention_gradcheck():
    rng = np.random.default_rng(7)
    mha = randomize(nn.MultiHeadAttention(4, 2, dtype=np.float64, rng=rng), rng)
    query, memory = rand(rng, 1, 2, 4, grad=True), rand(rng, 1, 3, 4, grad=True)
    assert gradcheck(lambda q, m, *params: mha(q, m), [query, memory, *mha.parameters()])


def test_multi_head_attention_matches_torch():
    torch = optional("torch")
    rng = np.random.default_rng(8)
    E, nh = 8, 2
    mha = randomize(nn.MultiHeadAttention(E, nh, dtype=np.float64, rng=rng), rng)
    reference = torch.nn.MultiheadAttention(E, nh, batch_first=True, dtype=torch.float64)
    with torch.no_grad():  # the documented mapping from torch's fused in_proj to ours
        reference.in_proj_weight.copy_(
            torch.from_numpy(
                np.concatenate(
                    [mha.q_proj.weight.data.T, mha.k_proj.weight.data.T, mha.v_proj.weight.data.T]
                )
            )
        )
        reference.in_proj_bias.copy_(
            torch.from_numpy(
                np.concatenate([mha.q_proj.bias.data, mha.k_proj.bias.data, mha.v_proj.bias.data])
            )
        )
        reference.out_proj.weight.copy_(torch.from_numpy(mha.out_proj.weight.data.T))
        reference.out_proj.bias.copy_(torch.from_numpy(mha.out_proj.bias.data))
    query, key, value = (rng.standard_normal((2, t, E)) for t in (3, 4, 4))
    mask = rng.random((3, 4)) < 0.7
    mask[:, 0] = True
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (query, key, value))
    expected, _ = reference(tq, tk, tv, attn_mask=torch.from_numpy(~mask))  # torch: True = blocked
    gq, gk, gv = (Tensor(a, requires_grad=True) for a in (query, key, value))
    out = mha(gq, gk, gv, mask=mask)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    upstream = rng.standard_normal(out.shape)
    out.backward(upstream)
    expected.backward(torch.from_numpy(upstream))
    for ours, theirs in ((gq, tq), (gk, tk), (gv, tv)):
        np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-9, atol=1e-12)
    in_grad = reference.in_proj_weight.grad.numpy()
    np.testing.assert_allclose(mha.k_proj.weight.grad, in_grad[E : 2 * E].T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        mha.out_proj.weight.grad, reference.out_proj.weight.grad.numpy().T, rtol=1e-9, atol=1e-12
    )
