"""Compiled one-pass kernels for the fused functions, used when numba is installed.

NumPy runs a fused function as a chain of whole-array passes: LayerNorm's forward is five
(row sums, centring, squares, scaling by ``rstd`` and ``w``), its VJP seven, each a trip through
memory and the interpreter, and NumPy's broadcasting passes run at half speed. With the ``fast``
extra (numba: ``pip install -e '.[fast]'`` in the checkout) `layer_norm` runs each row in one
compiled pass instead: at the tiny GPT's shape (768, 128) the forward takes 11-14 us against
55, the VJP 17 against 92 (bench/RESULTS.md).

The NumPy code stays the definition: each function's docstring states the maths, its NumPy
routine computes it, and ``tests/test_compiled.py`` holds every kernel to that routine (to
float32 rounding: a kernel's row sums add in another order), while the gradient checks run on
whichever path is in use. Both paths compute each row on its own, so either gives the same bits
for every thread count.

The kernels load on first use, compiled once per machine into numba's cache (next to this
package, or ``NUMBA_CACHE_DIR``). ``GLASSLLM_NUMBA=0`` in the environment, or
``set_enabled(False)``, keeps NumPy alone.

>>> enabled() in (True, False)
True
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

import numpy as np

__all__ = ["enabled", "kernels", "kernels_for", "load", "set_enabled"]

_UNSET = object()
_loaded: object = _UNSET  # the kernel module, None (no numba, or disabled), or _UNSET
_wanted = os.environ.get("GLASSLLM_NUMBA", "1") != "0"


def kernels() -> ModuleType | None:
    """The compiled kernels (`glassllm.kernels._numba_kernels`), or None when numba is not
    installed or the kernels are turned off."""
    global _loaded
    if _loaded is _UNSET:
        _loaded = None
        if _wanted:
            try:
                from glassllm.kernels import _numba_kernels
            except ImportError:  # no numba, or one that does not run with this NumPy
                pass
            except Exception as error:  # noqa: BLE001 - e.g. no writable cache directory
                warnings.warn(
                    f"glassllm: numba is installed but its kernels did not load ({error}); "
                    "using NumPy alone",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                _loaded = _numba_kernels
    return _loaded  # type: ignore[return-value]


def kernels_for(dtype: object) -> ModuleType | None:
    """`kernels()` for arrays of ``dtype`` when it is float32 or float64 in the machine's byte
    order (what numba compiles for); None for any other (float16, longdouble, a big-endian
    float32 read from a file: NumPy alone)."""
    if dtype not in _COMPILED_DTYPES:
        return None
    return kernels()


_COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # native byte order


def enabled() -> bool:
    """Whether the fused functions use the compiled kernels."""
    return kernels() is not None


def set_enabled(flag: bool) -> None:
    """Use the compiled kernels (when numba is installed) or NumPy alone, from now on."""
    global _loaded, _wanted
    _wanted = bool(flag)
    _loaded = _UNSET


def load() -> bool:
    """Compile the kernels for float32 now (or read them from numba's cache) instead of on first
    use; True when they are in use.

    numba, as it compiles, reads SciPy's BLAS bindings when SciPy is installed, which loads
    SciPy's own OpenBLAS into the process: `glassllm.distributed.limit_blas_threads` loads the
    kernels first, so that its limit reaches that library's threads too.
    """
    fused = kernels()
    if fused is None:
        return False
    rows = np.ones((1, 2), np.float32)
    row = np.ones(2, np.float32)
    one, zero = np.float32(1.0), np.float32(0.0)
    fused.layer_norm_rows(row, row, 1e-5, rows, row[:1].copy(), row[:1].copy(), rows.copy())
    fused.layer_norm_rows_vjp(row, rows, rows, row[:1], row[:1], rows.copy(), rows.copy())
    fused.gelu_tanh_exponent(row, one, one, row.copy())
    fused.gelu_tanh_finish(row, row.copy(), row.copy())
    fused.gelu_tanh_slope(row, row, row, one, one, row.copy())
    fused.adam_update(row.copy(), row, row.copy(), row.copy(), one, zero, *[one] * 6)
    angle = np.ones((1, 1), np.float32)  # rotary: heads as arrays, and as views of packed ones
    # (two heads, so that a view's strides are not a contiguous array's: numba types them apart)
    heads = [np.ones((1, 2, 1, 2), np.float32), np.ones((1, 2, 1, 4), np.float32)[..., :2]]
    for x in heads:
        for out in (np.empty_like(heads[0]), np.empty((1, 2, 1, 4), np.float32)[..., 2:]):
            fused.rotate_pairs(x, angle, angle, False, False, out)
    return True
