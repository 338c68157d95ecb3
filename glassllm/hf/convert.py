"""Hugging Face <-> glassllm GPT: configurations and tensors, both ways, without files.

Every family's configuration is read by `glassllm.hf.configs` and its tensors mapped by the tables
of `glassllm.hf.families` (`state_dict_from_hf` with ``model_type``); the GPT-2 names below are
kept here as plain renames, GPT-2 being the family glassllm's own names come from.

glassllm's GPT with ``bias=True`` computes GPT-2 exactly (pre-LayerNorm, eps 1e-5, tanh GELU, tied
head, learned positions), and HF's ``Conv1D`` stores its weight ``(in, out)`` as glassllm's
``Linear`` does: converting is a rename, no tensor is transposed or changed::

    HF GPT-2 (optional "transformer." prefix)   glassllm
    wte.weight                                  wte.weight (also the output head)
    wpe.weight                                  wpe.weight
    h.{i}.ln_1.weight / .bias                   blocks.{i}.ln_1.weight / .bias
    h.{i}.attn.c_attn.weight / .bias            blocks.{i}.attn.qkv.weight / .bias
    h.{i}.attn.c_proj.weight / .bias            blocks.{i}.attn.proj.weight / .bias
    h.{i}.ln_2.weight / .bias                   blocks.{i}.ln_2.weight / .bias
    h.{i}.mlp.c_fc.weight / .bias               blocks.{i}.mlp.fc.weight / .bias
    h.{i}.mlp.c_proj.weight / .bias             blocks.{i}.mlp.proj.weight / .bias
    ln_f.weight / .bias                         ln_f.weight / .bias
    h.{i}.attn.bias, h.{i}.attn.masked_bias     (dropped: causal-mask buffers, not weights)
    lm_head.weight                              (dropped when equal to wte.weight: the tied head)

Files in the wild use both spellings: the original ``gpt2`` repository has no prefix and stores the
mask buffers; transformers' own ``save_pretrained`` writes the prefix and no buffers.

>>> name_from_hf("transformer.h.3.attn.c_attn.weight"), name_from_hf("h.3.attn.bias")
('blocks.3.attn.qkv.weight', None)
>>> name_to_hf("blocks.0.mlp.proj.bias")
'transformer.h.0.mlp.c_proj.bias'
>>> config_from_hf({"model_type": "gpt2", "n_layer": 6}).n_embd   # the rest: GPT-2's defaults
768
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm.hf.configs import SHAPE_KEYS as _SHAPE_KEYS
from glassllm.hf.configs import config_from_hf
from glassllm.hf.families import FAMILIES
from glassllm.hf.targets import config_to_hf, state_dict_to_hf
from glassllm.hf.tensors import from_hf, plan
from glassllm.hf.tensors import head_problems as _head_problems
from glassllm.hf.untrusted import HFFormatError
from glassllm.models.gpt import GPTConfig, parameter_shapes

__all__ = ["HEAD", "PREFIX", "HFFormatError", "config_from_hf", "config_to_hf", "expected_shapes",
           "name_from_hf", "name_to_hf", "rename_from_hf", "state_dict_from_hf",
           "state_dict_to_hf"]  # fmt: skip

PREFIX = "transformer."
HEAD = "lm_head.weight"
# Per-block names: HF suffix -> glassllm suffix.
_BLOCK_NAMES = {
    "ln_1": "ln_1",
    "attn.c_attn": "attn.qkv",
    "attn.c_proj": "attn.proj",
    "ln_2": "ln_2",
    "mlp.c_fc": "mlp.fc",
    "mlp.c_proj": "mlp.proj",
}
_TO_HF_BLOCK = {ours: theirs for theirs, ours in _BLOCK_NAMES.items()}
_HF_BLOCK = re.compile(r"h\.(\d+)\.(ln_1|ln_2|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.")
_OUR_BLOCK = re.compile(r"blocks\.(\d+)\.(ln_1|ln_2|attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.")
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


# ---------------------------------------------------------------------------- tensor names

# The table of glassllm's tensor names and shapes is the model's own; its name here before it
# moved to glassllm.models.gpt.
expected_shapes = parameter_shapes


def name_from_hf(name: str) -> str | None:
    """The glassllm name of an HF GPT-2 tensor name (prefix optional); None for a mask buffer,
    the unchanged name for anything unknown (the caller reports it as unexpected)."""
    bare = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    if _MASK_BUFFER.fullmatch(bare):
        return None
    match = _HF_BLOCK.match(bare)
    if match:
        i, layer = match.groups()
        return f"blocks.{i}.{_BLOCK_NAMES[layer]}.{bare[match.end() :]}"
    return bare


def name_to_hf(name: str, prefix: bool = True) -> str:
    """The HF GPT-2 name of a glassllm tensor name, with the ``transformer.`` prefix by default."""
    match = _OUR_BLOCK.match(name)
    if match:
        i, layer = match.groups()
        name = f"h.{i}.{_TO_HF_BLOCK[layer]}.{name[match.end() :]}"
    return PREFIX + name if prefix else name


def rename_from_hf(
    shapes: Mapping[str, tuple[int, ...]], config: GPTConfig, model_type: str = "gpt2"
) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Match HF tensor names (with their shapes) to the glassllm GPT of ``config``: ``({glassllm
    name: its HF source names}, problems)``, problems listing every missing, unexpected,
    duplicated and mis-shaped tensor (`glassllm.hf.tensors.plan`)."""
    found, problems = plan(shapes, config, FAMILIES[model_type], _SHAPE_KEYS[model_type])
    return {ours: names for ours, (_, names) in found.sources.items()}, problems


def state_dict_from_hf(
    tensors: Mapping[str, np.ndarray],
    config: GPTConfig,
    dtype: Any = np.float32,
    model_type: str = "gpt2",
) -> dict[str, np.ndarray]:
    """glassllm's state dict (for ``GPT(config).load_state_dict``) from the tensors of a Hugging
    Face ``model_type`` file (torch layout, transformers' names).

    Every problem (missing, unexpected, duplicated, mis-shaped tensors, a stored tied head that is
    not the embedding) is listed in one HFFormatError. Arrays are converted to ``dtype``.
    """
    family = FAMILIES[model_type]
    shapes = {name: np.shape(value) for name, value in tensors.items()}
    found, problems = plan(shapes, config, family, _SHAPE_KEYS[model_type])
    embedding = found.sources.get("wte.weight", (None, ("",)))[1][0]
    if found.head is not None and embedding in tensors:
        problems += _head_problems(tensors[found.head], tensors[embedding], found.head, embedding)
    if problems:
        raise HFFormatError(f"cannot convert the {model_type} tensors", problems)
    return {
        ours: np.ascontiguousarray(
            from_hf(how, [np.asarray(tensors[n], dtype=dtype) for n in names], config)
        )
        for ours, (how, names) in found.sources.items()
    }


def head_problems(head: np.ndarray, wte: np.ndarray) -> list[str]:
    """[] when a stored GPT-2 ``lm_head.weight`` is the tied ``wte.weight``, else the problem."""
    return _head_problems(head, wte, HEAD, "wte.weight")
