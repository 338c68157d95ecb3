"""A Hugging Face ``config.json`` (as a dict) -> the `GPTConfig` that computes the same function.

Six ``model_type`` values are read (`glassllm.hf.families`), in both spellings in use: the one
transformers 5 writes (``rope_parameters``, ``layer_types``, ``dtype``) and the one most files on
the Hub carry (``rope_theta``, ``rope_scaling``, ``rotary_pct``, ``rotary_emb_base``,
``use_sliding_window``, ``torch_dtype``). A key the file leaves out takes the default of
transformers' config class for that family, as transformers does. Every value is hostile until
checked: bounded, of the right type, and a value glassllm's model cannot compute exactly (an
unknown ``rope_type`` such as ``yarn``, an unknown activation, cross-attention, ...) is refused by
name; all problems are listed in one `HFFormatError`.

>>> config = config_from_hf({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
...     "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128})
>>> config.norm, config.mlp, config.positions, config.n_kv_head, config.tied_head
('rmsnorm', 'swiglu', 'rotary', 2, False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from glassllm.hf.families import FAMILIES
from glassllm.hf.untrusted import HFFormatError, shown
from glassllm.models.gpt import MAX_CONTEXT, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, GPTConfig

# A rotary model's context sizes no tensor (no wpe), so it may be long: Llama-3.2 says 131072.
MAX_ROTARY_CONTEXT = 2**24
MAX_THETA = 1e12
# Activation names -> glassllm's MLP (GPTConfig.mlp); transformers' ACT2FN spells them so.
GELUS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
SILUS = ("silu", "swish")
ROPE_KEYS = {  # rope_type -> the keys its parameters may hold (besides rope_type/type/rope_theta)
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}

# transformers' defaults for the keys each family reads (its config class's field defaults).
_LLAMA_LIKE = {"hidden_act": "silu", "tie_word_embeddings": False, "head_dim": None,
               "rms_norm_eps": 1e-6, "num_key_value_heads": None}  # fmt: skip
_SLIDING = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
            "layer_types": None}  # fmt: skip
DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
             "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
             "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
             "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
             "tie_word_embeddings": True},
    "llama": {**_LLAMA_LIKE, "vocab_size": 32000, "hidden_size": 4096,
              "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False},
    "qwen2": {**_LLAMA_LIKE, **_SLIDING, "vocab_size": 151936, "hidden_size": 4096,
              "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3": {**_LLAMA_LIKE, **_SLIDING, "vocab_size": 151936, "hidden_size": 4096,
              "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
              "attention_bias": False},
    "gpt_neox": {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44,
                 "num_attention_heads": 64, "intermediate_size": 24576, "hidden_act": "gelu",
                 "max_position_embeddings": 2048, "layer_norm_eps": 1e-5,
                 "tie_word_embeddings": False, "use_parallel_residual": True,
                 "attention_bias": True},
    "gpt_neo": {"vocab_size": 50257, "max_position_embeddings": 2048, "hidden_size": 2048,
                "num_layers": 24, "attention_types": [[["global", "local"], 12]],
                "num_heads": 16, "intermediate_size": None, "window_size": 256,
                "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                "tie_word_embeddings": True},
}  # fmt: skip
# Each family's names for the shape keys: (vocab, context, width, layers, heads).
SHAPE_KEYS = {
    "gpt2": ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"),
    "gpt_neo": ("vocab_size", "max_position_embeddings", "hidden_size", "num_layers", "num_heads"),
    **{t: ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers",
           "num_attention_heads") for t in ("llama", "qwen2", "qwen3", "gpt_neox")},
}  # fmt: skip


def config_from_hf(hf: Mapping[str, Any], dropout: float = 0.0) -> GPTConfig:
    """The GPTConfig of a Hugging Face ``config.json`` (as a dict) of a family glassllm reads;
    every unsupported value is listed in one HFFormatError. ``dropout`` is the model's dropout
    (the files' dropout values are training settings, not part of the function)."""
    if not isinstance(hf, Mapping):
        raise HFFormatError("config.json", [f"expected a JSON object, got {type(hf).__name__}"])
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise HFFormatError("config.json", [f"model_type is {shown(model_type)}; {supported()}"])
    values = _Values(model_type, hf)
    fields = _READERS[model_type](values)
    if "quantization_config" in hf:
        values.problems.append("quantization_config (quantized weights are not read)")
    if values.problems:
        raise HFFormatError("unsupported config.json values", values.problems)
    try:
        return GPTConfig(**fields, dropout=dropout)
    except ValueError as err:  # a combination the model refuses
        raise HFFormatError("unsupported config.json values", [str(err)]) from None


def supported() -> str:
    return f"glassllm loads model_type {', '.join(repr(t) for t in FAMILIES)}"


class _Values:
    """The keys of one config.json with transformers' defaults, read with bounds; each bad value
    adds a problem (and reads as None), so all of them are reported together."""

    def __init__(self, model_type: str, hf: Mapping[str, Any]) -> None:
        self.model_type, self.hf = model_type, hf
        self.values = {**DEFAULTS[model_type], **{k: v for k, v in hf.items()}}
        self.problems: list[str] = []

    def bad(self, key: str, why: str) -> None:
        self.problems.append(f"{key}={shown(self.values.get(key))} ({why})")

    def int(self, key: str, most: int, least: int = 1) -> int | None:
        value = self.values.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            self.bad(key, f"must be an integer in [{least}, {most}]")
            return None
        return value

    def number(self, key: str, low: float, high: float, value: Any = None) -> float | None:
        """A finite number in (low, high]."""
        value = self.values.get(key) if value is None else value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        # ints compare exactly whatever their size (10**400 too); floats must be finite
        ok = ok and (isinstance(value, int) or math.isfinite(value)) and low < value <= high
        if not ok:
            self.problems.append(f"{key}={shown(value)} (must be a number in ({low}, {high}])")
            return None
        return float(value)

    def flag(self, key: str) -> bool | None:
        value = self.values.get(key)
        if not isinstance(value, bool):
            self.bad(key, "must be true or false")
            return None
        return value

    def shape(self) -> tuple[Any, ...]:
        """(vocab_size, block_size, n_embd, n_layer, n_head), bounded."""
        vocab, context, width, layers, heads = SHAPE_KEYS[self.model_type]
        learned = self.model_type in ("gpt2", "gpt_neo")
        return (
            self.int(vocab, MAX_VOCAB),
            self.int(context, MAX_CONTEXT if learned else MAX_ROTARY_CONTEXT),
            self.int(width, MAX_WIDTH),
            self.int(layers, MAX_LAYERS),
            self.int(heads, MAX_HEADS),
        )

    def head_dim(self, width: int | None, heads: int | None, key: str = "head_dim") -> int | None:
        """The per-head width: ``head_dim`` when the file sets it, else width / heads."""
        if self.values.get(key) is not None:
            return self.int(key, MAX_WIDTH)
        if width is not None and heads is not None and width % heads:
            _, _, width_key, _, heads_key = SHAPE_KEYS[self.model_type]
            self.problems.append(f"{width_key}={width} is not divisible by {heads_key}={heads}")
            return None
        return None if width is None or heads is None else width // heads

    def mlp_width(self, key: str, width: int | None) -> int | None:
        if self.values.get(key) is None:
            return None if width is None else 4 * width
        return self.int(key, 4 * MAX_WIDTH)

    def gelu(self, key: str) -> str | None:
        name = self.values.get(key)
        if not isinstance(name, str) or name not in GELUS:
            self.bad(key, f"glassllm supports {', '.join(GELUS)}")
            return None
        return GELUS[name]


# ---------------------------------------------------------------------------- families


def _gpt2(v: _Values) -> dict[str, Any]:
    vocab, context, width, layers, heads = v.shape()
    v.head_dim(width, heads, key="")  # n_embd must divide into n_head heads
    mlp_hidden = v.mlp_width("n_inner", width)
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if v.values.get(key) is not False:
            v.bad(key, "glassllm supports False")
    scaled = v.flag("scale_attn_weights")
    return dict(
        vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads, n_embd=width,
        bias=True, mlp=v.gelu("activation_function"),
        mlp_hidden=None if mlp_hidden == (width or 0) * 4 else mlp_hidden,
        norm_eps=v.number("layer_norm_epsilon", 0.0, 1.0),
        attention_scale=None if scaled is not False else 1.0,
        tied_head=v.flag("tie_word_embeddings"),
    )  # fmt: skip


def _llama(v: _Values) -> dict[str, Any]:
    """llama, qwen2 and qwen3: RMSNorm, SwiGLU, RoPE, grouped-query attention."""
    vocab, context, width, layers, heads = v.shape()
    head_dim = v.head_dim(width, heads)
    kv_heads = v.int("num_key_value_heads", heads or MAX_HEADS) if (
        v.values.get("num_key_value_heads") is not None) else heads  # fmt: skip
    if kv_heads and heads and heads % kv_heads:
        v.bad("num_key_value_heads", f"must divide num_attention_heads={heads}")
    if v.values.get("rope_interleaved", False) is not False:  # SmolLM2's files say false
        v.bad("rope_interleaved", "transformers rotates halves whatever it says; glassllm reads "
              "false only")  # fmt: skip
    act = v.values.get("hidden_act")
    if act not in SILUS:
        v.bad("hidden_act", f"a SwiGLU MLP needs {' or '.join(SILUS)}")
    fields = dict(
        vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads, n_embd=width,
        n_kv_head=kv_heads if kv_heads != heads else None,
        head_dim=head_dim if heads is None or width is None or head_dim != width // heads
        else None,
        norm="rmsnorm", norm_eps=v.number("rms_norm_eps", 0.0, 1.0), mlp="swiglu",
        mlp_hidden=v.int("intermediate_size", 4 * MAX_WIDTH), positions="rotary",
        tied_head=v.flag("tie_word_embeddings"), bias=False,
        **_rope(v, head_dim, context, partial_default=None),
    )  # fmt: skip
    if v.model_type == "qwen2":  # q, k, v biases are unconditional in its code
        fields.update(qkv_bias=True, attn_out_bias=False, mlp_bias=False)
    else:
        attention_bias = v.flag("attention_bias")
        fields.update(qkv_bias=attention_bias, attn_out_bias=attention_bias)
        fields["mlp_bias"] = v.flag("mlp_bias") if v.model_type == "llama" else False
    if v.model_type == "qwen3":
        fields["qk_norm"] = True
    if v.model_type != "llama":
        fields.update(_sliding_window(v, layers))
    return fields


def _gpt_neox(v: _Values) -> dict[str, Any]:
    vocab, context, width, layers, heads = v.shape()
    head_dim = v.head_dim(width, heads, key="")
    attention_bias = v.flag("attention_bias")
    return dict(
        vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads, n_embd=width,
        norm_eps=v.number("layer_norm_eps", 0.0, 1.0), mlp=v.gelu("hidden_act"),
        mlp_hidden=v.int("intermediate_size", 4 * MAX_WIDTH), positions="rotary",
        parallel_residual=v.flag("use_parallel_residual"), bias=True,
        qkv_bias=attention_bias, attn_out_bias=attention_bias,
        tied_head=v.flag("tie_word_embeddings"),
        **_rope(v, head_dim, context, partial_default=0.25),
    )  # fmt: skip


def _gpt_neo(v: _Values) -> dict[str, Any]:
    vocab, context, width, layers, heads = v.shape()
    v.head_dim(width, heads, key="")
    mlp_hidden = v.mlp_width("intermediate_size", width)
    local = _attention_types(v, layers)
    window = v.int("window_size", MAX_CONTEXT) if local else None
    return dict(
        vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads, n_embd=width,
        norm_eps=v.number("layer_norm_epsilon", 0.0, 1.0), mlp=v.gelu("activation_function"),
        mlp_hidden=None if mlp_hidden == (width or 0) * 4 else mlp_hidden, bias=True,
        qkv_bias=False, attention_scale=1.0,  # GPT-Neo's scores are q·k, unscaled
        local_layers=local, attention_window=window, tied_head=v.flag("tie_word_embeddings"),
    )  # fmt: skip


_READERS = {"gpt2": _gpt2, "llama": _llama, "qwen2": _llama, "qwen3": _llama,
            "gpt_neox": _gpt_neox, "gpt_neo": _gpt_neo}  # fmt: skip


# ---------------------------------------------------------------------------- RoPE and windows


def _rope(
    v: _Values, head_dim: int | None, context: int | None, partial_default: float | None
) -> dict[str, Any]:
    """rope_theta, rope_scaling and rotary_dim, from ``rope_parameters`` (v5) or ``rope_scaling``
    + ``rope_theta`` / ``rotary_emb_base`` / ``rotary_pct`` (v4), with transformers' precedence:
    a ``rope_scaling`` object wins over ``rope_parameters``, keys inside it over keys beside it."""
    hf = v.hf
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    where = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    if not isinstance(params, Mapping):
        v.problems.append(f"{where}={shown(params)} (must be an object or null)")
        return {}
    neox = v.model_type == "gpt_neox"
    theta = params.get("rope_theta", hf.get("rotary_emb_base" if neox else "rope_theta", 1e4))
    theta = v.number(f"{where}.rope_theta", 1.0, MAX_THETA, theta)
    partial_key = "rotary_pct" if neox else "partial_rotary_factor"
    partial = params.get("partial_rotary_factor", hf.get(partial_key, partial_default))
    rotary_dim = None
    if partial is not None:
        factor = v.number(f"{where}.partial_rotary_factor", 0.0, 1.0, partial)
        if factor is not None and head_dim is not None:
            rotary_dim = int(head_dim * factor)
            if rotary_dim < 2 or rotary_dim % 2 or (not neox and rotary_dim != head_dim):
                v.problems.append(
                    f"partial_rotary_factor={shown(partial)} (rotates {rotary_dim} of "
                    f"{head_dim} features; glassllm needs an even number"
                    + (")" if neox else f", and all of them for {v.model_type})")
                )
    elif head_dim is not None and head_dim % 2:
        v.problems.append(f"head_dim={head_dim} (rotary embeddings need an even head_dim)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in ROPE_KEYS:
        v.problems.append(
            f"{where}.rope_type={shown(rope_type)} (glassllm implements {', '.join(ROPE_KEYS)})"
        )
        return {"rope_theta": theta}
    known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *ROPE_KEYS[rope_type]}
    unknown = sorted(str(k) for k in params if k not in known)
    if unknown:
        v.problems.append(f"{where} keys {unknown} (not used by rope_type {rope_type!r})")
    scaling = None
    if rope_type == "linear":
        factor = v.number(f"{where}.factor", 0.0, 1e6, params.get("factor"))
        scaling = {"rope_type": "linear", "factor": factor}
    elif rope_type == "llama3":
        original = params.get("original_max_position_embeddings",
                              hf.get("original_max_position_embeddings", context))  # fmt: skip
        if (
            isinstance(original, bool)
            or not isinstance(original, int)
            or not (0 < original <= MAX_ROTARY_CONTEXT)
        ):
            v.problems.append(f"{where}.original_max_position_embeddings={shown(original)} "
                              f"(must be an integer in [1, {MAX_ROTARY_CONTEXT}])")  # fmt: skip
        low, high = (v.number(f"{where}.{k}", 0.0, 1e6, params.get(k))
                     for k in ("low_freq_factor", "high_freq_factor"))  # fmt: skip
        if low is not None and high is not None and not low < high:
            v.problems.append(f"{where}: low_freq_factor={low} must be below high_freq_factor")
        scaling = {"rope_type": "llama3",
                   "factor": v.number(f"{where}.factor", 0.0, 1e6, params.get("factor")),
                   "low_freq_factor": low, "high_freq_factor": high,
                   "original_max_position_embeddings": original}  # fmt: skip
    return {"rope_theta": theta, "rope_scaling": scaling, "rotary_dim": rotary_dim}


def _sliding_window(v: _Values, layers: int | None) -> dict[str, Any]:
    """Qwen2/Qwen3's sliding-window layers as glassllm's local layers: transformers masks key j
    for query i unless ``i - j < sliding_window`` there, the band of ``attention_window``. An
    inactive window (``use_sliding_window: false``, as Qwen2.5's files) is no window."""
    use = v.flag("use_sliding_window")
    window = v.values.get("sliding_window") if use else None
    types = v.values.get("layer_types")
    if layers is None:
        return {}
    if types is None:
        start = v.int("max_window_layers", MAX_LAYERS, least=0) if window is not None else None
        local = () if start is None else tuple(range(start, layers))
    elif (
        not isinstance(types, list)
        or len(types) != layers
        or any(t not in ("full_attention", "sliding_attention") for t in types)
    ):
        v.bad("layer_types", f"must list {layers} of 'full_attention', 'sliding_attention'")
        return {}
    else:
        local = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if not local:
        return {}
    if window is None:
        v.problems.append("layer_types has sliding_attention layers but use_sliding_window is "
                          "false or sliding_window null")  # fmt: skip
        return {}
    return {"local_layers": local, "attention_window": v.int("sliding_window", MAX_ROTARY_CONTEXT)}


def _attention_types(v: _Values, layers: int | None) -> tuple[int, ...]:
    """GPT-Neo's ``attention_types`` (``[[["global", "local"], 12]]``: the pattern repeated 12
    times), expanded to the indices of its local layers; the count is bounded before expanding."""
    types = v.values.get("attention_types")
    expanded: list[str] = []
    ok = isinstance(types, list)
    for item in types if ok else ():
        pattern = item[0] if isinstance(item, list) and len(item) == 2 else None
        count = item[1] if pattern is not None else None
        if not isinstance(pattern, list) or isinstance(count, bool) or not isinstance(count, int):
            ok = False
            break
        if count < 0 or len(expanded) + len(pattern) * count > MAX_LAYERS:
            ok = False
            break
        expanded += pattern * count
    if not ok or any(t not in ("global", "local") for t in expanded):
        v.bad("attention_types", "must be [[['global' or 'local', ...], count], ...]")
        return ()
    if layers is not None and len(expanded) != layers:
        v.bad("attention_types", f"expands to {len(expanded)} layers, num_layers is {layers}")
    return tuple(i for i, t in enumerate(expanded) if t == "local")
