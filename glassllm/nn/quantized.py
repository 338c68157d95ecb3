"""`QuantizedLinear`: `Linear`'s map with its weight kept as 4-bit blocks (a `Q4Weight`).

What `glassllm.hf.load_gguf(path, keep_quantized=True)` puts in place of a model's projections
whose file blocks are Q4_0 or Q4_1: the weights stay as the file's blocks (6 bits a weight here
against 32), and a decoding step sums on them (`glassllm.functional.quantized_linear`).

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
from glassllm.functional.quantized import Q4Weight
from glassllm.nn.module import Module
from glassllm.tensor import Tensor


class QuantizedLinear(Module):
    """``y = x @ W + bias`` with ``W`` the `Q4Weight` ``blocks (in, out)``; ``bias`` a Tensor
    ``(out,)`` (registered as a parameter) or None."""

    def __init__(self, blocks: Q4Weight, bias: Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(blocks, Q4Weight):
            raise TypeError(f"QuantizedLinear: blocks must be a Q4Weight, got {type(blocks)}")
        self.blocks = blocks
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
            f"bias={self.bias is not None}, 4-bit blocks {self.blocks.nbytes:,} bytes"
        )
