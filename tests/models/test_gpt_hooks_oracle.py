"""TransformerLens as the oracle of the hook points: a random GPT-2-shaped (and a Llama-shaped:
grouped-query, rotary, RMSNorm, SwiGLU) glassllm model and a `HookedTransformer` given the same
weights (TransformerLens's layout, no folding or centring) cache the same activations under
every shared hook name (<= 1e-5)."""

from __future__ import annotations

import numpy as np
from conftest import optional
from test_gpt_families import FAMILIES, perturbed

from glassllm.models import GPTConfig

CONFIG = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=4, n_embd=32, bias=True)
IDS = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]])


def transformer_lens_twin(model):
    """A HookedTransformer with ``model``'s weights: GPT-2's block, GELU-tanh ("gelu_new")."""
    torch = optional("torch")
    lens = optional("transformer_lens")
    c = model.config
    H, hd, E = c.n_head, c.n_embd // c.n_head, c.n_embd
    cfg = lens.HookedTransformerConfig(
        n_layers=c.n_layer, d_model=E, n_heads=H, d_head=hd, d_mlp=c.mlp_size,
        d_vocab=c.vocab_size, n_ctx=c.block_size, act_fn="gelu_new", normalization_type="LN",
        eps=c.norm_eps, positional_embedding_type="standard", dtype=torch.float32, device="cpu",
    )  # fmt: skip
    twin = lens.HookedTransformer(cfg)
    weights = {"embed.W_E": model.wte.weight.data, "pos_embed.W_pos": model.wpe.weight.data}
    for i, block in enumerate(model.blocks):
        qkv_w, qkv_b = block.attn.qkv.weight.data, block.attn.qkv.bias.data
        p = f"blocks.{i}."
        for j, which in enumerate("QKV"):  # columns [q | k | v], each head-major
            columns = qkv_w[:, j * E : (j + 1) * E].reshape(E, H, hd)
            weights[f"{p}attn.W_{which}"] = columns.transpose(1, 0, 2)  # (H, E, hd)
            weights[f"{p}attn.b_{which}"] = qkv_b[j * E : (j + 1) * E].reshape(H, hd)
        weights[p + "attn.W_O"] = block.attn.proj.weight.data.reshape(H, hd, E)
        weights[p + "attn.b_O"] = block.attn.proj.bias.data
        for ours, theirs in (("ln_1", "ln1"), ("ln_2", "ln2")):
            weights[f"{p}{theirs}.w"] = getattr(block, ours).weight.data
            weights[f"{p}{theirs}.b"] = getattr(block, ours).bias.data
        weights[p + "mlp.W_in"], weights[p + "mlp.b_in"] = (
            block.mlp.fc.weight.data,
            block.mlp.fc.bias.data,
        )
        weights[p + "mlp.W_out"] = block.mlp.proj.weight.data
        weights[p + "mlp.b_out"] = block.mlp.proj.bias.data
    weights["ln_final.w"], weights["ln_final.b"] = model.ln_f.weight.data, model.ln_f.bias.data
    weights["unembed.W_U"] = model.wte.weight.data.T  # the tied head
    weights["unembed.b_U"] = np.zeros(c.vocab_size, np.float32)
    params = dict(twin.named_parameters())
    assert sorted(params) == sorted(weights)
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return twin


def test_every_shared_hook_point_agrees_with_transformer_lens():
    torch = optional("torch")
    model = perturbed(CONFIG)
    twin = transformer_lens_twin(model)
    logits, cache = model.run_with_cache(IDS)
    their_logits, theirs = twin.run_with_cache(torch.from_numpy(IDS))
    shared = sorted(set(cache) & set(theirs.keys()))
    assert shared == sorted(cache)  # every glassllm hook point of GPT-2 is one of theirs
    worst = {}
    for name in shared:
        ours, their = cache[name], theirs[name].numpy()
        assert ours.shape == their.shape, name
        finite = np.isfinite(their)
        assert np.array_equal(finite, np.isfinite(ours)), name  # the -inf of masked scores
        worst[name] = float(np.max(np.abs(ours[finite] - their[finite])))
    assert max(worst.values()) <= 1e-5, worst
    print(f"worst {max(worst.values()):.2e}, median {np.median(list(worst.values())):.2e}")
    np.testing.assert_allclose(logits.data, their_logits.detach().numpy(), atol=1e-5)


