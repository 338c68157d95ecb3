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

`StatsLog` is what ``glassllm train --stats-interval N`` uses: it owns ``OUT_DIR/stats.jsonl``,
arms a `StepStats` on every N-th step, adds weight and gradient histograms (`histogram`) on the
first step after each evaluation, and on ``--resume`` keeps the lines up to the checkpoint's
iteration (`kept_lines`).

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

import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from glassllm._files import open_regular
from glassllm._text import finite_for_json
from glassllm.app import jsonl
from glassllm.app.config import STATS_NAME  # the file in out_dir: one record per line
from glassllm.app.jsonl import JsonLines, read_json_lines
from glassllm.tensor import Tensor

__all__ = [
    "STATS_NAME",
    "StatsLog",
    "StepStats",
    "histogram",
    "kept_lines",
    "read_stats",
    "record_problem",
    "rms",
    "total_grad_norm",
    "was_clipped",
]

HISTOGRAM_BINS = 32


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
    return finite_for_json(float(value))


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
            ratio = math.log10(update_rms / w_rms) if w_rms > 0 and update_rms > 0 else None
            ratio = None if ratio is None else _number(ratio)
            params[name] = [_number(w_rms), _number(grad_rms), ratio]
        self._before = None
        return {
            "iter": int(iteration),
            "loss": _number(loss),
            "lr": _number(lr),
            "grad_norm": _number(grad_norm),
            "clipped": was_clipped(grad_norm, grad_clip),
            "grad_clip": _number(grad_clip),  # the threshold the page draws (0: no clipping)
            "params": params,
        }


