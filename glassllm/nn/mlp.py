"""`SwiGLU`: the gated MLP of Llama-family models (Shazeer, 2020, "GLU Variants Improve
Transformer"), ``proj(silu(gate(x)) * up(x))``.

Three Linears in glassllm's ``(in, out)`` layout: ``gate`` and ``up`` ``(E, M)``, ``proj``
``(M, E)`` (transformers' ``gate_proj``, ``up_proj``, ``down_proj``, transposed). The gating is
one fused node, `glassllm.functional.swiglu`. Llama, SmolLM2 and Qwen have no biases here
(``bias=False``, the default).

>>> import numpy as np
>>> from glassllm import Tensor
>>> mlp = SwiGLU(4, 6, rng=np.random.default_rng(0))
>>> [name for name, _ in mlp.named_parameters()]
['gate.weight', 'up.weight', 'proj.weight']
>>> mlp(Tensor(np.ones((2, 3, 4), dtype=np.float32))).shape
(2, 3, 4)
"""

from __future__ import annotations

from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_int
from glassllm.nn.linear import Linear
from glassllm.nn.module import Module
from glassllm.rng import get_rng
from glassllm.tensor import Tensor


class SwiGLU(Module):
    """``(..., E) -> (..., E)``: ``proj(F.swiglu(gate(x), up(x)))`` with a hidden width ``M``.

    ``gate`` (E, M), ``up`` (E, M), ``proj`` (M, E), each with a bias when ``bias``; float32
    unless ``dtype`` says otherwise; ``rng`` draws the initial values (`Linear`'s rule), in the
    order gate, up, proj.
    """

    def __init__(
        self,
        embed_dim: int,
        hidden_dim: int,
        bias: bool = False,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        self.embed_dim = check_int("embed_dim", embed_dim, min=1)
        self.hidden_dim = check_int("hidden_dim", hidden_dim, min=1)
        rng = get_rng(rng)
        self.gate = Linear(self.embed_dim, self.hidden_dim, bias=bias, dtype=dtype, rng=rng)
        self.up = Linear(self.embed_dim, self.hidden_dim, bias=bias, dtype=dtype, rng=rng)
        self.proj = Linear(self.hidden_dim, self.embed_dim, bias=bias, dtype=dtype, rng=rng)

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.swiglu(self.gate(x), self.up(x))  # (..., M)
        return self.proj(hidden)  # (..., E)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, hidden_dim={self.hidden_dim}, "
            f"bias={self.proj.bias is not None}, dtype={self.proj.weight.dtype}"
        )
