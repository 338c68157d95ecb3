"""``glassllm train`` on N processes: ``mpiexec -n N glassllm train ...`` (data-parallel, MPI).

The program's side of `glassllm.distributed`. Without a launcher every function here is the
identity of the single-process run: the world has size 1, mpi4py is never imported, and a step
with ``grad_accum`` 1 computes exactly what it computed before ranks existed.

The contract of a run on N ranks with K micro-batches (``--grad-accum K``):

* ``batch_size`` is the number of sequences per optimizer step, whatever N and K. Every rank
  draws the same batch from the one batch generator; rank r's k-th micro-batch is slice
  ``k*N + r`` of ``batch/(N*K)`` rows (`glassllm.distributed.micro_batch`). The micro-batch
  gradients are summed (locally, then over ranks) and divided once by ``N*K``, so N ranks give
  bit for bit what one process gives with ``--grad-accum N`` when both run as many BLAS
  threads per process (``--blas-threads``; a BLAS may sum in another order on another count).
* Rank 0 alone prints (the others' stdout is muted by `start_world`), writes the log, the
  checkpoint and the plot; the others compute.
  Evaluation batches are split over the ranks and their losses summed, so the logged loss is
  the mean over the same batches as one process evaluates.
* Dropout: rank 0 draws its masks from the run's model generator (saved in the checkpoint);
  rank r > 0 from a stream derived from ``(seed, rank, step)``, so a resumed run with the same
  N continues bit for bit. The equivalence with one process holds at dropout 0 (the default).
* Startup errors are agreed on (`agreement`): when any rank fails, every rank raises, and the
  command prints the error once (rank 0) and exits 2, instead of leaving the others waiting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from glassllm.app.config import LaunchConfig
from glassllm.distributed import (
    DataParallel,
    Launch,
    World,
    check_batch_split,
    detect_launch,
    init,
    limit_blas_threads,
    micro_batch,
)
from glassllm.nn.module import Module

__all__ = [
    "Launch",
    "TrainParallel",
    "agreement",
    "check_same_data",
    "check_same_resume",
    "check_split",
    "detect_launch",
    "start_world",
    "stop_signals",
]


def check_split(batch_size: int, grad_accum: int, launch: Launch | None) -> None:
    """ValueError unless ``grad_accum`` micro-batches on the launch's ranks split the batch;
    reads the world size from the launcher's environment, so it runs before MPI starts."""
    check_batch_split(batch_size, 1 if launch is None else launch.size, grad_accum)


def check_same_resume(world: World, resume: bool) -> None:
    """ValueError on every rank unless ``--resume`` was given to every rank or to none (a
    resumed rank takes its configuration from the checkpoint, a fresh one from its options)."""
    flags = world.allgather_object(bool(resume))
    if len(set(flags)) > 1:
        given, not_given = ([r for r, f in enumerate(flags) if f is side] for side in (True, False))
        raise ValueError(
            f"--resume is given to {_ranks(given)} but not to {_ranks(not_given)} of "
            f"{world.size}: give it to every rank or to none"
        )


def check_same_data(
    world: World, data: str, text_sha256: str, tokenizer: Any, prepared: bool = False
) -> None:
    """ValueError on every rank unless every rank read the same text and built the same
    tokenizer: ``--data`` is a path each rank resolves on its own (its working directory, its
    machine), and ranks training on different text would silently average their gradients.
    ``prepared``: ``text_sha256`` is a prepared corpus's manifest digest (which lists the sha256
    of every shard, each checked when first read: `glassllm.data.shards`)."""
    if world.size == 1:
        return
    spec = json.dumps(tokenizer.to_dict(), sort_keys=True, allow_nan=False)
    mine = (text_sha256, hashlib.sha256(spec.encode()).hexdigest())
    everyone = world.allgather_object(mine)
    corpus = "prepared corpus (manifest)" if prepared else "text"
    for index, what in ((0, corpus), (1, "tokenizer")):
        digests = [digest[index] for digest in everyone]
        if len(set(digests)) > 1:
            differing = [r for r, d in enumerate(digests) if d != digests[0]]
            shown = ", ".join(f"rank {r} {d[:12]}" for r, d in enumerate(digests))
            raise ValueError(
                f"{_ranks(differing)} read a different {what} from --data {data!r} than rank 0 "
                f"(sha256 {shown}): give every rank the same "
                f"{'directory, prepared once' if prepared else 'file'} (e.g. an absolute path on "
                "a shared file system)"
            )


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def start_world(settings: LaunchConfig) -> World:
    """Join the run this process was launched into (size 1, no MPI, without a launcher).

    ``settings.blas_threads`` limits this process's BLAS pool, also on one process; without
    it, ranks sharing cores split them (`glassllm.distributed.init`). On ranks other than 0,
    standard output is muted from here on (as PyTorch's reference scripts do): rank 0 prints
    for the run. RuntimeError when a launcher started ranks but mpi4py is missing (the message
    names the extra).
    """
    settings.validate()
    world = init(timeout_s=settings.dist_timeout, blas_threads=settings.blas_threads)
    if world.size == 1 and settings.blas_threads is not None:
        limit_blas_threads(settings.blas_threads)
    if not world.is_main:  # rank 0 speaks for the run; errors still reach stderr
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    return world


