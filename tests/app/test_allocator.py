"""glassllm.app.allocator (glassllm._heap): the tuned thresholds keep freed buffers resident,
`release_free_memory` hands them back, and the engine tunes by itself on the first backward over a
training-sized graph unless GLASSLLM_TUNE_ALLOCATOR=0 (measured in a child process: all change
process-wide allocator state)."""

from __future__ import annotations

import os
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


BACKWARD_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from glassllm import Tensor

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    elements = int(sys.argv[1])  # float32: x and x * x hold 8 bytes an element
    x = Tensor(np.ones(elements, dtype=np.float32), requires_grad=True)
    (x * x).sum().backward()
    blocks = [np.ones(2**18) for _ in range(200)]  # as above: 400 MiB of 2 MiB blocks
    held = rss_mb()
    del blocks
    print(held - rss_mb())
    """
)


def freed_by_glibc(elements: int, **env: str) -> float:
    """MiB that glibc handed back after the child's backward over ``elements`` float32 values."""
    out = subprocess.run(
        [sys.executable, "-c", BACKWARD_CHILD, str(elements)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | env,
    ).stdout
    return float(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_the_first_training_sized_backward_tunes_the_allocator_unless_opted_out():
    big = 2**21  # 16 MiB of arrays in the graph, over AUTO_TUNE_BYTES (8 MiB)
    assert freed_by_glibc(big) < 100  # tuned: the freed 400 MiB stays mapped for reuse
    assert freed_by_glibc(big, GLASSLLM_TUNE_ALLOCATOR="0") > 300  # glibc's own policy
    assert freed_by_glibc(256) > 300  # a 2 KiB graph leaves the policy alone
