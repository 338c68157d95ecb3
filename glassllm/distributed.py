"""Data-parallel training on MPI: N processes, one model, gradients averaged every step.

Launch a script (or ``glassllm train``) with ``mpiexec -n N``; each process (a *rank*) holds a
full replica of the model and works on its own rows of every batch::

    world = distributed.init(timeout_s=300)          # size 1 without a launcher: no MPI at all
    ddp = distributed.DataParallel(model, world, grad_accum=K)  # rank 0's weights everywhere
    for step in range(steps):
        x, y = get_batch(data, block_size, batch_size, batch_rng)  # same rows on every rank
        for k in range(K):
            rows = distributed.micro_batch(batch_size, world, K, k)  # this rank's k-th slice
            loss = model(x[rows], y[rows])[1]
            loss.backward()                          # .grad accumulates the K micro-batches
        ddp.sync_gradients()                         # sum over ranks, divided once by N*K
        clip_grad_norm_(model.parameters(), 1.0)     # sees the averaged gradient
        optimizer.step(); optimizer.zero_grad()

The contract:

* **Launch detection reads the environment only** (`detect_launch`): MPICH/Hydra and Intel MPI
  (``PMI_RANK``/``PMI_SIZE``), Open MPI (``OMPI_COMM_WORLD_RANK``/``_SIZE``), Slurm's ``srun``
  (``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``). Without one, or with a world of 1, `init` returns a
  size-1 `World` whose collectives do nothing, and mpi4py is never imported. mpi4py is imported
  by this module only, inside `init`.
* **The mean is taken once.** Each micro-batch loss is its own mean; `DataParallel.sync_gradients`
  adds the K accumulated micro-batch gradients of every rank (one in-place ``Allreduce`` SUM of
  a flat buffer) and divides the sum once by ``N*K``. N ranks therefore compute exactly what one
  process computes with ``grad_accum=N`` whenever the MPI sum adds in rank order (always for
  N = 2, where ``a + b == b + a`` bit for bit; MPICH for N = 3); other layouts agree to float32
  rounding.
* **Rows:** micro-batch k of rank r is slice ``k*N + r`` of the step's batch, slices of
  ``batch/(N*K)`` rows (`micro_batch`), so the data a step sees does not depend on N or K.
* **Nothing hangs.** With more than one rank, an uncaught exception on any rank prints
  ``rank r of N failed: <error>`` and ends every rank (``MPI_Abort``). Every collective of a
  `World` first checks that all ranks arrived at the *same* collective: each rank sends a small
  token to every other and waits at most ``timeout_s`` seconds; a rank that died, hangs or called
  another collective is named in one line and the job is aborted (exit status 2).
* **BLAS threads:** with more than one rank on a machine, each rank's BLAS pool is limited to
  its share of the cores (its cores divided by the ranks that may run on them) unless
  ``blas_threads`` or a standard variable (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS``) says otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
import traceback
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import numpy as np

from glassllm.blas_threads import available_cores, limit_blas_threads
from glassllm.nn.module import Module

__all__ = [
    "DataParallel",
    "Launch",
    "World",
    "check_batch_split",
    "detect_launch",
    "init",
    "limit_blas_threads",
    "micro_batch",
]

INSTALL_HINT = "pip install 'glassllm[mpi]'"
ABORT_PAUSE_S = 0.5  # MPICH's launcher drops output written just before MPI_Abort: pause first
BLAS_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# Codes sent in the arrival tokens, so that ranks calling different collectives are caught.
_OPS = {"allreduce": 1, "broadcast": 2, "broadcast_object": 3, "allgather_object": 4,
        "barrier": 5, "sync_gradients": 6}
_OP_NAMES = {code: name for name, code in _OPS.items()}
_TOKEN_TAG = 7


# ------------------------------------------------------------------------------- launch


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a launcher told this process through its environment."""

    launcher: str  # e.g. "MPICH/Hydra (PMI_SIZE)"
    rank: int
    size: int


