"""`QuantizedLinear` and `QuantizedEmbedding`: `Linear` and `Embedding` with their weights kept as
a GGUF file's blocks (a `Q4Weight` or a `Q8Weight`).

What `glassllm.hf.load_gguf(path, keep_quantized=True)` puts in place of a model's projections
and embedding whose file tensors are block-quantized (Q4_0 to Q8_0, Q4_K to Q6_K:
`glassllm.gguf.unpack`): the weights stay as those blocks (6 or 8 bits a weight here against
32), and a decoding step sums on them
(`glassllm.functional.quantized_linear`). A `QuantizedEmbedding` keeps the table as the blocks of
its tied head ``W = table^T``: looking a row up dequantizes that row, ``attend(x)`` sums on them.

It reads as a `Linear` does where the library reads layers: ``weight`` is the dequantized matrix
``(in, out)`` (a new constant Tensor each read, the exact float32 values the file's blocks mean),
``state_dict`` holds it under the same name, so a checkpoint or a Hugging Face export of a
quantized model holds the float32 weights a `Linear` would; ``load_state_dict`` refuses to write
it (the blocks are read-only). The blocks are not a parameter: nothing trains them (an optimizer
over ``model.parameters()`` trains the rest), and ``num_parameters`` does not count them. The
bias, when there is one, is an ordinary parameter. Gradients flow to the input.

>>> import numpy as np
>>> from glassllm.functional import Q4Weight
>>> blocks = Q4Weight.from_blocks(np.ones((16, 1), np.float32), np.zeros((16, 1), np.float32),
...                               np.full((16, 1, 16), 0x11, np.uint8))  # every weight 1.0
>>> layer = QuantizedLinear(blocks)
>>> layer
QuantizedLinear(in_features=32, out_features=16, bias=False, 4-bit blocks 384 bytes)
>>> layer.weight.shape, float(layer.weight.data.max()), list(layer.state_dict())
((32, 16), 1.0, ['weight'])
"""

from __future__ import annotations

import numpy as np

import glassllm.functional as F
from glassllm.functional.quantized import Q4Weight, Q8Weight
from glassllm.nn.module import Module
from glassllm.tensor import Tensor


class QuantizedLinear(Module):
    """``y = x @ W + bias`` with ``W`` the `Q4Weight` or `Q8Weight` ``blocks (in, out)``; ``bias``
    a Tensor ``(out,)`` (registered as a parameter) or None."""

    def __init__(self, blocks: Q4Weight | Q8Weight, bias: Tensor | None = None) -> None:
        super().__init__()
        self.blocks = _checked(blocks, "QuantizedLinear")
        self.in_features, self.out_features = blocks.shape
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"QuantizedLinear: bias {bias.shape} must be ({self.out_features},)")
        self.bias = bias

    @property
    def weight(self) -> Tensor:
        """The dequantized matrix ``(in, out)`` float32, a new constant Tensor each read (writing
        into it changes nothing in the layer)."""
        return Tensor(self.blocks.dequantize())

    def forward(self, x: Tensor) -> Tensor:
        return F.quantized_linear(x, self.blocks, self.bias)  # (..., in) -> (..., out)

    def _computed_state(self) -> dict[str, np.ndarray]:
        weight = self.blocks.dequantize()
        weight.flags.writeable = False  # load_state_dict: "read-only and cannot be loaded into"
        return {"weight": weight}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, {_kind(self.blocks)} {self.blocks.nbytes:,} bytes"
        )


class QuantizedEmbedding(Module):
    """Rows of ``table = W^T (num_embeddings, embedding_dim)`` by id, ``W`` the `Q4Weight` or
    `Q8Weight` ``blocks (embedding_dim, num_embeddings)`` of the tied head; ``attend(x) = x @ W``.

    ``weight`` is the dequantized table (a new constant Tensor each read), saved by
    ``state_dict`` under that name and refused by ``load_state_dict``, as `QuantizedLinear`'s.
    """

    def __init__(self, blocks: Q4Weight | Q8Weight) -> None:
        super().__init__()
        self.blocks = _checked(blocks, "QuantizedEmbedding")
        self.embedding_dim, self.num_embeddings = blocks.shape

    @property
    def weight(self) -> Tensor:
        """The dequantized table ``(num_embeddings, embedding_dim)`` float32, a new constant."""
        return Tensor(np.ascontiguousarray(self.blocks.dequantize().T))

    def forward(self, ids: np.ndarray | Tensor) -> Tensor:
        return F.quantized_embedding(ids, self.blocks)  # (...) -> (..., embedding_dim)

    def attend(self, x: Tensor) -> Tensor:
        """The table as a tied head: ``x (..., dim) @ W``, ``(..., num_embeddings)``."""
        return F.quantized_linear(x, self.blocks)

    def _computed_state(self) -> dict[str, np.ndarray]:
        weight = self.weight.data
        weight.flags.writeable = False  # load_state_dict: "read-only and cannot be loaded into"
        return {"weight": weight}

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"{_kind(self.blocks)} {self.blocks.nbytes:,} bytes"
        )


def _checked(blocks: Q4Weight | Q8Weight, layer: str) -> Q4Weight | Q8Weight:
    if not isinstance(blocks, Q4Weight | Q8Weight):
        raise TypeError(f"{layer}: blocks must be a Q4Weight or a Q8Weight, got {type(blocks)}")
    return blocks


def _kind(blocks: Q4Weight | Q8Weight) -> str:
    return "4-bit blocks" if isinstance(blocks, Q4Weight) else "8-bit blocks"
