"""Give the heap's free pages back to the system after loading a model (glibc's ``malloc_trim``).

Reading and dequantizing a checkpoint frees hundreds of MB of temporaries at once. glibc keeps
freed heap memory mapped up to its trim threshold, which the ``glassllm`` command raises to
512 MiB for training (`glassllm.app.allocator`), so without a trim a loaded SmolLM2-135M stays at
~1,007 MB resident instead of ~573 MB. Trimming changes no allocator setting: it only returns
what is free now. A no-op where glibc is absent (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util


def libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be found or opened."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the kernel now; True if glibc did."""
    malloc_trim = getattr(libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim(0) == 1
