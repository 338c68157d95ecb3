"""glassllm.distributed: launch detection, batch slicing and the size-1 path without MPI; then
real ``mpiexec -n 2`` runs of distributed_worker.py beside it (marker ``mpi``): equivalence with
one process accumulating gradients, the replica check, and every fault ending all ranks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from mpi_jobs import (
    clean_env,
    find_mpiexec,
    mpi_missing,
    run_job,
    seconds_since,
    start_job,
    watchdog,
)

from glassllm import distributed
from glassllm.distributed import blas_threads

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "distributed" / "distributed_worker.py"
# ------------------------------------------------------------------------- no MPI needed


def test_detect_launch_reads_each_launcher_environment():
    assert distributed.detect_launch({}) is None
    hydra = distributed.detect_launch({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert (hydra.rank, hydra.size) == (1, 2) and "MPICH" in hydra.launcher
    ompi = distributed.detect_launch({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"})
    assert (ompi.rank, ompi.size) == (3, 4) and "Open MPI" in ompi.launcher
    srun = distributed.detect_launch({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8"})
    assert (srun.rank, srun.size) == (0, 8)
    # An sbatch script (no srun step) is one process, whatever SLURM_NTASKS says.
    assert distributed.detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None
    assert distributed.detect_launch({"PMI_RANK": "2", "PMI_SIZE": "2"}) is None  # rank >= size


@pytest.mark.parametrize(("size", "accum"), [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2), (4, 4)])
def test_micro_batches_tile_the_batch_once_in_order(size, accum):
    batch = 48
    rows = [distributed.micro_batch(batch, size, accum, k) for k in range(accum)]  # rank 0
    covered = []
    for k in range(accum):
        for rank in range(size):
            world = distributed.World()
            world.rank, world.size = rank, size
            covered.extend(range(batch)[distributed.micro_batch(batch, world, accum, k)])
    assert covered == list(range(batch))  # slice k*N + r: in order, each row once
    assert all(r.stop - r.start == batch // (size * accum) for r in rows)


def test_batch_split_errors_name_what_would_fit():
    with pytest.raises(
        ValueError,
        match=r"batch_size 12 does not split into 2 ranks x 4 .*"
        r"grad_accum 1, 2, 3, 6 would",
    ):
        distributed.check_batch_split(12, 2, 4)
    with pytest.raises(ValueError, match="grad_accum must be >= 1"):
        distributed.check_batch_split(12, 2, 0)
    with pytest.raises(ValueError, match="no grad_accum would"):
        distributed.check_batch_split(6, 4, 1)


def test_size_one_world_is_the_identity_and_divides_accumulated_gradients_once():
    world = distributed.init(environ={})
    assert (world.rank, world.size, world.is_main) == (0, 1, True)
    x = np.arange(3, dtype=np.float32)
    assert world.allreduce_(x) is x and world.sum([1.5])[0] == 1.5
    assert world.broadcast_object({"a": 1}) == {"a": 1} and world.allgather_object(7) == [7]

    from glassllm.nn import Linear

    model = Linear(3, 2, rng=np.random.default_rng(0))
    ddp = distributed.DataParallel(model, world, grad_accum=3)
    grads = [np.float32([[1, 2, 3], [4, 5, 6]]), np.float32([[0.5] * 3] * 2)]
    for param, g in zip(model.parameters(), grads, strict=False):
        param.grad = g.copy()
    ddp.sync_gradients()
    for param, g in zip(model.parameters(), grads, strict=False):
        assert param.grad.dtype == np.float32
        assert np.array_equal(param.grad, g / 3)
    ddp.check_replicas()  # a single replica always agrees


def test_single_process_never_imports_mpi4py():
    code = (
        "import sys, numpy as np\n"
        "from glassllm import distributed\n"
        "from glassllm.nn import Linear\n"
        "w = distributed.init()\n"
        "m = Linear(2, 2, rng=np.random.default_rng(0))\n"
        "d = distributed.DataParallel(m, w, grad_accum=2); d.sync_gradients(); d.check_replicas()\n"
        "print(w.size, 'mpi4py' in sys.modules)\n"
    )
    for extra in ({}, {"PMI_RANK": "0", "PMI_SIZE": "1"}):  # mpiexec -n 1 is one process too
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=clean_env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["1", "False"]


def test_launcher_without_mpi4py_names_the_extra():
    code = (
        "import sys; sys.modules['mpi4py'] = None  # as if not installed\n"
        "from glassllm import distributed\n"
        "try:\n    distributed.init()\nexcept RuntimeError as err:\n    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(PMI_RANK="0", PMI_SIZE="2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    assert "started 2 processes" in lines[0] and "pip install -e '.[mpi]'" in lines[0]


def test_openblas_fallback_sets_the_thread_count_without_threadpoolctl():
    import ctypes

    if not Path("/proc/self/maps").exists():
        pytest.skip("the fallback reads /proc/self/maps (Linux)")
    getters = []
    with open("/proc/self/maps") as maps:
        for path in sorted({line.split()[-1] for line in maps if "openblas" in line.lower()}):
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
                if hasattr(lib, name):
                    getters.append(getattr(lib, name))
                    break
    if not getters:
        pytest.skip("this NumPy does not use a loaded OpenBLAS")
    before = getters[0]()
    try:
        assert blas_threads._limit_openblas(1)
        assert [get() for get in getters] == [1] * len(getters)
    finally:
        blas_threads._limit_openblas(before)


def test_blas_threads_doctest():
    import doctest

    assert doctest.testmod(blas_threads).failed == 0


def test_blas_thread_limit_takes_effect_after_numpy_is_loaded():
    threadpoolctl = optional("threadpoolctl")
    before = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    try:
        assert distributed.limit_blas_threads(1)
        after = [
            p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"
        ]
        assert after and set(after) == {1}
    finally:
        if before:
            distributed.limit_blas_threads(max(before))


# ------------------------------------------------------------------------- real mpiexec


@pytest.fixture(scope="module")
def mpi():
    reason = mpi_missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the MPI tests cannot run: {reason}")
        pytest.skip(reason)
    return find_mpiexec()


def run_worker(mpi, ranks, *args, cwd, launcher_args=(), shell=False):
    """Run the worker on ``ranks`` processes (0: plain python) in ``cwd``; return the process
    and the seconds from the fault to the end of the job (None without a fault).
    ``shell``: start each rank through ``sh -c``, as job scripts do."""
    fault_file = Path(cwd) / "fault_time"
    command = [sys.executable, str(WORKER), *map(str, args), "--fault-file", str(fault_file)]
    if shell:
        command = ["sh", "-c", '"$@"; exit $?', "sh", *command]
    if ranks:
        command = [mpi, *launcher_args, "-n", str(ranks), *command]
    out = run_job(command, cwd)
    return out, seconds_since(fault_file) if "--fault" in args else None


def trained(mpi, tmp_path, ranks, *args):
    path = tmp_path / f"params_{len(list(tmp_path.glob('params_*.npz')))}.npz"
    out, _ = run_worker(mpi, ranks, "--out", path, *args, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


@pytest.mark.mpi
def test_two_ranks_equal_one_process_accumulating_two_micro_batches_bit_for_bit(mpi, tmp_path):
    two_ranks = trained(mpi, tmp_path, 2, "--steps", 4)
    accumulated = trained(mpi, tmp_path, 0, "--steps", 4, "--grad-accum", 2)
    plain = trained(mpi, tmp_path, 0, "--steps", 4)
    assert two_ranks.keys() == accumulated.keys()
    for name in two_ranks:
        assert np.array_equal(two_ranks[name], accumulated[name]), name
    # Against one process on whole batches only the summation order differs.
    worst = max(float(np.abs(two_ranks[n] - plain[n]).max()) for n in two_ranks if n != "losses")
    assert 0 < worst < 1e-4
    # 2 ranks x 2 micro-batches vs 4 micro-batches: (g0+g2)+(g1+g3) vs ((g0+g1)+g2)+g3.
    mixed = trained(mpi, tmp_path, 2, "--steps", 4, "--grad-accum", 2)
    four = trained(mpi, tmp_path, 0, "--steps", 4, "--grad-accum", 4)
    for name in mixed:
        np.testing.assert_allclose(mixed[name], four[name], rtol=0, atol=1e-4, err_msg=name)


@pytest.mark.mpi
def test_ranks_with_different_models_are_refused_at_the_start(mpi, tmp_path):
    out, seconds = run_worker(mpi, 2, "--fault", "other-model", "--timeout", 60, cwd=tmp_path)
    assert out.returncode != 0 and seconds < 30  # at once: not after the 60 s timeout
    assert "rank 1 holds a different model than rank 0: ('wte.weight', (" in out.stderr
    assert ", 48), 'float32') where rank 0 has ('wte.weight', (" in out.stderr


@pytest.mark.mpi
def test_ctrl_c_stops_every_rank_after_the_same_step(mpi, tmp_path):
    command = [mpi, "-n", "2", sys.executable, str(WORKER), "--steps", "100000", "--stop-on-sigint"]
    with start_job(command, tmp_path) as launcher, watchdog(launcher):
        try:
            seen = []
            for line in launcher.stdout:  # wait until both ranks are training
                seen.append(line)
                if line.startswith("rank 1 step 2"):
                    break
            launcher.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does to mpiexec
            rest, err = launcher.communicate(timeout=30)
        finally:
            launcher.kill()
    # The launcher interleaves the ranks' output, at times within a line: search, don't split.
    stopped = dict(re.findall(r"rank (\d) stopped after step (\d+)", rest))
    assert launcher.returncode == 130, err
    assert stopped.keys() == {"0", "1"}, rest + err
    assert stopped["0"] == stopped["1"]  # the same step on both


@pytest.mark.mpi
def test_three_ranks_equal_one_process_accumulating_three_micro_batches(mpi, tmp_path):
    """N = 3 divides by 3, where dividing once (not 1/K per loss, then 1/N) keeps the bits;
    MPICH sums 3 ranks in rank order, so it is exact there."""
    three = trained(mpi, tmp_path, 3, "--steps", 4, "--batch-size", 12)
    accumulated = trained(mpi, tmp_path, 0, "--steps", 4, "--batch-size", 12, "--grad-accum", 3)
    version = subprocess.run([mpi, "--version"], capture_output=True, text=True, timeout=60).stdout
    for name in three:
        if "HYDRA" in version.upper():
            assert np.array_equal(three[name], accumulated[name]), name
        else:  # another MPI may add in another order
            np.testing.assert_allclose(three[name], accumulated[name], rtol=0, atol=1e-5)


@pytest.mark.mpi
def test_resume_with_another_number_of_ranks_continues_the_same_run(mpi, tmp_path):
    """1 process (grad_accum 2) -> 2 ranks -> 1 process, each leg resuming from rank 0's
    checkpoint, equals 5 uninterrupted steps bit for bit (2 ranks == 1 process x 2 micro-steps)."""
    whole = trained(mpi, tmp_path, 0, "--steps", 5, "--grad-accum", 2)
    first, second = tmp_path / "first.safetensors", tmp_path / "second.safetensors"
    trained(mpi, tmp_path, 0, "--steps", 2, "--grad-accum", 2, "--save", first)
    trained(mpi, tmp_path, 2, "--steps", 2, "--load", first, "--save", second)
    legs = trained(mpi, tmp_path, 0, "--steps", 1, "--grad-accum", 2, "--load", second)
    for name in whole:
        if name != "losses":
            assert np.array_equal(whole[name], legs[name]), name
    assert legs["losses"][-1] == whole["losses"][-1]


@pytest.mark.mpi
def test_ranks_with_different_configurations_are_refused_at_the_start(mpi, tmp_path):
    out, seconds = run_worker(
        mpi, 2, "--fault", "other-config", "--steps", 3, "--timeout", 60, cwd=tmp_path
    )
    assert out.returncode != 0 and seconds < 30  # at once: not after the 60 s timeout
    assert "rank 1 has a different configuration: steps 4 (rank 0: 3)" in out.stderr


@pytest.mark.mpi
def test_ranks_sharing_the_cores_split_them_for_blas(mpi, tmp_path):
    out, _ = run_worker(mpi, 2, "--steps", 1, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    share = max(1, len(distributed.available_cores()) // 2)  # the launcher binds nothing here
    assert f"BLAS threads {share} (" in out.stdout
    if "pools" in out.stdout:  # every BLAS library loaded (numba may load SciPy's): limited
        pools = out.stdout.split("(pools ")[1].split(")")[0].split(",")
        assert pools and all(int(p) == share for p in pools), out.stdout


@pytest.mark.mpi
def test_replica_check_names_a_desynchronised_rank_and_parameter(mpi, tmp_path):
    out, _ = run_worker(mpi, 2, "--fault", "desync", "--fault-step", 1, cwd=tmp_path)
    assert out.returncode != 0
    assert "replicas differ from rank 0: rank 1 (ln_f.weight)" in out.stderr


@pytest.mark.mpi
def test_an_exception_on_one_rank_ends_every_rank_naming_it(mpi, tmp_path):
    out, seconds = run_worker(
        mpi, 2, "--fault", "raise", "--steps", 4, "--timeout", 60, cwd=tmp_path
    )
    assert out.returncode != 0
    assert seconds < 30  # not the 60 s timeout: the abort hook ended the job
    assert (
        "glassllm: rank 1 of 2: failed: RuntimeError: deliberate failure for the test; "
        "ending all ranks"
    ) in out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["hang", "kill"])
def test_a_silent_rank_is_named_within_the_timeout(mpi, tmp_path, fault):
    launcher_args = ()
    if fault == "kill":
        # MPICH's launcher ends the job itself when a rank dies; with its clean-up off, and a
        # shell between it and the rank (it may still act on a child killed by a signal), the
        # survivors must notice on their own, as under launchers that do not clean up.
        version = subprocess.run(
            [mpi, "--version"], capture_output=True, text=True, timeout=60
        ).stdout
        if "HYDRA" not in version.upper():
            pytest.skip("-disable-auto-cleanup is an MPICH Hydra option")
        launcher_args = ("-disable-auto-cleanup",)
    out, seconds = run_worker(
        mpi,
        2,
        "--fault",
        fault,
        "--steps",
        4,
        "--timeout",
        2,
        launcher_args=launcher_args,
        shell=fault == "kill",
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert seconds < 2 + 10  # the timeout, then the abort: from the fault, not from the start
    named = [line for line in out.stderr.splitlines() if "stopped answering" in line]
    assert len(named) == 1, out.stderr
    assert re.fullmatch(
        r"glassllm: rank 0 of 2: rank 1 stopped answering: no word for 2 s at "
        r"sync_gradients #\d+ \(dist_timeout\); it died, hangs or is far behind",
        named[0],
    )


@pytest.mark.mpi
def test_a_killed_rank_ends_the_job_under_the_default_launcher(mpi, tmp_path):
    out, seconds = run_worker(
        mpi, 2, "--fault", "kill", "--steps", 4, "--timeout", 60, cwd=tmp_path
    )
    assert out.returncode != 0
    assert seconds < 30  # the launcher ended the job: not after the 60 s timeout


@pytest.mark.mpi
def test_ranks_calling_different_collectives_are_caught(mpi, tmp_path):
    out, seconds = run_worker(
        mpi, 2, "--fault", "extra-collective", "--steps", 4, "--timeout", 60, cwd=tmp_path
    )
    assert out.returncode == 2 and seconds < 30  # at once: not after the 60 s timeout
    assert "the ranks called different collectives" in out.stderr
    assert "barrier" in out.stderr and "sync_gradients" in out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["no-grads", "grad-dtype"])
def test_ranks_holding_other_gradients_are_named_at_once(mpi, tmp_path, fault):
    """Rank 1 drops its gradients (then its next collective is far off), or holds one in
    float64: both ranks make the one layout check of sync_gradients and end at once, well
    before the timeout, naming the difference."""
    out, seconds = run_worker(mpi, 2, "--fault", fault, "--steps", 4, "--timeout", 40, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert seconds < 20, out.stderr  # not after the 40 s timeout
    assert re.search(
        r"glassllm: rank [01] of 2: rank [01] holds other gradients than this rank "
        r"at sync_gradients #\d+: which parameters have a gradient, or their "
        r"shapes or dtypes, differ between the ranks",
        out.stderr,
    ), out.stderr
    assert "stopped answering" not in out.stderr
