"""glassllm.hf.convert: GPT-2 configurations and tensor names both ways, without files."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.hf.convert import (
    HFFormatError,
    config_from_hf,
    config_to_hf,
    expected_shapes,
    name_from_hf,
    name_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)
from glassllm.models import GPT, GPTConfig

# The real gpt2 repository's config.json (no tie_word_embeddings key, a legacy n_ctx).
GPT2_CONFIG = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
TINY = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=4, bias=True)


def test_the_real_gpt2_config_is_gpt2_small():
    assert config_from_hf(GPT2_CONFIG) == GPTConfig(
        vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True
    )


def test_missing_config_keys_take_transformers_defaults():
    assert config_from_hf({"model_type": "gpt2", "n_layer": 2}) == GPTConfig(
        vocab_size=50257, block_size=1024, n_layer=2, n_head=12, n_embd=768, bias=True
    )


def test_config_round_trip():
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=3, n_head=4, n_embd=32, bias=True)
    hf = config_to_hf(config, bos_token_id=0, eos_token_id=0)
    assert hf["n_positions"] == 64 and hf["eos_token_id"] == 0 and hf["tie_word_embeddings"]
    assert config_from_hf(hf) == config
    # A bias=False model is written with zero biases, so it reads back as bias=True.
    unbiased = GPTConfig(vocab_size=65, block_size=64, n_layer=3, n_head=4, n_embd=32)
    assert config_from_hf(config_to_hf(unbiased)) == config


def test_every_unsupported_config_value_is_listed_at_once():
    bad = {
        **GPT2_CONFIG,
        "activation_function": "relu",
        "scale_attn_by_inverse_layer_idx": True,
        "add_cross_attention": True,
        "layer_norm_epsilon": 0.0,
        "n_layer": 0,
        "quantization_config": {"bits": 4},
    }
    with pytest.raises(HFFormatError) as caught:
        config_from_hf(bad)
    problems = " | ".join(caught.value.problems)
    for word in (
        "activation_function='relu'",
        "scale_attn_by_inverse_layer_idx=True",
        "add_cross_attention=True",
        "layer_norm_epsilon=0.0",
        "n_layer=0",
        "quantization_config",
    ):
        assert word in problems
    assert len(caught.value.problems) == 6
    assert "\n" not in str(caught.value)


def test_gpt2_choices_the_model_now_computes():
    """Values GPT-2 files may hold that glassllm's configurable model computes exactly."""
    changes = {"activation_function": "gelu", "layer_norm_epsilon": 1e-6, "n_inner": 100,
               "scale_attn_weights": False, "tie_word_embeddings": False}  # fmt: skip
    config = config_from_hf({**GPT2_CONFIG, **changes})
    assert (config.mlp, config.norm_eps, config.mlp_hidden) == ("gelu", 1e-6, 100)
    assert (config.attention_scale, config.tied_head) == (1.0, False)
    assert config_from_hf(GPT2_CONFIG).mlp_hidden is None  # n_inner null: 4 * n_embd


def test_other_model_types_are_named():
    with pytest.raises(
        HFFormatError,
        match="model_type is 'mamba'; glassllm loads model_type "
        "'gpt2', 'llama', 'qwen2', 'qwen3', 'gpt_neox', 'gpt_neo'",
    ):
        config_from_hf({"model_type": "mamba"})
    with pytest.raises(HFFormatError, match="n_embd=10 is not divisible by n_head=3"):
        config_from_hf({"model_type": "gpt2", "n_embd": 10, "n_head": 3})


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_names_both_ways(prefix):
    table = {
        "wte.weight": "wte.weight",
        "wpe.weight": "wpe.weight",
        "h.0.ln_1.weight": "blocks.0.ln_1.weight",
        "h.3.attn.c_attn.weight": "blocks.3.attn.qkv.weight",
        "h.3.attn.c_attn.bias": "blocks.3.attn.qkv.bias",
        "h.11.attn.c_proj.weight": "blocks.11.attn.proj.weight",
        "h.1.ln_2.bias": "blocks.1.ln_2.bias",
        "h.1.mlp.c_fc.weight": "blocks.1.mlp.fc.weight",
        "h.1.mlp.c_proj.bias": "blocks.1.mlp.proj.bias",
        "ln_f.bias": "ln_f.bias",
    }
    for theirs, ours in table.items():
        assert name_from_hf(prefix + theirs) == ours
        assert name_to_hf(ours, prefix=bool(prefix)) == prefix + theirs
    assert name_from_hf(prefix + "h.2.attn.bias") is None
    assert name_from_hf(prefix + "h.2.attn.masked_bias") is None


