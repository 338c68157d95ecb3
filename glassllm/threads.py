"""Worker threads for the row-parallel parts of the fused functions.

NumPy runs an elementwise ufunc, a reduction or a stack of small matrix products on the calling
thread only, while BLAS spreads a large matrix product over every core by itself. So between two
matrix products a training step runs on one core. The fused functions (`gelu`, `layer_norm`,
causal attention, `Adam` and `AdamW`, and `linear` on one row against a tied output head)
therefore split such work into independent blocks of rows and hand
them to `run_blocks`: block 0 runs on the calling thread, the others on persistent worker
threads. NumPy releases the GIL inside its loops, so the blocks run at the same time.

The contract:

* **Bit-identical for every thread count.** A block computes its own rows only; no sum crosses
  blocks (the fused functions take their column sums after the blocks, on the caller).
* ``set_num_threads(n)`` sets how many blocks a region is split into (1: no workers, nothing
  changes). The default is the number of cores this process may run on (PyTorch's default),
  or ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` when set and smaller, where the workers
  find those cores free between matrix products: NumPy's BLAS is OpenBLAS and
  ``OPENBLAS_THREAD_TIMEOUT`` (how long its idle threads spin, log2 cycles) is at most
  `SHORT_BLAS_SPIN`, which ``import glassllm`` sets to 16 when NumPy is not loaded yet.
  Elsewhere (other BLAS, or NumPy imported first with OpenBLAS's 0.1 s spin) the default is 1.
* A region opened from a worker, or while another thread is inside one, runs its blocks one
  after another on the caller: no nesting, no deadlock, the same results.
* An exception in any block, or a Ctrl-C meanwhile, is re-raised on the caller once every block
  has finished (a caller that saves on Ctrl-C never races a block still writing).
* Blocks that call BLAS (attention's stacked products) run with BLAS limited to one thread, so
  the two pools do not fight over the cores; where that limit cannot be set (BLAS other than
  OpenBLAS, or no ``/proc``), such regions run serially. The limit is OpenBLAS's process-wide
  setting: BLAS called meanwhile from another thread of the process also runs on one thread.

>>> import numpy as np
>>> set_num_threads(2); get_num_threads()
2
>>> out = [0, 0, 0]
>>> def fill(i):
...     out[i] = i * i
>>> run_blocks([lambda i=i: fill(i) for i in range(3)]); out
[0, 1, 4]
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "get_num_threads",
    "set_num_threads",
    "run_blocks",
    "row_blocks",
    "size_blocks",
    "split_rows",
]

_local = threading.local()  # .in_region: this thread is a worker or inside a region
_region = threading.Lock()  # one region at a time; a second caller runs its blocks serially
_workers: list[_Worker] = []
_num_threads: int | None = None  # None: the default, resolved on first use


# The longest OpenBLAS spin (log2 cycles) that leaves the cores to the workers between products.
SHORT_BLAS_SPIN = 20


def _default_threads() -> int:
    """The cores this process may run on when the workers will find them free, else 1."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):  # the BLAS pool's size, if set
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            cores = min(cores, int(value))
            break
    spin = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "")
    if cores > 1 and _BlasLimit().available and spin.isdigit() and int(spin) <= SHORT_BLAS_SPIN:
        return cores
    return 1


def get_num_threads() -> int:
    """How many blocks a parallel region is split into (``torch.get_num_threads``'s role)."""
    global _num_threads
    if _num_threads is None:
        _num_threads = _default_threads()
    return _num_threads


def set_num_threads(threads: int) -> None:
    """Split parallel regions into ``threads`` blocks from now on; 1 turns the workers off."""
    global _num_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    _num_threads = threads


class _Worker:
    """A daemon thread that runs ``(task, done)`` pairs from its queue, reporting to ``done``."""

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="glassllm-worker", daemon=True).start()

    def _loop(self) -> None:
        _local.in_region = True  # a region opened from here runs serially
        while True:
            task, done = self.tasks.get()
            try:
                task()
            except BaseException as error:  # noqa: BLE001 - re-raised on the caller
                done.put(error)
            else:
                done.put(None)


def run_blocks(tasks: Sequence[Callable[[], None]], uses_blas: bool = False) -> None:
    """Run every task once, concurrently when allowed; return when all have finished.

    ``uses_blas``: the tasks call BLAS, which is limited to one thread meanwhile (or, where that
    cannot be done, the tasks run one after another).
    """
    if len(tasks) <= 1 or getattr(_local, "in_region", False) or not _region.acquire(False):
        _run_serially(tasks)
        return
    try:
        limit = _BlasLimit() if uses_blas else None
        if limit is not None and not limit.available:
            _run_serially(tasks)
            return
        _local.in_region = True
        while len(_workers) < len(tasks) - 1:
            _workers.append(_Worker())
        done: queue.SimpleQueue = queue.SimpleQueue()
        with limit or contextlib.nullcontext():
            for worker, task in zip(_workers, tasks[1:], strict=False):
                worker.tasks.put((task, done))
            error = None
            try:
                tasks[0]()
            except BaseException as caught:  # noqa: BLE001 - raised once the workers are done
                error = caught
            pending = len(tasks) - 1
            while pending:  # even through Ctrl-C: a caller that saves must not race a block
                try:
                    failure = done.get()
                except BaseException as caught:  # noqa: BLE001 - e.g. KeyboardInterrupt
                    error = error or caught
                    continue
                pending -= 1
                error = error or failure
        if error is not None:
            raise error
    finally:
        _local.in_region = False
        _region.release()


