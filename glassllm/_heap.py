"""glibc's heap policy for training steps (``mallopt``); free pages back (``malloc_trim``).

A training step allocates and frees the same few hundred arrays each iteration. glibc serves
blocks above ``M_MMAP_THRESHOLD`` with fresh ``mmap`` calls and returns freed heap tops above
``M_TRIM_THRESHOLD`` to the kernel, so every step pays thousands of page faults to get the same
memory back (bench/RESULTS.md has the measured cost). `tune_allocator` raises both thresholds so
the pages stay mapped and reused. The engine does it once by itself, on the first backward over a
graph of at least ``AUTO_TUNE_BYTES`` of arrays (`tune_allocator_for`): a plain
``loss.backward()`` loop then runs as fast as ``glassllm train``. It is process-wide; set
``GLASSLLM_TUNE_ALLOCATOR=0`` to keep glibc's own policy (an explicit call still tunes).

Reading and dequantizing a checkpoint frees hundreds of MB of temporaries at once, which the
tuned heap keeps mapped: `release_free_memory` returns what is free now (without a trim a loaded
SmolLM2-135M stays at ~1,007 MB resident instead of ~573 MB) and changes no setting. Everything
here is a no-op where glibc is absent (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterable
from typing import Any

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024
# why: a graph this big is a training step's (bench sizes micro, tiny, small: 0.3, 31, 125 MiB of
# arrays); smaller ones (tests, a quick gradient) leave the process's allocator policy alone.
AUTO_TUNE_BYTES = 8 * 1024 * 1024
OPT_OUT_VARIABLE = "GLASSLLM_TUNE_ALLOCATOR"

_auto_tune_done = False


def libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be found or opened."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


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


def tune_allocator_for(nodes: Iterable[Any]) -> None:
    """The engine's once-per-process `tune_allocator`, on the first graph (``nodes``: Tensors)
    holding at least ``AUTO_TUNE_BYTES``; nothing once done or with GLASSLLM_TUNE_ALLOCATOR=0."""
    global _auto_tune_done
    if _auto_tune_done:
        return
    if os.environ.get(OPT_OUT_VARIABLE, "1").strip() == "0":
        _auto_tune_done = True  # read once: the policy of a process does not flip mid-run
        return
    if sum(node.data.nbytes for node in nodes) >= AUTO_TUNE_BYTES:
        _auto_tune_done = True
        tune_allocator()


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the kernel now; True if glibc did."""
    malloc_trim = getattr(libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim(0) == 1
