"""`Embedding`: a lookup table from integer ids to learned vectors.

``weight`` has shape ``(num_embeddings, embedding_dim)`` (the same layout as PyTorch) and starts
from N(0, 1). The backward adds the gradient of every occurrence of an id into that id's row, so an
id that repeats in a batch gets the sum of its contributions (`glassllm.functional.embedding`).
``attend(x)`` is the same table used as a tied output head, ``x @ weight^T`` (Flax's
``Embed.attend``), so a model asks its embedding for logits without knowing how it is stored
(`QuantizedEmbedding` keeps the table as blocks).

>>> import numpy as np
>>> table = Embedding(10, 4, rng=np.random.default_rng(0))
>>> table(np.array([[1, 2, 1]])).shape
(1, 3, 4)
"""

from __future__ import annotations

from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_float_dtype, check_int
from glassllm.nn import init
from glassllm.nn.module import Module
from glassllm.rng import get_rng
from glassllm.tensor import Tensor


class Embedding(Module):
    """Map integer ids ``(...)`` to vectors ``(..., embedding_dim)`` by row lookup in ``weight``.

    ``ids`` may be an integer ndarray or a Tensor holding one; ids outside
    ``[0, num_embeddings)`` raise an error. ``rng`` draws the N(0, 1) initial values (default
    `glassllm.rng.get_rng()`); parameters are float32 unless ``dtype`` says otherwise.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = check_int("num_embeddings", num_embeddings, min=1)
        self.embedding_dim = check_int("embedding_dim", embedding_dim, min=1)
        shape = (self.num_embeddings, self.embedding_dim)
        self.weight = Tensor(np.empty(shape, dtype=check_float_dtype(dtype)), requires_grad=True)
        init.normal_(self.weight, 0.0, 1.0, rng=get_rng(rng))

    def forward(self, ids: np.ndarray | Tensor) -> Tensor:
        return F.embedding(ids, self.weight)  # (...) -> (..., embedding_dim)

    def attend(self, x: Tensor) -> Tensor:
        """The table as a tied head: ``x (..., dim) @ weight^T``, ``(..., num_embeddings)``."""
        return F.linear(x, self.weight.transpose(1, 0))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, dtype={self.weight.dtype}"
