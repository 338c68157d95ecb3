"""Open a GGUF file: its model as a transformers-style pair (config dict, tensors), its tokenizer
and chat template. `glassllm.hf.load_gguf` builds the glassllm model from them (through
`glassllm.hf.model_from_hf`); this package never imports `glassllm.hf`, so the Hugging Face
loaders can open a GGUF file too without a circle of imports.

Every check on the header (`glassllm.gguf.header`), the configuration and the tensor names
(`glassllm.gguf.convert`) runs before a weight is dequantized; then each tensor's shape is held
to the one the configuration implies, so a file whose metadata and tensors disagree is refused
with the tensor named, not broken later in a matmul.

Weights are dequantized to float32 once, at load (the design's baseline): 0.54 GB for SmolLM2-135M
where the Q4_1 file is 98 MB, for plain NumPy matmuls afterwards. ``read_gguf(path, deferred=True)``
(what `glassllm.hf.load_gguf` asks for) holds each tensor as a `DeferredTensor` instead, dequantized
only when it is read: the model is then built one tensor at a time, so the load's peak is the model
plus its largest tensor, not the model twice.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from glassllm.chat_template import ChatTemplate
from glassllm.data.bpe import BPETokenizer
from glassllm.gguf.convert import hf_config, permuted_heads, tensor_names, unpermute
from glassllm.gguf.dequantize import dequantize, import_gguf
from glassllm.gguf.header import GGUFFormatError, GGUFHeader, read_header
from glassllm.gguf.tokenizer import special_tokens, tokenizer_from_metadata

SUFFIX = ".gguf"


@dataclasses.dataclass
class GGUFContents:
    """What a GGUF file holds, in Hugging Face's terms: ``config`` is a ``config.json`` dict,
    ``tensors`` float32 arrays under transformers' names in torch's layout (``(out, in)``), as
    ``model.state_dict()`` has them; the tokenizer and chat template come from the metadata
    (``chat_template`` None when the file has none)."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, np.ndarray]  # or DeferredTensor, with read_gguf(..., deferred=True)
    tokenizer: BPETokenizer
    chat_template: ChatTemplate | None
    metadata: dict[str, Any]
    header: GGUFHeader | None = None  # the file's parsed header (its raw blocks: header.raw)


def is_gguf_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is meant as a GGUF file: its name ends in ``.gguf``, or it starts with
    the GGUF magic (a file of another kind is left to the other readers)."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX:
        return True
    if not path.is_file():  # a directory, or a FIFO that an open() would wait on
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class DeferredTensor:
    """A tensor of a checked GGUF file, not yet dequantized: its ``shape`` and ``dtype``
    (float32) known, its values a new array from each ``np.asarray(tensor)``."""

    header: GGUFHeader
    name: str  # the file's name for it (blk.0.attn_q.weight)
    config: dict[str, Any]
    shape: tuple[int, ...]
    dtype = np.dtype(np.float32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = _tensor(self.header, self.name, self.config)
        return values if dtype is None else values.astype(dtype, copy=False)


def read_gguf(path: str | os.PathLike[str], *, deferred: bool = False) -> GGUFContents:
    """Read and check the GGUF file ``path`` whole; raises GGUFFormatError (a ValueError) naming
    the file and the field, MissingDependencyError without the gguf or tokenizers package.
    ``deferred``: the tensors as `DeferredTensor` (every check but the dequantization itself
    done now), so that a reader can hold one at a time."""
    header = read_header(path)
    import_gguf()  # before any work: a missing extra is said first
    config = hf_config(header)
    names = tensor_names(header, config)
    _check_shapes(header, names, config)
    tokenizer = tokenizer_from_metadata(header.metadata, str(header.path))
    if tokenizer.vocab_size > config["vocab_size"]:
        raise GGUFFormatError(
            str(header.path),
            [
                f"its tokenizer has {tokenizer.vocab_size:,} tokens, its model "
                f"{config['vocab_size']:,}"
            ],
        )
    shapes = expected_shapes(config)
    tensors = {
        ours: DeferredTensor(header, theirs, config, shapes[ours])
        if deferred
        else _tensor(header, theirs, config)
        for theirs, ours in names.items()
    }
    return GGUFContents(
        header.path, config, tensors, tokenizer, chat_template_of(header), header.metadata, header
    )


def chat_template_of(header: GGUFHeader) -> ChatTemplate | None:
    """``tokenizer.chat_template`` with the file's named special tokens, None when absent."""
    source = header.metadata.get("tokenizer.chat_template")
    if source is None:
        return None
    if not isinstance(source, str):
        raise GGUFFormatError(str(header.path), ["tokenizer.chat_template must be a string"])
    return ChatTemplate(source, special_tokens(header.metadata))


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each transformers tensor name of ``config``'s model with the torch shape it must have."""
    E, M, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd, H, KV = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    shapes["lm_head.weight"] = (V, E)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (E,),
            p + "post_attention_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (H * hd, E),
            p + "self_attn.k_proj.weight": (KV * hd, E),
            p + "self_attn.v_proj.weight": (KV * hd, E),
            p + "self_attn.o_proj.weight": (E, H * hd),
            p + "self_attn.q_proj.bias": (H * hd,),
            p + "self_attn.k_proj.bias": (KV * hd,),
            p + "self_attn.v_proj.bias": (KV * hd,),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (M, E),
            p + "mlp.up_proj.weight": (M, E),
            p + "mlp.down_proj.weight": (E, M),
        }
    return shapes


def _check_shapes(header: GGUFHeader, names: dict[str, str], config: dict[str, Any]) -> None:
    shapes = expected_shapes(config)
    wrong = [
        f"{theirs} is {' x '.join(map(str, header.tensors[theirs].shape))}, the config implies "
        f"{' x '.join(map(str, shapes[ours]))}"
        for theirs, ours in names.items()
        if header.tensors[theirs].shape != shapes[ours]
    ]
    if wrong:
        raise GGUFFormatError(str(header.path), wrong[:10])


def _tensor(header: GGUFHeader, name: str, config: dict[str, Any]) -> np.ndarray:
    values = dequantize(header, header.tensors[name])
    heads = permuted_heads(name, config)
    return values if heads is None else unpermute(values, heads)
