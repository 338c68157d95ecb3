"""glassllm.app.allocator: the tuned thresholds keep freed buffers resident, and
`release_free_memory` hands them back (measured in a child process: both change process-wide
allocator state)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import numpy as np
    from glassllm.app.allocator import release_free_memory, tune_allocator

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    assert tune_allocator()
    blocks = [np.ones(2**18) for _ in range(200)]  # 200 x 2 MiB, below the mmap threshold
    held = rss_mb()
    del blocks
    freed = rss_mb()
    assert release_free_memory()
    print(held, freed, rss_mb())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux")
def test_release_free_memory_returns_what_the_tuned_heap_kept():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout
    held, freed, released = map(float, out.split())
    assert freed > held - 100  # the tuned heap kept (most of) the 400 MiB freed
    assert released < freed - 300  # and the trim gave it back
