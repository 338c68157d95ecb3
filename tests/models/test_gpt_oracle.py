"""The whole GPT against oracles: finite differences in float64, and an equivalent PyTorch model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from glassllm import gradcheck
from glassllm.models import GPT, GPTConfig


def test_whole_model_gradients_match_finite_differences():
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=2, n_head=2, n_embd=4, bias=True)
    model = GPT(config, rng=np.random.default_rng(0), dtype=np.float64)
    rng = np.random.default_rng(0)
    # Scale the weights up from GPT-2's 0.02 so every path carries a gradient well above the
    # finite-difference noise.
    for p in model.parameters():
        if p.ndim >= 2:
            p.data *= 20.0
        else:
            p.data += 0.3 * rng.standard_normal(p.shape)
    idx = rng.integers(0, 7, size=(2, 4))
    targets = rng.integers(0, 7, size=(2, 4))
    named = dict(model.named_parameters())
    checked = [
        "wte.weight",  # tied: gradient from the embedding and from the output head
        "wpe.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.1.attn.proj.bias",
        "blocks.0.mlp.fc.weight",
        "blocks.1.ln_2.weight",
        "ln_f.bias",
    ]
    assert gradcheck(lambda *_: model(idx, targets)[1], [named[name] for name in checked])


# ----------------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize(
    "dtype, rtol, atol", [(np.float32, 2e-4, 2e-6), (np.float64, 1e-10, 1e-12)]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_logits_loss_and_gradients_match_pytorch(
    torch, tiny_gpt, dtype, rtol, atol, bias, attention
):
    """bench/torch_gpt.py (nanoGPT's model, both attention paths) given glassllm's weights."""
    from bench.torch_gpt import to_torch_layout, torch_name, twin

    model = tiny_gpt(dtype=dtype, bias=bias)
    rng = np.random.default_rng(1)
    for p in model.parameters():  # move off the init so biases and LayerNorm are exercised too
        p.data += (0.1 * rng.standard_normal(p.shape)).astype(dtype)
    reference = twin(model, attention=attention)
    torch_params = dict(reference.named_parameters())
    assert len(torch_params) == len(dict(model.named_parameters()))

    idx = rng.integers(0, 11, size=(3, 8))
    targets = rng.integers(0, 11, size=(3, 8))
    logits, loss = model(idx, targets)
    loss.backward()
    t_logits, t_loss = reference(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()

    assert logits.dtype == dtype and loss.dtype == dtype
    np.testing.assert_allclose(logits.data, t_logits.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(float(loss.data), t_loss.item(), rtol=rtol)
    assert abs(float(loss.data) - math.log(11)) < 1.5
    for name, p in model.named_parameters():
        t_name = torch_name(name)
        expected = to_torch_layout(t_name, torch_params[t_name].grad.numpy())
        assert p.grad.dtype == dtype, name
        np.testing.assert_allclose(p.grad, expected, rtol=rtol * 10, atol=atol * 10, err_msg=name)
