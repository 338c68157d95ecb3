"""A GGUF model's block-quantized tensors kept as their blocks (`Keeper`).

`glassllm.hf.load_gguf(path, keep_quantized=True)` builds the model as a float32 load does, but
before each weight is read a `Keeper` puts a `glassllm.nn.QuantizedLinear` in place of each
projection whose file tensors are all of kept types: 4-bit ones (Q4_0, Q4_1, Q4_K) as a
`Q4Weight`; 8-bit ones (Q8_0, Q5_0, Q5_1, Q5_K, Q6_K), or a mix with 4-bit ones widened, as a
`Q8Weight` (`glassllm.gguf.unpack` says how each maps, exactly). So a kept layer's float32 weight
is never made. The layers: ``attn.qkv`` (the file's q, k and v rows stacked, q and k unpermuted
as `glassllm.gguf.convert.unpermute` does to the float32 rows), ``attn.proj``, ``mlp.gate``,
``mlp.up``, ``mlp.proj`` and an untied ``lm_head``; and a `glassllm.nn.QuantizedEmbedding` in
place of ``wte`` (``token_embd``, also the tied head: SmolLM2's is Q8_0). A tensor of another type
(F16, BF16, F32) keeps its layer float32.

Each replacement is checked before it is made (`matches_file`): `CHECKED_ROWS` whole rows of each
file tensor, the first, the last and others spread between, must equal bit for bit what llama.cpp's
``gguf`` package makes of the same bytes, so a wrong offset, field or row order in the unpacking
is refused here, not seen later as a worse sample. A layer that fails the check is read as float32.

why rows and not the whole matrix: the check compares two readings of the same bytes, so what it
can find is a mistake in ours, and such a mistake (a layout, a field's bits, the q and k rows'
order) shows in every row, each of which holds every block position. Dequantizing the whole model
with the ``gguf`` package to compare it took ~0.9 s of SmolLM2's ~1.8 s load and made 425 MB of
float32 to throw away; the tests compare every value (tests/gguf).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm.functional.quantized import BLOCK, Q4Weight, Q8Weight, quantized_linear_array
from glassllm.gguf.convert import permuted_heads, unpermute
from glassllm.gguf.dequantize import dequantize
from glassllm.gguf.header import GGUFHeader
from glassllm.gguf.types import GGML_TYPES
from glassllm.gguf.unpack import KEPT, in_blocks_of, unpack, widened
from glassllm.kernels import compiled
from glassllm.nn.module import Module
from glassllm.nn.quantized import QuantizedEmbedding, QuantizedLinear

# whole rows of each file tensor compared with the gguf package's values (`matches_file`)
CHECKED_ROWS = 32
# glassllm layer (in block i) -> the file's tensors whose rows it holds, in order
LAYERS = {
    "attn.qkv": ("attn_q", "attn_k", "attn_v"),
    "attn.proj": ("attn_output",),
    "mlp.gate": ("ffn_gate",),
    "mlp.up": ("ffn_up",),
    "mlp.proj": ("ffn_down",),
}


def file_blocks(
    header: GGUFHeader, names: tuple[str, ...], config: dict[str, Any]
) -> Q4Weight | Q8Weight | None:
    """The file tensors ``names`` (matrices ``(out, in)`` of one input width) with their rows
    stacked, as a `Q4Weight` or `Q8Weight` ``(in, sum of outs)``; None unless every one is of a
    kept type (`glassllm.gguf.unpack`). Tensors of one weight's form stack as they are; a mix is
    widened to 8-bit blocks with offsets (`unpack.widened`), and 8-bit blocks of 32 weights
    beside blocks of 16 are cut to 16."""
    infos = [header.tensors.get(name) for name in names]
    if any(info is None or len(info.shape) != 2 or info.ggml_type not in KEPT for info in infos):
        return None
    if len({info.shape[1] for info in infos}) != 1 or infos[0].shape[1] % BLOCK:
        return None
    parts = []
    for name, info in zip(names, infos, strict=True):
        kind = GGML_TYPES[info.ggml_type]
        rows, width = info.shape
        blocks = header.raw(info).reshape(rows, width // kind.block_elements, kind.block_bytes)
        heads = permuted_heads(name, config)
        if heads is not None:
            blocks = unpermute(blocks, heads)  # the rows moved as the float32 rows are
        parts.append(unpack(info.ggml_type, blocks))
    if all(part.bits == 4 for part in parts):
        return Q4Weight.from_blocks(
            np.concatenate([p.scales for p in parts]),
            np.concatenate([p.offsets for p in parts]),
            np.concatenate([p.quants for p in parts]),
        )
    if {part.bits for part in parts} != {8} or len({p.offsets is None for p in parts}) != 1:
        parts = [widened(part) for part in parts]  # one form for all
    size = min(part.quants.shape[2] for part in parts)
    parts = [in_blocks_of(part, size) for part in parts]
    offsets = None if parts[0].offsets is None else np.concatenate([p.offsets for p in parts])
    scales, quants = (
        np.concatenate([p.scales for p in parts]),
        np.concatenate([p.quants for p in parts]),
    )
    return Q8Weight.from_blocks(scales, quants, offsets)


class Keeper:
    """Puts the blocks of a model being built from the file ``header`` (with the transformers
    ``config``) in place of its kept layers, each before its weight would be read (`__call__`,
    `glassllm.hf.load`'s ``kept``), so no float32 weight of a kept layer is ever made."""

    def __init__(self, header: GGUFHeader, config: dict[str, Any]) -> None:
        self.header, self.config = header, config

    def __call__(self, model: Module, name: str) -> bool:
        """``name``, a parameter about to be read: whether its layer was replaced by its blocks
        (then its float32 values are not needed)."""
        path, _, leaf = name.rpartition(".")
        if leaf != "weight":
            return False
        if path == "wte":
            table = model.wte.weight  # (V, E): the blocks' W (E, V) transposed
            blocks = self._checked(("token_embd.weight",), table.shape[::-1], table.dtype)
            if blocks is not None:
                model.wte = QuantizedEmbedding(blocks)
            return blocks is not None
        if path == "lm_head" and model.lm_head is not None:
            owner, layer_name, names = model, "lm_head", ("output.weight",)
        else:
            head, _, layer_path = path.partition(".")
            index, _, layer_path = layer_path.partition(".")
            if head != "blocks" or not index.isdigit() or layer_path not in LAYERS:
                return False
            owner_name, layer_name = layer_path.split(".")
            owner = getattr(model.blocks[int(index)], owner_name)
            names = tuple(f"blk.{index}.{part}.weight" for part in LAYERS[layer_path])
        layer = getattr(owner, layer_name)
        blocks = self._checked(names, layer.weight.shape, layer.weight.dtype)
        if blocks is not None:
            setattr(owner, layer_name, QuantizedLinear(blocks, layer.bias))
        return blocks is not None

    def _checked(
        self, names: tuple[str, ...], shape: tuple[int, ...], dtype: Any
    ) -> Q4Weight | Q8Weight | None:
        """The blocks of the file tensors ``names`` for a float32 weight ``(in, out)`` of
        ``shape``, when they are kept types and pass `matches_file`; else None."""
        blocks = file_blocks(self.header, names, self.config)
        if blocks is None or dtype != np.float32 or blocks.shape != tuple(shape):
            return None
        return blocks if matches_file(blocks, self.header, names, self.config) else None


def matches_file(
    blocks: Q4Weight | Q8Weight, header: GGUFHeader, names: tuple[str, ...], config: dict[str, Any]
) -> bool:
    """Whether ``blocks`` (the file tensors ``names`` with their rows stacked, `file_blocks`)
    hold, on `CHECKED_ROWS` whole rows of each tensor, the values llama.cpp's ``gguf`` package
    makes of the same bytes (`glassllm.gguf.dequantize`), bit for bit (``==``, as
    `numpy.array_equal`)."""
    first = 0  # the tensor's first output in ``blocks``
    for name in names:
        info = header.tensors[name]
        rows = info.shape[0]
        picked = checked_rows(rows)  # outputs of ``blocks``, less ``first``
        heads = permuted_heads(name, config)
        # output j of the layer is the file's row order[j] (the rows moved as `unpermute` moves
        # them: the same function on the row numbers)
        order = np.arange(rows) if heads is None else unpermute(np.arange(rows), heads)
        expected = dequantize(header, info, order[picked])  # (len(picked), in)
        if not np.array_equal(blocks.lookup(first + picked), expected):
            return False
        first += rows
    return True


def checked_rows(rows: int) -> np.ndarray:
    """The rows of a ``rows``-row tensor `matches_file` compares: the first, the last and
    `CHECKED_ROWS` - 2 others drawn once for that size (the same rows every load), ascending."""
    if rows <= CHECKED_ROWS:
        return np.arange(rows)
    inner = np.random.default_rng(rows).choice(np.arange(1, rows - 1), CHECKED_ROWS - 2, False)
    return np.concatenate([[0], np.sort(inner), [rows - 1]])


def load_kernels(model: Module) -> None:
    """Runs the smallest kept blocks of each kind in ``model`` once on zeros, so the compiled
    kernels a token needs are loaded at the load: one row on the blocks, and for a projection
    three rows, which are dequantized (as a prompt's are; a head's one row is summed on it).
    why: numba reads a kernel from its cache on its first call, and the first in a process
    starts LLVM (~0.3 s and ~60 MB on an EPYC guest); without this, the prompt paid it."""
    compiled.load()  # the rotary kernels, among others
    smallest: dict[tuple[type, bool], Q4Weight | Q8Weight] = {}  # (kind, a projection's)
    for module in model.modules():
        if isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            key = (type(module.blocks), isinstance(module, QuantizedLinear))
            if key not in smallest or module.blocks.nbytes < smallest[key].nbytes:
                smallest[key] = module.blocks
    for (_, projection), blocks in smallest.items():
        for rows in (1, 3) if projection else (1,):
            quantized_linear_array(np.zeros((rows, blocks.in_features), np.float32), blocks, None)
