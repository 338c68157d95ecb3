"""One nanoGPT training step, built for either side, with each phase timed.

A step is what nanoGPT's train.py does per iteration on a CPU: forward with targets (logits and
mean cross-entropy), backward, clip the global gradient norm to 1.0, AdamW step, zero the
gradients. Batches are random token ids drawn up front, so data loading is not timed.

Imported only inside worker processes (see _harness): the glassllm side never imports torch, and
the torch side never runs a NumPy matrix product.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

# AdamW as nanoGPT's shakespeare_char config uses it.
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.99)
GRAD_CLIP = 1.0

PHASES = ("forward", "backward", "clip", "optimizer")

StepFn = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def random_batches(
    count: int, batch_size: int, block_size: int, vocab_size: int, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` (x, y) pairs of int64 token ids (B, T), y shifted by one as in a real stream."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        window = rng.integers(0, vocab_size, size=(batch_size, block_size + 1), dtype=np.int64)
        out.append((np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])))
    return out


# ----------------------------------------------------------------------------- glassllm


def tune_allocator(enabled: bool = True) -> bool:
    """What the ``glassllm`` command does before training (glassllm.allocator): raise glibc's
    mmap/trim thresholds so freed step buffers are reused instead of page-faulted back. Returns
    whether it was applied (False where glassllm has no allocator module or glibc refuses)."""
    if not enabled:
        return False
    try:
        from glassllm.allocator import tune_allocator as tune
    except ImportError:
        return False
    return bool(tune())


def glassllm_model(config: dict[str, Any], seed: int = 0) -> Any:
    from glassllm.models import GPT, GPTConfig

    return GPT(GPTConfig(**config), rng=np.random.default_rng(seed))


def glassllm_step(config: dict[str, Any], seed: int = 0) -> tuple[Any, Any, StepFn]:
    """(model, optimizer, step) for glassllm; step(x, y) returns seconds per phase and the loss."""
    from glassllm.nn.utils import clip_grad_norm_

    model = glassllm_model(config, seed)
    optimizer = model.configure_optimizer(LEARNING_RATE, WEIGHT_DECAY, BETAS)
    params = list(model.parameters())

    def step(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        t0 = time.perf_counter()
        _, loss = model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        clip_grad_norm_(params, GRAD_CLIP)
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        t4 = time.perf_counter()
        return {
            "forward": t1 - t0,
            "backward": t2 - t1,
            "clip": t3 - t2,
            "optimizer": t4 - t3,
            "loss": float(loss.data),
        }

    return model, optimizer, step


# ----------------------------------------------------------------------------- torch


def torch_step(config: dict[str, Any], seed: int = 0) -> tuple[Any, Any, StepFn]:
    """(model, optimizer, step) for the PyTorch reference; the same step contract as glassllm's."""
    import torch
    from torch_gpt import TorchGPT, TorchGPTConfig

    torch.manual_seed(seed)
    model = TorchGPT(TorchGPTConfig(**config))
    model.train()
    optimizer = model.configure_optimizer(LEARNING_RATE, WEIGHT_DECAY, BETAS)
    params = list(model.parameters())

    def step(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)  # no copy
        t0 = time.perf_counter()
        _, loss = model(xt, yt)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        return {
            "forward": t1 - t0,
            "backward": t2 - t1,
            "clip": t3 - t2,
            "optimizer": t4 - t3,
            "loss": float(loss.detach()),
        }

    return model, optimizer, step


# ----------------------------------------------------------------------------- BLAS floor


def step_matmul_shapes(
    batch_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, vocab_size: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every matrix product of one training step as (a_shape, b_shape) for np.matmul, forward and
    backward (transposes folded into the shapes: BLAS handles them by flags, not copies)."""
    N, T, E, V = batch_size * block_size, block_size, n_embd, vocab_size
    BH, hs = batch_size * n_head, n_embd // n_head

    def linear(n_in: int, n_out: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        return [
            ((N, n_in), (n_in, n_out)),  # forward  y = x W
            ((N, n_out), (n_out, n_in)),  # backward dx = g Wᵀ
            ((n_in, N), (N, n_out)),  # backward dW = xᵀ g
        ]

    attention = [
        ((BH, T, hs), (BH, hs, T)),  # scores = q kᵀ
        ((BH, T, T), (BH, T, hs)),  # y = P v
        ((BH, T, hs), (BH, hs, T)),  # dP = dy vᵀ
        ((BH, T, T), (BH, T, hs)),  # dv = Pᵀ dy
        ((BH, T, T), (BH, T, hs)),  # dq = dS k
        ((BH, T, T), (BH, T, hs)),  # dk = dSᵀ q
    ]
    per_layer = linear(E, 3 * E) + attention + linear(E, E) + linear(E, 4 * E) + linear(4 * E, E)
    return per_layer * n_layer + linear(E, V)


def matmul_floor(config: dict[str, Any], batch_size: int) -> Callable[[], None]:
    """A function running exactly the step's matrix products with preallocated operands: the time
    a NumPy engine cannot go below without a faster BLAS."""
    rng = np.random.default_rng(0)
    operands = []
    for a_shape, b_shape in step_matmul_shapes(batch_size, **config):
        a = rng.standard_normal(a_shape, dtype=np.float32)
        b = rng.standard_normal(b_shape, dtype=np.float32)
        out = np.empty(
            np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]),
            dtype=np.float32,
        )
        operands.append((a, b, out))

    def run() -> None:
        for a, b, out in operands:
            np.matmul(a, b, out=out)

    return run
