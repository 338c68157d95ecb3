"""Dropout: randomly zero entries during training, rescaling the survivors."""

from __future__ import annotations

import numpy as np

from glassllm._checks import check_probability
from glassllm.functional._common import float_tensor
from glassllm.rng import dropout_mask
from glassllm.tensor import Tensor


def dropout(
    x: Tensor, p: float, training: bool = True, rng: np.random.Generator | None = None
) -> Tensor:
    """Zero each entry with probability ``p``, scale the rest by ``1/(1-p)`` ("inverted" dropout).

    Forward: ``y = x * m``, ``m_i = [u_i >= p] / (1 - p)``, ``u_i ~ U[0, 1)`` from
    ``glassllm.rng.get_rng(rng)``, so ``E[y] = x`` and evaluation needs no rescaling.
    VJP: ``dL/dx = g * m`` (the same mask, kept in ``x``'s dtype).
    ``training=False`` or ``p == 0`` returns ``x`` itself; ``p == 1`` gives zeros and a zero
    gradient (as PyTorch); ``p`` outside ``[0, 1]`` is a ValueError.

    >>> x = Tensor(np.ones(10_000, dtype=np.float32))
    >>> y = dropout(x, 0.25, rng=np.random.default_rng(0))
    >>> y.dtype, sorted(set(y.data.tolist())), abs(float(y.data.mean()) - 1.0) < 0.05
    (dtype('float32'), [0.0, 1.3333333730697632], True)
    """
    p = check_probability("dropout: p", p)
    x = float_tensor(x, "dropout: x")
    if not training or p == 0.0:
        return x
    mask = dropout_mask(x.shape, p, x.dtype, rng)
    out = np.multiply(x.data, mask)

    def backward(grad: np.ndarray) -> tuple:
        return (np.multiply(grad, mask),)

    return Tensor.from_op(out, (x,), backward).named("dropout")
