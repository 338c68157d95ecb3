"""A GGUF model's block-quantized tensors kept as their blocks (`Keeper`).

`glassllm.hf.load_gguf(path, keep_quantized=True)` builds the model in float32 as always, and a
`Keeper` puts, as soon as each weight is filled, a `glassllm.nn.QuantizedLinear` in place of each
projection whose file tensors are all of kept types: 4-bit ones (Q4_0, Q4_1, Q4_K) as a
`Q4Weight`; 8-bit ones (Q8_0, Q5_0, Q5_1, Q5_K, Q6_K), or a mix with 4-bit ones widened, as a
`Q8Weight` (`glassllm.gguf.unpack` says how each maps, exactly). So the float32 weights of the
kept layers are freed one by one. The layers: ``attn.qkv`` (the file's q, k and v rows stacked,
q and k unpermuted as `glassllm.gguf.convert.unpermute` does to the float32 rows),
``attn.proj``, ``mlp.gate``, ``mlp.up``, ``mlp.proj`` and an untied ``lm_head``; and a
`glassllm.nn.QuantizedEmbedding` in place of ``wte`` (``token_embd``, also the tied head:
SmolLM2's is Q8_0). A tensor of another type (F16, BF16, F32) keeps its layer float32.

Each replacement is checked before it is made: its blocks dequantized must equal the float32
layer's weight bit for bit (what llama.cpp's ``gguf`` package made of the same bytes), so a wrong
offset or row order is refused here, not seen later as a worse sample. A layer that fails the
check keeps its float32 weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm._heap import release_free_memory
from glassllm.functional.quantized import BLOCK, Q4Weight, Q8Weight
from glassllm.gguf.convert import permuted_heads, unpermute
from glassllm.gguf.header import GGUFHeader
from glassllm.gguf.types import GGML_TYPES
from glassllm.gguf.unpack import KEPT, in_blocks_of, unpack, widened
from glassllm.kernels import compiled
from glassllm.kernels.quantized import NO_OFFSETS
from glassllm.nn.module import Module
from glassllm.nn.quantized import QuantizedEmbedding, QuantizedLinear

# float32 weights dropped by the replacements between two trims of the heap (see `Keeper`)
RELEASE_BYTES = 64 * 2**20
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
    """Replaces the layers of a model being built from the file ``header`` (with the
    transformers ``config``) by their blocks, each as soon as its weight is filled (`__call__`,
    `glassllm.hf.load`'s ``filled``), so the float32 weights of the kept layers are never all in
    memory at once; `finish` then keeps the embedding and returns the names replaced."""

    def __init__(self, header: GGUFHeader, config: dict[str, Any]) -> None:
        self.header, self.config = header, config
        self.replaced: list[str] = []
        self._freed = 0  # bytes of float32 weights dropped since the heap was last trimmed

    def __call__(self, model: Module, name: str) -> None:
        """``name``, a parameter just filled: its layer replaced if it is a kept one's weight."""
        path, _, leaf = name.rpartition(".")
        if leaf != "weight":
            return
        if path == "lm_head" and model.lm_head is not None:
            owner, layer_name, names = model, "lm_head", ("output.weight",)
        else:
            head, _, layer_path = path.partition(".")
            index, _, layer_path = layer_path.partition(".")
            if head != "blocks" or not index.isdigit() or layer_path not in LAYERS:
                return
            owner_name, layer_name = layer_path.split(".")
            owner = getattr(model.blocks[int(index)], owner_name)
            names = tuple(f"blk.{index}.{part}.weight" for part in LAYERS[layer_path])
        weight_bytes = getattr(owner, layer_name).weight.data.nbytes
        if _replace_linear(owner, layer_name, self.header, names, self.config):
            self.replaced.append(path)
            # why: a tuned heap (glassllm.app.allocator) keeps the freed float32 pages, and then
            # the load's peak is the whole float32 model's (SmolLM2: 806 MB); handed back every
            # RELEASE_BYTES (a trim costs ~5 ms: after every layer, the load took 0.8 s longer)
            self._freed += weight_bytes
            if self._freed >= RELEASE_BYTES:
                release_free_memory()
                self._freed = 0

    def finish(self, model: Module) -> list[str]:
        """The embedding kept too (after the build: a tied head's check reads its float32 table);
        the names of every layer replaced."""
        blocks = file_blocks(self.header, ("token_embd.weight",), self.config)
        table = model.wte.weight.data  # (V, E): the blocks' W (E, V) transposed
        if blocks is not None and table.dtype == np.float32 and blocks.shape == table.shape[::-1]:
            if _is_table(blocks, table):
                model.wte = QuantizedEmbedding(blocks)
                self.replaced.append("wte")
        return self.replaced


def _is_table(blocks: Q4Weight | Q8Weight, table: np.ndarray) -> bool:
    """Whether ``table (V, E)`` is ``blocks``' ``W^T`` bit for bit; 8-bit blocks compared in
    place (0.09 against 0.27 s for SmolLM2's 49,152 x 576: no dequantized, transposed copy)."""
    if isinstance(blocks, Q8Weight):
        offsets = NO_OFFSETS if blocks.offsets is None else blocks.offsets
        return bool(compiled.kernels().q8_is_table(blocks.scales, offsets, blocks.quants, table))
    return np.array_equal(blocks.dequantize().T, table)


def _is_matrix(blocks: Q4Weight | Q8Weight, w: np.ndarray) -> bool:
    """Whether ``w (in, out)`` is ``blocks``' matrix bit for bit, compared in place (SmolLM2's
    150 projections: ~0.6 s through a dequantized copy of each, most of it the copies' fresh
    pages)."""
    fused = compiled.kernels()
    if isinstance(blocks, Q8Weight):
        offsets = NO_OFFSETS if blocks.offsets is None else blocks.offsets
        return bool(fused.q8_is_matrix(blocks.scales, offsets, blocks.quants, w))
    return bool(fused.q4_is_matrix(blocks.scales, blocks.offsets, blocks.nibbles, w))


def _replace_linear(
    owner: Module, name: str, header: GGUFHeader, names: tuple[str, ...], config: dict[str, Any]
) -> bool:
    """``owner.name`` (a float32 `Linear`) replaced by a `QuantizedLinear` on the file's blocks
    ``names`` when they hold its weight bit for bit; whether it was."""
    layer = getattr(owner, name)
    blocks = file_blocks(header, names, config)
    if blocks is None or layer.weight.dtype != np.float32 or blocks.shape != layer.weight.shape:
        return False
    if not _is_matrix(blocks, layer.weight.data):
        return False
    setattr(owner, name, QuantizedLinear(blocks, layer.bias))
    return True