def _hf_tensors(config, prefix, rng):
    state = GPT(config, rng=rng).state_dict()
    return {name_to_hf(k, prefix=prefix): v for k, v in state.items()}, state


@pytest.mark.parametrize("prefix", [False, True])
def test_state_dict_from_hf_drops_buffers_and_a_tied_head(prefix):
    hf, state = _hf_tensors(TINY, prefix, np.random.default_rng(0))
    p = "transformer." if prefix else ""
    hf[f"{p}h.0.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
    hf[f"{p}h.1.attn.masked_bias"] = np.array(-1e4, np.float32)
    hf["lm_head.weight"] = hf[f"{p}wte.weight"].copy()
    converted = state_dict_from_hf(hf, TINY)
    assert converted.keys() == state.keys()
    assert all(np.array_equal(converted[k], state[k]) for k in state)
    model = GPT(TINY, rng=np.random.default_rng(1))
    model.load_state_dict(converted)


def test_state_dict_from_hf_lists_every_tensor_problem():
    hf, _ = _hf_tensors(TINY, True, np.random.default_rng(0))
    del hf["transformer.h.1.mlp.c_fc.bias"], hf["transformer.ln_f.weight"]
    hf["transformer.score.weight"] = np.ones(4, np.float32)
    hf["transformer.h.0.attn.c_attn.weight"] = np.zeros((4, 4), np.float32)
    hf["h.0.ln_1.bias"] = np.zeros(4, np.float32)  # the same tensor, unprefixed
    hf["lm_head.weight"] = hf["transformer.wte.weight"] + 1.0
    with pytest.raises(HFFormatError) as caught:
        state_dict_from_hf(hf, TINY)
    message = str(caught.value)
    assert "missing tensors: h.1.mlp.c_fc.bias, ln_f.weight" in message
    assert "unexpected tensors: transformer.score.weight" in message
    assert "transformer.h.0.ln_1.bias and h.0.ln_1.bias" in message
    assert "transformer.h.0.attn.c_attn.weight (4, 4) (expected (4, 12))" in message
    assert "untied lm_head.weight" in message


def test_tensors_of_another_size_than_the_config_are_refused_before_matching():
    hf, _ = _hf_tensors(TINY, True, np.random.default_rng(0))
    hf["transformer.h.2.ln_1.weight"] = np.ones(4, np.float32)  # a third block
    with pytest.raises(HFFormatError, match="n_layer=2 but the weights hold 3 blocks"):
        state_dict_from_hf(hf, TINY)
    # A configuration of 1024 blocks costs nothing against a file of 2: no name is made for it.
    big = GPTConfig(**{**TINY.__dict__, "n_layer": 1024, "vocab_size": 7})
    with pytest.raises(HFFormatError) as caught:
        state_dict_from_hf(_hf_tensors(TINY, True, np.random.default_rng(0))[0], big)
    assert caught.value.problems == [
        "config.json has n_layer=1024 but the weights hold 2 blocks",
        f"wte.weight has shape ({TINY.vocab_size}, 4), where config.json's vocab_size=7 and "
        "n_embd=4 need (7, 4)",
    ]
    with pytest.raises(HFFormatError, match=r"n_layer=1025 \(must be an integer in \[1, 1024\]\)"):
        config_from_hf({"model_type": "gpt2", "n_layer": 1025})


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_to_hf_and_back(bias):
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=4, bias=bias)
    state = GPT(config, rng=np.random.default_rng(0)).state_dict()
    hf = state_dict_to_hf(state, config)
    assert all(k.startswith("transformer.") for k in hf)
    assert set(hf) == {name_to_hf(k) for k in expected_shapes(config, bias=True)}
    assert all(v.dtype == np.float32 for v in hf.values())
    back = state_dict_from_hf(hf, config_from_hf(config_to_hf(config)))
    for name, value in back.items():
        expected = state.get(name, np.zeros_like(value))  # bias=False: zero biases
        assert np.array_equal(value, expected), name
    if not bias:
        assert not hf["transformer.h.0.attn.c_attn.bias"].any()


