"""Every family as a configuration of the one GPT: against finite differences in float64, the
model's own cache and inspection, checkpoints, and transformers' own model classes given the same
weights (logits to <= 1e-4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import optional

import glassllm
from glassllm import no_grad
from glassllm.models import GPT, GPTConfig
from glassllm.models.config import llama_config, parameter_count, parameter_shapes
from glassllm.models.inspect import inspect

SHAPE = dict(vocab_size=29, block_size=16, n_layer=2)

# The six families (design study §1) at toy size, each choice that sets it apart switched on.
FAMILIES = {
    "gpt2": GPTConfig(**SHAPE, n_head=4, n_embd=16, bias=True),
    "llama": GPTConfig(
        **SHAPE, n_head=4, n_embd=32, n_kv_head=2, norm="rmsnorm", mlp="swiglu", mlp_hidden=40,
        positions="rotary", rope_theta=500.0, tied_head=False,
    ),
    "qwen2": GPTConfig(
        **SHAPE, n_head=4, n_embd=32, n_kv_head=2, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu",
        mlp_hidden=40, positions="rotary", qkv_bias=True,
    ),
    "qwen3": GPTConfig(
        **SHAPE, n_head=4, n_embd=32, n_kv_head=2, head_dim=16, norm="rmsnorm", norm_eps=1e-6,
        mlp="swiglu", mlp_hidden=40, positions="rotary", qk_norm=True,
    ),
    "gpt_neox": GPTConfig(
        **SHAPE, n_head=2, n_embd=32, bias=True, mlp="gelu", positions="rotary", rotary_dim=4,
        parallel_residual=True, tied_head=False,
    ),
    "gpt_neo": GPTConfig(
        **SHAPE, n_head=4, n_embd=16, bias=True, qkv_bias=False, attention_scale=1.0,
        attention_window=4, local_layers=(1,),
    ),
}  # fmt: skip


def perturbed(config: GPTConfig, dtype=np.float32, seed: int = 0) -> GPT:
    """A model whose every parameter matters: norms' weights in [0.5, 1.5], everything else
    normal(0, 0.1) added (the initialisation's ones, zeros and 0.02 hide wrong choices)."""
    model = GPT(config, rng=np.random.default_rng(seed), dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    for name, p in model.named_parameters():
        if p.ndim == 1 and name.endswith("weight"):  # a norm's scale
            p.data[...] = rng.uniform(0.5, 1.5, p.shape)
        else:
            p.data += (0.1 * rng.standard_normal(p.shape)).astype(dtype)
    return model


@pytest.fixture(params=list(FAMILIES))
def family(request) -> str:
    return request.param


def test_parameters_are_the_table_of_each_configuration(family):
    config = FAMILIES[family]
    model = GPT(config, rng=np.random.default_rng(0))
    built = [(name, p.shape) for name, p in model.named_parameters()]
    assert list(parameter_shapes(config).items()) == built
    assert parameter_count(config) == model.num_parameters()


def test_whole_model_gradients_match_finite_differences(family):
    """Every parameter's gradient along a random direction d of its own (HIPS autograd's check):
    ``grad . d`` against ``(L(p + eps d) - L(p - eps d)) / 2 eps`` in float64, two forwards per
    parameter instead of two per element; a wrong VJP of any op moves ``grad . d`` far off."""
    config = dataclasses.replace(FAMILIES[family], n_layer=2, vocab_size=11, block_size=6)
    model = perturbed(config, dtype=np.float64)
    for p in model.parameters():  # scale up from 0.02 so every path is far above the noise
        if p.ndim >= 2:
            p.data *= 5.0
    rng = np.random.default_rng(2)
    idx, targets = rng.integers(0, 11, size=(2, 6)), rng.integers(0, 11, size=(2, 6))
    model.zero_grad()
    model(idx, targets)[1].backward()
    eps = 1e-6
    for name, p in model.named_parameters():
        direction = rng.standard_normal(p.shape)
        analytic = float(np.sum(p.grad * direction))
        original = p.data.copy()
        with no_grad():
            p.data[...] = original + eps * direction
            plus = float(model(idx, targets)[1].data)
            p.data[...] = original - eps * direction
            minus = float(model(idx, targets)[1].data)
        p.data[...] = original
        numeric = (plus - minus) / (2 * eps)
        assert abs(analytic - numeric) <= 1e-6 + 1e-5 * abs(numeric), (name, analytic, numeric)


def test_the_cache_gives_the_full_forwards_logits(family):
    model = perturbed(FAMILIES[family])
    idx = np.random.default_rng(4).integers(0, 29, size=(2, 12))
    with no_grad():
        full = model(idx)[0].data  # (B, T, V)
        caches = [glassllm.nn.KVCache() for _ in model.blocks]
        steps = [model(idx[:, :5], kv_caches=caches)[0].data]  # a prompt, then token by token
        steps += [model(idx[:, t : t + 1], kv_caches=caches)[0].data for t in range(5, 12)]
    kv, head = model.config.kv_heads, model.config.head_size
    assert caches[0].keys.shape == (2, kv, 12, head)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5, rtol=0)


def test_generation_with_the_cache_equals_full_recompute(family):
    model = perturbed(FAMILIES[family])
    prompt = np.array([[3, 1, 4, 1, 5]])
    kwargs = dict(max_new_tokens=20, top_k=1)  # past block_size: the window slides too
    cached = model.generate(prompt, use_cache=True, rng=np.random.default_rng(0), **kwargs)
    recomputed = model.generate(prompt, use_cache=False, rng=np.random.default_rng(0), **kwargs)
    np.testing.assert_array_equal(cached, recomputed)


def test_inspect_records_what_the_forward_computed(family):
    model = perturbed(FAMILIES[family])
    ids = np.random.default_rng(5).integers(0, 29, size=10)
    seen = inspect(model, ids, full_lens=True)
    with no_grad():
        logits = model(ids[None])[0].data[0]
    np.testing.assert_array_equal(seen.logits, logits)
    np.testing.assert_allclose(seen.lens.full[-1], glassllm.functional.softmax(
        glassllm.Tensor(logits), axis=-1).data, atol=1e-6)  # fmt: skip
    assert seen.attention.shape == (2, model.config.n_head, 10, 10)
    assert seen.attention_check < 1e-5
    np.testing.assert_allclose(seen.attention.sum(-1), 1.0, atol=1e-5)
    assert seen.mlp.shape == (2, 10, model.config.mlp_size)
    for layer in model.config.local_layers:  # a local layer's row sees the window only
        i, j = np.indices((10, 10))
        assert not seen.attention[layer][:, (i - j) >= model.config.attention_window].any()


def test_checkpoint_round_trip(family, tmp_path):
    model = perturbed(FAMILIES[family])
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, model, metadata={"model_config": model.config.to_dict()})
    meta = glassllm.checkpoint.read_metadata(path)
    config = GPTConfig.from_dict(meta["model_config"])
    assert config == model.config
    fresh = GPT(config, init=False)
    glassllm.load(path, fresh)
    for (name, a), (_, b) in zip(
        model.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert np.array_equal(a, b), name
    with no_grad():
        np.testing.assert_array_equal(fresh([[1, 2, 3]])[0].data, model([[1, 2, 3]])[0].data)


def test_a_gpt2_config_writes_todays_dict_and_old_dicts_load():
    old = {"vocab_size": 5, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 4,
           "dropout": 0.0, "bias": True}  # fmt: skip
    assert GPTConfig.from_dict(old).to_dict() == old
    assert FAMILIES["gpt_neo"].to_dict()["local_layers"] == [1]  # JSON: a list
    for config in FAMILIES.values():
        assert GPTConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(n_kv_head=3), r"n_kv_head \(3\) must divide n_head \(4\)"),
        (dict(positions="rotary", rotary_dim=3), "rotary_dim .* must be even"),
        (dict(positions="rotary", rotary_dim=6), "at most head_dim"),
        (dict(rotary_dim=2), "rotary_dim is for positions='rotary' only"),
        (dict(norm="batchnorm"), "norm must be one of"),
        (dict(mlp="relu"), "mlp must be one of"),
        (dict(positions="alibi"), "positions must be one of"),
        (dict(local_layers=(2,), attention_window=4), r"local_layers holds 2, not a block index"),
        (dict(local_layers=(0,)), "local_layers needs attention_window"),
        (dict(attention_window=0, local_layers=(0,)), "attention_window must be positive"),
        (dict(attention_window=4), "local_layers is empty"),
        (dict(norm="rmsnorm", norm_bias=True), "norm_bias must not be True"),
        (dict(attention_scale=0.0), "attention_scale must be a positive"),
        (dict(norm_eps=float("nan")), "norm_eps must be a positive finite"),
        (dict(positions="rotary", rope_scaling={"rope_type": "yarn"}), "rope_scaling: .*'yarn'"),
        (dict(qk_norm="yes"), "qk_norm must be True or False"),
        (dict(head_dim=0), "head_dim must be positive"),
    ],
)
def test_configuration_errors_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**SHAPE, n_head=4, n_embd=16, **change)


