"""Hugging Face GPT-2 <-> glassllm GPT: configurations and tensor names, both ways, without files.

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

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm.hf.untrusted import HFFormatError, listed, shown
from glassllm.models.gpt import (
    MAX_CONTEXT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    GPTConfig,
    parameter_shapes,
)
from glassllm.models.gpt import size_problems as gpt_size_problems

PREFIX = "transformer."
HEAD = "lm_head.weight"
# Activation names whose function is GELU's tanh approximation, glassllm's GELU(approximate="tanh").
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
LAYER_NORM_EPS = 1e-5
# GPT2Config's defaults: transformers uses them for any key a config.json leaves out.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}
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
_BLOCK_INDEX = re.compile(r"h\.(\d+)\.")
# The shape keys of config.json and their bounds.
_SHAPE_KEYS = {
    "vocab_size": MAX_VOCAB,
    "n_positions": MAX_CONTEXT,
    "n_embd": MAX_WIDTH,
    "n_layer": MAX_LAYERS,
    "n_head": MAX_HEADS,
}


# ---------------------------------------------------------------------------- configurations


def config_from_hf(hf: Mapping[str, Any], dropout: float = 0.0) -> GPTConfig:
    """The GPTConfig of a GPT-2 ``config.json`` (as a dict); every unsupported value is listed in
    one HFFormatError.

    Keys the file leaves out take GPT2Config's defaults, as transformers does; keys glassllm has no
    use for (``n_ctx``, ``*_pdrop``, ``summary_*``, token ids, ...) are ignored. ``dropout`` is the
    model's dropout (HF's three pdrop values are training settings, not part of the function).
    """
    if not isinstance(hf, Mapping):
        raise HFFormatError("config.json", [f"expected a JSON object, got {type(hf).__name__}"])
    model_type = hf.get("model_type")
    if model_type != "gpt2":
        only = "glassllm loads model_type 'gpt2' only"
        raise HFFormatError("config.json", [f"model_type is {shown(model_type)}; {only}"])
    values = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if k in HF_DEFAULTS}}
    problems = []
    shape = {}
    for key, most in _SHAPE_KEYS.items():
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
            problems.append(f"{key}={shown(value)} (must be an integer in [1, {most}])")
        shape[key] = value
    if not problems and shape["n_embd"] % shape["n_head"] != 0:
        problems.append(f"n_embd={shape['n_embd']} is not divisible by n_head={shape['n_head']}")
    n_inner = values["n_inner"]
    if n_inner is not None and not (
        isinstance(shape["n_embd"], int) and n_inner == 4 * shape["n_embd"]
    ):
        problems.append(f"n_inner={shown(n_inner)} (glassllm's MLP is 4 * n_embd wide)")
    if not isinstance(values["activation_function"], str) or (
        values["activation_function"] not in TANH_GELUS
    ):
        problems.append(
            f"activation_function={shown(values['activation_function'])} (glassllm supports "
            f"{', '.join(TANH_GELUS)})"
        )
    eps = values["layer_norm_epsilon"]
    if not isinstance(eps, float) or not math.isclose(eps, LAYER_NORM_EPS, rel_tol=1e-9):
        problems.append(
            f"layer_norm_epsilon={shown(eps)} (glassllm's LayerNorm uses {LAYER_NORM_EPS})"
        )
    for key, wanted in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if values[key] is not wanted:
            problems.append(f"{key}={shown(values[key])} (glassllm supports {wanted})")
    if values["tie_word_embeddings"] is not True:
        problems.append(
            f"tie_word_embeddings={shown(values['tie_word_embeddings'])} (an untied lm_head is not "
            "supported: glassllm's output head is wte.weight)"
        )
    if problems:
        raise HFFormatError("unsupported config.json values", problems)
    return GPTConfig(
        vocab_size=shape["vocab_size"],
        block_size=shape["n_positions"],
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        n_embd=shape["n_embd"],
        dropout=dropout,
        bias=True,
    )


def config_to_hf(
    config: GPTConfig, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    """A GPT-2 ``config.json`` dict for a glassllm GPT (``bias=False`` too: its biases are written
    as zeros). ``bos_token_id``/``eos_token_id`` should name the tokenizer's ``<|endoftext|>`` or
    stay None: transformers otherwise assumes GPT-2's 50256."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "dtype": "float32",
    }


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


