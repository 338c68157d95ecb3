"""Keep glibc from handing big NumPy buffers back to the kernel after every step.

The policy and its reasons live in `glassllm._heap`: the engine tunes the allocator by itself on
the first backward over a training-sized graph (opt out with ``GLASSLLM_TUNE_ALLOCATOR=0``), so
a plain ``loss.backward()`` loop needs no call; the ``glassllm`` command still calls
`tune_allocator` first, before loading data. A no-op where glibc is absent (macOS, Windows, musl).
"""

from __future__ import annotations

from glassllm._heap import (  # noqa: F401  (the app's names for them)
    MMAP_THRESHOLD_BYTES,
    TRIM_THRESHOLD_BYTES,
    libc,
    release_free_memory,
    tune_allocator,
)
