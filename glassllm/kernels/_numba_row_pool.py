"""The compiled half of `glassllm.kernels.row_pool`: one row times a block-quantized matrix
shared between the calling thread and helper threads that spin, without the GIL, on a slot of
int64 fields (imported only when numba is).

A job is published field by field, then its ``STATE`` set to ``POSTED`` with release ordering;
a helper claims it with a compare-exchange (``POSTED -> CLAIMED``), runs it and stores ``DONE``.
The caller runs its own part first, then takes back (``POSTED -> IDLE``) any part no helper has
claimed yet and runs it too: a helper the OS has descheduled, or one still waking, is never
waited for. Only a part already claimed is waited for, and it is already running.

The bits do not depend on who runs what. A part is a range of blocks (or, by columns, a range
of outputs over all the blocks). The caller's first range is added in block order onto 0 in
``out``; each further range writes one row of ``partials`` per block, which the caller then adds
to ``out`` in block order: the same additions in the same order as one thread's pass.
"""

from __future__ import annotations

import numba
import numpy as np

from glassllm.kernels._numba_atomics import (
    compare_exchange,
    float32_at,
    int8_at,
    load_acquire,
    spin_pause,
    store_release,
    uint8_at,
    yield_thread,
)
from glassllm.kernels._numba_kernels import _exact, q4_row_product, q8_row_product
from glassllm.kernels.row_pool import Q4

# a slot's fields (one int64 row per helper)
STATE, KIND, SCALES, OFFSETS, OFFSET_ROWS, QUANTS, X, OUT = 0, 1, 2, 3, 4, 5, 6, 7
PARTIALS, PARTIAL_ROWS, BLOCKS, SIZE, OUTPUTS, FIRST, LAST, FIRST_BLOCK = (
    8,
    9,
    10,
    11,
    12,
    13,
    14,
    15,
)
LAST_BLOCK = 16
FIELDS = 24  # 192 bytes: a slot never shares a 64-byte cache line with another
# a slot's states: IDLE (spinning, free), OWNED (reserved by a caller about to post), POSTED,
# CLAIMED (running), DONE, SLEEPING (the helper waits on its event), EXIT (the helper returns)
# polls between two yields of the core: a spinning thread gives way to a runnable one (a busy
# machine's neighbour, or the thread it helps, descheduled onto the same core) within ~1 us
YIELD_EVERY = 16
IDLE, OWNED, POSTED, CLAIMED, DONE, SLEEPING, EXIT = 0, 1, 2, 3, 4, 5, 6


@_exact
def _run_posted(slot):
    """Runs the part whose fields ``slot`` holds, on arrays rebuilt from their addresses."""
    blocks, size, outputs = slot[BLOCKS], slot[SIZE], slot[OUTPUTS]
    scales = numba.carray(float32_at(slot[SCALES]), (blocks, outputs))
    offsets = numba.carray(float32_at(slot[OFFSETS]), (slot[OFFSET_ROWS], outputs))
    x = numba.carray(float32_at(slot[X]), (blocks * size * (2 if slot[KIND] == Q4 else 1),))
    out = numba.carray(float32_at(slot[OUT]), (outputs,))
    partials = numba.carray(float32_at(slot[PARTIALS]), (slot[PARTIAL_ROWS], outputs))
    first, last, first_block, last_block = (
        slot[FIRST],
        slot[LAST],
        slot[FIRST_BLOCK],
        slot[LAST_BLOCK],
    )
    if slot[KIND] == Q4:
        nibbles = numba.carray(uint8_at(slot[QUANTS]), (blocks, size, outputs))
        q4_row_product(
            scales, offsets, nibbles, x, out, first, last, first_block, last_block, partials
        )
    else:
        quants = numba.carray(int8_at(slot[QUANTS]), (blocks, size, outputs))
        q8_row_product(
            scales, offsets, quants, x, out, first, last, first_block, last_block, partials
        )


