"""The fast kernels behind the fused functions, and the one switch that picks them.

`glassllm.functional` holds each fused operation's definition: forward, vector-Jacobian product
and derivation in plain NumPy, one screen each. This package holds the ways to run the same maths
fast: row blocks on worker threads, a choice of BLAS or einsum row sums by shape, chunked
elementwise passes, causal attention in query tiles (`attention`), one-row products on blocks
shared with helper threads that spin without the GIL (`row_pool`), and numba loops with the
``fast`` extra (`compiled`: that switch is ``GLASSLLM_NUMBA=0`` / ``compiled.set_enabled``).
Each kernel is tested against its definition (``tests/kernels/test_kernels.py``): the same
bits where it does the same operations in the same order, equal to float rounding where it adds
a sum in another order.

`select(definition, kernel)` is where an operation takes its implementation: the kernel, or,
under ``use("reference")`` (or ``GLASSLLM_KERNELS=reference`` in the environment), the plain
definition, so that a reader can run the maths they read, and tests can use it as the oracle.

>>> with use("reference"):
...     reference()
True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from glassllm.kernels.adam import adam_in_blocks
from glassllm.kernels.embedding import scatter_add_rows
from glassllm.kernels.gelu import gelu_tanh
from glassllm.kernels.layer_norm import layer_norm
from glassllm.kernels.linear import matmul_rows
from glassllm.kernels.quantized import dequantize_q4, dequantize_q8, q4_matmul, q8_matmul
from glassllm.kernels.rms_norm import rms_norm
from glassllm.kernels.rotary import rotary
from glassllm.kernels.sums import sum_axes
from glassllm.kernels.swiglu import swiglu

__all__ = [
    "adam_in_blocks",
    "dequantize_q4",
    "dequantize_q8",
    "gelu_tanh",
    "layer_norm",
    "matmul_rows",
    "q4_matmul",
    "q8_matmul",
    "reference",
    "rms_norm",
    "rotary",
    "scatter_add_rows",
    "select",
    "sum_axes",
    "swiglu",
    "use",
]

MODES = ("fast", "reference")
_reference = os.environ.get("GLASSLLM_KERNELS", "fast") == "reference"

F = TypeVar("F", bound=Callable)


def reference() -> bool:
    """Whether the fused functions run their plain definitions instead of the kernels."""
    return _reference


def select(definition: F, kernel: F) -> F:
    """``kernel``, or ``definition`` under ``use("reference")``: the one place that chooses."""
    return definition if _reference else kernel


@contextmanager
def use(mode: str) -> Iterator[None]:
    """Run the fused functions with ``"fast"`` kernels (the default) or their ``"reference"``
    definitions inside the block; the mode before comes back on exit."""
    global _reference
    if mode not in MODES:
        raise ValueError(f"kernels.use: mode must be one of {MODES}, got {mode!r}")
    before = _reference
    _reference = mode == "reference"
    try:
        yield
    finally:
        _reference = before
