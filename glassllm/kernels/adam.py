"""Adam's update run fast: the parameters in blocks of about equal size over worker threads, each
parameter in one compiled loop of the same operations with the ``fast`` extra (the same bits as
the NumPy update of `glassllm.optim.adam`, which runs where no compiled loop applies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from glassllm.kernels import compiled
from glassllm.threads import run_blocks, size_blocks

# why: below ~64K elements per block a hand-off to a worker thread costs more than it saves.
MIN_BLOCK = 1 << 16

Update = tuple[np.ndarray, np.ndarray, dict[str, Any]]  # (param, grad, state)


def adam_in_blocks(
    updates: Sequence[Update], settings: Any, update_one: Callable[..., None]
) -> None:
    """``update_one(param, grad, state, settings, slot)`` for every update, or its compiled loop;
    the parameters are independent, so each block runs on its own thread with its own scratch
    ``slot``, and each parameter's arithmetic is the same on any thread."""
    blocks = size_blocks(list(updates), [param.size for param, _, _ in updates], MIN_BLOCK)
    run_blocks(
        [
            partial(_update_block, block, settings, update_one, f"{i}")
            for i, block in enumerate(blocks)
        ]
    )


def _update_block(block: list, settings: Any, update_one: Callable[..., None], slot: str) -> None:
    for param, grad, state in block:
        fused = compiled.kernels_for(param.dtype)
        flat = (
            None
            if fused is None
            else _flat_views(param, grad, state["exp_avg"], state["exp_avg_sq"])
        )
        if flat is None:
            update_one(param, grad, state, settings, slot)
            continue
        step = state["step"]
        lr, weight_decay, decoupled = settings.lr, settings.weight_decay, settings.decoupled
        dtype = param.dtype.type
        fused.adam_update(
            *flat,
            dtype(1.0 - lr * weight_decay if decoupled and weight_decay else 1.0),
            dtype(0.0 if decoupled else weight_decay),
            dtype(1.0 - settings.beta1),
            dtype(settings.beta2),
            dtype(1.0 - settings.beta2),
            dtype((1.0 - settings.beta2**step) ** 0.5),
            dtype(settings.eps),
            dtype(-lr / (1.0 - settings.beta1**step)),
        )


def _flat_views(*arrays: np.ndarray) -> list[np.ndarray] | None:
    """The arrays as 1-D views when all are C-contiguous with the same shape and dtype (what a
    compiled kernel takes), else None."""
    first = arrays[0]
    for a in arrays:
        if not a.flags.c_contiguous or a.shape != first.shape or a.dtype != first.dtype:
            return None
    return [a.reshape(-1) for a in arrays]