def test_free_head_dim_lifts_the_divisibility_rule():
    config = GPTConfig(**SHAPE, n_head=3, n_embd=16, head_dim=8)
    assert parameter_shapes(config)["blocks.0.attn.proj.weight"] == (24, 16)


def test_llama_config_matches_the_gpt2_recipes_parameter_count():
    for n_layer, n_head, n_embd, block_size in [(4, 4, 128, 64), (6, 6, 384, 256), (2, 2, 64, 32)]:
        shape = dict(vocab_size=65, block_size=block_size, n_layer=n_layer, n_head=n_head)
        gpt2 = parameter_count(GPTConfig(**shape, n_embd=n_embd))
        llama = parameter_count(llama_config(**shape, n_embd=n_embd))
        assert abs(llama - gpt2) <= 3 * n_embd * n_layer / 2  # M rounded: half a unit per block


# ------------------------------------------------------------------ transformers' own models


def _linear(w: np.ndarray):  # glassllm (in, out) -> torch.nn.Linear (out, in)
    return np.ascontiguousarray(w.T)


def _split_qkv(state: dict, prefix: str, config: GPTConfig, what: str = "weight") -> list:
    H, KV, hd = config.n_head, config.kv_heads, config.head_size
    packed = state[f"{prefix}.attn.qkv.{what}"]
    bounds = [0, H * hd, (H + KV) * hd, (H + 2 * KV) * hd]
    return [packed[..., a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def hf_model(family: str, model: GPT):
    """transformers' model of ``family`` built to ``model.config`` and given its weights."""
    import torch
    import transformers as tf

    c, s = model.config, model.state_dict()
    common = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_attention_heads=c.n_head,
        max_position_embeddings=c.block_size,
        tie_word_embeddings=c.tied_head,
    )
    hf: dict[str, np.ndarray] = {}
    if family in ("llama", "qwen2", "qwen3"):
        cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
               "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
               "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[family]  # fmt: skip
        hf_config = cls[0](
            **common, intermediate_size=c.mlp_size, num_hidden_layers=c.n_layer,
            num_key_value_heads=c.kv_heads, head_dim=c.head_size, rms_norm_eps=c.norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        )  # fmt: skip
        hf["model.embed_tokens.weight"] = s["wte.weight"]
        hf["model.norm.weight"] = s["ln_f.weight"]
        for i in range(c.n_layer):
            p, q = f"blocks.{i}", f"model.layers.{i}"
            for part, w in zip("qkv", _split_qkv(s, p, c), strict=True):
                hf[f"{q}.self_attn.{part}_proj.weight"] = _linear(w)
            if c.has_bias("qkv"):
                for part, b in zip("qkv", _split_qkv(s, p, c, "bias"), strict=True):
                    hf[f"{q}.self_attn.{part}_proj.bias"] = b
            if c.qk_norm:
                hf[f"{q}.self_attn.q_norm.weight"] = s[f"{p}.attn.q_norm.weight"]
                hf[f"{q}.self_attn.k_norm.weight"] = s[f"{p}.attn.k_norm.weight"]
            hf[f"{q}.self_attn.o_proj.weight"] = _linear(s[f"{p}.attn.proj.weight"])
            hf[f"{q}.input_layernorm.weight"] = s[f"{p}.ln_1.weight"]
            hf[f"{q}.post_attention_layernorm.weight"] = s[f"{p}.ln_2.weight"]
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("proj", "down_proj")):
                hf[f"{q}.mlp.{theirs}.weight"] = _linear(s[f"{p}.mlp.{ours}.weight"])
        if not c.tied_head:
            hf["lm_head.weight"] = _linear(s["lm_head.weight"])
    elif family == "gpt_neox":
        cls = (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM)
        hf_config = tf.GPTNeoXConfig(
            **common, intermediate_size=c.mlp_size, num_hidden_layers=c.n_layer,
            hidden_act="gelu", layer_norm_eps=c.norm_eps, use_parallel_residual=True,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                             "partial_rotary_factor": c.rotary_size / c.head_size},
        )  # fmt: skip
        hf["gpt_neox.embed_in.weight"] = s["wte.weight"]
        hf["gpt_neox.final_layer_norm.weight"] = s["ln_f.weight"]
        hf["gpt_neox.final_layer_norm.bias"] = s["ln_f.bias"]
        hf["lm_head.weight"] = _linear(s["lm_head.weight"])  # embed_out in the files
        H, hd = c.n_head, c.head_size
        for i in range(c.n_layer):
            p, q = f"blocks.{i}", f"gpt_neox.layers.{i}"
            w = np.stack([x.T.reshape(H, hd, c.n_embd) for x in _split_qkv(s, p, c)], axis=1)
            hf[f"{q}.attention.query_key_value.weight"] = w.reshape(3 * H * hd, c.n_embd)
            b = np.stack([x.reshape(H, hd) for x in _split_qkv(s, p, c, "bias")], axis=1)
            hf[f"{q}.attention.query_key_value.bias"] = b.reshape(-1)
            hf[f"{q}.attention.dense.weight"] = _linear(s[f"{p}.attn.proj.weight"])
            hf[f"{q}.attention.dense.bias"] = s[f"{p}.attn.proj.bias"]
            for ours, theirs in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
                hf[f"{q}.{theirs}.weight"] = s[f"{p}.{ours}.weight"]
                hf[f"{q}.{theirs}.bias"] = s[f"{p}.{ours}.bias"]
            for ours, theirs in (("fc", "dense_h_to_4h"), ("proj", "dense_4h_to_h")):
                hf[f"{q}.mlp.{theirs}.weight"] = _linear(s[f"{p}.mlp.{ours}.weight"])
                hf[f"{q}.mlp.{theirs}.bias"] = s[f"{p}.mlp.{ours}.bias"]
    else:  # gpt_neo and gpt2 share their names under transformer.
        if family == "gpt_neo":
            kinds = ["local" if i in c.local_layers else "global" for i in range(c.n_layer)]
            hf_config = tf.GPTNeoConfig(
                vocab_size=c.vocab_size, max_position_embeddings=c.block_size,
                hidden_size=c.n_embd, num_layers=c.n_layer, num_heads=c.n_head,
                attention_types=[[kinds, 1]], intermediate_size=c.mlp_size,
                window_size=c.attention_window, activation_function="gelu_new",
                layer_norm_epsilon=c.norm_eps,
            )  # fmt: skip
        else:
            hf_config = tf.GPT2Config(
                vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd,
                n_layer=c.n_layer, n_head=c.n_head, activation_function="gelu_new",
                layer_norm_epsilon=c.norm_eps,
            )  # fmt: skip
        for ours in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
            hf[f"transformer.{ours}"] = s[ours]
        for i in range(c.n_layer):
            p, q = f"blocks.{i}", f"transformer.h.{i}"
            for ln in ("ln_1", "ln_2"):
                hf[f"{q}.{ln}.weight"], hf[f"{q}.{ln}.bias"] = (
                    s[f"{p}.{ln}.weight"],
                    s[f"{p}.{ln}.bias"],
                )
            if family == "gpt_neo":  # torch.nn.Linear layers
                for part, w in zip("qkv", _split_qkv(s, p, c), strict=True):
                    hf[f"{q}.attn.attention.{part}_proj.weight"] = _linear(w)
                hf[f"{q}.attn.attention.out_proj.weight"] = _linear(s[f"{p}.attn.proj.weight"])
                hf[f"{q}.attn.attention.out_proj.bias"] = s[f"{p}.attn.proj.bias"]
                layout = _linear
            else:  # GPT-2's Conv1D: (in, out) as ours
                hf[f"{q}.attn.c_attn.weight"] = s[f"{p}.attn.qkv.weight"]
                hf[f"{q}.attn.c_attn.bias"] = s[f"{p}.attn.qkv.bias"]
                hf[f"{q}.attn.c_proj.weight"] = s[f"{p}.attn.proj.weight"]
                hf[f"{q}.attn.c_proj.bias"] = s[f"{p}.attn.proj.bias"]
                layout = np.ascontiguousarray
            for ours, theirs in (("fc", "c_fc"), ("proj", "c_proj")):
                hf[f"{q}.mlp.{theirs}.weight"] = layout(s[f"{p}.mlp.{ours}.weight"])
                hf[f"{q}.mlp.{theirs}.bias"] = s[f"{p}.mlp.{ours}.bias"]
        cls = (None, tf.GPTNeoForCausalLM if family == "gpt_neo" else tf.GPT2LMHeadModel)
    torch.manual_seed(0)
    reference = cls[1](hf_config).eval()
    tensors = {name: torch.from_numpy(np.array(value)) for name, value in hf.items()}
    missing, unexpected = reference.load_state_dict(tensors, strict=False)
    assert not unexpected, unexpected
    tied = {"lm_head.weight"} if c.tied_head else set()
    assert set(missing) <= tied | {n for n in missing if n.endswith((".attn.bias", ".masked_bias"))}
    return reference


def test_logits_match_transformers_own_model(family):
    torch = optional("torch")
    optional("transformers")
    model = perturbed(FAMILIES[family])
    reference = hf_model(family, model)
    ids = np.random.default_rng(6).integers(0, 29, size=(2, 16))
    with torch.no_grad():
        expected = reference(torch.from_numpy(ids)).logits.numpy()
    with no_grad():
        logits = model(ids)[0].data
    assert np.abs(expected).max() > 0.3  # logits that tell the choices apart
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
