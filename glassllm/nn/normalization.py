"""`LayerNorm` (Ba, Kiros & Hinton, 2016) and `RMSNorm` (Zhang & Sennrich, 2019) over the last axis.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the biased variance taken
over the last axis; ``weight`` starts at ones and ``bias`` at zeros. ``bias=False`` drops the bias,
as nanoGPT's LayerNorm does (PyTorch 2.1+ spells it the same way). The fused forward and backward
are `glassllm.functional.layer_norm`. `RMSNorm` (Llama, Qwen, SmolLM2) drops the centring and the
bias: ``y = x / sqrt(mean(x^2) + eps) * weight`` (`glassllm.functional.rms_norm`).

>>> import numpy as np
>>> from glassllm import Tensor
>>> norm = LayerNorm(4)
>>> y = norm(Tensor(np.arange(8, dtype=np.float32).reshape(2, 4)))
>>> np.allclose(y.data.mean(axis=-1), 0.0, atol=1e-6)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm._checks import check_float_dtype, check_int
from glassllm.nn.hooks import HookPoint, any_active
from glassllm.nn.module import Module
from glassllm.tensor import Tensor


class LayerNorm(Module):
    """Normalise the last axis (size ``dim``) to zero mean, unit variance; then scale and shift.

    ``weight`` (dim,) ones, ``bias`` (dim,) zeros or None with ``bias=False``; float32 unless
    ``dtype`` says otherwise.
    """

    def __init__(
        self, dim: int, eps: float = 1e-5, bias: bool = True, dtype: Any = np.float32
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, min=1)
        if not float(eps) > 0.0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.eps = float(eps)
        dtype = check_float_dtype(dtype)
        self.weight = Tensor(np.ones(self.dim, dtype=dtype), requires_grad=True)
        self.bias = Tensor(np.zeros(self.dim, dtype=dtype), requires_grad=True) if bias else None
        _add_hook_points(self)

    def forward(self, x: Tensor) -> Tensor:
        if any_active(self._hook_points):
            return _hooked_norm(self, x, centre=True)
        return F.layer_norm(x, self.weight, self.bias, eps=self.eps)  # (..., dim) -> (..., dim)

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, eps={self.eps}, bias={self.bias is not None}, dtype={self.weight.dtype}"
        )


class RMSNorm(Module):
    """Scale the last axis (size ``dim``) to unit root mean square, then by ``weight``.

    ``y = x / sqrt(mean(x^2) + eps) * weight``, as transformers' ``LlamaRMSNorm`` (normalise,
    then multiply by the weight); ``weight`` (dim,) ones, float32 unless ``dtype`` says
    otherwise. No bias. eps: 1e-5 in SmolLM2 and Llama, 1e-6 in Qwen.

    >>> norm = RMSNorm(2, eps=0.0)
    >>> norm(Tensor(np.array([[3.0, 4.0]], dtype=np.float32))).data.astype(float).round(4).tolist()
    [[0.8485, 1.1314]]
    """

    def __init__(self, dim: int, eps: float = 1e-6, dtype: Any = np.float32) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, min=1)
        if not float(eps) >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        self.eps = float(eps)
        dtype = check_float_dtype(dtype)
        self.weight = Tensor(np.ones(self.dim, dtype=dtype), requires_grad=True)
        _add_hook_points(self)

    def forward(self, x: Tensor) -> Tensor:
        if any_active(self._hook_points):
            return _hooked_norm(self, x, centre=False)
        return F.rms_norm(x, self.weight, eps=self.eps)  # (..., dim) -> (..., dim)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, dtype={self.weight.dtype}"


def _add_hook_points(norm: Module) -> None:
    """TransformerLens's two sites of a norm, both `HookPoint.side` (the fused op never forms
    them): ``hook_scale`` (..., 1), ``sqrt(var + eps)`` (LayerNorm) or ``sqrt(mean(x^2) +
    eps)`` (RMSNorm); ``hook_normalized`` (..., dim), ``(x - mean) / scale`` or ``x / scale``,
    before the weight and bias."""
    norm.hook_scale = HookPoint(side=True)
    norm.hook_normalized = HookPoint(side=True)
    object.__setattr__(norm, "_hook_points", (norm.hook_scale, norm.hook_normalized))


def _hooked_norm(norm: LayerNorm | RMSNorm, x: Tensor, centre: bool) -> Tensor:
    """The norm with its hook points: scale and normalised value are computed step by step and
    shown to the hooks; if neither is replaced the fused op's output is returned (the same
    numbers as without hooks), else ``normalized * weight (+ bias)`` of the replacements."""
    centred = _centred(x) if centre else x  # (..., dim)
    scale = _root_mean_square(centred, norm.eps)  # (..., 1)
    shown_scale = norm.hook_scale(scale)
    normalized = centred / shown_scale  # (..., dim)
    shown = norm.hook_normalized(normalized)
    if shown_scale is scale and shown is normalized:
        if centre:
            return F.layer_norm(x, norm.weight, norm.bias, eps=norm.eps)
        return F.rms_norm(x, norm.weight, eps=norm.eps)
    y = shown * norm.weight
    bias = getattr(norm, "bias", None)
    return y if bias is None else y + bias


def _centred(x: Tensor) -> Tensor:
    """``x - mean(x)`` over the last axis, one node: the VJP is ``g - mean(g)``."""
    data = x.data - x.data.mean(axis=-1, keepdims=True)
    return Tensor.from_op(data, (x,), lambda g: (g - g.mean(axis=-1, keepdims=True),)).named(
        "centre"
    )


def _root_mean_square(x: Tensor, eps: float) -> Tensor:
    """``sqrt(mean(x^2) + eps)`` over the last axis (kept, size 1), one node: the VJP is
    ``g x / (n s)``."""
    s = np.sqrt((x.data * x.data).mean(axis=-1, keepdims=True) + eps)
    n = x.shape[-1]
    return Tensor.from_op(s, (x,), lambda g: (g * x.data / (n * s),)).named("root_mean_square")
