"""glassllm.hf.configs on the config.json files of the models people use (as the Hub carries them:
transformers-4 spelling), without torch: each is the GPTConfig it should be. With transformers
installed, each is also held to what transformers' own config class makes of the same file."""

from __future__ import annotations

import pytest
from conftest import optional

from glassllm.hf import config_from_hf

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "vocab_size": 49152,
}
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
TINYLLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
PYTHIA_70M = {
    "architectures": ["GPTNeoXForCausalLM"],
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "gelu",
    "hidden_size": 512,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 8,
    "num_hidden_layers": 6,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "use_parallel_residual": True,
    "vocab_size": 50304,
}
TINYSTORIES_33M = {
    "activation_function": "gelu_new", "architectures": ["GPTNeoForCausalLM"],
    "attention_dropout": 0, "attention_layers": ["global", "local", "global", "local"],
    "attention_types": [[["global", "local"], 2]], "bos_token_id": 50256, "embed_dropout": 0,
    "eos_token_id": 50256, "gradient_checkpointing": False, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": None, "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neo", "num_heads": 16, "num_layers": 4,
    "resid_dropout": 0, "torch_dtype": "float32", "use_cache": True, "vocab_size": 50257,
    "window_size": 256,
}  # fmt: skip

CASES = {
    "SmolLM2-135M": (SMOLLM2_135M, dict(
        vocab_size=49152, block_size=8192, n_layer=30, n_head=9, n_embd=576, n_kv_head=3,
        head_dim=None, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", mlp_hidden=1536,
        positions="rotary", rope_theta=100000.0, rope_scaling=None, tied_head=True,
        bias=False, qkv_bias=False, attn_out_bias=False, mlp_bias=False)),
    "Llama-3.2-1B": (LLAMA_32_1B, dict(
        block_size=131072, n_kv_head=8, head_dim=None, tied_head=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "TinyLlama-1.1B": (TINYLLAMA, dict(n_kv_head=4, tied_head=False, mlp_hidden=5632)),
    "Qwen2.5-0.5B": (QWEN25_05B, dict(
        n_head=14, n_kv_head=2, qkv_bias=True, attn_out_bias=False, mlp_bias=False,
        norm_eps=1e-6, rope_theta=1e6, local_layers=(), attention_window=None, tied_head=True)),
    "Qwen3-0.6B": (QWEN3_06B, dict(
        n_embd=1024, n_head=16, head_dim=128, n_kv_head=8, qk_norm=True, qkv_bias=False,
        block_size=40960, tied_head=True)),
    "Pythia-70m": (PYTHIA_70M, dict(
        vocab_size=50304, norm="layernorm", mlp="gelu", positions="rotary", rotary_dim=16,
        parallel_residual=True, tied_head=False, bias=True, qkv_bias=True, mlp_hidden=2048)),
    "TinyStories-33M": (TINYSTORIES_33M, dict(
        n_layer=4, n_head=16, n_embd=768, positions="learned", mlp="gelu_tanh", mlp_hidden=None,
        local_layers=(1, 3), attention_window=256, attention_scale=1.0, qkv_bias=False,
        attn_out_bias=None, bias=True, tied_head=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_the_configs_of_models_in_use(name):
    hf, fields = CASES[name]
    config = config_from_hf(hf)
    for field, value in fields.items():
        assert getattr(config, field) == value, field


@pytest.mark.parametrize("name", list(CASES))
def test_they_mean_what_transformers_makes_of_them(name):
    transformers = optional("transformers")
    hf, _ = CASES[name]
    config = config_from_hf(hf)
    theirs = transformers.AutoConfig.for_model(**hf)
    assert theirs.vocab_size == config.vocab_size
    assert theirs.max_position_embeddings == config.block_size
    assert theirs.hidden_size == config.n_embd
    assert getattr(theirs, "num_hidden_layers", getattr(theirs, "num_layers", None)) == (
        config.n_layer
    )
    assert theirs.tie_word_embeddings == config.tied_head
    rope = getattr(theirs, "rope_parameters", None) or {}
    if config.positions == "rotary":
        assert rope["rope_theta"] == config.rope_theta
        scaling = {
            k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")
        }
        if scaling["rope_type"] == "default":
            assert config.rope_scaling is None
        else:
            assert scaling == config.rope_scaling
        head_dim = getattr(theirs, "head_dim", theirs.hidden_size // theirs.num_attention_heads)
        assert head_dim == config.head_size
        assert int(head_dim * rope.get("partial_rotary_factor", 1.0)) == config.rotary_size
    layer_types = getattr(theirs, "layer_types", None) or getattr(theirs, "attention_layers", [])
    local = tuple(i for i, t in enumerate(layer_types) if t in ("sliding_attention", "local"))
    assert local == config.local_layers


def test_a_rope_interleaved_file_is_refused():
    from glassllm.hf import HFFormatError

    with pytest.raises(HFFormatError, match="rope_interleaved=True"):
        config_from_hf({**SMOLLM2_135M, "rope_interleaved": True})