@contextlib.contextmanager
def agreement(world: World) -> Iterator[None]:
    """Run a startup stage whose failure may differ between ranks (a file one node cannot read)
    and end it together: when any rank raised, every rank raises. The rank that failed re-raises
    its own error; the others a ValueError naming that rank and its message, so rank 0 always
    has a message to print. A size-1 world just runs the stage."""
    if world.size == 1:
        yield
        return
    failure: BaseException | None = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - every rank must hear of any failure
        failure = err
    mine = None if failure is None else (type(failure).__name__, str(failure))
    everyone = world.allgather_object(mine)
    if failure is not None:
        raise failure
    for rank, theirs in enumerate(everyone):
        if theirs is not None:
            raise ValueError(f"rank {rank} of {world.size} could not start: {theirs[1]}")


def stop_signals(world: World) -> tuple[int, ...]:
    """The signals that ask a run to stop: Ctrl-C, and under a launcher also SIGUSR1, which
    Open MPI's mpiexec forwards (it kills the ranks on SIGINT, where MPICH's forwards it)."""
    if world.size > 1 and hasattr(signal, "SIGUSR1"):
        return (signal.SIGINT, signal.SIGUSR1)
    return (signal.SIGINT,)


class TrainParallel:
    """The Trainer's link to the other ranks: gradients, losses, stop requests, replica checks.

    Built once the model (and any checkpoint) is in place: checks every rank built the same
    model and gives every rank rank 0's weights (`glassllm.distributed.DataParallel`).
    """

    def __init__(
        self,
        world: World,
        model: Module,
        grad_accum: int,
        model_rng: np.random.Generator,
        seed: int,
        dropout: float,
    ) -> None:
        self.world, self.grad_accum = world, grad_accum
        self.ddp = DataParallel(model, world, grad_accum=grad_accum)
        self._model_rng, self._seed = model_rng, seed
        self._rank_dropout = world.size > 1 and world.rank > 0 and dropout > 0.0

    @classmethod
    def join(cls, trainer: Any) -> TrainParallel:
        """The link of a `glassllm.app.train.Trainer` built on every rank: refuses ranks whose
        configuration or model differ, and gives every rank rank 0's weights."""
        config = trainer.config
        trainer.world.check_same(config.to_dict())
        corpus = trainer.corpus
        check_same_data(
            trainer.world, config.data, corpus.sha256, trainer.tokenizer, corpus.prepared
        )
        return cls(
            trainer.world,
            trainer.model,
            config.grad_accum,
            trainer.model_rng,
            config.seed,
            config.dropout,
        )

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    def describe(self, batch_size: int) -> str:
        """How each step is split, for the run's first line ("" for one process, one batch)."""
        size, accum = self.world.size, self.grad_accum
        if size == 1 and accum == 1:
            return ""
        threads = self.world.blas_threads
        blas = "" if threads is None else f", {threads} BLAS thread{'s' * (threads > 1)} each"
        return (
            f" | {size} rank{'s' * (size > 1)} x {accum} micro-batch"
            f"{'es' * (accum > 1)} of {batch_size // (size * accum)} rows{blas}"
        )

    def backward(self, model: Module, x: np.ndarray, y: np.ndarray, step: int) -> float:
        """Forward and backward of this rank's micro-batches of the step's batch ``(x, y)``;
        leaves every ``.grad`` the mean gradient of the whole batch (summed over micro-batches
        and ranks, divided once by N*K) and returns the whole batch's mean loss."""
        size, accum = self.world.size, self.grad_accum
        if self._rank_dropout:  # this rank's own masks, a function of (seed, rank, step)
            stream = np.random.default_rng([self._seed, 0, self.world.rank, step])
            self._model_rng.bit_generator.state = stream.bit_generator.state
        if size == 1 and accum == 1:  # the single-process step, exactly as it always was
            _, loss = model(x, y)
            # why: training reads only the parameters' gradients; freeing each intermediate's
            # gradient, and what each operation saved, as soon as it is passed back cuts the
            # step's peak memory (bench/RESULTS.md, memory).
            loss.backward(retain_intermediate_grads=False, retain_graph=False)
            return float(loss.data)
        loss_sum = 0.0
        for k in range(accum):
            rows = micro_batch(x.shape[0], self.world, accum, k)
            _, loss = model(x[rows], y[rows])
            # .grad adds up the micro-batches
            loss.backward(retain_intermediate_grads=False, retain_graph=False)
            loss_sum += float(loss.data)
        self.ddp.sync_gradients()
        if size > 1:
            loss_sum = float(self.world.sum([loss_sum])[0])
        return loss_sum / (size * accum)

    def evaluates(self, index: int) -> bool:
        """Whether this rank evaluates the ``index``-th group of evaluation batches (every rank
        draws all of them, so the batches do not depend on N)."""
        return index % self.world.size == self.world.rank

    def sum(self, values: list[float]) -> list[float]:
        """``values`` summed over ranks (unchanged on one process)."""
        if self.world.size == 1:
            return values
        return [float(v) for v in self.world.sum(values)]

    def stop_agreed(self, requested: bool) -> bool:
        """True on every rank when any rank asked to stop (Ctrl-C reaches every rank, not
        always before the same step), so every rank stops after the same step."""
        if self.world.size == 1:
            return requested
        return bool(self.world.sum([float(requested)])[0] > 0)

    def check_replicas(self) -> None:
        """RuntimeError naming the ranks whose parameters differ from rank 0's (no-op alone)."""
        if self.world.size > 1:
            self.ddp.check_replicas()
