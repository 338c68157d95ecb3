"""One row times block-quantized weights shared with the row helpers (glassllm.kernels.row_pool):
the bits of a sequential sum in the kernels' order on any thread count, split by blocks or by
outputs; a helper asleep, a part no helper claims, callers on several threads, a region of the
other pool, one thread, and a forked child."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from conftest import optional

from glassllm import threads
from glassllm.kernels import compiled, row_pool
from glassllm.kernels import quantized as kq


@pytest.fixture(autouse=True)
def _kernels(monkeypatch):
    optional("numba")
    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")
    before = threads.get_num_threads()
    monkeypatch.setattr(row_pool, "MIN_WEIGHTS_TO_SPLIT", 0)  # small matrices split too
    monkeypatch.setattr(row_pool, "_cores_taken", lambda wanted: False)  # a busy CI box too
    yield
    threads.set_num_threads(before)


def q4_arrays(rng, blocks, outputs):
    scales = rng.normal(0, 0.1, (blocks, outputs)).astype(np.float32)
    offsets = rng.normal(0, 0.1, (blocks, outputs)).astype(np.float32)
    return scales, offsets, rng.integers(0, 256, (blocks, 16, outputs), dtype=np.uint8)


def q8_arrays(rng, blocks, outputs, size=32, offsets=False):
    scales = rng.normal(0, 0.1, (blocks, outputs)).astype(np.float32)
    m = rng.normal(0, 0.1, (blocks, outputs)).astype(np.float32) if offsets else None
    return scales, rng.integers(-128, 128, (blocks, size, outputs), dtype=np.int8), m


def q4_sequential(scales, offsets, nibbles, x):
    """Per block and output: the low-nibble terms in one float32 sum, the high-nibble ones in
    another, the block's inputs summed in order; ``d (low + high) + m sum x`` added onto the
    total, block after block."""
    blocks, half, outputs = nibbles.shape
    total = np.zeros(outputs, np.float32)
    for b in range(blocks):
        low, high = np.zeros(outputs, np.float32), np.zeros(outputs, np.float32)
        x_sum = np.float32(0)
        for j in range(2 * half):
            x_sum = np.float32(x_sum + x[2 * half * b + j])
        for j in range(half):
            low += (nibbles[b, j] & 15).astype(np.float32) * x[2 * half * b + j]
            high += (nibbles[b, j] >> 4).astype(np.float32) * x[2 * half * b + half + j]
        total += scales[b] * (low + high) + offsets[b] * x_sum
    return total


def q8_sequential(scales, quants, offsets, x):
    """Per block and output: ``q x`` added in order into one float32 sum, ``d`` times it (plus
    ``m`` times the block's inputs summed in order) added onto the total, block after block."""
    blocks, size, outputs = quants.shape
    total = np.zeros(outputs, np.float32)
    for b in range(blocks):
        block_sum, x_sum = np.zeros(outputs, np.float32), np.float32(0)
        for j in range(size):
            block_sum += quants[b, j].astype(np.float32) * x[size * b + j]
            x_sum = np.float32(x_sum + x[size * b + j])
        scaled = scales[b] * block_sum
        total += scaled if offsets is None else scaled + offsets[b] * x_sum
    return total


def q4_product(arrays, x):
    return kq.q4_matmul(x[None], *arrays)[0]


def q8_product(arrays, x):
    scales, quants, offsets = arrays
    return kq.q8_matmul(x[None], scales, quants, offsets)[0]


CASES = {  # kind: (arrays, product, sequential)
    "q4": (lambda rng, nb, n: q4_arrays(rng, nb, n), q4_product, q4_sequential),
    "q8": (lambda rng, nb, n: q8_arrays(rng, nb, n), q8_product, q8_sequential),
    "q8 offsets": (
        lambda rng, nb, n: q8_arrays(rng, nb, n, offsets=True),
        q8_product,
        q8_sequential,
    ),
    "q8 blocks of 16": (
        lambda rng, nb, n: q8_arrays(rng, nb, n, size=16),
        q8_product,
        q8_sequential,
    ),
}


def _x(arrays, rng):
    quants = next(a for a in arrays if a is not None and a.ndim == 3)
    blocks, size, _ = quants.shape
    width = blocks * size * (2 if quants.dtype == np.uint8 else 1)
    return rng.standard_normal(width, dtype=np.float32)


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("by", ["blocks", "outputs"])
def test_every_thread_count_gives_the_sequential_sums_bits(kind, by, monkeypatch):
    make, product, sequential = CASES[kind]
    # by outputs from 64 a thread (aligned to 64), else never
    monkeypatch.setattr(row_pool, "COLUMNS_PER_THREAD", 64 if by == "outputs" else 1 << 30)
    rng = np.random.default_rng(len(kind) + len(by))
    for blocks, outputs in [(7, 300), (2, 129), (1, 70), (12, 64)]:
        arrays = make(rng, blocks, outputs)
        x = _x(arrays, rng)
        expected = sequential(*arrays, x)
        for count in (1, 2, 3, 5):
            threads.set_num_threads(count)
            for _ in range(3):  # helpers asleep, waking, spinning
                assert np.array_equal(product(arrays, x), expected), (blocks, outputs, count)


def _states():
    from glassllm.kernels import _numba_row_pool as pool

    return pool, row_pool._slots[: len(row_pool._events), pool.STATE]


def _q4_case(seed):
    """Two threads; 4-bit blocks (6 x 256), a row, and the sequential sum's result."""
    threads.set_num_threads(2)
    rng = np.random.default_rng(seed)
    arrays = q4_arrays(rng, 6, 256)
    x = _x(arrays, rng)
    return arrays, x, q4_sequential(*arrays, x)


def test_a_helper_asleep_is_woken_and_the_product_is_right_meanwhile():
    arrays, x, expected = _q4_case(1)
    assert np.array_equal(q4_product(arrays, x), expected)  # starts the helper
    pool, states = _states()
    deadline = time.monotonic() + 10
    while states[0] != pool.SLEEPING:  # SPINS polls without a job: it sleeps
        assert time.monotonic() < deadline, "the helper never went to sleep"
        time.sleep(0.001)
    assert np.array_equal(q4_product(arrays, x), expected)  # without it, and it is woken
    deadline = time.monotonic() + 10
    while states[0] == pool.SLEEPING:
        assert time.monotonic() < deadline, "the helper was not woken"
        time.sleep(0.001)
    assert np.array_equal(q4_product(arrays, x), expected)


@pytest.mark.parametrize("by_columns", [False, True])
def test_a_part_no_helper_claims_is_run_by_the_caller(by_columns):
    """A slot nobody serves (a helper the OS has descheduled): the caller reserves it, posts its
    part, and takes the part back when its own is done."""
    from glassllm.kernels import _numba_row_pool as pool

    rng = np.random.default_rng(2)
    scales, offsets, nibbles = q4_arrays(rng, 5, 640)
    x = _x((scales, offsets, nibbles), rng)
    slots = np.zeros((2, pool.FIELDS), np.int64)  # two idle slots, no thread on either
    out = np.full(640, np.nan, np.float32)
    asleep = pool.shared_row_product(
        slots, row_pool.Q4, scales, offsets, nibbles, x, out, by_columns
    )
    assert asleep == 0 and list(slots[:, pool.STATE]) == [pool.IDLE, pool.IDLE]
    assert np.array_equal(out, q4_sequential(scales, offsets, nibbles, x))
    slots[1, pool.STATE] = pool.SLEEPING  # one asleep: reported, not used
    out[:] = np.nan
    asleep = pool.shared_row_product(
        slots, row_pool.Q4, scales, offsets, nibbles, x, out, by_columns
    )
    assert asleep == 0b10 and slots[1, pool.STATE] == pool.SLEEPING
    assert np.array_equal(out, q4_sequential(scales, offsets, nibbles, x))


def test_callers_on_several_threads_share_the_helpers():
    threads.set_num_threads(2)
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(4):
        arrays = q8_arrays(rng, 9, 512, offsets=True)
        x = _x(arrays, rng)
        cases.append((arrays, x, q8_sequential(*arrays, x)))
    wrong = []

    def caller(arrays, x, expected):
        for _ in range(100):
            if not np.array_equal(q8_product(arrays, x), expected):
                wrong.append(1)

    callers = [threading.Thread(target=caller, args=case) for case in cases]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join()
    assert not wrong


def test_one_thread_and_a_region_of_the_other_pool_use_no_helper(monkeypatch):
    from glassllm.kernels import _numba_row_pool as pool

    def refused(*args):
        raise AssertionError("split although it should not be")

    monkeypatch.setattr(pool, "shared_row_product", refused)
    rng = np.random.default_rng(4)
    arrays = q4_arrays(rng, 4, 128)
    x = _x(arrays, rng)
    expected = q4_sequential(*arrays, x)
    threads.set_num_threads(1)
    assert np.array_equal(q4_product(arrays, x), expected)
    threads.set_num_threads(2)
    results = [None, None]

    def block(i):
        results[i] = q4_product(arrays, x)

    threads.run_blocks([lambda: block(0), lambda: block(1)])
    assert all(np.array_equal(result, expected) for result in results)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_starts_helpers_of_its_own():
    arrays, x, expected = _q4_case(5)
    assert np.array_equal(q4_product(arrays, x), expected)  # the parent's helper running
    pid = os.fork()
    if pid == 0:  # the child: no helper thread was copied; new ones start
        try:
            ok = all(np.array_equal(q4_product(arrays, x), expected) for _ in range(20))
            ok = ok and len(row_pool._events) == 1
        except BaseException:  # noqa: BLE001 - reported by the exit status
            ok = False
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
