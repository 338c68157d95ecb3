"""glassllm: a glass-box neural-network framework on a NumPy reverse-mode autograd engine.

>>> from glassllm import Tensor, no_grad

The names below are imported on first use (PEP 562), so ``import glassllm`` alone loads no
NumPy: the ``glassllm`` command starts its Ctrl-C handling before the library's imports, which
take most of a start-up. ``from glassllm import Tensor`` and ``glassllm.Tensor`` work as usual.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

# why: after each matrix product OpenBLAS's idle workers spin for 2^28 cycles (~0.1 s), holding
# the cores that glassllm.threads' workers need between products (a tiny GPT step was 4% slower
# with the workers than without, and 10% faster with this). 2^16 cycles (~25 us) still covers
# back-to-back products. OpenBLAS reads it once, when NumPy loads: too late after that.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")

__version__ = "0.1.0"

# Each public name and the module that defines it.
_PUBLIC = {
    "Tensor": "glassllm.tensor",
    "no_grad": "glassllm.autograd",
    "is_grad_enabled": "glassllm.autograd",
    "gradcheck": "glassllm.gradcheck",
    "manual_seed": "glassllm.rng",
    "get_rng": "glassllm.rng",
    "save": "glassllm.checkpoint",
    "load": "glassllm.checkpoint",
}

__all__ = [
    "Tensor",
    "no_grad",
    "is_grad_enabled",
    "gradcheck",
    "manual_seed",
    "get_rng",
    "save",
    "load",
    "__version__",
]

if TYPE_CHECKING:  # what type checkers and IDEs see
    from glassllm.autograd import is_grad_enabled, no_grad
    from glassllm.checkpoint import load, save
    from glassllm.gradcheck import gradcheck
    from glassllm.rng import get_rng, manual_seed
    from glassllm.tensor import Tensor


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'glassllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
