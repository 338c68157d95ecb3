"""The Hugging Face model families glassllm reads, as tables: for each ``model_type``, where each
glassllm parameter (`glassllm.models.gpt.parameter_shapes`) lives in the files transformers'
``save_pretrained`` writes, and how its layout differs.

transformers stores a ``torch.nn.Linear`` weight ``(out, in)``; glassllm's `Linear` stores
``(in, out)`` (``y = x @ W``), so those weights are transposed. GPT-2's ``Conv1D`` is ``(in,
out)`` already. glassllm packs the attention's input projection in one matrix ``attn.qkv`` of
columns ``[q heads | k heads | v heads]``; Llama-style files keep q, k and v apart (their rows are
stacked), GPT-NeoX packs them per head (``[h0: q k v][h1: q k v]...``), GPT-2 as glassllm does.

How a glassllm tensor is made from the file's tensors ``sources`` (torch layout):

======================  ==========================================================
``COPY``                the one source as it is (embeddings, norms, biases, Conv1D)
``TRANSPOSE``           the one source transposed (an nn.Linear weight)
``STACKED``             q, k, v rows stacked, then transposed (``attn.qkv.weight``)
``JOINED``              q, k, v biases joined (``attn.qkv.bias``)
``PER_HEAD``            GPT-NeoX's per-head q/k/v rows regrouped, then transposed
``PER_HEAD_BIAS``       the same for its bias
======================  ==========================================================

>>> FAMILIES["llama"].tensors["blocks.{i}.attn.qkv.weight"][0]
'stacked'
>>> sorted(FAMILIES)
['gpt2', 'gpt_neo', 'gpt_neox', 'llama', 'qwen2', 'qwen3']
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

COPY, TRANSPOSE, STACKED, JOINED, PER_HEAD, PER_HEAD_BIAS = (
    "copy", "transpose", "stacked", "joined", "per_head", "per_head_bias"
)  # fmt: skip

# glassllm parameter (``{i}``: the block) -> (how, transformers tensor names).
Table = Mapping[str, tuple[str, tuple[str, ...]]]


@dataclasses.dataclass(frozen=True)
class Family:
    """One ``model_type``: its tensors, its blocks' name prefix, and what its files hold that is
    not a weight (mask and frequency buffers older transformers saved)."""

    model_type: str
    architecture: str  # transformers' class, config.json's "architectures"
    blocks: str  # the name prefix of block i, without the i: "model.layers."
    tensors: Table
    buffers: tuple[str, ...] = ()  # regular expressions of names to drop
    optional_prefix: str = ""  # GPT-2 files are written with and without "transformer."
    # Other names of a tensor: a model's state_dict may name it otherwise than its files do.
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def block_index(self) -> re.Pattern[str]:
        """Matches a tensor name of a block; group 1 is the block's index."""
        return re.compile(re.escape(self.blocks) + r"(\d+)\.")

    def is_buffer(self, name: str) -> bool:
        return any(re.fullmatch(pattern, name) for pattern in self.buffers)


