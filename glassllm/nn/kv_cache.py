"""`KVCache`: the keys and values one attention layer has already computed, for generation.

When a GPT generates token t+1 it needs the keys and values of positions 0..t again. Recomputing
them costs the whole context per new token; the cache keeps them, so a step only projects the new
token and attends over the stored positions. One `KVCache` belongs to one attention layer. Its
``nh`` is the layer's key/value heads: fewer than its query heads under grouped-query attention,
which is what makes such a cache smaller. Keys are stored as attended (after QK-norm and rotary
positions), so a cached key is never rotated again.

Storage is a preallocated array of shape ``(B, nh, capacity, hs)`` that doubles when full, so
appending T positions one at a time copies O(T) elements in total rather than O(T^2).

>>> import numpy as np
>>> cache = KVCache()
>>> keys, values = cache.append(np.zeros((1, 2, 3, 4)), np.ones((1, 2, 3, 4)))
>>> keys.shape, cache.length
((1, 2, 3, 4), 3)
>>> keys, values = cache.append(np.zeros((1, 2, 1, 4)), np.ones((1, 2, 1, 4)))
>>> values.shape, cache.length
((1, 2, 4, 4), 4)
"""

from __future__ import annotations

import numpy as np

from glassllm._checks import is_integer


class KVCache:
    """Keys and values ``(B, nh, T, hs)`` of one attention layer, appended position by position.

    ``capacity`` is how many positions to allocate on the first append (default: what that append
    needs, at least 16); the buffers double whenever an append does not fit. The batch size, number
    of heads, head size and dtype are fixed by the first append. `reset` empties the cache.
    Only `CausalSelfAttention` under ``no_grad`` writes to it: a cache is for inference.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and not (is_integer(capacity) and capacity > 0):
            raise ValueError(f"capacity must be a positive integer or None, got {capacity!r}")
        self.capacity_hint = capacity
        self._keys: np.ndarray | None = None  # (B, nh, capacity, hs); positions >= length unused
        self._values: np.ndarray | None = None
        self.length = 0

    @property
    def keys(self) -> np.ndarray | None:
        """The cached keys ``(B, nh, length, hs)`` (a view), or None before the first append."""
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> np.ndarray | None:
        """The cached values ``(B, nh, length, hs)`` (a view), or None before the first append."""
        return None if self._values is None else self._values[:, :, : self.length]

    @property
    def capacity(self) -> int:
        """Positions the buffers hold before the next doubling (0 before the first append)."""
        return 0 if self._keys is None else self._keys.shape[2]

    def reset(self) -> None:
        """Forget every cached position (the buffers are released too)."""
        self._keys = self._values = None
        self.length = 0

    def append(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store ``keys`` and ``values`` ``(B, nh, T_new, hs)`` after the cached positions.

        Returns views of all cached keys and values, ``(B, nh, length, hs)`` each. Views stay valid
        until the next append (which may move the storage when it doubles).
        """
        keys, values = np.asarray(keys), np.asarray(values)
        if keys.ndim != 4 or keys.shape != values.shape:
            raise ValueError(
                f"KVCache.append expects keys and values of one shape (B, nh, T, hs), "
                f"got {keys.shape} and {values.shape}"
            )
        if keys.dtype != values.dtype:
            raise TypeError(f"keys ({keys.dtype}) and values ({values.dtype}) differ in dtype")
        batch, heads, new, head_size = keys.shape
        if self._keys is None:
            capacity = max(new, self.capacity_hint or 16)
            self._keys = np.empty((batch, heads, capacity, head_size), dtype=keys.dtype)
            self._values = np.empty_like(self._keys)
        else:
            expected = (self._keys.shape[0], self._keys.shape[1], self._keys.shape[3])
            if (batch, heads, head_size) != expected or keys.dtype != self._keys.dtype:
                raise ValueError(
                    f"KVCache holds (B, nh, hs) = {expected} of {self._keys.dtype}; cannot append "
                    f"{(batch, heads, head_size)} of {keys.dtype} (call reset() for a new sequence)"
                )
        end = self.length + new
        if end > self.capacity:
            self._grow(end)
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self.keys, self.values

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = np.empty(old.shape[:2] + (capacity,) + old.shape[3:], dtype=old.dtype)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def __repr__(self) -> str:
        if self._keys is None:
            return "KVCache(empty)"
        batch, heads, _, head_size = self._keys.shape
        return (
            f"KVCache(B={batch}, nh={heads}, hs={head_size}, length={self.length}, "
            f"capacity={self.capacity}, dtype={self._keys.dtype})"
        )
