"""`Linear`: an affine map ``y = x @ weight + bias`` over the last axis.

**Layout.** ``weight`` has shape ``(in_features, out_features)``, so forward is a plain
``x @ weight`` with no transpose. PyTorch stores the transpose, ``(out_features, in_features)``,
and computes ``x @ weight.T``: to move weights between the two, transpose
(``ours.weight.data = torch_layer.weight.detach().numpy().T``). ``bias`` has shape
``(out_features,)`` in both.

**Initialisation.** Weight and bias are drawn from U(-1/sqrt(in_features), 1/sqrt(in_features)),
which is what PyTorch's ``kaiming_uniform_(a=sqrt(5))`` and its bias rule amount to.

>>> import numpy as np
>>> from glassllm import Tensor
>>> layer = Linear(3, 2, rng=np.random.default_rng(0))
>>> layer.weight.shape, layer.bias.shape, layer.weight.dtype
((3, 2), (2,), dtype('float32'))
>>> layer(Tensor(np.ones((5, 4, 3), dtype=np.float32))).shape
(5, 4, 2)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_float_dtype, check_int
from glassllm.nn import init
from glassllm.nn.module import Module
from glassllm.rng import get_rng
from glassllm.tensor import Tensor


class Linear(Module):
    """``y = x @ weight + bias``, ``weight`` (in_features, out_features), ``bias`` (out_features,).

    Input ``(..., in_features)``, output ``(..., out_features)``. With ``bias=False`` the ``bias``
    attribute is None. Parameters are float32 unless ``dtype`` says otherwise; ``rng`` (a
    ``numpy.random.Generator``) draws the initial values, default `glassllm.rng.get_rng()`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features, min=1)
        self.out_features = check_int("out_features", out_features, min=1)
        dtype = check_float_dtype(dtype)
        rng = get_rng(rng)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = Tensor(
            np.empty((self.in_features, self.out_features), dtype=dtype), requires_grad=True
        )
        init.uniform_(self.weight, -bound, bound, rng=rng)
        if bias:
            self.bias = Tensor(np.empty(self.out_features, dtype=dtype), requires_grad=True)
            init.uniform_(self.bias, -bound, bound, rng=rng)
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., in) -> (..., out)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, dtype={self.weight.dtype}"
        )
