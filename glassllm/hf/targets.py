"""A glassllm GPT as a Hugging Face model: which transformers class computes its configuration
exactly, that class's ``config.json``, and the tensors under its names (`state_dict_to_hf`).

Two classes are written: ``GPT2LMHeadModel`` for learned positions (GPT-2's layers) and
``LlamaForCausalLM`` for rotary ones (RMSNorm, SwiGLU, RoPE, grouped-query attention). A bias the
model lacks but the class has is written as zeros, which computes the same function; anything the
class cannot compute (QK-norm, a parallel residual, local attention layers, partial or
interleaved rotary, another attention scale, ...) is refused by name, never dropped.

>>> from glassllm.models import GPTConfig
>>> hf = config_to_hf(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=4))
>>> hf["architectures"], hf["n_positions"]
(['GPT2LMHeadModel'], 8)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm.hf.configs import config_from_hf
from glassllm.hf.families import FAMILIES, Family
from glassllm.hf.tensors import to_hf
from glassllm.hf.untrusted import HFFormatError, listed, shown
from glassllm.models.gpt import GPTConfig, parameter_shapes


def target_of(config: GPTConfig) -> Family:
    """The family a glassllm GPT is written as, or an HFFormatError naming every field no
    transformers class glassllm writes can represent."""
    family = FAMILIES["gpt2" if config.positions == "learned" else "llama"]
    problems = representation_problems(config, family)
    if problems:
        raise HFFormatError(f"cannot write the model as {family.architecture}", problems)
    return family


def representation_problems(config: GPTConfig, family: Family) -> list[str]:
    """What ``family``'s class cannot compute of ``config`` (GPTConfig field = value)."""
    H = config.n_head
    head_dim = config.head_dim or config.n_embd // H
    wanted: dict[str, tuple[Any, ...]] = {
        "qk_norm": (False,), "parallel_residual": (False,), "local_layers": ((),)
    }  # fmt: skip
    if family.model_type == "gpt2":
        wanted.update(norm=("layernorm",), n_kv_head=(None, H),
                      head_dim=(None, config.n_embd // H), mlp=("gelu_tanh", "gelu"),
                      attention_scale=(None, 1.0))  # fmt: skip
    else:
        wanted.update(norm=("rmsnorm",), mlp=("swiglu",), rotary_dim=(None, head_dim),
                      rotary_interleaved=(False,))  # fmt: skip
        scale = config.attention_scale
        if scale is not None and math.isclose(scale, head_dim**-0.5, rel_tol=1e-7):
            wanted["attention_scale"] = (scale,)
        else:
            wanted["attention_scale"] = (None,)
    problems = []
    for name, allowed in wanted.items():
        value = getattr(config, name)
        value = tuple(value) if isinstance(value, list) else value
        if value not in allowed:
            needs = " or ".join(map(repr, allowed))
            problems.append(f"{name}={shown(value)} ({family.architecture} needs {needs})")
    scaling = config.rope_scaling
    if (
        family.model_type != "gpt2"
        and scaling is not None
        and (scaling.get("rope_type") not in ("linear", "llama3"))
    ):
        problems.append(f"rope_scaling={shown(scaling)} (glassllm writes linear or llama3)")
    return problems


def config_to_hf(
    config: GPTConfig, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    """The ``config.json`` dict (transformers' spelling) of the class `target_of` picks.
    ``bos_token_id``/``eos_token_id`` should name the tokenizer's end-of-text token or stay
    None (GPT-2 otherwise assumes 50256)."""
    family = target_of(config)
    if family.model_type == "gpt2":
        return _gpt2(config, bos_token_id, eos_token_id)
    return _llama(config, bos_token_id, eos_token_id)


def _gpt2(config: GPTConfig, bos: int | None, eos: int | None) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.mlp_hidden,
        "activation_function": "gelu" if config.mlp == "gelu" else "gelu_new",
        "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": config.attention_scale is None,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": config.tied_head,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None,
        "dtype": "float32",
    }


def _biases(config: GPTConfig) -> tuple[bool, bool]:
    """(attention_bias, mlp_bias) of a Llama file: on when any of the layers has one (the others
    are written as zeros)."""
    return config.has_bias("qkv") or config.has_bias("attn_out"), config.has_bias("mlp")


def _llama(config: GPTConfig, bos: int | None, eos: int | None) -> dict[str, Any]:
    attention_bias, mlp_bias = _biases(config)
    rope: dict[str, Any] = {"rope_theta": float(config.rope_theta),
                            "rope_type": "default"}  # fmt: skip
    rope.update(config.rope_scaling or {})
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.block_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.mlp_hidden or 4 * config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head or config.n_head,
        "head_dim": config.head_dim or config.n_embd // config.n_head,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "rope_parameters": rope,
        "attention_bias": attention_bias,
        "mlp_bias": mlp_bias,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tied_head,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None,
        "dtype": "float32",
    }


def state_dict_to_hf(
    state: Mapping[str, np.ndarray], config: GPTConfig, prefix: bool = True
) -> dict[str, np.ndarray]:
    """The tensors (float32, torch layout, under the names of the class `target_of` picks) of a
    glassllm GPT's state dict; a bias the class has and the model lacks is written as zeros, a
    tied head not at all. ``prefix=False`` leaves GPT-2's ``transformer.`` prefix out."""
    problems = []
    wanted = parameter_shapes(config)
    missing = [name for name in wanted if name not in state]
    unexpected = [name for name in state if name not in wanted]
    if missing:
        problems.append(f"missing tensors: {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {listed(unexpected)}")
    problems += [
        f"{name} has shape {np.shape(state[name])}, expected {shape}"
        for name, shape in wanted.items()
        if name in state and np.shape(state[name]) != shape
    ]
    family = FAMILIES["gpt2" if config.positions == "learned" else "llama"]
    if problems:
        raise HFFormatError(f"cannot write the model as {family.architecture}", problems)
    family = target_of(config)
    written = config_from_hf(config_to_hf(config))  # the configuration the file will say
    out = {}
    for name, shape in parameter_shapes(written).items():
        value = state.get(name)
        array = np.zeros(shape, np.float32) if value is None else np.asarray(value, np.float32)
        block = name.split(".")[1] if name.startswith("blocks.") else None
        pattern = name.replace(f"blocks.{block}.", "blocks.{i}.") if block else name
        how, names = family.tensors[pattern]
        for hf_name, tensor in zip(names, to_hf(how, array, written), strict=True):
            hf_name = hf_name.format(i=block)
            if not prefix and family.optional_prefix and hf_name.startswith(family.optional_prefix):
                hf_name = hf_name[len(family.optional_prefix) :]
            out[hf_name] = tensor
    return out
