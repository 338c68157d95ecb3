"""Metrics of a run's logits for the experiments: one number per batch row.

A metric is a function ``metric(logits) -> (B,)`` of the logits Tensor (B, T, V), built from
glassllm ops, so the same function serves both uses:

* activation patching and ablation evaluate it under no_grad on a batch of patched runs, one
  row per cell (``metric(logits).data``);
* attribution patching, saliency and integrated gradients back-propagate its sum over the
  batch (rows are independent sequences, so row r's gradient is row r's alone).

The default is TransformerLens's favourite, the logit difference
``logit[answer] - logit[wrong]`` at one position (the last): positive when the model prefers
the answer. It is linear in the final norm's output, which is what makes direct logit
attribution exact once the norm's scale is frozen (`glassllm.interp.dla`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from glassllm.autograd import no_grad
from glassllm.tensor import Tensor

Metric = Callable[[Tensor], Tensor]


def logit_diff(answer: int, wrong: int, position: int = -1) -> Metric:
    """``logits[:, position, answer] - logits[:, position, wrong]``, (B,), as a metric."""
    answer, wrong, position = int(answer), int(wrong), int(position)

    def metric(logits: Tensor) -> Tensor:
        _check_token(logits, answer, "answer")
        _check_token(logits, wrong, "wrong")
        return logits[:, position, answer] - logits[:, position, wrong]

    metric.__name__ = f"logit_diff({answer}, {wrong})"
    return metric


def _check_token(logits: Tensor, token: int, role: str) -> None:
    if not 0 <= token < logits.shape[-1]:
        raise ValueError(
            f"the {role} token {token} is outside the vocabulary [0, {logits.shape[-1]})"
        )


def rows(metric: Metric, logits: Tensor) -> np.ndarray:
    """``metric(logits)`` as a float64 array (B,), checked: one value per batch row."""
    with no_grad():
        value = metric(logits)
    data = np.asarray(value.data if isinstance(value, Tensor) else value, dtype=np.float64)
    if data.shape != (logits.shape[0],):
        raise ValueError(
            f"a metric must return one value per batch row, shape ({logits.shape[0]},); "
            f"got shape {data.shape}"
        )
    return data


def total(metric: Metric) -> Metric:
    """The scalar ``metric(logits).sum()``: what a backward starts from."""

    def summed(logits: Tensor) -> Tensor:
        value = metric(logits)
        if not isinstance(value, Tensor) or value.ndim != 1:
            raise ValueError("a metric must return a (B,) Tensor built from glassllm ops")
        return value.sum()

    return summed
