"""`Dropout` (Srivastava et al., 2014), the inverted form PyTorch uses.

In training mode each element is zeroed with probability ``p`` and the kept ones are scaled by
``1/(1-p)``, so the expected value is unchanged and evaluation needs no rescaling. In eval mode
(``module.eval()``), and always when ``p == 0``, it is the identity; ``p == 1`` gives zeros (as
PyTorch).

>>> import numpy as np
>>> from glassllm import Tensor
>>> drop = Dropout(0.5, rng=np.random.default_rng(0))
>>> x = Tensor(np.ones(8, dtype=np.float32))
>>> sorted(set(drop(x).data.tolist())) in ([0.0, 2.0], [0.0], [2.0])
True
>>> drop.eval()(x).data.tolist() == x.data.tolist()
True
"""

from __future__ import annotations

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_generator, check_probability
from glassllm.nn.module import Module
from glassllm.tensor import Tensor


class Dropout(Module):
    """Zero each element with probability ``p`` in training mode; identity in eval mode.

    ``rng``: the ``numpy.random.Generator`` the masks come from. When None (the default), each call
    draws from `glassllm.rng.get_rng()` at call time, so `glassllm.manual_seed` called after
    construction still makes the masks reproducible.
    """

    def __init__(self, p: float = 0.5, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        self.p = check_probability("dropout probability p", p)
        self.rng = check_generator("rng", rng)

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, training=self.training, rng=self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"
