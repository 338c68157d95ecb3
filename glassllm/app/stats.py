"""Training statistics of one optimisation step: weight and gradient sizes, update/weight ratios.

`StepStats` watches a model's parameters across ``optimizer.step()``; it reads weights and
gradients and never writes them, and draws no random numbers, so a run that records statistics
trains exactly as one that does not. The training loop calls, between ``backward`` and
``zero_grad``::

    grad_norm = clip_grad_norm_(params, grad_clip)   # or total_grad_norm(params) without clipping
    stats.before_update()                            # copies the weights, reads the gradients
    optimizer.step()
    record = stats.after_update(iteration, loss, lr, grad_norm, grad_clip)

and writes ``record`` as one line of ``stats.jsonl``::

    {"iter": 10, "loss": 2.31, "lr": 0.001, "grad_norm": 0.84, "clipped": false,
     "params": {"wte.weight": [w_rms, grad_rms, log10_update_ratio], ...}}

* ``w_rms = rms(W)`` before the update; ``grad_rms = rms(g)`` of the gradient the optimizer used
  (after clipping);
* ``log10_update_ratio = log10(rms(dW) / rms(W))`` with ``dW`` the real update the optimizer
  made (AdamW's, weight decay included; not ``lr * g``). About -3 is the healthy range
  (Karpathy, makemore part 3). None where it is undefined: ``W = 0`` (a zero-initialised
  bias at step 1) or no update at all.
* ``grad_norm`` is the global 2-norm before clipping (what ``clip_grad_norm_`` returns);
  ``clipped`` whether clipping scaled the gradients (the test ``clip_grad_norm_`` applies).

Non-finite numbers are written as None (JSON has no nan).

>>> import numpy as np
>>> from glassllm import Tensor
>>> from glassllm.optim import SGD
>>> w = Tensor(np.array([3.0, 4.0]), requires_grad=True)
>>> w.grad = np.array([1.0, 1.0])
>>> stats = StepStats([("w", w)])
>>> stats.before_update()
>>> SGD([w], lr=0.01).step()
>>> record = stats.after_update(iteration=1, loss=0.5, lr=0.01, grad_norm=1.4142, grad_clip=1.0)
>>> record["clipped"], [round(v, 4) for v in record["params"]["w"]]
(True, [3.5355, 1.0, -2.5485])
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from glassllm.tensor import Tensor

# The file in out_dir that holds one record per stats step (one JSON object per line).
STATS_NAME = "stats.jsonl"


def rms(array: np.ndarray) -> float:
    """Root mean square of ``array``, accumulated in float64."""
    if array.size == 0:
        return 0.0
    flat = array.reshape(-1).astype(np.float64, copy=False)
    return math.sqrt(float(np.dot(flat, flat)) / flat.size)


def total_grad_norm(parameters: Iterable[Tensor]) -> float:
    """The global 2-norm of the gradients (what ``clip_grad_norm_`` returns), without clipping."""
    total = 0.0
    for param in parameters:
        if param.grad is not None:
            flat = param.grad.reshape(-1).astype(np.float64, copy=False)
            total += float(np.dot(flat, flat))
    return math.sqrt(total)


def was_clipped(grad_norm: float, grad_clip: float) -> bool:
    """Whether ``clip_grad_norm_(params, grad_clip)`` scaled gradients of norm ``grad_norm``
    (its test: ``grad_clip / (grad_norm + 1e-6) < 1``); ``grad_clip <= 0`` means no clipping."""
    if grad_clip <= 0:
        return False
    scale = grad_clip / (grad_norm + 1e-6)
    return scale < 1.0 or math.isnan(scale)


def _number(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


class StepStats:
    """Statistics of the parameters ``named_parameters`` across one optimizer step."""

    def __init__(self, named_parameters: Iterable[tuple[str, Tensor]]) -> None:
        self.parameters = list(named_parameters)
        for name, param in self.parameters:
            if not isinstance(param, Tensor):
                raise TypeError(f"parameter {name!r} is a {type(param).__name__}, not a Tensor")
        self._before: list[tuple[np.ndarray, float]] | None = None

    def before_update(self) -> None:
        """Copy each weight and measure its gradient; call after clipping, before the step."""
        self._before = [
            (param.data.copy(), 0.0 if param.grad is None else rms(param.grad))
            for _, param in self.parameters
        ]

    def after_update(
        self,
        iteration: int,
        loss: float,
        lr: float,
        grad_norm: float,
        grad_clip: float,
    ) -> dict[str, Any]:
        """The record of the step (see the module docstring); call right after the step."""
        if self._before is None:
            raise RuntimeError("StepStats.after_update needs before_update first")
        params: dict[str, list[float | None]] = {}
        for (name, param), (weight, grad_rms) in zip(self.parameters, self._before, strict=True):
            w_rms = rms(weight)
            update_rms = rms(param.data - weight)
            ratio = (
                math.log10(update_rms / w_rms) if w_rms > 0 and update_rms > 0 else None
            )
            params[name] = [_number(w_rms), _number(grad_rms), None if ratio is None else ratio]
        self._before = None
        return {
            "iter": int(iteration),
            "loss": _number(loss),
            "lr": _number(lr),
            "grad_norm": _number(grad_norm),
            "clipped": was_clipped(grad_norm, grad_clip),
            "params": params,
        }
