"""Rotary position embeddings (RoPE; Su et al., 2021, "RoFormer"): frequencies, the Llama-3
frequency scaling, the cos/sin tables, and the rotation of queries and keys.

Feature pair ``i`` of a head (``i < r/2``, ``r`` the rotary dims) is rotated by the angle
``p * inv_freq[i]`` at position ``p``, ``inv_freq[i] = theta^(-2i/r)``; since a rotation by
``a`` then the transpose of a rotation by ``b`` is a rotation by ``a - b``, the score
``q_p . k_s`` depends on ``p - s`` only. Two layouts name which features form pair ``i``:

- half-split (transformers, GPT-NeoX): features ``i`` and ``i + r/2``;
- interleaved (Meta's original code, llama.cpp's files): features ``2i`` and ``2i + 1``.

Features ``r..D-1`` pass through (GPT-NeoX's partial rotary: ``r = D * rotary_pct``). Every
number here is computed in float32 in transformers' order, so the tables are theirs to float32
rounding (``tests/functional/test_functional_rotary.py`` measures it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm import kernels
from glassllm._checks import check_int
from glassllm.functional._common import float_tensor, integer_array
from glassllm.tensor import Tensor

__all__ = ["rotary", "rotary_cos_sin", "rotary_frequencies"]

_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rotary_frequencies(
    rotary_dim: int, theta: float = 10000.0, scaling: Mapping[str, Any] | None = None
) -> np.ndarray:
    """The inverse frequencies ``inv_freq[i] = 1 / theta^(2i / r)``, float32 ``(r/2,)``.

    Computed as transformers does (``1.0 / (base ** (arange(0, r, 2).float() / r))``, all in
    float32). ``scaling``: None; ``{"rope_type": "linear", "factor": f}`` (every frequency / f);
    or ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (Llama 3.1/3.2): with ``wavelen = 2 pi / inv_freq``,
    ``lo = orig / low_freq_factor`` and ``hi = orig / high_freq_factor``, a wavelength longer
    than ``lo`` is divided by ``factor``, one shorter than ``hi`` is kept, and between them
    ``(1 - s) inv_freq / factor + s inv_freq`` with ``s = (orig / wavelen - low) / (high -
    low)`` (transformers' ``_compute_llama3_parameters``). ``rope_type`` "default" is None; any
    other type raises ValueError naming it.

    >>> rotary_frequencies(4, theta=100.0).tolist()
    [1.0, 0.10000000149011612]
    """
    rotary_dim = check_int("rotary_frequencies: rotary_dim", rotary_dim, min=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_frequencies: rotary_dim must be even, got {rotary_dim}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating, np.integer)):
        raise TypeError(f"rotary_frequencies: theta must be a number, got {theta!r}")
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError(f"rotary_frequencies: theta must be a positive number, got {theta!r}")
    exponents = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / rotary_dim
    # why: torch's float32 pow is (nearly always) correctly rounded, NumPy's is not (1 ulp off
    # for most entries, 2 ulps after 1/x, 8e-6 in cos at position 200): take the power in
    # float64 and round once, which gives torch's bits (64 of 64 at head_dim 128, theta 1e4).
    powers = np.power(float(theta), exponents.astype(np.float64)).astype(np.float32)
    inv_freq = 1.0 / powers  # (r/2,) float32
    if scaling is None:
        return inv_freq
    if not isinstance(scaling, Mapping):
        raise TypeError(f"rotary_frequencies: scaling must be a dict or None, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / _positive(scaling, "factor")
    if rope_type == "llama3":
        return _llama3_frequencies(inv_freq, *(_positive(scaling, key) for key in _LLAMA3_KEYS))
    raise ValueError(
        f"rotary_frequencies: rope scaling type {rope_type!r} is not implemented "
        "(known: default, linear, llama3)"
    )


def _positive(scaling: Mapping[str, Any], key: str) -> float:
    value = scaling.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"rotary_frequencies: scaling[{key!r}] must be a positive number, got {value!r}"
        )
    return value


def _llama3_frequencies(
    inv_freq: np.ndarray, factor: float, low: float, high: float, original: float
) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters`` line for line, in float32 (Python scalars
    stay weak, as torch's wrapped numbers: every operation rounds to float32)."""
    if not high > low:
        raise ValueError(
            f"rotary_frequencies: llama3 high_freq_factor {high} must exceed low_freq_factor {low}"
        )
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > np.float32(low_wavelen), inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < np.float32(high_wavelen)) & ~(wavelen > np.float32(low_wavelen))
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rotary_cos_sin(positions: Any, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` of the angles ``positions[..., None] * inv_freq``, float32
    ``(..., T, r/2)`` for integer ``positions (..., T)``: the product in float32, as
    transformers' rotary embedding classes compute it, then cos and sin rounded once to float32.

    >>> cos, sin = rotary_cos_sin(np.arange(3), rotary_frequencies(2))
    >>> cos.shape, cos.dtype, sin[:, 0].astype(float).round(4).tolist()
    ((3, 1), dtype('float32'), [0.0, 0.8415, 0.9093])
    """
    positions = integer_array(positions, "rotary_cos_sin: positions")
    inv_freq = np.asarray(inv_freq)
    if inv_freq.ndim != 1 or inv_freq.dtype.kind != "f":
        raise ValueError(
            "rotary_cos_sin: inv_freq must be a 1-D float array (rotary_frequencies), got "
            f"shape {inv_freq.shape} dtype {inv_freq.dtype}"
        )
    angles = positions.astype(np.float32)[..., None] * inv_freq.astype(np.float32)  # (..., T, r/2)
    # why: cos and sin of each float32 angle in float64, rounded once: within 1 ulp of torch's
    # float32 functions (which differ from NumPy's float32 ones in 17% of entries, by 1-2 ulps)
    wide = angles.astype(np.float64)
    return np.cos(wide).astype(np.float32), np.sin(wide).astype(np.float32)


def rotary(x: Tensor, cos: Any, sin: Any, interleaved: bool = False) -> Tensor:
    """Rotate the first ``r = 2 * cos.shape[-1]`` features of ``x (..., T, D)`` by position.

    ``cos``, ``sin`` (`rotary_cos_sin`): ``(T, r/2)``, or any shape broadcasting to ``x``'s
    ``(..., T, r/2)``; constants (no gradient), cast to ``x``'s dtype. With ``(a, b)`` the
    feature pairs (half-split: ``a = x[..., :r/2]``, ``b = x[..., r/2:r]``; ``interleaved``:
    ``a = x[..., 0:r:2]``, ``b = x[..., 1:r:2]``)::

        out_a = a cos - b sin          out_b = b cos + a sin          out[..., r:] = x[..., r:]

    (transformers' ``q * cos + rotate_half(q) * sin`` with ``rotate_half = [-b, a]``, the same
    float operations). VJP: the rotation is orthogonal, its transpose the rotation by ``-angle``:
    ``da = g_a cos + g_b sin``, ``db = g_b cos - g_a sin``, the pass-through features copy ``g``.
    Nothing to stabilise: every output is a sum of two products of bounded factors.

    >>> x = Tensor(np.array([[1.0, 0.0]], dtype=np.float32))  # (T=1, D=2)
    >>> c, s = np.array([[0.0]], np.float32), np.array([[1.0]], np.float32)  # 90 degrees
    >>> rotary(x, c, s).data.tolist()
    [[0.0, 1.0]]
    """
    x = float_tensor(x, "rotary: x")
    cos = float_tensor(cos, "rotary: cos").data.astype(x.dtype, copy=False)
    sin = float_tensor(sin, "rotary: sin").data.astype(x.dtype, copy=False)
    if x.ndim < 2:
        raise ValueError(f"rotary: x needs at least 2 axes (..., T, D), got shape {x.shape}")
    if cos.shape != sin.shape or cos.ndim < 1:
        raise ValueError(f"rotary: cos {cos.shape} and sin {sin.shape} must share one shape")
    half = cos.shape[-1]
    if not 0 < 2 * half <= x.shape[-1]:
        raise ValueError(
            f"rotary: cos/sin rotate 2 * {half} features but x {x.shape} has {x.shape[-1]} "
            "(need 0 < rotary dims <= D)"
        )
    pairs_shape = x.shape[:-1] + (half,)
    try:
        if np.broadcast_shapes(pairs_shape, cos.shape) != pairs_shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"rotary: cos/sin of shape {cos.shape} do not broadcast to x's (..., T, r/2) = "
            f"{pairs_shape} (one row per position of x)"
        ) from None
    rotate = kernels.select(_rotary_definition, kernels.rotary)
    out, vjp = rotate(x.data, cos, sin, bool(interleaved))

    def backward(grad: np.ndarray) -> tuple:
        return (vjp(grad),)

    return Tensor.from_op(out, (x,), backward).named("rotary")


def rotary_array(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """`rotary`'s forward on a plain array, for decoding under ``no_grad`` (the key/value cache
    path): the same arithmetic and bits (the same kernel or definition), no Tensor and no
    checks; the caller's ``cos``, ``sin`` are `rotary_cos_sin`'s rows for ``x``'s positions."""
    cos, sin = cos.astype(x.dtype, copy=False), sin.astype(x.dtype, copy=False)
    rotate = kernels.select(_rotary_definition, kernels.rotary)
    return rotate(x, cos, sin, bool(interleaved))[0]


def _pairs(a: np.ndarray, half: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """The two members of each rotated pair, as views of ``a (..., D)``."""
    if interleaved:
        return a[..., 0 : 2 * half : 2], a[..., 1 : 2 * half : 2]
    return a[..., :half], a[..., half : 2 * half]


def _rotary_definition(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> tuple:
    """`rotary` in plain NumPy: ``(out, vjp)``, ``vjp(g) -> dx``."""
    half = cos.shape[-1]

    def rotate(a: np.ndarray, sign: float) -> np.ndarray:
        """``a`` with each pair rotated by ``sign * angle`` (-1: the transpose)."""
        first, second = _pairs(a, half, interleaved)
        result = a.copy()  # the pass-through features, then each pair written over
        out_first, out_second = _pairs(result, half, interleaved)
        if sign > 0:
            np.subtract(first * cos, second * sin, out=out_first)
            np.add(second * cos, first * sin, out=out_second)
        else:
            np.add(first * cos, second * sin, out=out_first)
            np.subtract(second * cos, first * sin, out=out_second)
        return result

    def vjp(g: np.ndarray) -> np.ndarray:
        return rotate(g, -1.0)

    return rotate(x, 1.0), vjp
