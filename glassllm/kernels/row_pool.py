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
adaptive controller reach these products too); none from inside a `threads.run_blocks` region.
"""

from __future__ import annotations

import atexit
import os
import threading

import numpy as np

from glassllm import threads

# polls of an idle helper before it sleeps: ~1 ms on the 2-vCPU EPYC guest (x86's pause is ~30
# cycles there), longer than the gaps between a token's products and short beside a neighbour's
SPINS = 1 << 15
# a product is split only from this many weights: a hand-off is ~1-2 us, 64K weights ~4 us
MIN_WEIGHTS_TO_SPLIT = 1 << 16
# outputs per thread from which a product is split by outputs rather than by blocks
COLUMNS_PER_THREAD = 4096

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
    if wanted > 0 and blocks * quants.shape[1] * outputs >= MIN_WEIGHTS_TO_SPLIT:
        slots = _helper_slots(min(wanted, blocks - 1))
        by_columns = outputs >= COLUMNS_PER_THREAD * (len(slots) + 1)
        asleep = pool.shared_row_product(slots, kind, scales, offsets, quants, x, out, by_columns)
        if asleep:
            _wake(asleep)
        return
    kernel = fused.q4_row_product if kind == Q4 else fused.q8_row_product
    kernel(scales, offsets, quants, x, out, 0, outputs, 0, blocks, NO_PARTIALS)


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
