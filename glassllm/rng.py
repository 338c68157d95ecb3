"""One seedable source of randomness.

Every layer and function that draws random numbers takes an optional
``numpy.random.Generator``; when none is given it uses the module's default
generator, which :func:`manual_seed` replaces. Nothing in glassllm calls the
legacy ``np.random.*`` global functions.

The default generator starts from a fixed seed (1337, as nanoGPT), so a fresh
process is reproducible even before anyone calls :func:`manual_seed`, just as a
fresh PyTorch process has a fixed default seed.

>>> import glassllm
>>> a = glassllm.manual_seed(0).random()
>>> b = glassllm.manual_seed(0).random()
>>> a == b
True
"""

from __future__ import annotations

import numpy as np

from glassllm._checks import check_generator

DEFAULT_SEED = 1337

_default_generator: np.random.Generator = np.random.default_rng(DEFAULT_SEED)


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the default generator and return it."""
    global _default_generator
    _default_generator = np.random.default_rng(seed)
    return _default_generator


def get_rng(rng: np.random.Generator | None = None) -> np.random.Generator:
    """Return ``rng`` when given, else the default generator (read at call time, so a later
    :func:`manual_seed` applies)."""
    return _default_generator if check_generator("rng", rng) is None else rng


def dropout_mask(
    shape: tuple[int, ...], p: float, dtype: np.dtype, rng: np.random.Generator | None = None
) -> np.ndarray:
    """A ``dtype`` array holding ``1/(1-p)`` with probability ``1-p`` and 0 otherwise.

    Drawn as ``u >= p`` for ``u ~ U[0, 1)`` in ``dtype`` (float32 draws for float32, so no
    float64 temporary); with ``p = 1`` every entry is 0. Shared by `glassllm.functional.dropout`
    and attention's dropout (its definition and its kernels alike).
    """
    draw_dtype = dtype if dtype in (np.float32, np.float64) else np.float32
    mask = get_rng(rng).random(shape, dtype=draw_dtype)
    keep = mask >= p
    np.multiply(keep, 1.0 / (1.0 - p) if p < 1.0 else 0.0, out=mask)
    return mask if mask.dtype == dtype else mask.astype(dtype)
