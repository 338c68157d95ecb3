"""Keep glibc from handing big NumPy buffers back to the kernel after every step.

A training step allocates and frees the same few hundred arrays each
iteration. glibc serves blocks above ``M_MMAP_THRESHOLD`` with fresh ``mmap``
calls and returns freed heap tops above ``M_TRIM_THRESHOLD`` to the kernel, so
every step pays thousands of page faults to get the same memory back (bench/RESULTS.md has the
measured cost). Raising both thresholds keeps the pages mapped and reused.

This changes process-wide allocator policy, so the library never calls it on
import: the ``glassllm`` command and the benchmarks do, and a user's own script
may. It is a no-op where glibc is absent (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024


def _libc() -> ctypes.CDLL | None:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds; True if glibc accepted both."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return ok_mmap and ok_trim


def release_free_memory() -> bool:
    """Hand the free pages of the heap back to the kernel now (glibc's ``malloc_trim(0)``); True
    if glibc did. Called once a model is open: reading and dequantizing a file frees hundreds of
    MB of temporaries that the raised trim threshold would otherwise keep resident (SmolLM2-135M:
    1,007 MB after loading, 573 MB after the trim)."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim(0) == 1
