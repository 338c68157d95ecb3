"""Token streams cut into training examples, as nanoGPT's ``get_batch``.

An example is a window of ``block_size + 1`` consecutive tokens: the first ``block_size`` are the
input ``x``, the last ``block_size`` the targets ``y`` (``y[t] = x[t + 1]``), so one window
teaches the model ``block_size`` next-token predictions at once.

>>> import numpy as np
>>> data = np.arange(10)
>>> x, y = get_batch(data, block_size=4, batch_size=2, rng=np.random.default_rng(0))
>>> x.shape, y.shape
((2, 4), (2, 4))
>>> bool((y[:, :-1] == x[:, 1:]).all())
True
>>> train, val = split_train_val(data)
>>> len(train), len(val)
(9, 1)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

VAL_FRACTION = 0.1


def split_train_val(
    ids: np.ndarray, val_fraction: float = VAL_FRACTION
) -> tuple[np.ndarray, np.ndarray]:
    """First ``1 - val_fraction`` of the stream for training, the rest for validation (nanoGPT).

    A contiguous split (not a shuffled one) keeps validation text unseen in every window.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_train = int(len(ids) * (1.0 - val_fraction))
    return ids[:n_train], ids[n_train:]


def check_long_enough(ids: np.ndarray, block_size: int, split: str) -> None:
    """A split needs at least one full window of ``block_size + 1`` tokens."""
    if len(ids) < block_size + 1:
        raise ValueError(
            f"the {split} split has {len(ids)} tokens, fewer than block_size + 1 = {block_size + 1}"
        )


def get_batch(
    data: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``batch_size`` windows at uniformly random offsets: ``x, y`` int64 arrays (B, block_size).

    Draws exactly ``rng.integers(len(data) - block_size, size=batch_size)``, as nanoGPT, so the
    generator's state after a batch depends only on how many batches were drawn. ``data`` is an
    array, or a `glassllm.data.shards.TokenShards` stream, which gives the same windows.
    """
    check_long_enough(data, block_size, "data")
    ix = rng.integers(len(data) - block_size, size=batch_size)  # start offsets, (B,)
    if isinstance(data, np.ndarray):
        windows = np.lib.stride_tricks.sliding_window_view(data, block_size + 1)  # view, no copy
        chosen = windows[ix].astype(np.int64)  # (B, block_size + 1), a copy
    else:  # a prepared corpus's shards (glassllm.data.shards): the same windows, read from disk
        chosen = data.windows(ix, block_size + 1)
    return chosen[:, :-1], chosen[:, 1:]


def sequential_batches(
    data: np.ndarray, block_size: int, batch_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every non-overlapping window of the stream, in order, ``batch_size`` at a time.

    Scoring these covers each token of ``data`` (but the first, and a tail shorter than a window)
    exactly once: the whole-split loss a benchmark reports, as opposed to the random-batch
    estimate used during training.
    """
    check_long_enough(data, block_size, "data")
    n_windows = (len(data) - 1) // block_size
    starts = np.arange(n_windows) * block_size
    for first in range(0, n_windows, batch_size):
        ix = starts[first : first + batch_size]
        if isinstance(data, np.ndarray):
            offsets = ix[:, None] + np.arange(block_size + 1)  # (b, block_size + 1)
            chosen = data[offsets].astype(np.int64)
        else:  # shards (glassllm.data.shards)
            chosen = data.windows(ix, block_size + 1)
        yield chosen[:, :-1], chosen[:, 1:]
