"""A GGUF file's metadata and tensors as the ``config.json`` dict and the ``state_dict`` names a
Hugging Face directory of the same model has (what `glassllm.hf.model_from_hf` takes).

Architectures: ``llama`` (SmolLM2, Llama-3.2, TinyLlama), ``qwen2`` (Qwen2.5: q/k/v biases),
``qwen3`` (QK-norm). Any other ``general.architecture``, and any key of the architecture's
namespace that changes the computation but is not mapped here (rope scaling, a sliding window,
experts, ...), is refused by name, never ignored.

llama.cpp's converter permutes the rows of a Llama ``q``/``k`` projection so that its interleaved
RoPE (pairs ``2i, 2i+1``) computes what transformers' half-split RoPE computes on the original
rows; `unpermute` puts them back. Qwen2/3 use the half-split ("NeoX") RoPE in llama.cpp too, and
their rows are stored unpermuted.

>>> stored = np.array([0, 4, 1, 5, 2, 6, 3, 7], dtype=np.float32)  # one head's rows 0..7 as
>>> unpermute(stored.reshape(8, 1), 1)[:, 0].tolist()               # llama.cpp orders them
[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm._text import listed, shown
from glassllm.gguf.header import GGUFHeader

# general.architecture -> transformers' model_type and class
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
# "{arch}.X" metadata -> config.json key (the names transformers' GGUF loader uses)
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
# "{arch}.X" keys read for checks only: the rotary width must be the head width, the value
# width the key width (neither family sets them otherwise)
CHECKED_KEYS = ("rope.dimension_count", "attention.value_length")
# "{arch}.X" keys that describe and do not change the computation
INERT_KEYS = ("tensor_data_layout",)
MAX_LAYERS = 4096

# GGUF tensor name -> transformers' name; {i} is the block
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(.+)")


def _problem(subject: str, problems: list[str]) -> Exception:
    from glassllm.gguf.header import GGUFFormatError

    return GGUFFormatError(subject, problems)


def architecture_of(header: GGUFHeader) -> str:
    """``general.architecture``, when glassllm maps it; else GGUFFormatError naming it."""
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        holds = f"it holds a {shown(arch)} model" if arch else "no general.architecture"
        raise _problem(
            str(header.path),
            [f"{holds}; glassllm reads GGUF architectures {listed(ARCHITECTURES)}"],
        )
    return arch


def hf_config(header: GGUFHeader) -> dict[str, Any]:
    """The transformers ``config.json`` dict of the file's model (v4 spelling: ``rope_theta``)."""
    arch = architecture_of(header)
    meta = header.metadata
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in meta.items():
        if not key.startswith(arch + "."):
            if key.startswith("split."):
                problems.append(f"{key}: a model split over several files (glassllm reads one)")
            continue
        field = key[len(arch) + 1 :]
        if field in CONFIG_KEYS or field in CHECKED_KEYS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                problems.append(f"{key} must be a positive number, got {shown(value)}")
            else:
                values[field] = value
        elif field not in INERT_KEYS:
            problems.append(f"{key} = {shown(value)} is not supported (glassllm cannot honour it)")
    problems += [f"no {arch}.{field}" for field in REQUIRED if field not in values]
    if problems:
        raise _problem(str(header.path), problems)
    config: dict[str, Any] = {CONFIG_KEYS[f]: v for f, v in values.items() if f in CONFIG_KEYS}
    integers = [
        k for k, v in config.items() if k not in ("rope_theta", "rms_norm_eps") and v != int(v)
    ]
    if integers:
        raise _problem(str(header.path), [f"{listed(integers)} must be integers"])
    config = {k: (v if k in ("rope_theta", "rms_norm_eps") else int(v)) for k, v in config.items()}
    model_type, cls = ARCHITECTURES[arch]
    heads = config["num_attention_heads"]
    config.setdefault("num_key_value_heads", heads)
    if config["hidden_size"] % heads and "head_dim" not in config:
        raise _problem(
            str(header.path), [f"{arch}.embedding_length is not a multiple of the heads"]
        )
    head_dim = config.setdefault("head_dim", config["hidden_size"] // heads)
    for field in CHECKED_KEYS:
        if field in values and values[field] != head_dim:
            raise _problem(
                str(header.path),
                [
                    f"{arch}.{field} = {values[field]} differs from the head width {head_dim} "
                    "(partial rotary or a different value width: not supported)"
                ],
            )
    if config["num_hidden_layers"] > MAX_LAYERS:
        raise _problem(str(header.path), [f"{arch}.block_count is over {MAX_LAYERS}"])
    embed = header.tensors.get("token_embd.weight")
    if "vocab_size" not in config and embed is not None:
        config["vocab_size"] = embed.shape[0]
    config.setdefault("rms_norm_eps", 1e-5 if arch == "llama" else 1e-6)
    config.setdefault("rope_theta", 10000.0)
    config.setdefault("max_position_embeddings", 2048)
    return {
        "model_type": model_type,
        "architectures": [cls],
        **config,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in header.tensors,
        **({"attention_bias": False, "mlp_bias": False} if arch == "llama" else {}),
        **_special_ids(meta),
    }


def _special_ids(meta: Mapping[str, Any]) -> dict[str, int]:
    names = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"}
    names["pad_token_id"] = "padding_token_id"
    return {
        ours: meta[f"tokenizer.ggml.{theirs}"]
        for ours, theirs in names.items()
        if isinstance(meta.get(f"tokenizer.ggml.{theirs}"), int)
    }


def hf_name(gguf_name: str) -> str | None:
    """transformers' name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``), None when it has none."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_NAME.fullmatch(gguf_name)
    if match and match.group(2) in BLOCK_TENSORS:
        return f"model.layers.{int(match.group(1))}.{BLOCK_TENSORS[match.group(2)]}"
    return None


def tensor_names(header: GGUFHeader, config: Mapping[str, Any]) -> dict[str, str]:
    """``{GGUF name: transformers name}`` of every tensor; a tensor without a transformers name
    (``rope_freqs.weight``: Llama-3's frequency factors, ...) or of a block the config does not
    have is refused by name."""
    layers = config["num_hidden_layers"]
    names, unknown = {}, []
    for name in header.tensors:
        ours = hf_name(name)
        match = _BLOCK_NAME.fullmatch(name)
        if ours is None or (match and int(match.group(1)) >= layers):
            unknown.append(name)
        else:
            names[name] = ours
    if unknown:
        raise _problem(
            str(header.path),
            [f"tensors glassllm cannot place in a {config['model_type']} model: {listed(unknown)}"],
        )
    return names


def permuted_heads(name: str, config: Mapping[str, Any]) -> int | None:
    """The heads whose rows llama.cpp permuted in the tensor ``name`` (a Llama q or k
    projection), None for any other tensor."""
    if config["model_type"] != "llama" or name.split(".")[-2] not in ("attn_q", "attn_k"):
        return None
    return config["num_attention_heads" if ".attn_q." in name else "num_key_value_heads"]


def unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a Llama q or k projection (out, ...) with ``n_head``
    heads: within each head, rows ``(0, d/2, 1, d/2+1, ...)`` back to ``(0, 1, ..., d-1)``."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of pairs")
    grouped = weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2)).reshape(weights.shape)