def test_state_dict_to_hf_checks_its_input():
    state = GPT(TINY, rng=np.random.default_rng(0)).state_dict()
    state.pop("wpe.weight")
    state["wte.weight"] = state["wte.weight"][:5]
    with pytest.raises(HFFormatError, match=r"missing tensors: wpe.weight.*wte.weight has shape"):
        state_dict_to_hf(state, TINY)


def test_docstring_examples():
    import doctest

    import glassllm.hf.convert

    assert doctest.testmod(glassllm.hf.convert).failed == 0


@pytest.mark.parametrize("tied", [True, False])
def test_a_llama_state_dict_to_hf_and_back(tied):
    from glassllm.models.config import llama_config

    config = llama_config(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=8,
                          tied_head=tied, qkv_bias=True)  # fmt: skip
    state = GPT(config, rng=np.random.default_rng(0)).state_dict()
    hf = state_dict_to_hf(state, config)
    assert hf["model.layers.0.self_attn.k_proj.weight"].shape == (
        4,
        8,
    )  # 2 kv heads of 2, (out, in)
    assert not hf["model.layers.1.self_attn.o_proj.bias"].any()  # Llama's one attention_bias
    assert ("lm_head.weight" in hf) is not tied
    back = state_dict_from_hf(hf, config_from_hf(config_to_hf(config)), model_type="llama")
    for name, value in back.items():
        assert np.array_equal(value, state.get(name, np.zeros_like(value))), name


@pytest.mark.parametrize("how", ["copy", "transpose", "stacked", "joined", "per_head",
                                 "per_head_bias"])  # fmt: skip
def test_every_layout_inverts(how):
    from glassllm.hf.tensors import from_hf, source_shapes, to_hf

    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=4, n_embd=8, n_kv_head=2)
    if how in ("per_head", "per_head_bias"):
        config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=4, n_embd=8)
    H, KV, hd = config.n_head, config.kv_heads, config.head_size
    shape = {"copy": (8,), "transpose": (8, 5), "stacked": (8, (H + 2 * KV) * hd),
             "joined": ((H + 2 * KV) * hd,), "per_head": (8, 3 * H * hd),
             "per_head_bias": (3 * H * hd,)}[how]  # fmt: skip
    rng = np.random.default_rng(0)
    sources = [rng.standard_normal(s).astype(np.float32) for s in source_shapes(how, shape, config)]
    ours = from_hf(how, sources, config)
    assert ours.shape == shape
    assert all(np.array_equal(a, b) for a, b in zip(to_hf(how, ours, config), sources, strict=True))
    if how == "per_head":  # GPT-NeoX's rows [h0: q k v][h1: q k v]... become [q | k | v] columns
        rows = sources[0].reshape(H, 3, hd, 8)
        assert np.array_equal(ours[:, hd : 2 * hd], rows[1, 0].T)  # query head 1
        assert np.array_equal(ours[:, (H + 2) * hd : (H + 3) * hd], rows[2, 1].T)  # key head 2
