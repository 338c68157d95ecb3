"""The ranks of an MPI launch (`World`, `init`, `detect_launch`): collectives that check every rank
arrived at the same one within a timeout, and an abort that ends every rank.

See `glassllm.distributed` for the contract.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import numpy as np

from glassllm._install import install_hint
from glassllm.distributed.blas_threads import available_cores, limit_blas_threads

INSTALL_HINT = install_hint("mpi")
ABORT_PAUSE_S = 0.5  # MPICH's launcher drops output written just before MPI_Abort: pause first
BLAS_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# Codes sent in the arrival tokens, so that ranks calling different collectives are caught.
_OPS = {
    "allreduce": 1,
    "broadcast": 2,
    "broadcast_object": 3,
    "allgather_object": 4,
    "barrier": 5,
    "sync_gradients": 6,
}
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
        self.arrive("allreduce", array.size)
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
        self.arrive("broadcast", array.size)
        self._comm.Bcast(array, root=root)
        return array

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Root's picklable ``obj`` on every rank (e.g. checkpoint metadata on resume)."""
        if self._comm is None:
            return obj
        self.arrive("broadcast_object", 0)
        return self._comm.bcast(obj, root=root)

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order, on every rank."""
        if self._comm is None:
            return [obj]
        self.arrive("allgather_object", 0)
        return self._comm.allgather(obj)

    def check_same(
        self,
        settings: Mapping[str, Any],
        what: str = "configuration",
        label: Callable[[str], str] = str,
    ) -> None:
        """ValueError on every rank unless all ranks passed equal ``settings`` (e.g. a run's
        configuration, checked at the start). The message names the first rank that differs
        from rank 0 and exactly the keys that differ, each as ``label(key)`` with both ranks'
        values (a key one rank lacks is "not given" there), then any other ranks that differ."""
        everyone = self.allgather_object(dict(settings))
        first = everyone[0]
        differing = [rank for rank, other in enumerate(everyone) if other != first]
        if not differing:
            return
        other = everyone[differing[0]]
        keys = sorted(k for k in set(first) | set(other) if _given(first, k) != _given(other, k))
        shown = "; ".join(
            f"{label(k)} {_shown(other, k)} (rank 0: {_shown(first, k)})" for k in keys
        )
        more = differing[1:]
        also = ""
        if more:
            also = f"; rank{'s' * (len(more) > 1)} {', '.join(map(str, more))} differ"
            also += "s too" if len(more) == 1 else " too"
        raise ValueError(f"rank {differing[0]} has a different {what}: {shown}{also}")

    def barrier(self) -> None:
        if self._comm is not None:
            self.arrive("barrier", 0)

    def abort(self, message: str, status: int = 1) -> NoReturn:
        """Print ``message`` (prefixed with this rank) and end every rank with ``status``."""
        _print_error(f"glassllm: rank {self.rank} of {self.size}: {message}")
        if self._comm is None:
            raise SystemExit(status)
        time.sleep(ABORT_PAUSE_S)
        self._comm.Abort(status)
        os._exit(status)  # MPICH's MPI_Abort can return while its launcher ends the job

    # ---- the arrival check behind every collective

    def arrive(self, op: str, check: int) -> None:
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


_NOT_GIVEN = object()


def _given(settings: Mapping[str, Any], key: str) -> Any:
    return settings.get(key, _NOT_GIVEN)


def _shown(settings: Mapping[str, Any], key: str) -> str:
    return "not given" if key not in settings else repr(settings[key])


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

    With more than one rank: imports mpi4py (``RuntimeError`` naming the ``mpi``
    extra, `INSTALL_HINT`, when it is missing or finds no MPI library), installs an exception hook
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
            f"({type(err).__name__}: {err}): install {INSTALL_HINT}, or mpi4py against your "
            "site's MPI"
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
