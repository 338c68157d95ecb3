"""Elementwise activations as modules, for use in `Sequential`.

The maths and the gradients live in `glassllm.functional` (GELU, ReLU, SiLU) and the engine (tanh).

>>> import numpy as np
>>> from glassllm import Tensor
>>> ReLU()(Tensor(np.array([-1.0, 2.0]))).data.tolist()
[0.0, 2.0]
"""

from __future__ import annotations

import glassllm.functional as F
from glassllm.nn.module import Module
from glassllm.tensor import Tensor


class GELU(Module):
    """Gaussian error linear unit (Hendrycks & Gimpel, 2016): ``x * Phi(x)``.

    ``approximate="tanh"`` (the default here, as GPT-2 used it) computes
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``; ``approximate="none"`` uses the exact
    normal CDF. Note PyTorch's ``nn.GELU()`` defaults to ``"none"``; pass it explicitly when
    porting.
    """

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """Sigmoid linear unit, ``x * sigmoid(x)`` (PyTorch's ``nn.SiLU``; "swish")."""

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class ReLU(Module):
    """``max(x, 0)``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class Tanh(Module):
    """``tanh(x)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()
