"""Learning-rate schedules: nanoGPT's get_lr, torch's StepLR, resuming a schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import optional

from glassllm import Tensor
from glassllm.optim import (
    SGD,
    AdamW,
    Constant,
    CosineWithWarmup,
    StepLR,
    cosine_with_warmup,
    step_decay,
)


def nanogpt_get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """karpathy/nanoGPT train.py's get_lr, verbatim apart from the arguments."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def optimizer(lr=1e-3, groups=1):
    groups = [{"params": [Tensor(np.zeros(1), requires_grad=True)]} for _ in range(groups)]
    return AdamW(groups, lr=lr)


@pytest.mark.parametrize("warmup, decay", [(100, 2000), (0, 50), (10, 11)])
def test_cosine_with_warmup_is_nanogpt_get_lr(warmup, decay):
    for it in range(decay + 20):
        assert cosine_with_warmup(it, 1e-3, 1e-4, warmup, decay) == nanogpt_get_lr(
            it, 1e-3, 1e-4, warmup, decay
        )


def test_cosine_shape_and_edge_cases():
    assert cosine_with_warmup(0, 1.0, 0.1, 4, 10) == pytest.approx(0.2)  # (0 + 1) / (4 + 1)
    assert cosine_with_warmup(4, 1.0, 0.1, 4, 10) == 1.0  # the peak right after warmup
    assert cosine_with_warmup(7, 1.0, 0.1, 4, 10) == pytest.approx(0.55)  # half way: the mean
    assert cosine_with_warmup(10, 1.0, 0.1, 4, 10) == 0.1
    assert cosine_with_warmup(5, 1.0, 0.1, 5, 5) == 0.1  # no decay phase: straight to the floor
    lrs = [cosine_with_warmup(it, 1.0, 0.1, 4, 10) for it in range(4, 11)]
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1, 1.0, 0.1, 4, 10), "iteration"),
        ((1.5, 1.0, 0.1, 4, 10), "iteration"),
        ((0, 1.0, 0.1, 10, 4), "lr_decay_iters"),
        ((0, 1.0, 0.1, -1, 4), "warmup_iters"),
    ],
)
def test_cosine_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        cosine_with_warmup(*args)


def test_step_lr_matches_torch():
    torch = optional("torch")
    ours = optimizer(lr=0.1)
    scheduler = StepLR(ours, step_size=3, gamma=0.5)
    param = torch.zeros(1, requires_grad=True)
    theirs = torch.optim.SGD([param], lr=0.1)
    reference = torch.optim.lr_scheduler.StepLR(theirs, step_size=3, gamma=0.5)
    for _ in range(10):
        assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], rel=1e-12)
        theirs.step()
        scheduler.step()
        reference.step()
    assert step_decay(9, 0.1, 3, 0.5) == pytest.approx(0.0125)
    with pytest.raises(ValueError, match="step_size"):
        StepLR(ours, step_size=0)


def test_schedulers_set_every_group_and_resume():
    opt = optimizer(lr=1e-3, groups=2)
    opt.param_groups[1]["lr"] = 2e-3
    scheduler = CosineWithWarmup(opt, warmup_iters=5, lr_decay_iters=20, min_lr=1e-4)
    assert [g["lr"] for g in opt.param_groups] == [1e-3 / 6, 2e-3 / 6]
    for _ in range(8):
        scheduler.step()
    expected = [cosine_with_warmup(8, base, 1e-4, 5, 20) for base in (1e-3, 2e-3)]
    assert [g["lr"] for g in opt.param_groups] == expected == scheduler.get_last_lr()

    resumed_opt = optimizer(lr=1e-3, groups=2)
    resumed = CosineWithWarmup(resumed_opt, warmup_iters=5, lr_decay_iters=20, min_lr=1e-4)
    resumed.load_state_dict(scheduler.state_dict())
    assert [g["lr"] for g in resumed_opt.param_groups] == expected
    scheduler.step()
    resumed.step()
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    with pytest.raises(ValueError, match="one per parameter group"):
        CosineWithWarmup(optimizer(), 5, 20, 1e-4).load_state_dict(scheduler.state_dict())


def test_constant_keeps_the_base_lr():
    opt = SGD([Tensor(np.zeros(1), requires_grad=True)], lr=0.3)
    scheduler = Constant(opt)
    for _ in range(3):
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.3 and scheduler.last_iter == 3


def test_group_added_after_the_scheduler_is_a_clear_error_that_changes_nothing():
    # PyTorch users add groups with optimizer.add_param_group; a schedule built before that has
    # no base lr for the new group. It must say so, not fail half-way through setting the lrs.
    opt = optimizer(lr=1e-3)
    scheduler = StepLR(opt, step_size=1, gamma=0.5)
    opt.add_param_group({"params": [Tensor(np.zeros(1), requires_grad=True)], "lr": 0.3})
    with pytest.raises(ValueError, match="2 parameter groups.*built for 1"):
        scheduler.step()
    assert scheduler.last_iter == 0
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 0.3]
