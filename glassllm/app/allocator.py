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

from glassllm._heap import libc, release_free_memory  # noqa: F401  (the app's, too)

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds; True if glibc accepted both."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return ok_mmap and ok_trim
