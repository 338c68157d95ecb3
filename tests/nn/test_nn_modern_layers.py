"""The Llama-family layers: RMSNorm, SiLU, SwiGLU, RotaryEmbedding. Construction, finite
differences in float64, dtypes, repr, and transformers' own modules as the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

import glassllm.nn as nn
from glassllm import Tensor, gradcheck


def rand(rng, *shape, dtype=np.float64, grad=True):
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=grad)


def gradcheck_module(module, *inputs):
    params = list(module.parameters())
    assert all(p.dtype == np.float64 for p in params)
    assert gradcheck(lambda *tensors: module(*tensors[: len(inputs)]), [*inputs, *params])


# ----------------------------------------------------------------------------- RMSNorm


def test_rms_norm_init_forward_dtype_and_repr():
    norm = nn.RMSNorm(5, eps=1e-5)
    assert norm.weight.data.tolist() == [1.0] * 5 and norm.weight.dtype == np.float32
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 4.0
    y = norm(Tensor(x)).data
    assert y.dtype == np.float32
    np.testing.assert_allclose(np.sqrt((y.astype(np.float64) ** 2).mean(-1)), 1.0, rtol=1e-5)
    assert repr(norm).startswith("RMSNorm(5, eps=1e-05, dtype=float32)")
    with pytest.raises(ValueError, match="eps"):
        nn.RMSNorm(5, eps=-1.0)
    with pytest.raises(ValueError, match="dim"):
        nn.RMSNorm(0)


def test_rms_norm_gradcheck_and_transformers_llama_rms_norm():
    rng = np.random.default_rng(1)
    norm = nn.RMSNorm(6, eps=1e-5, dtype=np.float64)
    norm.weight.data[...] = rng.uniform(0.5, 1.5, 6)
    gradcheck_module(norm, rand(rng, 2, 3, 6))
    optional("torch")
    modeling_llama = optional("transformers.models.llama.modeling_llama")
    import torch

    norm32 = nn.RMSNorm(6, eps=1e-5)
    norm32.weight.data[...] = norm.weight.data
    reference = modeling_llama.LlamaRMSNorm(6, eps=1e-5)
    with torch.no_grad():
        reference.weight.copy_(torch.tensor(norm32.weight.data))
    x = rng.standard_normal((2, 4, 6)).astype(np.float32) * 3
    want = reference(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(norm32(Tensor(x)).data, want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- SiLU, SwiGLU


def test_silu_module_gradcheck_dtype_and_torch():
    rng = np.random.default_rng(2)
    x = rand(rng, 3, 4)
    assert gradcheck(nn.SiLU(), [x])
    assert nn.SiLU()(Tensor(x.data.astype(np.float32))).dtype == np.float32
    torch = optional("torch")
    want = torch.nn.SiLU()(torch.tensor(x.data)).numpy()
    np.testing.assert_allclose(nn.SiLU()(x).data, want, rtol=1e-12, atol=1e-15)


def test_swiglu_shapes_names_repr_and_reproducible_init():
    mlp = nn.SwiGLU(4, 6, rng=np.random.default_rng(0))
    shapes = {n: p.shape for n, p in mlp.named_parameters()}
    assert shapes == {"gate.weight": (4, 6), "up.weight": (4, 6), "proj.weight": (6, 4)}
    assert repr(mlp).startswith("SwiGLU(embed_dim=4, hidden_dim=6, bias=False, dtype=float32\n")
    again = nn.SwiGLU(4, 6, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(mlp.up.weight.data, again.up.weight.data)
    biased = nn.SwiGLU(4, 6, bias=True)
    assert sorted(n for n, _ in biased.named_parameters()) == sorted(
        ["gate.weight", "gate.bias", "up.weight", "up.bias", "proj.weight", "proj.bias"]
    )
    x = Tensor(np.ones((2, 3, 4), np.float32))
    assert mlp(x).shape == (2, 3, 4) and mlp(x).dtype == np.float32


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_gradcheck_and_transformers_llama_mlp(bias):
    rng = np.random.default_rng(3)
    mlp = nn.SwiGLU(4, 6, bias=bias, dtype=np.float64, rng=rng)
    gradcheck_module(mlp, rand(rng, 2, 3, 4))
    optional("torch")
    transformers = optional("transformers")
    modeling_llama = optional("transformers.models.llama.modeling_llama")
    import torch

    config = transformers.LlamaConfig(
        hidden_size=4,
        intermediate_size=6,
        num_attention_heads=1,
        num_key_value_heads=1,
        mlp_bias=bias,
    )
    reference = modeling_llama.LlamaMLP(config).double()
    with torch.no_grad():
        for ours, theirs in ((mlp.gate, "gate_proj"), (mlp.up, "up_proj"), (mlp.proj, "down_proj")):
            layer = getattr(reference, theirs)
            layer.weight.copy_(torch.tensor(ours.weight.data.T))  # torch's (out, in)
            if bias:
                layer.bias.copy_(torch.tensor(ours.bias.data))
    x = rng.standard_normal((2, 3, 4))
    want = reference(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(mlp(Tensor(x)).data, want, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- RotaryEmbedding


def test_rotary_embedding_has_no_parameters_and_a_repr():
    rope = nn.RotaryEmbedding(8, theta=100000.0)
    assert list(rope.named_parameters()) == [] and rope.state_dict() == {}
    assert repr(rope) == "RotaryEmbedding(8, theta=100000.0, interleaved=False)"
    scaled = nn.RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0})
    assert "scaling={'rope_type': 'linear', 'factor': 2.0}" in repr(scaled)
    with pytest.raises(ValueError, match="'yarn'"):
        nn.RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="start"):
        rope(Tensor(np.ones((2, 8))), start=-1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_decoding_steps_match_the_full_forward_across_table_growth(interleaved):
    rope = nn.RotaryEmbedding(6, interleaved=interleaved)  # head 8, 6 rotary dims
    x = np.random.default_rng(4).standard_normal((1, 2, 300, 8)).astype(np.float32)
    steps = [rope(Tensor(x[:, :, :250])).data]  # the table covers 256 positions
    steps += [rope(Tensor(x[:, :, t : t + 1]), start=t).data for t in range(250, 300)]  # grows
    fresh = nn.RotaryEmbedding(6, interleaved=interleaved)
    np.testing.assert_array_equal(np.concatenate(steps, axis=2), fresh(Tensor(x)).data)
    gradcheck_module(
        nn.RotaryEmbedding(4, interleaved=interleaved), rand(np.random.default_rng(5), 2, 3, 6)
    )


def test_rotary_embedding_matches_transformers_llama_attention_rotation():
    torch = optional("torch")
    transformers = optional("transformers")
    modeling_llama = optional("transformers.models.llama.modeling_llama")
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        max_position_embeddings=64,
    )
    reference = modeling_llama.LlamaRotaryEmbedding(config)
    q = np.random.default_rng(6).standard_normal((2, 4, 9, 16)).astype(np.float32)
    positions = torch.arange(5, 14)[None]
    cos, sin = reference(torch.zeros(1), positions)
    want, _ = modeling_llama.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    got = nn.RotaryEmbedding(16, theta=100000.0)(Tensor(q), start=5).data
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-6)