def size_problems(shapes: Mapping[str, tuple[int, ...]], config: GPTConfig) -> list[str]:
    """Whether the HF tensors ``shapes`` hold a model of ``config``'s size (`glassllm.models.gpt.
    size_problems`, every ``h.N.`` tensor counting for block N). Cheap whatever ``config`` says:
    checked before anything (`parameter_shapes` included) is sized from the configuration."""
    ours: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        bare = name[len(PREFIX) :] if name.startswith(PREFIX) else name
        block = _BLOCK_INDEX.match(bare)
        ours.setdefault(f"blocks.{block.group(1)}.{bare[block.end() :]}" if block else bare, shape)
    return gpt_size_problems(ours, config, "config.json", keys={"block_size": "n_positions"})


def rename_from_hf(
    shapes: Mapping[str, tuple[int, ...]], config: GPTConfig
) -> tuple[dict[str, str], list[str]]:
    """Match HF tensor names (with their shapes) to the glassllm GPT of ``config``.

    Returns ``({glassllm name: HF name}, problems)``: problems list every missing, unexpected,
    duplicated and mis-shaped tensor; only `size_problems` when the tensors are not a model of
    ``config``'s size (then nothing is matched). ``lm_head.weight`` is neither: the caller checks
    that it equals ``wte.weight`` (a tied head); mask buffers are dropped.
    """
    problems = size_problems(shapes, config)
    if problems:
        return {}, problems
    wanted = parameter_shapes(config)
    sources: dict[str, str] = {}
    unexpected, duplicated, wrong = [], [], []
    for hf_name, shape in shapes.items():
        if hf_name in (HEAD, PREFIX + HEAD):
            continue
        ours = name_from_hf(hf_name)
        if ours is None:
            continue
        if ours not in wanted:
            unexpected.append(hf_name)
        elif ours in sources:
            duplicated.append(f"{sources[ours]} and {hf_name}")
        else:
            sources[ours] = hf_name
            if tuple(shape) != wanted[ours]:
                wrong.append(f"{hf_name} {shown(tuple(shape))} (expected {wanted[ours]})")
    missing = [name_to_hf(ours, prefix=False) for ours in wanted if ours not in sources]
    problems = []
    if missing:
        problems.append(f"missing tensors: {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {listed(unexpected)}")
    if duplicated:
        problems.append(f"tensors given twice: {listed(duplicated)}")
    if wrong:
        problems.append(f"wrong shapes: {listed(wrong)}")
    return sources, problems


def state_dict_from_hf(
    tensors: Mapping[str, np.ndarray], config: GPTConfig, dtype: Any = np.float32
) -> dict[str, np.ndarray]:
    """glassllm's state dict (for ``GPT(config).load_state_dict``) from HF GPT-2 tensors.

    Every problem (missing, unexpected, duplicated, mis-shaped tensors, an ``lm_head.weight``
    that is not ``wte.weight``) is listed in one HFFormatError. Arrays are converted to ``dtype``.
    """
    shapes = {name: np.shape(value) for name, value in tensors.items()}
    sources, problems = rename_from_hf(shapes, config)
    head = next((tensors[n] for n in (HEAD, PREFIX + HEAD) if n in tensors), None)
    if head is not None and "wte.weight" in sources:
        problems += head_problems(head, tensors[sources["wte.weight"]])
    if problems:
        raise HFFormatError("cannot convert the GPT-2 tensors", problems)
    return {ours: np.asarray(tensors[theirs], dtype=dtype) for ours, theirs in sources.items()}


def head_problems(head: np.ndarray, wte: np.ndarray) -> list[str]:
    """[] when ``lm_head.weight`` is the tied ``wte.weight``, else the problem."""
    if np.shape(head) == np.shape(wte) and np.array_equal(head, wte):
        return []
    return ["an untied lm_head.weight (it differs from wte.weight) is not supported"]


def state_dict_to_hf(
    state: Mapping[str, np.ndarray], config: GPTConfig, prefix: bool = True
) -> dict[str, np.ndarray]:
    """HF GPT-2 tensors (float32, ``transformer.``-prefixed by default, no buffers, no
    ``lm_head.weight``) from a glassllm GPT's state dict. A ``bias=False`` model gets zero biases,
    which compute the same function."""
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
    if problems:
        raise HFFormatError("cannot write the model as GPT-2", problems)
    out = {}
    for name, shape in parameter_shapes(config, bias=True).items():
        value = state.get(name)
        array = np.zeros(shape, np.float32) if value is None else np.asarray(value, np.float32)
        out[name_to_hf(name, prefix)] = np.ascontiguousarray(array)
    return out
