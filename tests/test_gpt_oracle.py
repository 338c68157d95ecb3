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


def torch_gpt(torch, config: GPTConfig):
    """nanoGPT's model, written with torch.nn (its attention via scaled_dot_product_attention)."""
    tnn = torch.nn
    functional = torch.nn.functional

    class SelfAttention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = tnn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.proj = tnn.Linear(config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            B, T, E = x.shape
            q, k, v = self.qkv(x).split(E, dim=2)
            heads = lambda t: t.view(B, T, config.n_head, E // config.n_head).transpose(1, 2)
            y = functional.scaled_dot_product_attention(
                heads(q), heads(k), heads(v), is_causal=True
            )
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, E))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = tnn.LayerNorm(config.n_embd, bias=config.bias)
            self.attn = SelfAttention()
            self.ln_2 = tnn.LayerNorm(config.n_embd, bias=config.bias)
            self.fc = tnn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.mlp_proj = tnn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp_proj(functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = tnn.Embedding(config.block_size, config.n_embd)
            self.blocks = tnn.ModuleList([Block() for _ in range(config.n_layer)])
            self.ln_f = tnn.LayerNorm(config.n_embd, bias=config.bias)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T
            loss = functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            return logits, loss

    return TorchGPT()


def torch_name(name: str) -> str:
    return name.replace("mlp.fc", "fc").replace("mlp.proj", "mlp_proj")


def is_linear_weight(name: str) -> bool:
    """glassllm stores Linear weights (in, out); torch stores (out, in)."""
    return name.endswith(("qkv.weight", "proj.weight", "fc.weight"))


@pytest.mark.parametrize(
    "dtype, rtol, atol", [(np.float32, 2e-4, 2e-6), (np.float64, 1e-10, 1e-12)]
)
@pytest.mark.parametrize("bias", [False, True])
def test_logits_loss_and_gradients_match_pytorch(dtype, rtol, atol, bias):
    torch = pytest.importorskip("torch")
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=bias)
    model = GPT(config, rng=np.random.default_rng(0), dtype=dtype)
    rng = np.random.default_rng(1)
    for p in model.parameters():  # move off the init so biases and LayerNorm are exercised too
        p.data += (0.1 * rng.standard_normal(p.shape)).astype(dtype)
    reference = torch_gpt(torch, config).to(torch.float32 if dtype == np.float32 else torch.float64)
    torch_params = dict(reference.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = p.data.T if is_linear_weight(name) else p.data
            torch_params[torch_name(name)].copy_(torch.from_numpy(np.ascontiguousarray(value)))
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
        t_grad = torch_params[torch_name(name)].grad.numpy()
        expected = t_grad.T if is_linear_weight(name) else t_grad
        assert p.grad.dtype == dtype, name
        np.testing.assert_allclose(p.grad, expected, rtol=rtol * 10, atol=atol * 10, err_msg=name)