def _qkv(prefix: str, suffix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{p}{suffix}" for p in ("q", "k", "v"))


_L = "model.layers.{i}."
LLAMA: Table = {
    # glassllm                          how        transformers
    "wte.weight":                       (COPY,      ("model.embed_tokens.weight",)),
    "blocks.{i}.ln_1.weight":           (COPY,      (_L + "input_layernorm.weight",)),
    "blocks.{i}.attn.qkv.weight":       (STACKED,   _qkv(_L + "self_attn.", "_proj.weight")),
    "blocks.{i}.attn.qkv.bias":         (JOINED,    _qkv(_L + "self_attn.", "_proj.bias")),
    "blocks.{i}.attn.q_norm.weight":    (COPY,      (_L + "self_attn.q_norm.weight",)),
    "blocks.{i}.attn.k_norm.weight":    (COPY,      (_L + "self_attn.k_norm.weight",)),
    "blocks.{i}.attn.proj.weight":      (TRANSPOSE, (_L + "self_attn.o_proj.weight",)),
    "blocks.{i}.attn.proj.bias":        (COPY,      (_L + "self_attn.o_proj.bias",)),
    "blocks.{i}.ln_2.weight":           (COPY,      (_L + "post_attention_layernorm.weight",)),
    "blocks.{i}.mlp.gate.weight":       (TRANSPOSE, (_L + "mlp.gate_proj.weight",)),
    "blocks.{i}.mlp.gate.bias":         (COPY,      (_L + "mlp.gate_proj.bias",)),
    "blocks.{i}.mlp.up.weight":         (TRANSPOSE, (_L + "mlp.up_proj.weight",)),
    "blocks.{i}.mlp.up.bias":           (COPY,      (_L + "mlp.up_proj.bias",)),
    "blocks.{i}.mlp.proj.weight":       (TRANSPOSE, (_L + "mlp.down_proj.weight",)),
    "blocks.{i}.mlp.proj.bias":         (COPY,      (_L + "mlp.down_proj.bias",)),
    "ln_f.weight":                      (COPY,      ("model.norm.weight",)),
    "lm_head.weight":                   (TRANSPOSE, ("lm_head.weight",)),
}  # fmt: skip

_X = "gpt_neox.layers.{i}."
GPT_NEOX: Table = {
    "wte.weight":                       (COPY,      ("gpt_neox.embed_in.weight",)),
    "blocks.{i}.ln_1.weight":           (COPY,      (_X + "input_layernorm.weight",)),
    "blocks.{i}.ln_1.bias":             (COPY,      (_X + "input_layernorm.bias",)),
    "blocks.{i}.attn.qkv.weight":       (PER_HEAD,  (_X + "attention.query_key_value.weight",)),
    "blocks.{i}.attn.qkv.bias":         (PER_HEAD_BIAS, (_X + "attention.query_key_value.bias",)),
    "blocks.{i}.attn.proj.weight":      (TRANSPOSE, (_X + "attention.dense.weight",)),
    "blocks.{i}.attn.proj.bias":        (COPY,      (_X + "attention.dense.bias",)),
    "blocks.{i}.ln_2.weight":           (COPY,      (_X + "post_attention_layernorm.weight",)),
    "blocks.{i}.ln_2.bias":             (COPY,      (_X + "post_attention_layernorm.bias",)),
    "blocks.{i}.mlp.fc.weight":         (TRANSPOSE, (_X + "mlp.dense_h_to_4h.weight",)),
    "blocks.{i}.mlp.fc.bias":           (COPY,      (_X + "mlp.dense_h_to_4h.bias",)),
    "blocks.{i}.mlp.proj.weight":       (TRANSPOSE, (_X + "mlp.dense_4h_to_h.weight",)),
    "blocks.{i}.mlp.proj.bias":         (COPY,      (_X + "mlp.dense_4h_to_h.bias",)),
    "ln_f.weight":                      (COPY,      ("gpt_neox.final_layer_norm.weight",)),
    "ln_f.bias":                        (COPY,      ("gpt_neox.final_layer_norm.bias",)),
    "lm_head.weight":                   (TRANSPOSE, ("embed_out.weight",)),
}  # fmt: skip

_N = "transformer.h.{i}."
GPT_NEO: Table = {
    "wte.weight":                       (COPY,      ("transformer.wte.weight",)),
    "wpe.weight":                       (COPY,      ("transformer.wpe.weight",)),
    "blocks.{i}.ln_1.weight":           (COPY,      (_N + "ln_1.weight",)),
    "blocks.{i}.ln_1.bias":             (COPY,      (_N + "ln_1.bias",)),
    "blocks.{i}.attn.qkv.weight":       (STACKED,   _qkv(_N + "attn.attention.", "_proj.weight")),
    "blocks.{i}.attn.proj.weight":      (TRANSPOSE, (_N + "attn.attention.out_proj.weight",)),
    "blocks.{i}.attn.proj.bias":        (COPY,      (_N + "attn.attention.out_proj.bias",)),
    "blocks.{i}.ln_2.weight":           (COPY,      (_N + "ln_2.weight",)),
    "blocks.{i}.ln_2.bias":             (COPY,      (_N + "ln_2.bias",)),
    "blocks.{i}.mlp.fc.weight":         (TRANSPOSE, (_N + "mlp.c_fc.weight",)),
    "blocks.{i}.mlp.fc.bias":           (COPY,      (_N + "mlp.c_fc.bias",)),
    "blocks.{i}.mlp.proj.weight":       (TRANSPOSE, (_N + "mlp.c_proj.weight",)),
    "blocks.{i}.mlp.proj.bias":         (COPY,      (_N + "mlp.c_proj.bias",)),
    "ln_f.weight":                      (COPY,      ("transformer.ln_f.weight",)),
    "ln_f.bias":                        (COPY,      ("transformer.ln_f.bias",)),
    "lm_head.weight":                   (TRANSPOSE, ("lm_head.weight",)),
}  # fmt: skip

# GPT-2's Conv1D is (in, out) like glassllm's Linear: a rename, but for an untied nn.Linear head.
GPT2: Table = {
    "wte.weight":                       (COPY,      ("transformer.wte.weight",)),
    "wpe.weight":                       (COPY,      ("transformer.wpe.weight",)),
    **{
        f"blocks.{{i}}.{ours}.{kind}":  (COPY,      (f"transformer.h.{{i}}.{theirs}.{kind}",))
        for ours, theirs in (("ln_1", "ln_1"), ("attn.qkv", "attn.c_attn"),
                             ("attn.proj", "attn.c_proj"), ("ln_2", "ln_2"),
                             ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj"))
        for kind in ("weight", "bias")
    },
    "ln_f.weight":                      (COPY,      ("transformer.ln_f.weight",)),
    "ln_f.bias":                        (COPY,      ("transformer.ln_f.bias",)),
    "lm_head.weight":                   (TRANSPOSE, ("lm_head.weight",)),
}  # fmt: skip

# Buffers older transformers versions saved: causal masks and RoPE frequencies, not weights.
_ROPE_FREQUENCIES = r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"
FAMILIES: dict[str, Family] = {
    "gpt2": Family("gpt2", "GPT2LMHeadModel", "transformer.h.", GPT2,
                   (r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",), "transformer."),
    "llama": Family("llama", "LlamaForCausalLM", "model.layers.", LLAMA, (_ROPE_FREQUENCIES,)),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "model.layers.", LLAMA, (_ROPE_FREQUENCIES,)),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "model.layers.", LLAMA, (_ROPE_FREQUENCIES,)),
    "gpt_neox": Family("gpt_neox", "GPTNeoXForCausalLM", "gpt_neox.layers.", GPT_NEOX,
                       (r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\."
                        r"inv_freq)",), aliases={"lm_head.weight": "embed_out.weight"}),
    "gpt_neo": Family("gpt_neo", "GPTNeoForCausalLM", "transformer.h.", GPT_NEO,
                      (r"transformer\.h\.\d+\.attn\.attention\.(bias|masked_bias)",)),
}  # fmt: skip
