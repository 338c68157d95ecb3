"""How many threads NumPy's BLAS uses, changed while the program runs.

BLAS libraries read ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` once, when
NumPy loads them; after ``import numpy`` only a call into the library changes its pool. Several
processes on one machine (data-parallel ranks) each running a pool as large as the machine
oversubscribe the cores: limit each to its share.

>>> limit_blas_threads(0)
Traceback (most recent call last):
...
ValueError: BLAS threads must be >= 1, got 0
"""

from __future__ import annotations

import os

__all__ = ["available_cores", "limit_blas_threads"]


def limit_blas_threads(threads: int) -> bool:
    """Limit this process's BLAS thread pools, and `glassllm.threads`' workers, to ``threads``;
    True if a BLAS pool was limited.

    Works after NumPy is loaded (when the environment variables no longer act): through
    threadpoolctl when installed (every BLAS and OpenMP runtime it knows), else by calling
    OpenBLAS's own ``*openblas_set_num_threads*`` in the libraries this process has loaded.
    """
    if threads < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {threads}")
    from glassllm.kernels import compiled
    from glassllm.threads import get_num_threads, set_num_threads

    compiled.load()  # numba loads SciPy's OpenBLAS, when installed, as it compiles: limit it too

    # The library's own workers share the same cores; a limit never raises their count (where
    # the default chose 1, OpenBLAS's long spin would leave them no core).
    set_num_threads(min(threads, get_num_threads()))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return _limit_openblas(threads)
    threadpool_limits(limits=threads, user_api="blas")
    return True


def _limit_openblas(threads: int) -> bool:
    from glassllm.threads import openblas_thread_functions

    pairs = openblas_thread_functions()
    for _, set_ in pairs:
        set_(threads)
    return bool(pairs)


def available_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity; all cores where the OS hides it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))
