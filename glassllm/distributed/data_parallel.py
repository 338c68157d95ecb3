"""Data parallelism over a `World`: `DataParallel` (broadcast, gradient averaging, replica
checks) and the batch split (`micro_batch`, `check_batch_split`).

See `glassllm.distributed` for the contract.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import numpy as np

from glassllm.distributed.world import World
from glassllm.nn.module import Module

# ------------------------------------------------------------------------------- batches


def check_batch_split(batch_size: int, world_size: int, grad_accum: int) -> None:
    """ValueError unless ``world_size * grad_accum`` micro-batches split ``batch_size`` evenly."""
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    parts = world_size * grad_accum
    if batch_size % parts:
        fits = [k for k in range(1, batch_size + 1) if batch_size % (world_size * k) == 0]
        hint = f"grad_accum {', '.join(map(str, fits))} would" if fits else "no grad_accum would"
        raise ValueError(
            f"batch_size {batch_size} does not split into {world_size} ranks x {grad_accum} "
            f"micro-batches ({parts} parts); with {world_size} ranks {hint}"
        )


def micro_batch(batch_size: int, world: World | int, grad_accum: int, step: int) -> slice:
    """Rows of the step's batch for this rank's micro-step ``step`` (0 <= step < grad_accum):
    slice ``step*N + rank`` of ``batch_size/(N*grad_accum)`` rows. ``world`` may be a rank count
    only for rank 0."""
    size, rank = (world, 0) if isinstance(world, int) else (world.size, world.rank)
    check_batch_split(batch_size, size, grad_accum)
    if not 0 <= step < grad_accum:
        raise ValueError(f"micro-step {step} is outside [0, {grad_accum})")
    rows = batch_size // (size * grad_accum)
    index = step * size + rank
    return slice(index * rows, (index + 1) * rows)


# ------------------------------------------------------------------------------- the model


class DataParallel:
    """Keep one model's replicas identical: same start, averaged gradients, checkable.

    Construction checks that every rank holds the same state names, shapes and dtypes
    (``ValueError`` naming the first difference) and copies rank 0's parameters and persistent
    buffers to every rank. ``sync_gradients`` after the last ``backward`` of a step;
    ``check_replicas`` at evaluations; after rank 0 alone loaded a checkpoint,
    ``broadcast_model`` and ``broadcast_optimizer``.
    """

    def __init__(self, model: Module, world: World, grad_accum: int = 1) -> None:
        if grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
        self.model, self.world, self.grad_accum = model, world, grad_accum
        self.named = list(model.named_parameters())
        if world.size == 1:
            return
        # What broadcast_model sends: parameters, then persistent buffers (state_dict's order).
        signature = [
            (name, array.shape, str(array.dtype)) for name, array in model.state_dict().items()
        ]
        everyone = world.allgather_object(signature)
        for rank, other in enumerate(everyone):
            if other != everyone[0]:
                difference = _first_difference(everyone[0], other)
                raise ValueError(f"rank {rank} holds a different model than rank 0: {difference}")
        self.broadcast_model()

    def broadcast_model(self) -> None:
        """Copy rank 0's parameters and persistent buffers into every rank's model (in place):
        each array of rank 0's ``state_dict``, broadcast in its order, then ``load_state_dict``."""
        state = {
            name: np.ascontiguousarray(array) for name, array in self.model.state_dict().items()
        }
        for array in state.values():
            self.world.broadcast_(array, root=0)
        if not self.world.is_main:
            self.model.load_state_dict(state)

    def broadcast_optimizer(self, optimizer: Any) -> None:
        """Give every rank rank 0's optimizer state and hyper-parameters (e.g. after rank 0
        alone loaded a checkpoint): one pickled broadcast of ``optimizer.state_dict()``."""
        state = self.world.broadcast_object(optimizer.state_dict() if self.world.is_main else None)
        if not self.world.is_main:
            optimizer.load_state_dict(state)

    def sync_gradients(self) -> None:
        """Replace every ``.grad`` by the sum over ranks divided once by ``size * grad_accum``.

        Parameters without a gradient are left as they are. Which parameters have one, and the
        gradients' shapes and dtypes, must be the same on every rank: one arrival check covers
        that whole layout before any data moves, so a rank whose layout differs (no gradient at
        all, another dtype) is named at once. Gradients of one dtype travel in one flat buffer.
        """
        divisor = self.world.size * self.grad_accum
        with_grad = [p for _, p in self.named if p.grad is not None]
        if self.world.size == 1:
            if divisor != 1:
                for param in with_grad:
                    param.grad = np.divide(param.grad, divisor, dtype=param.grad.dtype)
            return
        by_dtype: dict[np.dtype, list[Any]] = {}
        for param in with_grad:
            by_dtype.setdefault(param.grad.dtype, []).append(param)
        groups = []
        for dtype in sorted(by_dtype, key=str):
            params = by_dtype[dtype]
            flat = np.empty(sum(p.grad.size for p in params), dtype=dtype)
            offset = 0
            for param in params:
                flat[offset : offset + param.grad.size] = param.grad.reshape(-1)
                offset += param.grad.size
            groups.append((params, flat))
        self.world.arrive("sync_gradients", _gradient_layout(self.named))  # once, every rank
        from mpi4py import MPI

        for params, flat in groups:
            self.world._comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            np.divide(flat, divisor, out=flat)  # the one division (same arithmetic as size 1)
            offset = 0
            for param in params:  # views of this call's fresh buffer: nothing is shared later
                size = param.grad.size
                param.grad = flat[offset : offset + size].reshape(param.grad.shape)
                offset += size

    def digests(self) -> list[str]:
        """A short SHA-256 digest of each parameter's bytes, in named_parameters order."""
        return [
            hashlib.sha256(np.ascontiguousarray(p.data).tobytes()).hexdigest()[:16]
            for _, p in self.named
        ]

    def check_replicas(self) -> None:
        """RuntimeError naming the ranks and parameters whose bytes differ from rank 0's."""
        mine = self.digests()
        everyone = self.world.allgather_object(mine)
        wrong = []
        for rank, theirs in enumerate(everyone):
            names = [
                name
                for (name, _), a, b in zip(self.named, everyone[0], theirs, strict=True)
                if a != b
            ]
            if names:
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                wrong.append(f"rank {rank} ({', '.join(names[:3])}{more})")
        if wrong:
            raise RuntimeError(f"replicas differ from rank 0: {'; '.join(wrong)}")


def _gradient_layout(named: list[tuple[str, Any]]) -> int:
    """A checksum of which parameters have a gradient, with its shape and dtype, in order."""
    layout = [
        (name, None) if p.grad is None else (name, p.grad.shape, str(p.grad.dtype))
        for name, p in named
    ]
    return zlib.crc32(repr(layout).encode())


def _first_difference(mine: list[tuple], theirs: list[tuple]) -> str:
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            return f"{b} where rank 0 has {a}"
    return f"{len(theirs)} parameters where rank 0 has {len(mine)}"
