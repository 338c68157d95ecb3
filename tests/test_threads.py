"""glassllm.threads: the worker pool's contract, and every op that uses it giving the same bits
on one thread as on several (the oracle for the parallel path is the serial one)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import REPO, on_threads
from hypothesis import given
from hypothesis import strategies as st

from glassllm import Tensor, threads
from glassllm import functional as F
from glassllm.optim import AdamW


@pytest.fixture
def num_threads():
    """``num_threads(n)`` sets the pool's size for the test; the old size comes back after."""
    before = threads.get_num_threads()
    yield threads.set_num_threads
    threads.set_num_threads(before)


def test_run_blocks_runs_every_task_once_on_distinct_threads(num_threads):
    num_threads(3)
    seen: list[tuple[int, int]] = []
    barrier = threading.Barrier(3, timeout=10)  # only passes if all three run at once

    def task(i: int) -> None:
        barrier.wait()
        seen.append((i, threading.get_ident()))

    threads.run_blocks([lambda i=i: task(i) for i in range(3)])
    assert sorted(i for i, _ in seen) == [0, 1, 2]
    assert len({ident for _, ident in seen}) == 3
    assert dict(seen)[0] == threading.get_ident()  # block 0 on the caller


def test_an_error_in_a_block_is_raised_after_every_block_finished(num_threads):
    num_threads(2)
    finished = []

    def slow() -> None:
        time.sleep(0.05)
        finished.append("worker")

    def fail() -> None:
        raise KeyError("block 0")

    with pytest.raises(KeyError, match="block 0"):
        threads.run_blocks([fail, slow])
    assert finished == ["worker"]
    with pytest.raises(ZeroDivisionError):  # from a worker's block too
        threads.run_blocks([lambda: None, lambda: 1 / 0])
    threads.run_blocks([lambda: None, lambda: None])  # and the pool still works


def test_a_region_inside_a_region_and_two_callers_at_once_run_serially(num_threads):
    num_threads(2)
    out = np.zeros(8)

    def inner(rows: slice) -> None:  # a region opened from inside a block
        threads.split_rows(lambda a: a.__iadd__(1), out[rows])

    threads.run_blocks([lambda: inner(slice(0, 4)), lambda: inner(slice(4, 8))])
    np.testing.assert_array_equal(out, 1)

    results = {}

    def caller(name: str) -> None:  # two user threads, each opening regions
        a = np.arange(100_000.0)
        for _ in range(20):
            b = np.empty_like(a)
            threads.split_rows(lambda x, y: np.multiply(x, 2.0, out=y), a, b)
        results[name] = b

    users = [threading.Thread(target=caller, args=(n,)) for n in "ab"]
    for user in users:
        user.start()
    for user in users:
        user.join(timeout=30)
    for b in results.values():
        np.testing.assert_array_equal(b, np.arange(100_000.0) * 2)
    assert len(results) == 2


@given(
    rows=st.integers(0, 10_000),
    parts=st.integers(1, 8),
    min_rows=st.integers(1, 3_000),
    align=st.sampled_from([1, 1, 4, 64]),
)
def test_row_blocks_cover_the_rows_once_in_order(rows, parts, min_rows, align):
    before = threads.get_num_threads()
    threads.set_num_threads(parts)
    try:
        blocks = threads.row_blocks(rows, min_rows, align=align)
    finally:
        threads.set_num_threads(before)
    assert blocks[0].start == 0 and blocks[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:], strict=False))
    assert 1 <= len(blocks) <= parts
    assert all(b.start % align == 0 for b in blocks)  # every edge but the table's end aligned
    if len(blocks) > 1:
        sizes = [b.stop - b.start for b in blocks]
        assert min(sizes) >= max(min_rows, align)
        assert max(sizes) - min(sizes) <= (1 if align == 1 else 2 * align)


