"""A linear map on weights kept in 4-bit blocks: `Q4Weight` and ``quantized_linear``.

GGUF's Q4_0 and Q4_1 store a matrix's rows in blocks of 32 weights, each block a scale ``d``, an
offset ``m`` (Q4_0: ``m = -8 d``) and 32 four-bit integers ``q``, so that ``w = q d + m``. Kept
that way a weight costs 6 bits (``d`` and ``m`` widened to float32) instead of float32's 32; a
decoding step, which reads every weight once for one row of activations, then reads a fifth of
the memory.

**The values are exact.** ``d`` and ``m`` are float16 values (11 significant bits) and ``q`` has
4, so ``q d`` is exact in float32 and ``q d + m`` rounds once: the float32 a dequantizer writes
(llama.cpp's ``gguf`` package: ``d * q + m``), with or without a fused multiply-add.

**Layout.** The file's blocks transposed, so that a row of the input meets every output in
order: ``nibbles (nb, 16, out)`` (uint8), byte ``j`` of block ``b`` of each output, its low four
bits weight ``32 b + j``, its high four bits weight ``32 b + 16 + j`` (GGUF's order within a
block); ``scales``, ``offsets (nb, out)`` float32. One vector register then holds the same
input's weights for 16 or so outputs, each output's sum in its own lane
(`glassllm.kernels.quantized`).

The maths is ``linear``'s with ``W`` the dequantized matrix ``(in, out)``: ``Y = X W + b``; VJP
``dX = G W^T``, ``db = 1^T G``. ``W`` is a constant (no gradient: nothing trains 4-bit blocks).

>>> weight = Q4Weight.from_blocks(
...     np.full((3, 1), 0.5, np.float32), np.full((3, 1), -1.0, np.float32),
...     np.full((3, 1, 16), 0x21, np.uint8))   # q = 1 low, 2 high: w = -0.5, then 0.0
>>> w = weight.dequantize()
>>> w.shape, w[0, 0].item(), w[16, 0].item()
((32, 3), -0.5, 0.0)
>>> quantized_linear(Tensor(np.ones((1, 32), np.float32)), weight).data[0, :2].tolist()
[-8.0, -8.0]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from glassllm import kernels
from glassllm.functional._common import as_dtype, float_tensor, sum_over
from glassllm.kernels import compiled
from glassllm.tensor import Tensor

BLOCK = 32  # weights per block, along the input axis


@dataclasses.dataclass(frozen=True, eq=False)
class Q4Weight:
    """A matrix ``(in, out)`` kept as 4-bit blocks (the module docstring's layout); read-only."""

    scales: np.ndarray  # (nb, out) float32
    offsets: np.ndarray  # (nb, out) float32
    nibbles: np.ndarray  # (nb, 16, out) uint8

    @classmethod
    def from_blocks(cls, scales: np.ndarray, offsets: np.ndarray, quants: np.ndarray) -> Q4Weight:
        """From a file's order: ``scales``, ``offsets (out, nb)``, ``quants (out, nb, 16)`` (the
        block's 16 bytes)."""
        rows, blocks = scales.shape
        if offsets.shape != scales.shape or quants.shape != (rows, blocks, BLOCK // 2):
            raise ValueError(
                f"Q4Weight: scales {scales.shape}, offsets {offsets.shape} and quants "
                f"{quants.shape} do not describe one matrix: (out, nb), (out, nb), (out, nb, 16)"
            )

        def transposed(a: np.ndarray, dtype: type) -> np.ndarray:  # (out, nb, ..) -> (nb, .., out)
            result = np.ascontiguousarray(np.moveaxis(a, 0, -1), dtype=dtype)
            result.flags.writeable = False
            return result

        return cls(
            transposed(scales, np.float32),
            transposed(offsets, np.float32),
            transposed(quants, np.uint8),
        )

    @property
    def in_features(self) -> int:
        return self.nibbles.shape[0] * BLOCK

    @property
    def out_features(self) -> int:
        return self.nibbles.shape[2]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.in_features, self.out_features)

    @property
    def nbytes(self) -> int:
        return self.scales.nbytes + self.offsets.nbytes + self.nibbles.nbytes

    def dequantize(self) -> np.ndarray:
        """The float32 matrix ``(in, out)``, a new array."""
        kernel = kernels.dequantize_q4 if compiled.enabled() else dequantize_q4
        return kernels.select(dequantize_q4, kernel)(self.scales, self.offsets, self.nibbles)


def dequantize_q4(scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """``W[32 b + j, o] = q d + m`` with ``q`` the low (``j < 16``) or high four bits of
    ``nibbles[b, j mod 16, o]``, ``d, m = scales, offsets[b, o]``: ``(in, out)`` float32."""
    blocks, half, outputs = nibbles.shape
    d, m = scales[:, None, :], offsets[:, None, :]  # (nb, 1, out)
    low = (nibbles & 15).astype(np.float32) * d + m  # (nb, 16, out): weights 32 b + j
    high = (nibbles >> 4).astype(np.float32) * d + m  # weights 32 b + 16 + j
    return np.concatenate([low, high], axis=1).reshape(blocks * 2 * half, outputs)


def _matmul_definition(
    x2: np.ndarray, scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray
) -> np.ndarray:
    """``X W`` for rows ``X (N, in)``: the matrix dequantized, then one BLAS product."""
    return x2 @ as_dtype(dequantize_q4(scales, offsets, nibbles), x2.dtype)


def quantized_linear(x: Tensor, weight: Q4Weight, bias: Tensor | None = None) -> Tensor:
    """``y = x @ W + b`` over the last axis of ``x``, ``W`` the `Q4Weight` ``(in, out)``.

    Forward: ``x (..., in)`` viewed as ``X (N, in)``; one row (a decoding step) is summed on
    the blocks themselves (`glassllm.kernels.q4_matmul`), more rows dequantize ``W`` and take
    one BLAS product. VJP with ``G = dL/dY (N, out)``: ``dX = G W^T``, ``db = 1^T G``; ``W``
    has no gradient.
    """
    x = float_tensor(x, "quantized_linear: x")
    if not isinstance(weight, Q4Weight):
        raise TypeError(f"quantized_linear: weight must be a Q4Weight, got {type(weight).__name__}")
    fan_in, fan_out = weight.shape
    if x.ndim == 0 or x.shape[-1] != fan_in:
        raise ValueError(
            f"quantized_linear: the last axis of x {x.shape} must be the weight's in={fan_in}"
        )
    if bias is not None:
        bias = float_tensor(bias, "quantized_linear: bias")
        if bias.shape != (fan_out,):
            raise ValueError(f"quantized_linear: bias shape {bias.shape} must be ({fan_out},)")
    x2 = x.data.reshape(-1, fan_in)  # (N, in)
    kernel = kernels.q4_matmul if compiled.enabled() else _matmul_definition  # numba's, or none
    product = kernels.select(_matmul_definition, kernel)
    out = product(x2, weight.scales, weight.offsets, weight.nibbles)  # (N, out)
    if bias is not None:
        out += bias.data
    out_shape = x.shape[:-1] + (fan_out,)

    def backward(grad: np.ndarray) -> tuple:
        g2 = grad.reshape(-1, fan_out)  # (N, out)
        w = as_dtype(weight.dequantize(), g2.dtype) if x.requires_grad else None
        dx = (g2 @ w.T).reshape(x.shape) if w is not None else None
        if bias is None:
            return (dx,)
        db = (
            as_dtype(sum_over(g2, (0,), keepdims=False), bias.dtype) if bias.requires_grad else None
        )
        return dx, db

    parents = (x,) if bias is None else (x, bias)
    return Tensor.from_op(out.reshape(out_shape), parents, backward).named("quantized_linear")