def histogram(array: np.ndarray | None, bins: int = HISTOGRAM_BINS) -> list[Any] | None:
    """``[lo, hi, counts]``: ``bins`` equal bins from the smallest to the largest finite value
    (``lo == hi``: every count in the middle bin); None for no array, or none of it finite."""
    if array is None:
        return None
    flat = array.reshape(-1)
    finite = flat[np.isfinite(flat)]
    if finite.size == 0:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    if lo == hi:
        counts = np.zeros(bins, dtype=np.int64)
        counts[bins // 2] = finite.size
        return [lo, hi, counts.tolist()]
    # np.histogram's equal bins ([lo + i*w, lo + (i+1)*w), the last one closed) by index
    # arithmetic, which is much faster than np.histogram's search of the bin edges.
    index = ((finite.astype(np.float64) - lo) * (bins / (hi - lo))).astype(np.intp)
    np.clip(index, 0, bins - 1, out=index)
    return [lo, hi, np.bincount(index, minlength=bins).tolist()]


class StatsLog:
    """``stats.jsonl`` of a training run: a `StepStats` record every ``interval`` steps (0: none),
    and, on the first step after each evaluation, weight and gradient histograms too.

    The training step calls, after clipping and around ``optimizer.step()``::

        stats.before_update(iteration, grad_norm, evaluated)   # nothing unless this step logs
        optimizer.step()
        stats.after_update(loss, lr)                           # appends the step's line

    ``iteration`` is the count of steps done before this one (the line's ``iter`` is one more,
    as in ``log.jsonl``, where ``iter`` is the steps done); ``grad_norm`` what
    ``clip_grad_norm_`` returned, or None without clipping (then computed here, only on a
    logged step); ``evaluated`` whether the run evaluated at ``iteration``: that step's line
    gets ``"hist": {name: {"w": [lo, hi, counts], "g": [lo, hi, counts]}}``, the weights being
    exactly those evaluated and the gradient the next batch's at those weights (at evaluation
    time there is none). Lines are strict JSON (non-finite numbers are None).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        named_parameters: Iterable[tuple[str, Tensor]],
        interval: int,
        grad_clip: float,
    ) -> None:
        self.path = Path(path)
        self.interval = int(interval)
        self.grad_clip = float(grad_clip)
        self.stats = StepStats(named_parameters)
        self._pending: tuple[int, float, dict[str, Any] | None] | None = None

    def start(self, kept_until: int | None, warn: Callable[[str], None] | None = None) -> None:
        """Begin the file: a fresh run (``kept_until`` None) empties it; a resumed run keeps the
        lines with ``iter <= kept_until`` (the checkpoint's iteration) and drops later ones and
        bad ones (``warn`` is told how many), as ``log.jsonl`` is kept. Without stats and
        without a file, nothing. A FIFO there is refused, never waited on (`glassllm._files`)."""
        if self.interval == 0 and not os.path.lexists(self.path):
            return
        kept = "" if kept_until is None else kept_lines(self.path, kept_until, warn)
        with open_regular(self.path, f"stats {str(self.path)!r}", "write") as file:
            file.write(kept.encode("utf-8"))

    def before_update(self, iteration: int, grad_norm: float | None, evaluated: bool) -> None:
        """Copy the weights and measure the gradients when step ``iteration + 1`` is logged."""
        self._pending = None
        if self.interval == 0:
            return
        step = iteration + 1
        if step % self.interval != 0 and not evaluated:
            return
        if grad_norm is None:
            grad_norm = total_grad_norm(param for _, param in self.stats.parameters)
        hist = None
        if evaluated:
            hist = {
                name: {"w": histogram(param.data), "g": histogram(param.grad)}
                for name, param in self.stats.parameters
            }
        self.stats.before_update()
        self._pending = (step, float(grad_norm), hist)

    def after_update(self, loss: float, lr: float) -> dict[str, Any] | None:
        """Append the line of the step `before_update` armed (and return it); else None."""
        if self._pending is None:
            return None
        step, grad_norm, hist = self._pending
        self._pending = None
        record = self.stats.after_update(step, loss, lr, grad_norm, self.grad_clip)
        if hist is not None:
            record["hist"] = hist
        return self._append(record)

    def after_last_evaluation(self, iteration: int) -> dict[str, Any] | None:
        """Append the weight histograms of the run's last evaluation, at ``iteration`` (no step
        follows it, so none would carry them): ``{"iter": iteration + 1, "hist": ...}`` with
        ``"g"`` None, no gradient having been computed at those weights. A resumed run drops
        the line (``iter`` beyond the checkpoint's) and its first step writes the full one."""
        if self.interval == 0:
            return None
        hist = {
            name: {"w": histogram(param.data), "g": None} for name, param in self.stats.parameters
        }
        return self._append({"iter": int(iteration) + 1, "hist": hist})

    def _append(self, record: dict[str, Any]) -> dict[str, Any]:
        line = json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
        with open_regular(self.path, f"stats {str(self.path)!r}", "append") as file:
            file.write(line.encode("utf-8"))  # a FIFO put there meanwhile: refused, not waited on
        return record


def _ratios(params: Any) -> bool:
    return isinstance(params, dict) and all(
        isinstance(v, list) and len(v) == 3 and all(map(jsonl.number_or_null, v))
        for v in params.values()
    )


# What each key of a stats record must be, when the line has it (only "iter" is required).
_STATS_FIELDS = {
    "loss": (jsonl.number_or_null, "a number or null"),
    "lr": (jsonl.number_or_null, "a number or null"),
    "grad_norm": (jsonl.number_or_null, "a number or null"),
    "clipped": (lambda v: isinstance(v, bool), "true or false"),
    "grad_clip": (jsonl.number_or_null, "a number or null"),
    "params": (_ratios, "an object of [w_rms, grad_rms, log10_update_ratio]"),
    "hist": (lambda v: isinstance(v, dict), "an object"),
}


def record_problem(value: Any) -> str | None:
    """Why the JSON value of a ``stats.jsonl`` line is not a record, or None: an object with an
    integer ``iter`` and, of the keys `StatsLog` writes, each present one of its type."""
    return jsonl.record_problem(value, _STATS_FIELDS)


def read_stats(path: str | os.PathLike[str], live: bool = False) -> JsonLines:
    """The records of ``stats.jsonl`` (`record_problem`), a bad line skipped and counted
    (`glassllm.app.jsonl`: the one reader, and why). ``live``: a run may be writing the last
    line. A file that cannot be read raises FileProblem (a ValueError)."""
    return read_json_lines(path, record_problem, live=live, label=f"stats {os.fspath(path)!r}")


def kept_lines(
    path: str | os.PathLike[str], last: int, warn: Callable[[str], None] | None = None
) -> str:
    """The lines of ``stats.jsonl`` whose ``iter`` is at most ``last``, in order (a missing file
    keeps nothing; a bad line, e.g. half written by a crash, is skipped, ``warn`` called with
    one line saying so)."""
    lines = read_stats(path)
    message = lines.warning(Path(path).name)
    if message is not None and warn is not None:
        warn(message)
    return "".join(line.text + "\n" for line in lines.records if line.value["iter"] <= last)
