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
* One row times block-quantized weights (a decoding step's products, 20-80 us each, too short
  for these workers' ~58 us hand-off) has helpers of its own, `glassllm.kernels.row_pool`,
  split into the same number of parts; inside a region it is not split.
* An exception in any block, or a Ctrl-C meanwhile, is re-raised on the caller once every block
  has finished (a caller that saves on Ctrl-C never races a block still writing).
* Blocks that call BLAS (attention's stacked products) run with BLAS limited to one thread, so
  the two pools do not fight over the cores; where that limit cannot be set (BLAS other than
  OpenBLAS, or no ``/proc``), such regions run serially. The limit is OpenBLAS's process-wide
  setting: BLAS called meanwhile from another thread of the process also runs on one thread.
* **Adaptive** (`set_adaptive`; ``Trainer.train_step`` turns it on by itself where it changes
  no bit, see below): on a loaded machine a pool of spinning threads waits on a thread the OS
  has descheduled (a step at 2 threads ran 2.8x slower than at 1 beside one busy core).
  `AdaptiveThreads` times the steps run inside `adaptive_step` and tries both ways, all threads
  or one, a few steps each, at the start, when steps slow by ``degrade``, and after ``every``
  steps (twice as long each time a probe keeps all threads: a quiet box pays less and less for
  probing), keeping one thread only when it is faster by ``margin``. `set_adaptive` moves
  glassllm's workers only, which changes no bit; most of the loss is OpenBLAS's pool, which
  ``blas=True`` moves too. OpenBLAS sums some products in another order on 1 thread than on 2
  (0.3.31: e.g. 40x256 @ 256x64 with its Haswell kernels, a Llama step's at the small size
  with its SkylakeX ones), so the results may then depend on the machine's load. The Trainer
  moves OpenBLAS's pool only after checking that its own step gives the same bits on 1 thread
  and on all (`glassllm.app.thread_check`).

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
import math
import os
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
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
    "one_blas_thread",
    "in_region",
    "AdaptiveThreads",
    "set_adaptive",
    "adaptive_setting",
    "adaptive_step",
    "end_adaptive",
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


def in_region() -> bool:
    """Whether this thread is a worker or inside a region (where work is not split again)."""
    return getattr(_local, "in_region", False)


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


def row_blocks(rows: int, min_rows: int = 1, align: int = 1) -> list[slice]:
    """``rows`` split into at most `get_num_threads` contiguous, near-equal slices of at least
    ``min_rows`` rows each (one slice when that allows no split), every slice but the last
    starting and ending at a multiple of ``align``.

    >>> set_num_threads(2); row_blocks(5), row_blocks(5, min_rows=3)
    ([slice(0, 2, None), slice(2, 5, None)], [slice(0, 5, None)])
    >>> row_blocks(200, align=64)
    [slice(0, 64, None), slice(64, 200, None)]
    """
    units = rows // align  # whole runs of ``align`` rows, dealt out near-equally
    parts = max(1, min(get_num_threads(), units // -(-max(1, min_rows) // align)))
    bounds = [units * part // parts * align for part in range(parts)] + [rows]
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


@contextlib.contextmanager
def one_blas_thread() -> Iterator[bool]:
    """``with one_blas_thread() as limited:`` OpenBLAS runs on one thread inside and on its
    previous count after (its process-wide setting, as in `run_blocks`); ``limited`` is False,
    and nothing changes, where that cannot be set (another BLAS, or no ``/proc``)."""
    limit = _BlasLimit()
    if not limit.available:
        yield False
        return
    with limit:
        yield True


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


class AdaptiveThreads:
    """Chooses between all threads (``most``) and one from step wall times fed to `observe`.

    A probe runs the steps of a plan, ``(count, kept)`` each: the first after a change of count
    (or the first ``settle`` ever: compilation, caches) is not kept. Then ``most`` is used unless
    one thread's median is lower by ``margin`` (a wrong pick of one thread on a quiet box costs
    more than a wrong pick of all on a busy one), until ``every`` steps passed or each of the
    last ``window`` steps exceeds ``degrade`` times the best median of ``window`` since the
    probe (5 rather than 3: fewer probes set off by a moment's noise); the next probe
    times the other count, then the current one again. A probe that
    keeps all threads doubles ``every`` (up to ``16 every``); any other starts again from
    ``every``. ``apply(count)`` sets the pools.
    """

    def __init__(self, most: int, apply: Callable[[int], None], settle: int = 3, probe: int = 3,
                 every: int = 100, degrade: float = 1.3, margin: float = 0.05,
                 window: int = 5) -> None:  # fmt: skip
        self.most, self.apply, self.probe, self.degrade = most, apply, probe, degrade
        self.margin, self.first_every, self.every = margin, every, every
        self.current, self.recent = most, deque(maxlen=window)
        self.before_probe: int | None = None  # the count a re-probe started from
        self.plan = [(most, False)] * settle + [(most, True)] * probe + self._trial(1)
        self.samples: dict[int, list[float]] = {most: [], 1: []}
        self.best, self.since = math.inf, 0

    def _trial(self, count: int) -> list[tuple[int, bool]]:
        return [(count, False)] + [(count, True)] * self.probe

    def observe(self, seconds: float) -> None:
        """The wall time of a step just run at ``self.current`` threads."""
        if self.plan:
            count, kept = self.plan.pop(0)
            if kept:
                self.samples[count].append(seconds)
            if not self.plan:
                self._decide()
            elif self.plan[0][0] != self.current:
                self._use(self.plan[0][0])
            return
        self.recent.append(seconds)
        self.since += 1
        if len(self.recent) == self.recent.maxlen:
            self.best = min(self.best, statistics.median(self.recent))
        slowed = (
            len(self.recent) == self.recent.maxlen and min(self.recent) > self.degrade * self.best
        )
        if self.since >= self.every or slowed:
            # both counts timed afresh, the other first: steps that slowed for a moment (the
            # box's noise, not a neighbour that stays) do not stand for the current count
            self.before_probe = self.current
            other = 1 if self.current == self.most else self.most
            self.samples = {self.current: [], other: []}
            self.plan = self._trial(other) + self._trial(self.current)
            self._use(other)

    def _decide(self) -> None:
        medians = {count: statistics.median(times) for count, times in self.samples.items()}
        one_wins = medians[1] < (1.0 - self.margin) * medians[self.most]
        chosen = 1 if one_wins else self.most
        # all threads kept: probe half as often (a quiet box pays less and less); one thread:
        # as often as at first (the neighbour may be gone, and one-thread steps do not slow)
        kept_most = chosen == self.most == self.before_probe
        self.every = min(2 * self.every, 16 * self.first_every) if kept_most else self.first_every
        self._use(chosen)
        self.recent.clear()
        self.best, self.since = math.inf, 0

    def _use(self, count: int) -> None:
        if count != self.current:
            self.current = count
            self.apply(count)


_adaptive: AdaptiveThreads | None = None
_adaptive_on: bool | None = None  # None: the default, on where a caller asks for it (Trainer)
_clock: Callable[[], float] = time.perf_counter
_adapt_blas = False


def set_adaptive(
    on: bool | None, clock: Callable[[], float] = time.perf_counter, blas: bool = False
) -> None:
    """Turn the adaptive thread count of `adaptive_step` on or off (off: all threads again;
    None: the default again); ``clock``: what times a step (tests pass a fake one); ``blas``:
    move OpenBLAS's pool too (faster under load, but its bits then depend on the load)."""
    global _adaptive, _adaptive_on, _clock, _adapt_blas
    if _adaptive is not None and _adaptive.current != _adaptive.most:
        _adaptive.apply(_adaptive.most)
    _adaptive, _adaptive_on, _clock = None, None if on is None else bool(on), clock
    _adapt_blas = bool(blas)


@contextlib.contextmanager
def adaptive_step(default: bool = False, blas: bool = False) -> Iterator[None]:
    """``with adaptive_step():`` around one training step feeds its wall time to the adaptive
    controller, when `set_adaptive` turned it on, or never was called and ``default``: then
    ``blas`` says whether OpenBLAS's pool moves too (the caller checked that it changes no bit)."""
    global _adaptive
    if not (default if _adaptive_on is None else _adaptive_on):
        yield
        return
    if _adaptive is None:
        _adaptive = _controller(_adapt_blas if _adaptive_on is not None else blas)
    start = _clock()
    yield  # a step that raises is not timed
    if _adaptive is not None:
        _adaptive.observe(_clock() - start)


def end_adaptive() -> None:
    """All threads again and the controller forgotten (the next `adaptive_step` probes afresh),
    `set_adaptive`'s setting kept: the Trainer's run ends, its evaluation and sampling next."""
    global _adaptive
    if _adaptive is not None and _adaptive.current != _adaptive.most:
        _adaptive.apply(_adaptive.most)
    _adaptive = None


def adaptive_setting() -> bool | None:
    """What `set_adaptive` said: True, False, or None (never called, or reset: the default)."""
    return _adaptive_on


def _controller(move_blas: bool) -> AdaptiveThreads | None:
    """A controller over this process's pools as they are now: glassllm's, and OpenBLAS's when
    ``move_blas``."""
    blas, workers = openblas_thread_functions() if move_blas else [], get_num_threads()
    blas_most = blas[0][0]() if blas else 1

    def apply(count: int) -> None:
        set_num_threads(workers if count > 1 else 1)
        for _, set_ in blas:
            set_(blas_most if count > 1 else 1)

    return AdaptiveThreads(max(workers, blas_most), apply)


def _forget_workers_after_fork() -> None:  # a forked child has none of the parent's threads
    global _region
    _workers.clear()
    _region = threading.Lock()
    _local.in_region = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)
