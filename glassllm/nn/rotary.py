"""`RotaryEmbedding`: rotary position embeddings for queries and keys, with cached tables.

No parameters: the inverse frequencies come from ``rotary_dim``, ``theta`` and ``scaling``
(`glassllm.functional.rotary_frequencies`), and ``forward(x, start)`` rotates ``x (..., T, D)``
as positions ``start .. start + T - 1`` (`glassllm.functional.rotary`). ``start`` is the number
of positions already in a key/value cache when decoding, so a token appended at position ``p``
is rotated as it would be in a full forward. The cos/sin tables are computed once for the
positions seen so far and grown (doubling) when a longer sequence comes; each entry depends on
its position only, so a grown table holds the same bits.

>>> import numpy as np
>>> from glassllm import Tensor
>>> rope = RotaryEmbedding(4)
>>> x = Tensor(np.ones((2, 3, 5, 4), dtype=np.float32))  # (B, heads, T, head_dim)
>>> full = rope(x).data
>>> np.array_equal(rope(Tensor(x.data[:, :, 4:]), start=4).data, full[:, :, 4:])
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_int
from glassllm.nn.module import Module
from glassllm.tensor import Tensor

# why: the first table covers 256 positions (a few KB), enough for the tiny models' contexts;
# longer sequences double it.
_FIRST_TABLE = 256


class RotaryEmbedding(Module):
    """Rotate the first ``rotary_dim`` features of ``x (..., T, D)`` by position.

    ``theta``: the frequency base (10000 in Llama 2 and GPT-NeoX, 100000 in SmolLM2, 500000 in
    Llama 3); ``scaling``: as `glassllm.functional.rotary_frequencies` (None, linear or llama3);
    ``interleaved``: pairs ``(2i, 2i + 1)`` (llama.cpp's row order) instead of transformers'
    ``(i, i + r/2)``. ``rotary_dim < D`` leaves the rest as they are (GPT-NeoX).
    """

    def __init__(
        self,
        rotary_dim: int,
        theta: float = 10000.0,
        scaling: Mapping[str, Any] | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        self.rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
        self.inv_freq = F.rotary_frequencies(self.rotary_dim, theta, scaling)  # (r/2,) float32
        self.theta = float(theta)
        self.scaling = None if scaling is None else dict(scaling)
        self.interleaved = bool(interleaved)
        self._cos = self._sin = np.empty((0, self.rotary_dim // 2), np.float32)

    def tables(self, start: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` for positions ``start .. start + steps - 1``, ``(steps, r/2)`` float32."""
        stop = start + steps
        if stop > len(self._cos):
            size = max(_FIRST_TABLE, len(self._cos))
            while size < stop:
                size *= 2
            self._cos, self._sin = F.rotary_cos_sin(np.arange(size), self.inv_freq)
        return self._cos[start:stop], self._sin[start:stop]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        start = check_int("RotaryEmbedding: start", start, min=0)
        if getattr(x, "ndim", 0) < 2:
            raise ValueError(
                f"RotaryEmbedding: x needs at least 2 axes (..., T, D), got shape {x.shape}"
            )
        cos, sin = self.tables(start, x.shape[-2])  # (T, r/2)
        return F.rotary(x, cos, sin, interleaved=self.interleaved)  # (..., T, D)

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return f"{self.rotary_dim}, theta={self.theta}{scaling}, interleaved={self.interleaved}"