def row_blocks(rows: int, min_rows: int = 1) -> list[slice]:
    """``rows`` split into at most `get_num_threads` contiguous, near-equal slices of at least
    ``min_rows`` rows each (one slice when that allows no split).

    >>> set_num_threads(2); row_blocks(5), row_blocks(5, min_rows=3)
    ([slice(0, 2, None), slice(2, 5, None)], [slice(0, 5, None)])
    """
    parts = max(1, min(get_num_threads(), rows // max(1, min_rows)))
    bounds = [rows * part // parts for part in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


def split_rows(
    kernel: Callable[..., None],
    *arrays: np.ndarray | None,
    min_rows: int = 1,
    uses_blas: bool = False,
) -> None:
    """``kernel(*blocks)`` for each `row_blocks` slice of the arrays' first axis (all the same
    length; a None stays None), run by `run_blocks`. The kernel writes its results into the
    blocks it was given.

    >>> import numpy as np
    >>> a = np.arange(6.0); out = np.empty(6)
    >>> split_rows(lambda a, out: np.multiply(a, a, out=out), a, out); out
    array([ 0.,  1.,  4.,  9., 16., 25.])
    """
    if len(arrays[0]) < 2 * min_rows or get_num_threads() == 1:  # one block: call it directly
        kernel(*arrays)
        return
    blocks = row_blocks(len(arrays[0]), min_rows)
    tasks = [partial(kernel, *(None if a is None else a[rows] for a in arrays)) for rows in blocks]
    run_blocks(tasks, uses_blas)


def size_blocks(items: Sequence, sizes: Sequence[int], min_size: int = 1) -> list[list]:
    """``items`` dealt into at most `get_num_threads` lists of about equal total size (largest
    first, each to the lightest list so far), each list at least ``min_size`` in total where
    that allows a split; the order within a list follows ``items``. Deterministic.

    >>> set_num_threads(2); size_blocks("abcd", [5, 1, 4, 2])
    [['a', 'b'], ['c', 'd']]
    """
    total = sum(sizes)
    parts = max(1, min(get_num_threads(), len(items), total // max(1, min_size)))
    loads, members = [0] * parts, [[] for _ in range(parts)]
    for index in sorted(range(len(items)), key=lambda i: -sizes[i]):
        lightest = loads.index(min(loads))
        loads[lightest] += sizes[index]
        members[lightest].append(index)
    return [[items[i] for i in sorted(part)] for part in members if part]


def _run_serially(tasks: Sequence[Callable[[], None]]) -> None:
    for task in tasks:
        task()


class _BlasLimit:
    """``with _BlasLimit():`` OpenBLAS runs on one thread inside, its previous count after."""

    _functions: list | None = None  # openblas_thread_functions(), found once

    def __init__(self) -> None:
        if _BlasLimit._functions is None:
            _BlasLimit._functions = openblas_thread_functions()
        self.available = bool(_BlasLimit._functions)

    def __enter__(self) -> None:
        self.previous = self._functions[0][0]()
        if self.previous != 1:
            for _, set_ in self._functions:
                set_(1)

    def __exit__(self, *exc: object) -> None:
        if self.previous != 1:
            for _, set_ in self._functions:
                set_(self.previous)


def openblas_thread_functions() -> list[tuple[Callable[[], int], Callable[[int], None]]]:
    """OpenBLAS's ``(get_num_threads, set_num_threads)``, one pair per OpenBLAS library loaded
    in this process (NumPy's wheel names them ``scipy_openblas_*64_``); empty where there is
    none or no ``/proc`` to find them in. `glassllm.distributed.limit_blas_threads` uses it too."""
    import numpy  # noqa: F401 - loads NumPy's BLAS, whose functions are looked up below

    try:
        with open("/proc/self/maps") as maps:  # Linux: the shared libraries loaded here
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:
        return []
    pairs = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("scipy_", ""), ("", "")):
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                pairs.append((get, set_))
                break
    return pairs


def _forget_workers_after_fork() -> None:  # a forked child has none of the parent's threads
    global _region
    _workers.clear()
    _region = threading.Lock()
    _local.in_region = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)
