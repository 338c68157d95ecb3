"""The Trainer's default thread adaptation: OpenBLAS's pool moves with the load only where the
run's own step gives the same bits on all its threads and on one (glassllm.app.thread_check)."""

from __future__ import annotations

import numpy as np
import pytest
from test_train import data, parameters, tiny  # noqa: F401  (data: a fixture)

from glassllm import Tensor, threads
from glassllm.app import thread_check
from glassllm.app.train import Trainer


@pytest.fixture
def two_blas_threads():
    """OpenBLAS and glassllm's workers on 2 threads for the test, as they were after it."""
    blas = threads.openblas_thread_functions()
    if not blas:
        pytest.skip("NumPy's BLAS is not an OpenBLAS found through /proc here")
    before = (threads.get_num_threads(), [get() for get, _ in blas])
    threads.set_num_threads(2)
    for _, set_ in blas:
        set_(2)
    threads.set_adaptive(None)
    yield blas
    threads.set_adaptive(None)
    threads.set_num_threads(before[0])
    for (_, set_), count in zip(blas, before[1], strict=True):
        set_(count)


def test_the_check_sees_a_result_that_depends_on_openblas_threads_and_puts_all_back(
    two_blas_threads,
):
    blas = two_blas_threads
    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    w.grad = kept = np.full(3, 7.0, np.float32)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state

    def backward(depends: bool) -> float:
        draw = rng.standard_normal(dtype=np.float32)  # the same draw on both runs
        w.grad = np.full(3, draw + (blas[0][0]() if depends else 0), np.float32)
        return float(draw)

    assert thread_check.moving_blas_keeps_bits([w], lambda: backward(False), [rng])
    assert not thread_check.moving_blas_keeps_bits([w], lambda: backward(True), [rng])
    assert w.grad is kept and rng.bit_generator.state == state
    assert [get() for get, _ in blas] == [2] * len(blas)  # the pools as they were


def test_the_check_says_no_where_openblas_has_one_thread(two_blas_threads):
    for _, set_ in two_blas_threads:
        set_(1)
    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    assert not thread_check.moving_blas_keeps_bits([w], lambda: 0.0, [])


@pytest.mark.parametrize("keeps_bits", [True, False])
def test_a_default_run_adapts_only_where_the_check_allows_and_changes_no_bit(
    data,  # noqa: F811
    tmp_path,
    monkeypatch,
    two_blas_threads,
    keeps_bits,
):
    """Dropout on, a fake clock that makes one-thread steps look faster: a default run (whose
    check is forced either way) gives the weights and losses of a run that never adapts, and
    moves OpenBLAS's pool exactly when the check said it may."""
    blas = two_blas_threads
    real_check, checks = thread_check.moving_blas_keeps_bits, []

    def check(*args):
        checks.append(real_check(*args))  # runs the real check: it must change nothing
        return keeps_bits

    monkeypatch.setattr(thread_check, "moving_blas_keeps_bits", check)
    now, counts = [0.0], []

    def clock():
        counts.append(blas[0][0]())
        now[0] += 0.5 if blas[0][0]() == 1 else 1.0
        return now[0]

    runs = {}
    for adaptive in (False, None):
        threads.set_adaptive(adaptive, clock=clock)
        config = tiny(data, tmp_path / str(adaptive), dropout=0.1, max_iters=16)
        trainer = Trainer(config)
        losses = trainer.fit(progress=False).losses
        runs[adaptive] = parameters(trainer.model) | {"losses": np.array(losses)}
        assert [get() for get, _ in blas] == [2] * len(blas)  # all threads after the run
    assert len(checks) == 1  # the default run checked once; set_adaptive(False) skips it
    assert (1 in counts) == keeps_bits
    for name, value in runs[False].items():
        np.testing.assert_array_equal(runs[None][name], value, err_msg=name)