def detect_launch(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The parallel launch this process belongs to, or None when started on its own.

    Reads environment variables only (no MPI import), so a command can check its arguments
    against the world size, and print from rank 0 only, before MPI starts.
    """
    env = os.environ if environ is None else environ
    for launcher, rank_var, size_var in (
        ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("MPICH/Hydra or Intel MPI", "PMI_RANK", "PMI_SIZE"),
        ("Slurm srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
    ):
        if size_var in env and rank_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
            except ValueError:
                continue
            if size >= 1 and 0 <= rank < size:
                return Launch(f"{launcher} ({size_var}={size})", rank, size)
    return None


# ------------------------------------------------------------------------------- the world


class World:
    """The processes of one run. ``rank`` in ``[0, size)``; rank 0 does the printing and writing.

    A size-1 world (no launcher) runs every collective as the identity, with no MPI. Collectives
    must be called by every rank in the same order (never inside rank-0-only code): a rank that
    does not arrive within ``timeout_s`` seconds is named and the job aborted.
    """

    def __init__(self, comm: Any = None, timeout_s: float = 300.0) -> None:
        self._comm = comm
        self.timeout_s = float(timeout_s)
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.local_size = 1  # ranks on this machine; set by init
        self.blas_threads: int | None = None  # what init limited BLAS to (None: untouched)
        self._control = None if comm is None else comm.Dup()  # tokens never meet user traffic
        self._sequence = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- collectives (identity when size == 1)

    def allreduce_(self, array: np.ndarray) -> np.ndarray:
        """Sum ``array`` over ranks in place (C-contiguous float32/float64/int64); returns it."""
        if self._comm is None:
            return array
        _check_buffer(array)
        self._arrive("allreduce", array.size)
        from mpi4py import MPI

        self._comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        return array

    def sum(self, values: Iterable[float]) -> np.ndarray:
        """Sum of small float64 values over ranks: e.g. ``[loss_sum, stop_flag]`` once a step."""
        return self.allreduce_(np.array(list(values), dtype=np.float64))

    def mean(self, values: Iterable[float]) -> np.ndarray:
        """Mean over ranks of small float64 values (e.g. each rank's evaluation loss)."""
        total = self.sum(values)
        return total / self.size

    def broadcast_(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite ``array`` on every rank with root's (same shape and dtype everywhere)."""
        if self._comm is None:
            return array
        _check_buffer(array)
        self._arrive("broadcast", array.size)
        self._comm.Bcast(array, root=root)
        return array

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Root's picklable ``obj`` on every rank (e.g. checkpoint metadata on resume)."""
        if self._comm is None:
            return obj
        self._arrive("broadcast_object", 0)
        return self._comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order, on every rank."""
        if self._comm is None:
            return [obj]
        self._arrive("allgather_object", 0)
        return self._comm.allgather(obj)

    def check_same(self, settings: Mapping[str, Any], what: str = "configuration") -> None:
        """ValueError on every rank unless all ranks passed equal ``settings`` (e.g. a run's
        configuration, checked at the start), naming the first rank that differs and how."""
        everyone = self.allgather_object(dict(settings))
        first = everyone[0]
        for rank, other in enumerate(everyone):
            if other != first:
                keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
                shown = "; ".join(f"{k} {other.get(k)!r} (rank 0: {first.get(k)!r})"
                                  for k in keys[:5])
                raise ValueError(f"rank {rank} has a different {what}: {shown}")

    def barrier(self) -> None:
        if self._comm is not None:
            self._arrive("barrier", 0)

    def abort(self, message: str, status: int = 1) -> NoReturn:
        """Print ``message`` (prefixed with this rank) and end every rank with ``status``."""
        _print_error(f"glassllm: rank {self.rank} of {self.size}: {message}")
        if self._comm is None:
            raise SystemExit(status)
        time.sleep(ABORT_PAUSE_S)
        self._comm.Abort(status)
        os._exit(status)  # MPICH's MPI_Abort can return while its launcher ends the job

    # ---- the arrival check behind every collective

    def _arrive(self, op: str, check: int) -> None:
        """Exchange a token ``(sequence, op, check)`` with every other rank; wait for all of
        theirs for at most ``timeout_s``. Names the ranks that did not answer, or that sent a
        different token, and aborts the job."""
        from mpi4py import MPI

        self._sequence += 1
        mine = np.array([self._sequence, _OPS[op], check], dtype=np.int64)
        peers = [peer for peer in range(self.size) if peer != self.rank]
        theirs = {peer: np.zeros(3, dtype=np.int64) for peer in peers}
        recvs = [self._control.Irecv(theirs[peer], source=peer, tag=_TOKEN_TAG) for peer in peers]
        sends = [self._control.Isend(mine, dest=peer, tag=_TOKEN_TAG) for peer in peers]
        deadline = time.monotonic() + self.timeout_s
        pause = 0.0
        while not MPI.Request.Testall(recvs):
            if time.monotonic() > deadline:
                silent = [peer for peer, req in zip(peers, recvs, strict=True) if not req.Test()]
                waiting = [rank for rank in range(self.size) if rank not in silent]
                if self.rank != waiting[0]:  # let the first waiting rank print the one line
                    time.sleep(4 * ABORT_PAUSE_S)
                self.abort(
                    f"{_ranks(silent)} stopped answering: no word for {self.timeout_s:g} s "
                    f"at {op} #{self._sequence} (dist_timeout); it died, hangs or is far behind",
                    status=2,
                )
            time.sleep(pause)  # 0 first (yield), then up to 1 ms: idle ranks leave the CPU
            pause = min(1e-3, pause * 2 + 1e-5)
        MPI.Request.Waitall(sends)
        for peer in peers:
            if np.array_equal(theirs[peer][:2], mine[:2]) and op == "sync_gradients":
                if theirs[peer][2] != mine[2]:
                    self.abort(
                        f"rank {peer} holds other gradients than this rank at {op} "
                        f"#{self._sequence}: which parameters have a gradient, or their shapes "
                        "or dtypes, differ between the ranks",
                        status=2,
                    )
            elif not np.array_equal(theirs[peer], mine):
                self.abort(
                    f"rank {peer} is at {_describe(theirs[peer])} while this rank is at "
                    f"{_describe(mine)}: the ranks called different collectives (a collective "
                    "inside rank-0-only code?) or hold different gradients",
                    status=2,
                )


def _describe(token: np.ndarray) -> str:
    sequence, op, check = (int(v) for v in token)
    return f"collective #{sequence} {_OP_NAMES.get(op, op)} ({check})"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _check_buffer(array: np.ndarray) -> None:
    if not (isinstance(array, np.ndarray) and array.flags.c_contiguous and array.flags.writeable):
        raise TypeError("collectives need a writeable C-contiguous numpy array")


def _print_error(message: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- init


def init(
    timeout_s: float = 300.0,
    blas_threads: int | None = None,
    abort_on_exception: bool = True,
    environ: Mapping[str, str] | None = None,
) -> World:
    """Join the run this process was launched into; a size-1 `World` without a launcher.

    With more than one rank: imports mpi4py (``RuntimeError`` naming ``pip install
    'glassllm[mpi]'`` when it is missing or finds no MPI library), installs an exception hook
    that aborts every rank when one raises (``abort_on_exception``), and limits BLAS threads
    (``blas_threads``; None: this rank's cores divided by the ranks that share them, unless a
    standard variable is set). ``environ`` replaces ``os.environ`` for the launch detection.
    ``timeout_s`` bounds the wait of every collective for the slowest rank: make it longer
    than the longest stretch between two collectives (an evaluation plus a checkpoint).
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    launch = detect_launch(environ)
    if launch is None or launch.size == 1:
        return World(None, timeout_s)
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as err:  # RuntimeError: mpi4py found no MPI library
        raise RuntimeError(
            f"{launch.launcher} started {launch.size} processes but MPI is unavailable here "
            f"({type(err).__name__}: {err}): {INSTALL_HINT}, or mpi4py against your site's MPI"
        ) from None
    world = World(MPI.COMM_WORLD, timeout_s)
    if world.size != launch.size:
        raise RuntimeError(
            f"{launch.launcher} announced {launch.size} processes but MPI sees {world.size}: "
            "is mpi4py using another MPI than the launcher's? (a venv-local MPI wheel shadows "
            "the system's)"
        )
    if abort_on_exception:
        _install_abort_hook(world)
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this machine
    world.local_size = local.Get_size()
    mine = set(available_cores())
    sharing = sum(1 for cores in local.allgather(mine) if cores & mine)  # me included
    local.Free()
    if blas_threads is None and not any(os.environ.get(name) for name in BLAS_VARIABLES):
        # Ranks the launcher bound to their own cores keep them; ranks that share cores split.
        blas_threads = max(1, len(mine) // sharing)
    if blas_threads is not None and limit_blas_threads(blas_threads):
        world.blas_threads = blas_threads
    return world


def _install_abort_hook(world: World) -> None:
    def abort_all(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(kind, error, tb))
        _print_error(text.rstrip())
        if kind is KeyboardInterrupt:
            world.abort("interrupted (KeyboardInterrupt); ending all ranks", status=130)
        world.abort(f"failed: {kind.__name__}: {error}; ending all ranks", status=1)

    sys.excepthook = abort_all


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
        signature = [(name, array.shape, str(array.dtype))
                     for name, array in model.state_dict().items()]
        everyone = world.allgather_object(signature)
        for rank, other in enumerate(everyone):
            if other != everyone[0]:
                difference = _first_difference(everyone[0], other)
                raise ValueError(f"rank {rank} holds a different model than rank 0: {difference}")
        self.broadcast_model()

    def broadcast_model(self) -> None:
        """Copy rank 0's parameters and persistent buffers into every rank's model (in place):
        each array of rank 0's ``state_dict``, broadcast in its order, then ``load_state_dict``."""
        state = {name: np.ascontiguousarray(array)
                 for name, array in self.model.state_dict().items()}
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
                flat[offset:offset + param.grad.size] = param.grad.reshape(-1)
                offset += param.grad.size
            groups.append((params, flat))
        self.world._arrive("sync_gradients", _gradient_layout(self.named))  # once, every rank
        from mpi4py import MPI

        for params, flat in groups:
            self.world._comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            np.divide(flat, divisor, out=flat)  # the one division (same arithmetic as size 1)
            offset = 0
            for param in params:  # views of this call's fresh buffer: nothing is shared later
                size = param.grad.size
                param.grad = flat[offset:offset + size].reshape(param.grad.shape)
                offset += size

    def digests(self) -> list[str]:
        """A short SHA-256 digest of each parameter's bytes, in named_parameters order."""
        return [hashlib.sha256(np.ascontiguousarray(p.data).tobytes()).hexdigest()[:16]
                for _, p in self.named]

    def check_replicas(self) -> None:
        """RuntimeError naming the ranks and parameters whose bytes differ from rank 0's."""
        mine = self.digests()
        everyone = self.world.allgather_object(mine)
        wrong = []
        for rank, theirs in enumerate(everyone):
            names = [name for (name, _), a, b in zip(self.named, everyone[0], theirs, strict=True)
                     if a != b]
            if names:
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                wrong.append(f"rank {rank} ({', '.join(names[:3])}{more})")
        if wrong:
            raise RuntimeError(f"replicas differ from rank 0: {'; '.join(wrong)}")


def _gradient_layout(named: list[tuple[str, Any]]) -> int:
    """A checksum of which parameters have a gradient, with its shape and dtype, in order."""
    layout = [(name, None) if p.grad is None else (name, p.grad.shape, str(p.grad.dtype))
              for name, p in named]
    return zlib.crc32(repr(layout).encode())


def _first_difference(mine: list[tuple], theirs: list[tuple]) -> str:
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            return f"{b} where rank 0 has {a}"
    return f"{len(theirs)} parameters where rank 0 has {len(mine)}"
