"""Whether the Trainer may move OpenBLAS's threads with the load without changing a bit.

Beside a busy core, a step on 2 OpenBLAS threads waits on the one the OS descheduled: at the tiny
size on the 2-core team box, 42-44 ms against 37.6 ms on one thread (bench/RESULTS.md, §1).
`glassllm.threads.AdaptiveThreads` picks the faster count from the steps' times, but OpenBLAS's
results may depend on its thread count: which kernel runs, and how a product or a dot is split,
depend on the shapes, the CPU's kernel set and the thread count (OpenBLAS 0.3.31 on the team box:
the GPT's step gives the same bits on 1 and 2 threads at three sizes with its SkylakeX kernels,
not with the Haswell ones the image pins, nor a Llama step at the small size with either).

So the Trainer asks the step itself, once, before its first: `moving_blas_keeps_bits` runs the
forward, backward and gradient norm of one batch on all threads and on one, and compares
every bit. The batch comes from its own generator and the model's generators are put back, so
the run's batches, dropout masks and weights are those it would have had without the check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import glassllm
from glassllm import threads
from glassllm.data import get_batch
from glassllm.nn.utils import clip_grad_norm_

__all__ = ["adapts_by_default", "moving_blas_keeps_bits"]


def adapts_by_default(trainer: Any) -> bool:
    """Whether ``trainer``'s steps adapt the thread count with OpenBLAS's pool when
    `threads.set_adaptive` was not called: on one process training whole batches (ranks limit
    their threads themselves; micro-batches have other shapes than the evaluation's), where
    `moving_blas_keeps_bits` on a batch of the run's shape."""
    if threads.adaptive_setting() is not None:
        return False
    if trainer.world.size > 1 or trainer.parallel.grad_accum > 1:
        return False
    cfg = trainer.config
    rng = np.random.default_rng([cfg.seed, 4])  # not the run's batch generator
    x, y = get_batch(trainer.corpus.train, cfg.block_size, cfg.batch_size, rng)
    return moving_blas_keeps_bits(
        trainer.parameters,
        lambda: trainer.parallel.backward(trainer.model, x, y, trainer.iteration),
        [trainer.model_rng, glassllm.get_rng()],
    )


def moving_blas_keeps_bits(
    params: list[Any],
    backward: Callable[[], float],
    generators: list[np.random.Generator],
) -> bool:
    """True when OpenBLAS runs on more than one thread here and ``backward()`` (a step's
    forward and backward; returns the loss) and the gradients' norm give the same bits with it on
    all its threads and on one. Every parameter's ``.grad`` and every generator's state are as
    they were before, on return."""
    pools = threads.openblas_thread_functions()
    most = [get() for get, _ in pools]
    if not pools or max(most) <= 1:
        return False  # nothing to move
    results = []
    with _kept(params, generators):
        for counts in (most, [1] * len(pools)):
            for (_, set_), count in zip(pools, counts, strict=True):
                set_(count)
            try:
                results.append(_one_step(params, backward, generators))
            finally:
                for (_, set_), count in zip(pools, most, strict=True):
                    set_(count)
    (loss, grads, norm), (loss_1, grads_1, norm_1) = results
    return (
        _same(loss, loss_1)
        and _same(norm, norm_1)
        and len(grads) == len(grads_1)
        and all(np.array_equal(a, b, equal_nan=True) for a, b in zip(grads, grads_1, strict=True))
    )


def _one_step(params: list[Any], backward: Callable[[], float], generators: list) -> tuple:
    states = [g.bit_generator.state for g in generators]
    for param in params:
        param.grad = None
    loss = backward()
    grads = [None if p.grad is None else np.array(p.grad) for p in params]
    norm = float(clip_grad_norm_(params, float("inf")))  # the norm alone: no gradient scaled
    for generator, state in zip(generators, states, strict=True):
        generator.bit_generator.state = state  # the second run draws the same masks
    return loss, grads, norm


def _same(a: float, b: float) -> bool:
    return np.array_equal(np.float64(a), np.float64(b), equal_nan=True)


@contextmanager
def _kept(params: list[Any], generators: list[np.random.Generator]) -> Iterator[None]:
    """The parameters' ``.grad`` and the generators' states put back on exit."""
    grads = [p.grad for p in params]
    states = [g.bit_generator.state for g in generators]
    try:
        yield
    finally:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
        for generator, state in zip(generators, states, strict=True):
            generator.bit_generator.state = state