def test_a_head_ablation_agrees_with_transformer_lens():
    torch = optional("torch")
    model = perturbed(CONFIG)
    twin = transformer_lens_twin(model)

    def zero_head_2(z, name):
        z[:, :, 2] = 0.0

    def zero_head_2_torch(z, hook):
        z[:, :, 2] = 0.0
        return z

    ours = model.run_with_hooks(IDS, [("blocks.1.attn.hook_z", zero_head_2)])
    with torch.no_grad():
        theirs = twin.run_with_hooks(
            torch.from_numpy(IDS), fwd_hooks=[("blocks.1.attn.hook_z", zero_head_2_torch)]
        )
    np.testing.assert_allclose(ours.data, theirs.numpy(), atol=1e-5)
    assert not np.allclose(ours.data, model.run_with_hooks(IDS).data, atol=1e-3)


def llama_twin(model):
    """A HookedTransformer of the Llama family with ``model``'s weights (grouped-query heads
    in TransformerLens's ``_W_K`` / ``_W_V``, rotary pairs (i, i + d/2) as transformers)."""
    torch = optional("torch")
    lens = optional("transformer_lens")
    c = model.config
    attn = model.blocks[0].attn
    H, KV, hd, E = attn.num_heads, attn.num_kv_heads, attn.head_size, c.n_embd
    cfg = lens.HookedTransformerConfig(
        n_layers=c.n_layer, d_model=E, n_heads=H, d_head=hd, d_mlp=c.mlp_size,
        d_vocab=c.vocab_size, n_ctx=c.block_size, act_fn="silu", normalization_type="RMS",
        eps=c.norm_eps, positional_embedding_type="rotary", rotary_dim=hd,
        rotary_base=c.rope_theta, n_key_value_heads=KV, gated_mlp=True, final_rms=True,
        dtype=torch.float32, device="cpu",
    )  # fmt: skip
    twin = lens.HookedTransformer(cfg)
    weights = {"embed.W_E": model.wte.weight.data}
    for i, block in enumerate(model.blocks):
        w, p = block.attn.qkv.weight.data, f"blocks.{i}."
        groups = {"W_Q": (0, H), "_W_K": (H, KV), "_W_V": (H + KV, KV)}
        for name, (first, count) in groups.items():
            columns = w[:, first * hd : (first + count) * hd].reshape(E, count, hd)
            weights[p + "attn." + name] = columns.transpose(1, 0, 2)  # (heads, E, hd)
        weights[p + "attn.W_O"] = block.attn.proj.weight.data.reshape(H, hd, E)
        weights[p + "ln1.w"], weights[p + "ln2.w"] = block.ln_1.weight.data, block.ln_2.weight.data
        weights[p + "mlp.W_gate"] = block.mlp.gate.weight.data
        weights[p + "mlp.W_in"] = block.mlp.up.weight.data
        weights[p + "mlp.W_out"] = block.mlp.proj.weight.data
    weights["ln_final.w"] = model.ln_f.weight.data
    weights["unembed.W_U"] = model.lm_head.weight.data
    params = dict(twin.named_parameters())
    assert set(weights) <= set(params)
    with torch.no_grad():
        for name, param in params.items():  # the biases glassllm's Llama has none of: zeros
            value = weights.get(name, np.zeros(tuple(param.shape), np.float32))
            param.copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return twin


def test_a_llama_model_agrees_with_transformer_lens_grouped_query_and_rotary():
    torch = optional("torch")
    model = perturbed(FAMILIES["llama"])
    twin = llama_twin(model)
    ids = IDS % model.config.vocab_size
    logits, cache = model.run_with_cache(ids)
    their_logits, theirs = twin.run_with_cache(torch.from_numpy(ids))
    shared = sorted(set(cache) & set(theirs.keys()))
    assert shared == sorted(cache)
    assert cache["blocks.0.attn.hook_k"].shape[2] == 2  # KV heads, theirs too (checked below)
    worst = {}
    for name in shared:
        ours, their = cache[name], theirs[name].numpy()
        assert ours.shape == their.shape, name
        finite = np.isfinite(their)
        assert np.array_equal(finite, np.isfinite(ours)), name
        worst[name] = float(np.max(np.abs(ours[finite] - their[finite])))
    assert max(worst.values()) <= 1e-5, worst
    print(f"llama worst {max(worst.values()):.2e}")
    np.testing.assert_allclose(logits.data, their_logits.detach().numpy(), atol=1e-5)
