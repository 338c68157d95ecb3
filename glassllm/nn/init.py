"""Parameter initialisers, in place on a Tensor's ``.data`` (or an ndarray), keeping its dtype.

Each takes ``rng`` (a ``numpy.random.Generator``; default `glassllm.rng.get_rng()`, which
`glassllm.manual_seed` reseeds) and returns the tensor, as ``torch.nn.init`` does.

**Fan convention.** glassllm stores a `Linear` weight as ``(in_features, out_features)`` so that
forward is ``x @ weight``; PyTorch stores ``(out, in)``. Fans follow *our* layout: for a 2-D weight
``fan_in = shape[0]`` and ``fan_out = shape[1]`` (the opposite axes from torch's formula, the same
numbers for the same layer). For more than two axes the trailing axes are a receptive field that
multiplies both: ``fan_in = shape[0] * prod(shape[2:])``, ``fan_out = shape[1] * prod(shape[2:])``.

>>> import numpy as np
>>> from glassllm import Tensor
>>> w = Tensor(np.empty((256, 128), dtype=np.float32), requires_grad=True)
>>> _ = kaiming_uniform_(w, nonlinearity="relu", rng=np.random.default_rng(0))
>>> w.data.dtype, bool(np.abs(w.data).max() <= np.sqrt(6.0 / 256))
(dtype('float32'), True)

**Skipping initialisation.** Inside ``with skip_init():`` every filler here (and so every layer
built there) leaves its array as it is, draws no random number and writes nothing: a model about
to be overwritten by a checkpoint costs neither the draws nor the memory the draws would commit.
The switch is a `contextvars.ContextVar`, so it holds for the thread (or asyncio task) that
entered it and for no other.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np

from glassllm.rng import get_rng
from glassllm.tensor import Tensor

T = TypeVar("T", Tensor, np.ndarray)

__all__ = [
    "calculate_fan_in_and_fan_out",
    "calculate_gain",
    "init_skipped",
    "constant_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "skip_init",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]


_SKIPPING = contextvars.ContextVar("glassllm_nn_init_skipping", default=False)


@contextmanager
def skip_init() -> Iterator[None]:
    """Within the block (in this thread or task only), the fillers of this module check their
    argument and return it untouched: parameters keep whatever their arrays held (``np.empty``:
    unspecified values). Nests; the previous setting returns on exit, even on an exception."""
    token = _SKIPPING.set(True)
    try:
        yield
    finally:
        _SKIPPING.reset(token)


def init_skipped() -> bool:
    """Whether `skip_init` is in force here."""
    return _SKIPPING.get()


def _array_of(tensor: Tensor | np.ndarray) -> np.ndarray:
    array = tensor.data if isinstance(tensor, Tensor) else tensor
    if not isinstance(array, np.ndarray):
        raise TypeError(f"init expects a Tensor or numpy ndarray, got {type(tensor).__name__}")
    if array.dtype.kind != "f":
        raise TypeError(f"init fills floating-point arrays only, got dtype {array.dtype}")
    if not array.flags.writeable:
        raise ValueError("init writes in place, but this array is read-only")
    return array


def _standard_normal(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    # Generator.standard_normal draws float32 or float64 natively; other float widths (float16)
    # are drawn in float64 and rounded on assignment.
    dtype = array.dtype if array.dtype in (np.float32, np.float64) else np.float64
    return rng.standard_normal(array.shape, dtype=dtype)


def _standard_uniform(rng: np.random.Generator, array: np.ndarray) -> np.ndarray:
    dtype = array.dtype if array.dtype in (np.float32, np.float64) else np.float64
    return rng.random(array.shape, dtype=dtype)


def normal_(
    tensor: T, mean: float = 0.0, std: float = 1.0, rng: np.random.Generator | None = None
) -> T:
    """Fill with draws from N(mean, std^2)."""
    array = _array_of(tensor)
    if std < 0:
        raise ValueError(f"normal_ needs std >= 0, got {std}")
    if _SKIPPING.get():
        return tensor
    array[...] = _standard_normal(get_rng(rng), array) * float(std) + float(mean)
    return tensor


def uniform_(
    tensor: T, a: float = 0.0, b: float = 1.0, rng: np.random.Generator | None = None
) -> T:
    """Fill with draws from U(a, b)."""
    array = _array_of(tensor)
    if not a <= b:
        raise ValueError(f"uniform_ needs a <= b, got a={a}, b={b}")
    if _SKIPPING.get():
        return tensor
    array[...] = _standard_uniform(get_rng(rng), array) * (float(b) - float(a)) + float(a)
    return tensor


def constant_(tensor: T, val: float) -> T:
    """Fill with ``val``."""
    array = _array_of(tensor)
    if not _SKIPPING.get():
        array.fill(val)
    return tensor


def zeros_(tensor: T) -> T:
    """Fill with 0."""
    return constant_(tensor, 0.0)


def ones_(tensor: T) -> T:
    """Fill with 1."""
    return constant_(tensor, 1.0)


def calculate_fan_in_and_fan_out(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` for glassllm's ``(in, out, *receptive_field)`` layout (module doc)."""
    if len(shape) < 2:
        raise ValueError(
            f"fan in and fan out need a tensor with at least 2 dimensions, got shape {tuple(shape)}"
        )
    receptive_field = math.prod(shape[2:])
    return shape[0] * receptive_field, shape[1] * receptive_field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The gain PyTorch recommends for a nonlinearity (``torch.nn.init.calculate_gain``).

    linear / identity / sigmoid: 1; tanh: 5/3; relu: sqrt(2); leaky_relu with negative slope ``a``
    (default 0.01): sqrt(2 / (1 + a^2)); selu: 3/4.
    """
    if nonlinearity in ("linear", "identity", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4.0
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def xavier_uniform_(tensor: T, gain: float = 1.0, rng: np.random.Generator | None = None) -> T:
    """Glorot & Bengio (2010): U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(_array_of(tensor).shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, rng=rng)


def xavier_normal_(tensor: T, gain: float = 1.0, rng: np.random.Generator | None = None) -> T:
    """Glorot & Bengio (2010): N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(_array_of(tensor).shape)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return normal_(tensor, 0.0, std, rng=rng)


def _kaiming_std(shape: tuple[int, ...], a: float, mode: str, nonlinearity: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(shape)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(
    tensor: T,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    rng: np.random.Generator | None = None,
) -> T:
    """He et al. (2015): U(-b, b) with b = gain * sqrt(3 / fan).

    ``gain = calculate_gain(nonlinearity, a)``, ``fan`` is fan_in or fan_out by ``mode``.

    Defaults match ``torch.nn.init.kaiming_uniform_``; ``a`` is leaky_relu's negative slope.
    """
    bound = math.sqrt(3.0) * _kaiming_std(_array_of(tensor).shape, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, rng=rng)


def kaiming_normal_(
    tensor: T,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    rng: np.random.Generator | None = None,
) -> T:
    """He et al. (2015): N(0, std^2) with std = gain / sqrt(fan).

    ``gain = calculate_gain(nonlinearity, a)``, ``fan`` is fan_in or fan_out by ``mode``.
    """
    std = _kaiming_std(_array_of(tensor).shape, a, mode, nonlinearity)
    return normal_(tensor, 0.0, std, rng=rng)
