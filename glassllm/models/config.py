"""`GPTConfig`: the shape of a GPT and every architectural choice, and the table of its parameters.

One decoder, six families: each field names a choice, and its default is GPT-2's, so a config
written before the choices existed still means what it meant.

=====================  ===================  ==============================================
choice                 GPT-2 (default)      others
=====================  ===================  ==============================================
``norm``               ``"layernorm"``      ``"rmsnorm"`` (Llama, Qwen)
``mlp``                ``"gelu_tanh"``      ``"gelu"`` (erf: GPT-NeoX), ``"swiglu"`` (Llama)
``positions``          ``"learned"``        ``"rotary"`` (RoPE on ``rotary_dim`` of each head)
``n_kv_head``          ``n_head``           fewer: grouped-query attention
``head_dim``           ``n_embd // n_head`` free (Qwen3)
biases                 all or none          ``qkv_bias``, ``attn_out_bias``, ``mlp_bias``,
                       (``bias``)           ``norm_bias`` each (None: follow ``bias``)
``qk_norm``            off                  RMSNorm of q and k per head (Qwen3)
``parallel_residual``  off                  ``x + attn(ln_1 x) + mlp(ln_2 x)`` (GPT-NeoX)
``tied_head``          on                   off: an own ``lm_head`` (Pythia)
``attention_scale``    ``1/sqrt(head_dim)`` ``1.0`` (GPT-Neo)
``local_layers``       none                 blocks whose attention sees the last
                                            ``attention_window`` keys only (GPT-Neo)
=====================  ===================  ==============================================

This module was split from ``gpt.py`` so that the model file reads as a model: the checks of
twenty fields and the parameter table are a concept of their own (the names they define are
re-exported by ``glassllm.models.gpt``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import is_integer, is_number
from glassllm._text import shown

# The largest shape a GPT read from a file may have (a glassllm checkpoint, a Hugging Face
# directory, the command's options): far beyond what a NumPy GPT trains, and low enough that no
# value within them asks for a model larger than any machine holds before the file's own
# tensors are compared with it.
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_WIDTH = 65_536  # n_embd, head_dim: GPT-3's n_embd is 12,288
MAX_HIDDEN = 4 * MAX_WIDTH  # mlp_hidden
MAX_CONTEXT = 65_536  # block_size: one attention matrix of this many positions is 16 GiB
MAX_VOCAB = 1_000_000_000

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu_tanh", "gelu", "swiglu")
POSITIONS = ("learned", "rotary")

# The fields of today's GPT-2 config: `to_dict` writes them always, the others when not default.
_GPT2_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias")


@dataclasses.dataclass
class GPTConfig:
    """Shape of a GPT and its architectural choices (see the module's table).

    ``bias`` adds biases to Linear and LayerNorm layers (GPT-2 has them; off is a little better and
    faster, as nanoGPT found); ``qkv_bias``, ``attn_out_bias``, ``mlp_bias`` and ``norm_bias``
    override it per layer kind. Every check runs at construction and raises a ValueError naming
    the field.

    >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=4, n_embd=8, n_kv_head=2)
    >>> config.kv_heads, config.head_size, config.mlp_size
    (2, 2, 32)
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = False
    n_kv_head: int | None = None  # None: n_head; fewer: grouped-query attention
    head_dim: int | None = None  # None: n_embd // n_head (Qwen3 sets it freely)
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    norm_eps: float = 1e-5
    mlp: str = "gelu_tanh"  # "gelu_tanh" | "gelu" (erf) | "swiglu"
    mlp_hidden: int | None = None  # None: 4 * n_embd
    positions: str = "learned"  # "learned" (wpe) | "rotary"
    rotary_dim: int | None = None  # None: head_dim; GPT-NeoX: int(head_dim * rotary_pct)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # as F.rotary_frequencies' scaling
    rotary_interleaved: bool = False
    qkv_bias: bool | None = None  # None: follows `bias` (also attn_out_bias, mlp_bias, norm_bias)
    attn_out_bias: bool | None = None
    mlp_bias: bool | None = None
    norm_bias: bool | None = None  # LayerNorm only; RMSNorm has none
    qk_norm: bool = False  # Qwen3: RMSNorm(head_dim) on q and k per head, before RoPE
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln_1(x)) + mlp(ln_2(x))
    tied_head: bool = True  # False: its own lm_head
    attention_scale: float | None = None  # None: 1/sqrt(head_dim); GPT-Neo: 1.0
    attention_window: int | None = None  # the window of the local layers
    local_layers: tuple[int, ...] = ()  # block indices that use attention_window (GPT-Neo)

    def __post_init__(self) -> None:
        for name in _GPT2_FIELDS[:5]:  # unbounded here, as always: readers of files bound them
            setattr(self, name, _count(name, getattr(self, name), None))
        for name, top in (("n_kv_head", MAX_HEADS), ("head_dim", MAX_WIDTH),
                          ("mlp_hidden", MAX_HIDDEN), ("rotary_dim", MAX_WIDTH),
                          ("attention_window", None)):  # fmt: skip
            value = getattr(self, name)
            setattr(self, name, None if value is None else _count(name, value, top))
        if self.head_dim is None and self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}) "
                "unless head_dim is given"
            )
        if self.n_kv_head is not None and self.n_head % self.n_kv_head != 0:
            raise ValueError(
                f"GPTConfig.n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): "
                "each kv head serves a group of query heads"
            )
        if not is_number(self.dropout):
            raise ValueError(f"GPTConfig.dropout must be a number, got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        self.dropout = float(self.dropout)
        for name in ("bias", "rotary_interleaved", "qk_norm", "parallel_residual", "tied_head"):
            setattr(self, name, _flag(name, getattr(self, name)))
        for name in ("qkv_bias", "attn_out_bias", "mlp_bias", "norm_bias"):
            value = getattr(self, name)
            setattr(self, name, None if value is None else _flag(name, value))
        for name, choices in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"GPTConfig.{name} must be one of {list(choices)}, got {getattr(self, name)!r}"
                )
        self.norm_eps = _positive_float("norm_eps", self.norm_eps)
        self.rope_theta = _positive_float("rope_theta", self.rope_theta)
        if self.attention_scale is not None:
            self.attention_scale = _positive_float("attention_scale", self.attention_scale)
        if self.norm == "rmsnorm" and self.norm_bias:
            raise ValueError("GPTConfig.norm_bias must not be True with norm='rmsnorm' (no bias)")
        self._check_rotary()
        self._check_local_layers()

    def _check_rotary(self) -> None:
        if self.positions != "rotary":
            for name in ("rotary_dim", "rope_scaling"):
                if getattr(self, name) is not None:
                    raise ValueError(f"GPTConfig.{name} is for positions='rotary' only")
            return
        if self.rotary_dim is not None and (
            self.rotary_dim % 2 or self.rotary_dim > self.head_size
        ):
            raise ValueError(
                f"GPTConfig.rotary_dim ({self.rotary_dim}) must be even and at most head_dim "
                f"({self.head_size}): it rotates pairs of each head's features"
            )
        if self.rotary_dim is None and self.head_size % 2:
            raise ValueError(
                f"GPTConfig: rotary positions need an even head_dim, got {self.head_size} "
                "(or give an even rotary_dim)"
            )
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, Mapping):
                raise ValueError(
                    f"GPTConfig.rope_scaling must be None or a dict, got {shown(self.rope_scaling)}"
                )
            self.rope_scaling = dict(self.rope_scaling)
        try:  # the frequencies' own checks (a rope_type nobody implements, a missing key)
            F.rotary_frequencies(self.rotary_size, self.rope_theta, self.rope_scaling)
        except (TypeError, ValueError) as err:
            raise ValueError(f"GPTConfig.rope_scaling: {err}") from None

    def _check_local_layers(self) -> None:
        layers = self.local_layers
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise ValueError(
                f"GPTConfig.local_layers must be a list of block indices, got {layers!r}"
            )
        layers = tuple(layers)
        for i in layers:
            if not is_integer(i) or not 0 <= i < self.n_layer:
                raise ValueError(
                    f"GPTConfig.local_layers holds {i!r}, not a block index in [0, {self.n_layer})"
                )
        if len(set(layers)) != len(layers):
            raise ValueError(f"GPTConfig.local_layers lists a block twice: {list(layers)}")
        self.local_layers = tuple(sorted(int(i) for i in layers))
        if self.local_layers and self.attention_window is None:
            raise ValueError("GPTConfig.local_layers needs attention_window (their window)")
        if self.attention_window is not None and not self.local_layers:
            raise ValueError(
                "GPTConfig.attention_window is set but local_layers is empty: name the blocks "
                "that use it"
            )

    # -------------------------------------------------- the choices, resolved

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_kv_head``, or ``n_head``)."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_size(self) -> int:
        """Features per attention head (``head_dim``, or ``n_embd // n_head``)."""
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def mlp_size(self) -> int:
        """The MLP's hidden width (``mlp_hidden``, or ``4 * n_embd``)."""
        return 4 * self.n_embd if self.mlp_hidden is None else self.mlp_hidden

    @property
    def rotary_size(self) -> int:
        """Features of each head that rotary positions rotate (0 with learned positions)."""
        if self.positions != "rotary":
            return 0
        return self.head_size if self.rotary_dim is None else self.rotary_dim

    def has_bias(self, kind: str) -> bool:
        """Whether layers of ``kind`` ("qkv", "attn_out", "mlp", "norm") have biases."""
        value = getattr(self, f"{kind}_bias")
        if kind == "norm" and self.norm == "rmsnorm":
            return False
        return self.bias if value is None else value

    def window_of(self, layer: int) -> int | None:
        """The attention window of block ``layer`` (None: it sees every earlier position)."""
        return self.attention_window if layer in self.local_layers else None

    def gpt2_differences(self) -> list[str]:
        """The fields whose choice GPT-2 does not make (empty: a GPT-2, however it is spelled),
        for writers of formats that hold GPT-2 only.

        >>> GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, n_kv_head=2,
        ...           tied_head=False).gpt2_differences()
        ['tied_head']
        """
        E, hd = self.n_embd, self.head_size
        differs = {
            "n_kv_head": self.kv_heads != self.n_head,
            "head_dim": hd * self.n_head != E,
            "norm": self.norm != "layernorm",
            "norm_eps": self.norm_eps != 1e-5,
            "mlp": self.mlp != "gelu_tanh",
            "mlp_hidden": self.mlp_size != 4 * E,
            "positions": self.positions != "learned",
            **{
                f"{kind}_bias": self.has_bias(kind) != self.bias
                for kind in ("qkv", "attn_out", "mlp", "norm")
            },  # fmt: skip
            "qk_norm": self.qk_norm,
            "parallel_residual": self.parallel_residual,
            "tied_head": not self.tied_head,
            "attention_scale": self.attention_scale not in (None, 1.0 / math.sqrt(hd)),
            "local_layers": bool(self.local_layers),
        }
        return [name for name, different in differs.items() if different]

    # ---------------------------------------------------------- dict form

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict, as stored in checkpoints. Fields at their defaults
        beyond GPT-2's seven are left out, so a GPT-2 config writes exactly what it always did.

        >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
        >>> list(config.to_dict()), config.to_dict()["bias"]
        (['vocab_size', 'block_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'bias'], False)
        """
        values = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _GPT2_FIELDS or value != field.default:
                values[field.name] = list(value) if isinstance(value, tuple) else value
        if self.rope_scaling is not None:
            values["rope_scaling"] = dict(self.rope_scaling)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> GPTConfig:
        """Inverse of to_dict (missing optional fields take their defaults); unknown or missing
        required keys raise a ValueError naming them."""
        if not isinstance(values, Mapping):
            raise TypeError(f"GPTConfig.from_dict expects a mapping, got {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown GPTConfig keys {unknown}; known keys are {list(fields)}")
        missing = [
            name
            for name, f in fields.items()
            if f.default is dataclasses.MISSING and name not in values
        ]
        if missing:
            raise ValueError(f"GPTConfig is missing required keys {missing}")
        return cls(**values)


def _count(name: str, value: Any, top: int | None) -> int:
    if not is_integer(value):
        raise ValueError(f"GPTConfig.{name} must be an integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"GPTConfig.{name} must be positive, got {value}")
    if top is not None and value > top:
        raise ValueError(f"GPTConfig.{name} must be at most {top:,}, got {value:,}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"GPTConfig.{name} must be True or False, got {value!r}")
    return bool(value)


def _positive_float(name: str, value: Any) -> float:
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"GPTConfig.{name} must be a positive finite number, got {value!r}")
    return float(value)


def llama_config(
    vocab_size: int,
    block_size: int,
    n_layer: int,
    n_head: int,
    n_embd: int,
    n_kv_head: int | None = None,
    mlp_hidden: int | None = None,
    **fields: Any,
) -> GPTConfig:
    """A Llama-style GPTConfig: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, tied
    head. ``n_kv_head`` defaults to ``n_head // 2`` when n_head is even (else ``n_head``).

    ``mlp_hidden`` defaults to the width that gives the model the parameter count of a GPT-2
    config (``GPTConfig(vocab_size, block_size, n_layer, n_head, n_embd)``) of the same size: the
    three SwiGLU matrices ``3 E M`` take what GPT-2's MLP (``8 E^2``), the attention that GQA
    saves and the position table (``block_size E``, spread over the layers) held, rounded to
    the nearest integer. ``fields`` set any other GPTConfig field (``dropout``, ``rope_theta``).

    >>> config = llama_config(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    >>> config.n_kv_head, config.mlp_hidden
    (2, 389)
    """
    if n_kv_head is None and is_integer(n_head) and n_head > 0:
        n_kv_head = n_head // 2 if n_head % 2 == 0 else n_head
    choices = dict(norm="rmsnorm", mlp="swiglu", positions="rotary", bias=False, tied_head=True)
    config = GPTConfig(vocab_size, block_size, n_layer, n_head, n_embd,
                       n_kv_head=n_kv_head, **{**choices, **fields})  # fmt: skip
    if mlp_hidden is None:
        E, hd = config.n_embd, config.head_size
        saved_attention = 2 * E * (config.n_head - config.kv_heads) * hd  # per block
        held = 8 * E * E + saved_attention + config.block_size * E / config.n_layer
        mlp_hidden = max(1, round(held / (3 * E)))
    return dataclasses.replace(config, mlp_hidden=mlp_hidden)


# ------------------------------------------------------------------ the parameter table


def parameter_shapes(config: GPTConfig, bias: bool | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of a GPT of ``config`` by name (the checkpoint tensor names), with its
    shape, in the model's parameter order. ``bias=True`` (or False) overrides every bias choice
    of ``config`` (RMSNorm never has one): the table of every tensor such a model may hold.

    Linear weights are (in, out). ``attn.qkv`` packs ``[q heads | k heads | v heads]``.

    >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=4)
    >>> shapes = parameter_shapes(config)
    >>> shapes["blocks.1.attn.qkv.weight"], len(shapes), len(parameter_shapes(config, bias=True))
    ((4, 12), 15, 28)
    """

    def has(kind: str) -> bool:
        if kind == "norm" and config.norm == "rmsnorm":
            return False
        return config.has_bias(kind) if bias is None else bias

    E, V, T, M = config.n_embd, config.vocab_size, config.block_size, config.mlp_size
    H, KV, hd = config.n_head, config.kv_heads, config.head_size
    qkv = (H + 2 * KV) * hd
    # Per block, each layer's weight shape, bias shape (None: never one) and bias kind;
    # nanoGPT calls a block transformer.h.{i}, its attn.qkv attn.c_attn, attn.proj attn.c_proj.
    per_block: list[tuple[str, tuple[int, ...], tuple[int, ...] | None, str]] = [
        ("ln_1", (E,), (E,), "norm"),
        ("attn.qkv", (E, qkv), (qkv,), "qkv"),
    ]
    if config.qk_norm:
        per_block += [("attn.q_norm", (hd,), None, ""), ("attn.k_norm", (hd,), None, "")]
    per_block += [("attn.proj", (H * hd, E), (E,), "attn_out"), ("ln_2", (E,), (E,), "norm")]
    if config.mlp == "swiglu":
        per_block += [("mlp.gate", (E, M), (M,), "mlp"), ("mlp.up", (E, M), (M,), "mlp")]
    else:
        per_block += [("mlp.fc", (E, M), (M,), "mlp")]  # nanoGPT: mlp.c_fc
    per_block += [("mlp.proj", (M, E), (E,), "mlp")]  # nanoGPT: mlp.c_proj

    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (V, E)}  # token embedding (and tied head)
    if config.positions == "learned":
        shapes["wpe.weight"] = (T, E)  # learned position embedding
    for i in range(config.n_layer):
        for layer, weight, bias_shape, kind in per_block:
            shapes[f"blocks.{i}.{layer}.weight"] = weight
            if bias_shape is not None and has(kind):
                shapes[f"blocks.{i}.{layer}.bias"] = bias_shape
    shapes["ln_f.weight"] = (E,)  # nanoGPT: transformer.ln_f
    if has("norm"):
        shapes["ln_f.bias"] = (E,)
    if not config.tied_head:
        shapes["lm_head.weight"] = (E, V)
    return shapes


def parameter_count(config: GPTConfig) -> int:
    """Values in a GPT of ``config`` (the tied head once), in closed form: no table is built,
    so it is cheap whatever the configuration says.

    >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=4)
    >>> parameter_count(config) == sum(math.prod(s) for s in parameter_shapes(config).values())
    True
    """
    E, V, M = config.n_embd, config.vocab_size, config.mlp_size
    H, KV, hd = config.n_head, config.kv_heads, config.head_size
    norm = E * (2 if config.has_bias("norm") else 1)
    block = 2 * norm + E * (H + 2 * KV) * hd + H * hd * E
    block += (H + 2 * KV) * hd * config.has_bias("qkv") + E * config.has_bias("attn_out")
    block += 2 * hd * config.qk_norm
    matrices = 3 if config.mlp == "swiglu" else 2
    block += matrices * E * M + ((matrices - 1) * M + E) * config.has_bias("mlp")
    total = V * E + config.n_layer * block + norm
    total += config.block_size * E * (config.positions == "learned")
    return total + E * V * (not config.tied_head)


def size_problems(
    shapes: Mapping[str, tuple[int, ...]],
    config: GPTConfig,
    source: str = "the configuration",
    keys: Mapping[str, str] | None = None,
) -> list[str]:
    """Whether the tensors ``shapes`` (glassllm name -> shape) of a file hold a GPT of
    ``config``'s size: as many blocks (distinct ``blocks.N.`` indices) as ``n_layer``,
    ``wte``/``wpe`` of shapes ``(vocab_size, n_embd)``/``(block_size, n_embd)`` (``wpe`` with
    learned positions only), and no more than twice as many values in all as the tensors hold
    (the free sizes: ``mlp_hidden``, ``head_dim``, ``n_kv_head``).

    Cheap whatever ``config`` says, so it is checked before anything (`parameter_shapes`, the
    model) is sized from a configuration read from a file: a model that passes is no larger than
    the file's own tensors. Every name and shape is compared afterwards, against the model.
    ``source`` names the configuration in messages and ``keys`` its fields where they differ from
    GPTConfig's (a Hugging Face ``config.json`` calls ``block_size`` ``n_positions``).

    >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=4)
    >>> size_problems({"wte.weight": (11, 4), "wpe.weight": (8, 4), "blocks.0.ln_1.weight": (4,)},
    ...               config, "model_config")
    ['model_config has n_layer=2 but the weights hold 1 block']
    """
    keys = keys or {}
    problems = []
    blocks = {name.split(".")[1] for name in shapes if name.startswith("blocks.")}
    if len(blocks) != config.n_layer:
        held = f"{len(blocks)} block{'' if len(blocks) == 1 else 's'}"
        problems.append(f"{source} has n_layer={config.n_layer} but the weights hold {held}")
    tables = [("wte.weight", config.vocab_size, "vocab_size")]
    if config.positions == "learned":
        tables.append(("wpe.weight", config.block_size, "block_size"))
    for name, rows, field in tables:
        stated = f"{source}'s {keys.get(field, field)}={rows} and n_embd={config.n_embd}"
        wanted = (rows, config.n_embd)
        if name not in shapes:
            problems.append(f"missing tensors: {name} (where {stated} need {wanted})")
        elif tuple(shapes[name]) != wanted:
            found = shown(tuple(shapes[name]))
            problems.append(f"{name} has shape {found}, where {stated} need {wanted}")
    if not problems:
        held_values = sum(math.prod(int(n) for n in shape) for shape in shapes.values())
        needed = parameter_count(config)
        if needed > 2 * held_values:  # twice: a file missing a few tensors is named later
            problems.append(
                f"{source} describes a model of {needed:,} values, more than twice what the "
                f"weights hold ({held_values:,})"
            )
    return problems
