"""The old home of the compiled kernels' switch: `glassllm.kernels.compiled`, under this name too.

The module object itself, not a copy of its names, so ``set_enabled`` and a test's monkeypatch
reach the same switch through either name.
"""

import sys

from glassllm.kernels import compiled

sys.modules[__name__] = compiled