@given(sizes=st.lists(st.integers(1, 1000), max_size=30), parts=st.integers(1, 4))
def test_size_blocks_deal_every_item_once_keeping_their_order(sizes, parts):
    before = threads.get_num_threads()
    threads.set_num_threads(parts)
    try:
        blocks = threads.size_blocks(list(range(len(sizes))), sizes)
    finally:
        threads.set_num_threads(before)
    assert sorted(i for block in blocks for i in block) == list(range(len(sizes)))
    assert all(block == sorted(block) for block in blocks)
    assert len(blocks) <= parts
    if blocks:  # greedy largest-first: no block exceeds the lightest by more than one item
        loads = [sum(sizes[i] for i in block) for block in blocks]
        assert max(loads) - min(loads) <= max(sizes)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_num_threads_rejects_anything_but_a_positive_int(bad):
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        threads.set_num_threads(bad)


def test_a_blas_region_runs_with_one_blas_thread_and_restores_the_count(num_threads):
    limit = threads._BlasLimit()
    if not limit.available:
        pytest.skip("NumPy's BLAS is not OpenBLAS: BLAS regions run serially")
    get = limit._functions[0][0]
    before = get()
    inside = []
    num_threads(2)
    threads.run_blocks([lambda: inside.append(get()), lambda: None], uses_blas=True)
    assert inside == [1] and get() == before


# ------------------------------------------------------------------ the same bits on any count


def _forward_backward(op, *shapes, seed=0):
    """``op``'s output and its inputs' gradients for a fixed random upstream gradient."""
    rng = np.random.default_rng(seed)
    inputs = [Tensor(rng.standard_normal(s, dtype=np.float32), requires_grad=True) for s in shapes]
    out = op(*inputs)
    out.backward(rng.standard_normal(out.shape, dtype=np.float32))
    return [out.data] + [t.grad for t in inputs]