@_exact
def serve(slot, spins):
    """A helper thread's loop on its ``slot``: runs every job posted to it. Returns 1 once it has
    polled ``spins`` times in a row without one (its state then ``SLEEPING``: the caller waits
    on its event), 0 on ``EXIT``."""
    idle = 0
    while True:
        state = load_acquire(slot, STATE)
        if state == POSTED:
            if compare_exchange(slot, STATE, POSTED, CLAIMED) == POSTED:
                _run_posted(slot)
                store_release(slot, STATE, DONE)
            idle = 0
        elif state == EXIT:
            return 0
        elif state == IDLE and idle >= spins:
            if compare_exchange(slot, STATE, IDLE, SLEEPING) == IDLE:
                return 1
        else:
            spin_pause()
            idle += 1
            if idle % YIELD_EVERY == 0:
                yield_thread()


@_exact
def shared_row_product(slots, kind, scales, offsets, quants, x, out, by_columns):
    """``out = x W`` for one row ``x (in,)`` and the ``kind`` blocks of ``W`` (``scales``,
    ``offsets`` (rows or none), ``quants``: `glassllm.functional.quantized`'s arrays), split
    between this thread and every helper of ``slots`` spinning now: ranges of blocks, or of
    outputs (aligned to 64) when ``by_columns``. Returns a bitmask of the helpers found asleep,
    for the caller to wake (this product runs without them)."""
    blocks, size, outputs = quants.shape
    helpers = slots.shape[0]
    owned = np.empty(helpers, np.int64)
    count, asleep = 0, 0
    for h in range(helpers):
        old = compare_exchange(slots[h], STATE, IDLE, OWNED)
        if old == IDLE:
            owned[count] = h
            count += 1
        elif old == SLEEPING:
            asleep |= 1 << h
    parts = count + 1
    bounds = np.empty(parts + 1, np.int64)
    for p in range(parts):
        bounds[p] = (outputs * p // parts) // 64 * 64 if by_columns else blocks * p // parts
    bounds[parts] = outputs if by_columns else blocks
    rows = 0 if by_columns or count == 0 else blocks - bounds[1]
    partials = np.empty((rows, outputs), np.float32)
    for i in range(count):
        slot = slots[owned[i]]
        slot[KIND], slot[SCALES], slot[QUANTS] = kind, scales.ctypes.data, quants.ctypes.data
        slot[OFFSETS], slot[OFFSET_ROWS] = offsets.ctypes.data, offsets.shape[0]
        slot[X], slot[OUT], slot[PARTIALS] = x.ctypes.data, out.ctypes.data, partials.ctypes.data
        slot[BLOCKS], slot[SIZE], slot[OUTPUTS] = blocks, size, outputs
        slot[FIRST], slot[LAST] = (bounds[i + 1], bounds[i + 2]) if by_columns else (0, outputs)
        slot[FIRST_BLOCK], slot[LAST_BLOCK] = (
            (0, blocks) if by_columns else (bounds[i + 1], bounds[i + 2])
        )
        slot[PARTIAL_ROWS] = rows
        if not by_columns:  # its rows of partials: the view past the blocks before its own
            slot[PARTIALS] = partials.ctypes.data + (bounds[i + 1] - bounds[1]) * outputs * 4
            slot[PARTIAL_ROWS] = bounds[i + 2] - bounds[i + 1]
        store_release(slot, STATE, POSTED)
    first, last = (0, bounds[1]) if by_columns else (0, outputs)
    first_block, last_block = (0, blocks) if by_columns else (0, bounds[1])
    no_partials = partials[:0]
    if kind == Q4:
        q4_row_product(
            scales, offsets, quants, x, out, first, last, first_block, last_block, no_partials
        )
    else:
        q8_row_product(
            scales, offsets, quants, x, out, first, last, first_block, last_block, no_partials
        )
    for i in range(count):
        slot = slots[owned[i]]
        if compare_exchange(slot, STATE, POSTED, CLAIMED) == POSTED:  # not claimed: ours now
            _run_posted(slot)
        else:
            polls = 0
            while load_acquire(slot, STATE) != DONE:
                spin_pause()
                polls += 1
                if polls % YIELD_EVERY == 0:
                    yield_thread()
        store_release(slot, STATE, IDLE)
    for r in range(rows):  # the further blocks' terms, in block order
        term = partials[r]
        for o in range(outputs):
            out[o] += term[o]
    return asleep
