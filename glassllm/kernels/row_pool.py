"""One row times a block-quantized matrix on every core: the decoding step's products.

A decoding step multiplies one row by ~150 matrices a token, each 20-80 us on one thread. Handing
half of one to a `glassllm.threads` worker costs more than it saves (an empty region: ~58 us on
a 2-vCPU guest; a product split that way took 195 us against 70 alone): the worker sleeps in the
OS between tasks, and waking it, then passing the GIL back and forth, is the time. So these
products have helpers of their own (`row_product`), native loops that never take the GIL while
they spin on a slot of fields, with a job handed over in about a microsecond
(`glassllm.kernels._numba_row_pool` says how, and why the bits equal one thread's). A helper
spins for `SPINS` polls (about a millisecond) after its last job, then sleeps on an event until
the next product wakes it; a product never waits for a helper that has not started its part: it
runs that part itself. On the 2-vCPU guest, SmolLM2's 1536 x 576 product with weights coming
from memory: 42 us on two threads against 70 on one.

The split is by blocks (each thread reads whole rows of the stored arrays, which the prefetcher
follows; split by outputs, each thread read half of every row, and the product took 82 us), or
by outputs for a wide matrix (a tied head's 49,152), whose halves of a row are long runs.

How many threads: `glassllm.threads.get_num_threads` (so ``set_num_threads(1)`` and the
adaptive controller reach these products too); none from inside a `threads.run_blocks` region,
and none while other runnable threads leave no core free for them (`_cores_taken`). Spinning and
waiting threads yield their core every `_numba_row_pool.YIELD_EVERY` polls.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

import numpy as np

from glassllm import threads

# polls of an idle helper before it sleeps: ~1 ms on the 2-vCPU EPYC guest (x86's pause is ~30
# cycles there), longer than the gaps between a token's products and short beside a neighbour's
SPINS = 1 << 15
# a product is split only from this many weights: a hand-off is ~1-2 us, 64K weights ~4 us
MIN_WEIGHTS_TO_SPLIT = 1 << 16
# outputs per thread from which a product is split by outputs rather than by blocks
COLUMNS_PER_THREAD = 4096

# how often `_cores_taken` reads the machine's runnable threads (~10 us a read)
BUSY_CHECK_SECONDS = 0.05
_checked_at, _taken = -1e9, False
_lock = threading.Lock()  # starting helpers
_slots: np.ndarray | None = None  # (most helpers, FIELDS) int64, made once: helpers hold rows
_events: list[threading.Event] = []  # one per helper started
NO_PARTIALS = np.zeros((0, 0), np.float32)
Q4, Q8 = 4, 8  # the kinds of blocks: 4-bit (uint8 nibble pairs), 8-bit (int8)


def row_product(
    fused: object,
    kind: int,
    scales: np.ndarray,
    offsets: np.ndarray,
    quants: np.ndarray,
    x: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out (outputs,) = x (in,) W`` on the ``kind`` blocks of ``W`` (``fused``: the compiled
    kernels; ``offsets``: rows, or none), split between this thread and the helpers."""
    from glassllm.kernels import _numba_row_pool as pool

    blocks, _, outputs = quants.shape
    wanted = 0 if threads.in_region() else threads.get_num_threads() - 1
    big = blocks * quants.shape[1] * outputs >= MIN_WEIGHTS_TO_SPLIT
    if wanted > 0 and big and not _cores_taken(wanted):
        slots = _helper_slots(min(wanted, blocks - 1))
        by_columns = outputs >= COLUMNS_PER_THREAD * (len(slots) + 1)
        asleep = pool.shared_row_product(slots, kind, scales, offsets, quants, x, out, by_columns)
        if asleep:
            _wake(asleep)
        return
    kernel = fused.q4_row_product if kind == Q4 else fused.q8_row_product
    kernel(scales, offsets, quants, x, out, 0, outputs, 0, blocks, NO_PARTIALS)


def _cores_taken(wanted: int) -> bool:
    """Whether other runnable threads leave no core for ``wanted`` helpers: Linux's count of
    threads running now (``/proc/loadavg``), less this one and the helpers spinning, read every
    `BUSY_CHECK_SECONDS`. Why: beside a busy neighbour on 2 vCPUs, a helper took a third of the
    caller's core and generation ran 0.86-0.94x one thread's; then the helpers sleep."""
    global _checked_at, _taken
    now = time.monotonic()
    if now - _checked_at >= BUSY_CHECK_SECONDS:
        _checked_at = now
        try:
            with open("/proc/loadavg") as loadavg:
                running = int(loadavg.read().split()[3].partition("/")[0])
        except (OSError, ValueError, IndexError):  # not Linux: no reading, no limit
            running = 0
        if _slots is not None:
            from glassllm.kernels import _numba_row_pool as pool

            running -= int(np.count_nonzero(_slots[: len(_events), pool.STATE] != pool.SLEEPING))
        _taken = running + wanted > _cores()  # running: this thread and the others
    return _taken


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _helper_slots(count: int) -> np.ndarray:
    """The slots of the first ``count`` helpers, started now where they were not yet."""
    global _slots
    if len(_events) < count:
        from glassllm.kernels import _numba_row_pool as pool

        with _lock:
            if _slots is None:
                _slots = np.zeros((max(1, (os.cpu_count() or 1) * 4), pool.FIELDS), np.int64)
            count = min(count, len(_slots))
            while len(_events) < count:
                event = threading.Event()
                slot = _slots[len(_events)]
                _events.append(event)
                thread = threading.Thread(
                    target=_helper, args=(slot, event), name="glassllm-row-helper", daemon=True
                )
                thread.start()
    return _slots[: min(count, len(_events))]


def _helper(slot: np.ndarray, event: threading.Event) -> None:
    from glassllm.kernels import _numba_row_pool as pool

    while pool.serve(slot, SPINS):  # 1: it slept (SLEEPING); woken by `_wake`
        event.wait()
        event.clear()


def _wake(asleep: int) -> None:
    """Wakes the helpers of the bitmask ``asleep`` (each ``SLEEPING``, waiting on its event)."""
    from glassllm.kernels import _numba_row_pool as pool

    for h, event in enumerate(_events):
        if asleep >> h & 1:
            _slots[h, pool.STATE] = pool.IDLE  # only a waker leaves SLEEPING: no race
            event.set()


def _stop_helpers() -> None:  # at exit: each native loop returns instead of spinning on
    if _slots is not None:
        from glassllm.kernels import _numba_row_pool as pool

        _slots[: len(_events), pool.STATE] = pool.EXIT
        for event in _events:
            event.set()


def _forget_helpers_after_fork() -> None:  # a forked child has none of the parent's threads
    global _slots, _lock
    _slots, _lock = None, threading.Lock()
    _events.clear()


atexit.register(_stop_helpers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers_after_fork)