@pytest.mark.parametrize(
    "name, op, shapes",
    [
        ("gelu", F.gelu, [(768, 512)]),
        ("layer_norm", F.layer_norm, [(3, 700, 96), (96,), (96,)]),
        ("attention", lambda t: F.packed_attention(t, 4, causal=True), [(6, 130, 96)]),
    ],
)
def test_parallel_ops_give_the_bits_of_one_thread(name, op, shapes, kernel_path):
    one = on_threads(1, lambda: _forward_backward(op, *shapes))
    two = on_threads(2, lambda: _forward_backward(op, *shapes))
    three = on_threads(3, lambda: _forward_backward(op, *shapes))
    for a, b, c in zip(one, two, three, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
        np.testing.assert_array_equal(a, c, err_msg=name)


def test_layer_norm_weight_grads_of_a_constant_input_on_the_split_path(kernel_path):
    """x that needs no gradient, a trainable weight and bias, rows enough to split: dw and db
    match the float64 formula and are the same bits on one thread or two."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 48), dtype=np.float32) * 3 + 1
    w0, b0 = rng.standard_normal(48, dtype=np.float32), rng.standard_normal(48, dtype=np.float32)
    dy = rng.standard_normal((2048, 48), dtype=np.float32)

    def grads() -> tuple:
        w, b = Tensor(w0.copy(), requires_grad=True), Tensor(b0.copy(), requires_grad=True)
        F.layer_norm(Tensor(x), w, b).backward(dy)
        return w.grad, b.grad

    one, two = on_threads(1, grads), on_threads(2, grads)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(one[0], (dy * xhat).sum(0), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(one[1], dy.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)


def test_gelu_in_chunks_gives_the_bits_of_one_pass_over_the_whole_array(kernel_path):
    """GELU runs its chain of passes chunk by chunk (its temporaries stay in the cache); a length
    that is not a multiple of the chunk gets the bits of the kernels over the whole array."""
    from glassllm.kernels import gelu as activations

    rng = np.random.default_rng(0)
    n = 3 * activations._CHUNK + 5
    x = rng.standard_normal(n, dtype=np.float32) * 4
    grad = rng.standard_normal(n, dtype=np.float32)
    s, out, slope = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    activations._gelu_tanh(x, s, out)
    activations._gelu_tanh_slope(x, s, grad, slope)
    t = Tensor(x, requires_grad=True)
    y = F.gelu(t)
    y.backward(grad)
    np.testing.assert_array_equal(y.data, out)
    np.testing.assert_array_equal(t.grad, slope)


def test_parallel_ops_split_these_shapes(monkeypatch, kernel_path):
    """The shapes above are large enough that each op really splits its work (else the bitwise
    test above would compare the serial path with itself)."""
    import glassllm.kernels.attention as attention

    calls = []
    original = threads.run_blocks

    def spy(tasks, uses_blas=False):
        calls.append(len(tasks))
        original(tasks, uses_blas)

    monkeypatch.setattr(threads, "run_blocks", spy)  # split_rows' (gelu, layer_norm)
    monkeypatch.setattr(attention, "run_blocks", spy)
    on_threads(2, lambda: _forward_backward(F.gelu, (768, 512)))
    on_threads(2, lambda: _forward_backward(F.layer_norm, (3, 700, 96), (96,), (96,)))
    causal = lambda t: F.packed_attention(t, 4, causal=True)  # noqa: E731
    on_threads(2, lambda: _forward_backward(causal, (6, 130, 96)))
    assert calls == [2] * 6  # gelu, layer_norm, attention: forward and backward each


def test_adamw_gives_the_bits_of_one_thread(kernel_path):
    def train(count: int) -> list[np.ndarray]:
        rng = np.random.default_rng(0)
        params = [
            Tensor(rng.standard_normal(shape, dtype=np.float32), requires_grad=True)
            for shape in [(300, 400), (400,), (200, 300), (7,)]
        ]
        opt = AdamW(params, lr=1e-2, weight_decay=0.1)

        def steps() -> None:
            for _ in range(3):
                for p in params:
                    p.grad = rng.standard_normal(p.shape, dtype=np.float32)
                opt.step()

        on_threads(count, steps)
        return [p.data.copy() for p in params] + [opt.state[n]["exp_avg_sq"] for n in opt.state]

    for a, b in zip(train(1), train(2), strict=True):
        np.testing.assert_array_equal(a, b)


def _fresh_python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS", "OMP_"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_default_uses_the_cores_only_where_openblas_spins_briefly():
    probe = (
        "from glassllm import threads; import os; "
        "print(threads.get_num_threads(), os.environ.get('OPENBLAS_THREAD_TIMEOUT'), "
        "len(os.sched_getaffinity(0)), bool(threads._BlasLimit().available))"
    )
    count, timeout, cores, openblas = _fresh_python("import glassllm; " + probe)
    assert timeout == "16"  # set by import glassllm, before NumPy
    assert int(count) == (int(cores) if openblas == "True" else 1)
    count, timeout, *_ = _fresh_python("import numpy; import glassllm; " + probe)
    assert (count, timeout) == ("1", "None")  # too late to shorten the spin: no workers
    count, timeout, *_ = _fresh_python("import glassllm; " + probe, OPENBLAS_NUM_THREADS="1")
    assert count == "1"
    count, timeout, *_ = _fresh_python("import glassllm; " + probe, OPENBLAS_THREAD_TIMEOUT="28")
    assert (count, timeout) == ("1", "28")  # the user's own long spin is respected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_starts_its_own_workers():
    code = (
        "import glassllm, os, numpy as np; from glassllm import threads;"
        "threads.set_num_threads(2); a = np.arange(200_000.0); b = np.empty_like(a);"
        "threads.split_rows(lambda x, y: np.multiply(x, 3.0, out=y), a, b);"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    c = np.empty_like(a); threads.split_rows(lambda x, y: np.add(x, 1.0, out=y), a, c)\n"
        "    os._exit(0 if (c == a + 1).all() else 1)\n"
        "_, status = os.waitpid(pid, 0); print(os.waitstatus_to_exitcode(status))"
    )
    assert _fresh_python(code) == ["0"]


def test_gpt_training_steps_give_the_bits_of_one_thread():
    from glassllm.models import GPT, GPTConfig

    def train(count: int) -> list[np.ndarray]:
        config = GPTConfig(vocab_size=65, block_size=128, n_layer=1, n_head=2, n_embd=64)
        model = GPT(config, rng=np.random.default_rng(0))
        opt = AdamW(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(1)

        def steps() -> None:
            for _ in range(2):
                tokens = rng.integers(0, 65, size=(8, 129))
                _, loss = model(tokens[:, :-1], tokens[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad()

        on_threads(count, steps)
        return [p.data.copy() for p in model.parameters()]

    for a, b in zip(train(1), train(2), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["rows", "transposed", "strided"])
def test_one_row_linear_matches_blas_and_gives_the_bits_of_one_thread(layout):
    """A decoding step's ``x @ W`` (one row) streams W with einsum; a tied head's transposed
    table is split into row blocks over the workers."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((6000, 96), dtype=np.float32)  # (out, in), as a tied head
    w = {
        "rows": np.ascontiguousarray(table.T),  # (in, out) C-contiguous, as nn.Linear's
        "transposed": table.T,  # F-contiguous view
        "strided": table.T[:, ::2],  # neither: falls back to matmul
    }[layout]
    x = Tensor(rng.standard_normal((1, 1, 96), dtype=np.float32))
    weight = Tensor(w)
    one = on_threads(1, lambda: F.linear(x, weight).data)
    two = on_threads(2, lambda: F.linear(x, weight).data)
    np.testing.assert_array_equal(one, two)
    assert one.dtype == np.float32 and one.shape == (1, 1, w.shape[1])
    np.testing.assert_allclose(one[0, 0], x.data[0, 0] @ w, rtol=1e-5, atol=1e-5)


def test_ctrl_c_during_a_region_waits_for_every_block():
    """A real SIGINT while the caller waits: the KeyboardInterrupt comes once the worker's block
    is done, so a caller that saves on Ctrl-C never races a block still writing."""
    code = (
        "import os, signal, threading, time\n"
        "from glassllm import threads\n"
        "threads.set_num_threads(2); log = []\n"
        "def caller():\n"
        "    threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "def worker():\n"
        "    time.sleep(0.5); log.append('worker done')\n"
        "try:\n"
        "    threads.run_blocks([caller, worker])\n"
        "except KeyboardInterrupt:\n"
        "    print(log == ['worker done'])\n"
    )
    assert _fresh_python(code) == ["True"]


def test_adam_checks_every_gradient_before_moving_any_state():
    w0 = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    w1 = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    opt = AdamW([w0, w1], lr=0.1)
    w0.grad = np.ones(3, dtype=np.float32)
    w1.grad = np.ones(4, dtype=np.float32)  # wrong shape
    with pytest.raises(ValueError, match="gradient shape"):
        opt.step()
    assert opt.state == {} and (w0.data == 1).all()


def controller_run(step_seconds, steps, **options):
    """The counts an `AdaptiveThreads` over 2 threads runs ``steps`` steps at, each step taking
    ``step_seconds(step, count)``: a fake clock, so nothing here depends on timing."""
    used = []
    options.setdefault("window", 3)
    control = threads.AdaptiveThreads(2, used.append, **options)
    counts = []
    for step in range(steps):
        counts.append(control.current)
        control.observe(step_seconds(step, control.current))
    return counts, used


def test_the_controller_keeps_one_thread_where_it_is_faster_and_all_where_they_are():
    busy = lambda step, count: 1.0 if count == 1 else 2.8
    counts, used = controller_run(busy, 12, settle=2, probe=2, every=100)
    # 2 settling + 2 timed steps at 2, one switching + 2 timed at 1, then 1 from there on
    assert counts == [2] * 4 + [1] * 8 and used == [1]
    quiet = lambda step, count: 1.33 if count == 1 else 1.0
    counts, used = controller_run(quiet, 12, settle=2, probe=2, every=100)
    assert counts == [2] * 4 + [1] * 3 + [2] * 5 and used == [1, 2]


def test_the_controller_probes_again_every_so_often_and_when_steps_slow_down():
    quiet = lambda step, count: 1.33 if count == 1 else 1.0
    counts, _ = controller_run(quiet, 60, settle=1, probe=1, every=10)
    # after the first probe (steps 0-3) 10 steps at 2, then a probe timing 1 and 2 again, back
    # to 2; each probe that keeps 2 doubles the wait: 20 steps, then 40
    assert counts == [2, 2, 1, 1] + [2] * 10 + [1, 1, 2, 2] + [2] * 20 + [1, 1, 2, 2] + [2] * 18
    neighbour = lambda step, count: 1.0 if count == 1 or step < 10 else 3.0  # from step 10
    counts, _ = controller_run(neighbour, 20, settle=1, probe=1, every=100, degrade=1.3)
    # 3 slow steps (10-12) to see it, then the probe at 1 (13-14) and 2 (15-16) keeps 1
    assert counts[:13] == [2, 2, 1, 1] + [2] * 9 and counts[13:] == [1, 1, 2, 2, 1, 1, 1]
    burst = lambda step, count: (3.0 if 20 <= step < 23 else 1.0) * (1.0 if count == 2 else 1.33)
    counts, _ = controller_run(burst, 40, settle=1, probe=1, every=100, degrade=1.3)
    # 3 slow steps at 2 (20-22) set off a probe (23-26), whose fresh steps at 2 keep 2
    assert counts == [2, 2, 1, 1] + [2] * 19 + [1, 1, 2, 2] + [2] * 13
    counts, _ = controller_run(burst, 40, settle=1, probe=1, every=100, window=5)
    assert counts == [2, 2, 1, 1] + [2] * 36  # a window of 5 sees no slowdown in 3 steps


def test_the_controller_keeps_all_threads_unless_one_wins_by_the_margin():
    near = lambda step, count: 0.97 if count == 1 else 1.0  # one thread 3% faster: noise
    counts, used = controller_run(near, 10, settle=1, probe=1, margin=0.05)
    assert counts == [2, 2, 1, 1] + [2] * 6 and used == [1, 2]
    clear = lambda step, count: 0.9 if count == 1 else 1.0  # 10% faster: one thread
    counts, used = controller_run(clear, 10, settle=1, probe=1, margin=0.05)
    assert counts == [2, 2, 1, 1] + [1] * 6 and used == [1]


def test_the_controller_probes_as_often_as_at_first_while_on_one_thread():
    load = lambda step, count: (
        (3.0 if 20 <= step < 60 and count == 2 else 1.0) * (1.0 if count == 2 else 1.33)
    )  # quiet, then a busy neighbour from step 20 to 59, then quiet
    counts, _ = controller_run(load, 100, settle=1, probe=1, every=10, degrade=1.3)
    expected = (
        [2, 2, 1, 1] + [2] * 10 + [1, 1, 2, 2]  # the first probe, 10 steps at 2, a probe keeps 2
        + [2] * 5  # steps 18-22: the wait is 20 now, but 20-22 slowed down
        + [1, 1, 2, 2] + [1] * 10  # 23-26: one thread wins; every 10 steps a probe
        + [2, 2, 1, 1] + [1] * 10 + [2, 2, 1, 1] + [1] * 10  # busy until 59: one thread kept
        + [2, 2, 1, 1] + [2] * 10  # 65-68: quiet again, all threads win; 10 steps at 2
        + [1, 1, 2, 2] + [2] * 17  # 79-82: all threads kept, so the wait doubles to 20
    )  # fmt: skip
    assert counts == expected


def test_adaptive_step_times_steps_with_the_given_clock_and_set_adaptive_off_restores(
    monkeypatch,
):
    blas = threads.openblas_thread_functions()
    before = (threads.get_num_threads(), [get() for get, _ in blas])
    threads.set_num_threads(2)
    now = [0.0]

    def clock():  # one thread makes a step look 2x faster
        now[0] += 0.5 if threads.get_num_threads() == 1 else 1.0
        return now[0]

    try:
        threads.set_adaptive(True, clock=clock, blas=True)
        for _ in range(10):
            with threads.adaptive_step():
                pass
        assert threads.get_num_threads() == 1 and all(get() == 1 for get, _ in blas)
        threads.set_adaptive(False)
        assert threads.get_num_threads() == 2 and [get() for get, _ in blas] == before[1]
        with threads.adaptive_step():  # off: times nothing, changes nothing
            pass
        assert now[0] > 0 and threads._adaptive is None
    finally:
        threads.set_adaptive(None)
        threads.set_num_threads(before[0])
        for (_, set_), count in zip(blas, before[1], strict=True):
            set_(count)
