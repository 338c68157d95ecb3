"""Learning-rate schedules: pure functions of the iteration, and objects that set ``group["lr"]``.

The functions give the learning rate at iteration ``it`` (counted from 0), so a training loop can
do what nanoGPT does::

    for group in optimizer.param_groups:
        group["lr"] = cosine_with_warmup(it, lr, min_lr, warmup_iters, lr_decay_iters)

The scheduler objects wrap the same functions, PyTorch style: constructing one sets the lr of
iteration 0, and each ``scheduler.step()`` (called after ``optimizer.step()``) moves to the next
iteration. Because the lr is a pure function of the iteration, resuming needs only the iteration
count (``state_dict()`` / ``load_state_dict()``, or ``scheduler.step(it)``).
"""

from __future__ import annotations

import math
from typing import Any

from glassllm._checks import check_int
from glassllm.optim.optimizer import Optimizer


def step_decay(it: int, lr: float, step_size: int, gamma: float = 0.1) -> float:
    """``lr · gamma^(it // step_size)``: multiply by ``gamma`` every ``step_size`` iterations
    (``torch.optim.lr_scheduler.StepLR``).

    >>> [step_decay(it, 1.0, step_size=2, gamma=0.5) for it in range(5)]
    [1.0, 1.0, 0.5, 0.5, 0.25]
    """
    it = check_int("the iteration", it, min=0)
    step_size = check_int("step_size", step_size, min=1)
    return float(lr) * float(gamma) ** (it // step_size)


def cosine_with_warmup(
    it: int, lr: float, min_lr: float, warmup_iters: int, lr_decay_iters: int
) -> float:
    """nanoGPT's ``get_lr``: linear warmup, cosine decay to a floor, then the floor.

    * ``it < warmup_iters``: ``lr · (it + 1) / (warmup_iters + 1)`` (never 0 at ``it = 0``);
    * ``warmup_iters <= it < lr_decay_iters``: with
      ``r = (it − warmup_iters) / (lr_decay_iters − warmup_iters)``,
      ``min_lr + ½ (1 + cos(π r)) (lr − min_lr)``, falling from ``lr`` to ``min_lr``;
    * ``it >= lr_decay_iters``: ``min_lr`` (nanoGPT's ``it > lr_decay_iters`` gives the same
      value, since ``cos(π) = −1`` exactly; ``>=`` also covers ``lr_decay_iters == warmup_iters``).

    >>> [round(cosine_with_warmup(it, 1.0, 0.1, 2, 6), 4) for it in range(8)]
    [0.3333, 0.6667, 1.0, 0.8682, 0.55, 0.2318, 0.1, 0.1]
    """
    it = check_int("the iteration", it, min=0)
    warmup_iters = check_int("warmup_iters", warmup_iters, min=0)
    lr_decay_iters = check_int("lr_decay_iters", lr_decay_iters, min=0)
    if lr_decay_iters < warmup_iters:
        raise ValueError(
            f"lr_decay_iters ({lr_decay_iters}) must be >= warmup_iters ({warmup_iters})"
        )
    lr, min_lr = float(lr), float(min_lr)
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (lr - min_lr)


class LRScheduler:
    """Base class: sets every group's ``lr`` to ``lr_at(iteration, base_lr)``.

    ``base_lrs`` are the groups' learning rates when the scheduler is built. Construction applies
    iteration 0; ``step()`` advances one iteration; ``step(it)`` jumps to iteration ``it``.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected a glassllm Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base_lrs: list[float] = [float(group["lr"]) for group in optimizer.param_groups]
        self.last_iter = 0
        self._apply()

    def lr_at(self, it: int, base_lr: float) -> float:
        """The learning rate at iteration ``it`` for a group whose base lr is ``base_lr``."""
        raise NotImplementedError

    def step(self, it: int | None = None) -> None:
        """Move to iteration ``it`` (default: the next one) and set each group's lr."""
        if it is None:
            it = self.last_iter + 1
        it = check_int("the iteration", it, min=0)
        self._check_groups()
        self.last_iter = it
        self._apply()

    def get_last_lr(self) -> list[float]:
        """The learning rate of each group at the current iteration."""
        return [self.lr_at(self.last_iter, base) for base in self.base_lrs]

    def _check_groups(self) -> None:
        # Checked before anything changes: a group added with add_param_group after the scheduler
        # was built has no base lr, and zip(strict=True) would fail half-way through the groups.
        groups, bases = len(self.optimizer.param_groups), len(self.base_lrs)
        if groups != bases:
            raise ValueError(
                f"the optimizer has {groups} parameter groups but this scheduler was built for "
                f"{bases}; build the scheduler after the last add_param_group"
            )

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.get_last_lr(), strict=True):
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        """``{"last_iter": int, "base_lrs": [float]}``: all a pure schedule needs to resume."""
        return {"last_iter": self.last_iter, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict` and set the groups' lr for that iteration."""
        base_lrs = state_dict.get("base_lrs")
        if not isinstance(base_lrs, list) or len(base_lrs) != len(self.optimizer.param_groups):
            raise ValueError(
                f"scheduler state has base_lrs {base_lrs!r}; expected one per parameter group "
                f"({len(self.optimizer.param_groups)})"
            )
        it = state_dict.get("last_iter")
        it = check_int("the iteration", it, min=0)
        self.base_lrs = [float(lr) for lr in base_lrs]
        self.step(it)


class Constant(LRScheduler):
    """Keep each group's lr at its base value (nanoGPT's ``decay_lr = False``).

    Not ``torch.optim.lr_scheduler.ConstantLR``, which scales the lr by a factor for a while.
    """

    def lr_at(self, it: int, base_lr: float) -> float:
        return base_lr


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` iterations (see `step_decay`).

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> from glassllm.optim import SGD
    >>> opt = SGD([Tensor(np.zeros(1), requires_grad=True)], lr=1.0)
    >>> scheduler = StepLR(opt, step_size=2, gamma=0.5)
    >>> lrs = []
    >>> for _ in range(5):
    ...     lrs.append(opt.param_groups[0]["lr"])
    ...     scheduler.step()
    >>> lrs
    [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        step_decay(0, 1.0, step_size, gamma)  # validates before anything is set
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer)

    def lr_at(self, it: int, base_lr: float) -> float:
        return step_decay(it, base_lr, self.step_size, self.gamma)


class CosineWithWarmup(LRScheduler):
    """Linear warmup, cosine decay to ``min_lr``, then ``min_lr`` (see `cosine_with_warmup`).

    The groups' lr at construction is the peak; ``min_lr`` is one absolute floor shared by all
    groups (as ``eta_min`` in PyTorch's ``CosineAnnealingLR``).

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> from glassllm.optim import AdamW
    >>> opt = AdamW([Tensor(np.zeros(1), requires_grad=True)], lr=1e-3)
    >>> scheduler = CosineWithWarmup(opt, warmup_iters=10, lr_decay_iters=100, min_lr=1e-4)
    >>> opt.param_groups[0]["lr"] == 1e-3 / 11
    True
    >>> scheduler.step(100); opt.param_groups[0]["lr"]
    0.0001
    """

    def __init__(
        self, optimizer: Optimizer, warmup_iters: int, lr_decay_iters: int, min_lr: float
    ) -> None:
        cosine_with_warmup(0, 1.0, min_lr, warmup_iters, lr_decay_iters)  # validates first
        self.warmup_iters, self.lr_decay_iters = warmup_iters, lr_decay_iters
        self.min_lr = float(min_lr)
        super().__init__(optimizer)

    def lr_at(self, it: int, base_lr: float) -> float:
        return cosine_with_warmup(it, base_lr, self.min_lr, self.warmup_iters, self.lr_decay_iters)
