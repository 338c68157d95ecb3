"""Running real ``mpiexec`` jobs from the tests: a clean environment for the ranks, whether MPI
can run here, and starting, timing out and killing a job's whole process group. Shared by
tests/distributed/ (glassllm.distributed) and tests/app/test_train_mpi.py (``glassllm train``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from glassllm import distributed

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_VARIABLES = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
)


def clean_env(**extra: str) -> dict[str, str]:
    # No launcher of ours, and no BLAS variable: init must pick each rank's thread count.
    dropped = (*LAUNCH_VARIABLES, *distributed.world.BLAS_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # In case the runtime is Open MPI: it refuses root and more ranks than cores otherwise.
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    env.update(extra)
    return env


def find_mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def mpi_missing() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return f"mpi4py is not installed ({distributed.INSTALL_HINT})"
    if find_mpiexec() is None:
        return "no mpiexec on PATH or beside the Python interpreter"
    probe = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        return f"mpi4py finds no MPI library: {probe.stderr.strip().splitlines()[-1:]}"
    return None


JOB_TIMEOUT = 180  # seconds: a job still running then hangs (tiny models take seconds)


def start_job(command, cwd) -> subprocess.Popen:
    """Start ``command`` (a launcher and its ranks) in a process group of its own, output piped
    as text, so that `kill_group` can end every rank."""
    return subprocess.Popen(
        command,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )


def run_job(command, cwd, timeout=JOB_TIMEOUT):
    """Run ``command`` (a launcher and its ranks) in a process group of its own; when it is
    still running after ``timeout`` seconds, kill the whole group and fail: a hang fails the
    test instead of blocking the test run."""
    with start_job(command, cwd) as job:
        try:
            stdout, stderr = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(job)
            stdout, stderr = job.communicate()
            pytest.fail(f"still running after {timeout} s (a hang?): {command}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)


def kill_group(job: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)


@contextlib.contextmanager
def watchdog(job: subprocess.Popen, timeout: float = JOB_TIMEOUT):
    """Kill ``job``'s process group (started with ``start_new_session``) if the block takes
    longer than ``timeout`` seconds, so that reading a hung job's output cannot block."""
    timer = threading.Timer(timeout, kill_group, (job,))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        kill_group(job)


def seconds_since(fault_file: Path) -> float:
    """Seconds from the time a worker wrote to ``fault_file`` (its fault) until now."""
    assert fault_file.exists(), "the worker never reached its fault"
    return time.time() - float(fault_file.read_text())
