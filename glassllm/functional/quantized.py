"""A linear map on weights kept in GGUF's blocks: `Q4Weight`, `Q8Weight`, ``quantized_linear``.

GGUF's Q4_0 and Q4_1 store a matrix's rows in blocks of 32 weights, each block a scale ``d``, an
offset ``m`` (Q4_0: ``m = -8 d``) and 32 four-bit integers ``q``, so that ``w = q d + m`` (Q4_K
gives each 32 weights of its 256 a ``d`` and an ``m`` the same way). Kept that way a weight costs
6 bits (``d`` and ``m`` widened to float32) instead of float32's 32; a decoding step, which reads
every weight once for one row of activations, then reads a fifth of the memory.

**The values are exact.** ``d`` and ``m`` have at most 17 significant bits (float16's 11, times
Q4_K's 6-bit sub-scales) and ``q`` has 4, so ``q d`` is exact in float32 and ``q d + m`` rounds
once: the float32 a dequantizer writes (llama.cpp's ``gguf`` package: ``d * q + m``), with or
without a fused multiply-add.

**Layout.** The file's blocks transposed, so that a row of the input meets every output in
order: ``nibbles (nb, 16, out)`` (uint8), byte ``j`` of block ``b`` of each output, its low four
bits weight ``32 b + j``, its high four bits weight ``32 b + 16 + j`` (GGUF's order within a
block); ``scales``, ``offsets (nb, out)`` float32. One vector register then holds the same
input's weights for 16 or so outputs, each output's sum in its own lane
(`glassllm.kernels.quantized`).

GGUF's Q8_0 stores blocks of 32 signed bytes ``q`` and a float16 scale ``d``: ``w = q d``, exact in
float32 (8 + 11 significant bits), 8 bits a weight kept (``d`` widened) against 32; Q5_0's
``q - 16`` and Q6_K's 6-bit ``q`` times its 19-bit scale are of that form too, also exact;
Q5_1 and Q5_K add an offset per block (``offsets (nb, out)``, ``w = q d + m``, ``q`` of 5 bits:
``q d`` exact, the sum rounded once).
`Q8Weight` holds them in the same transposed layout: ``quants (nb, size, out)`` (int8),
``scales (nb, out)``, ``size`` 32, or 16 for Q6_K, whose scales cover 16 weights
(`glassllm.gguf.unpack` says which ggml types become which weight, each exactly).

Both also give the dequantized rows of ``W^T`` for a few ids (``lookup``): a tied embedding is
``W^T``, its head ``W``, so one set of blocks serves both (`glassllm.nn.QuantizedEmbedding`).

The maths is ``linear``'s with ``W`` the dequantized matrix ``(in, out)``: ``Y = X W + b``; VJP
``dX = G W^T``, ``db = 1^T G``. ``W`` is a constant (no gradient: nothing trains the blocks).

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
from glassllm.functional._common import as_dtype, float_tensor, integer_array, sum_over
from glassllm.kernels import compiled
from glassllm.tensor import Tensor

BLOCK = 32  # weights per block, along the input axis
Q8_SIZES = (16, 32)  # the weights a scale of a `Q8Weight` covers (Q6_K's 16, the others' 32)


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
        return cls(
            _transposed(scales, np.float32),
            _transposed(offsets, np.float32),
            _transposed(quants, np.uint8),
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

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of ``W^T`` (the columns ``ids`` of ``W``): ``(len(ids), in)`` float32."""
        picked = [a[..., ids] for a in (self.scales, self.offsets, self.nibbles)]
        return np.ascontiguousarray(dequantize_q4(*picked).T)


@dataclasses.dataclass(frozen=True, eq=False)
class Q8Weight:
    """A matrix ``(in, out)`` kept as 8-bit blocks (the module docstring's layout); read-only."""

    scales: np.ndarray  # (nb, out) float32
    quants: np.ndarray  # (nb, size, out) int8, size 32 or 16
    offsets: np.ndarray | None = None  # (nb, out) float32: w = q d + m; None: w = q d

    @classmethod
    def from_blocks(
        cls, scales: np.ndarray, quants: np.ndarray, offsets: np.ndarray | None = None
    ) -> Q8Weight:
        """From a file's order: ``scales (out, nb)``, ``quants (out, nb, size)`` (signed bytes;
        ``size`` 32 or 16), ``offsets (out, nb)`` or None."""
        rows, blocks = scales.shape
        if (
            quants.ndim != 3
            or quants.shape[:2] != (rows, blocks)
            or quants.shape[2] not in Q8_SIZES
            or (offsets is not None and offsets.shape != scales.shape)
        ):
            shown = "" if offsets is None else f", offsets {offsets.shape}"
            raise ValueError(
                f"Q8Weight: scales {scales.shape} and quants {quants.shape}{shown} do not "
                "describe one matrix: (out, nb), (out, nb, 32 or 16), (out, nb)"
            )
        kept = None if offsets is None else _transposed(offsets, np.float32)
        return cls(_transposed(scales, np.float32), _transposed(quants, np.int8), kept)

    @property
    def in_features(self) -> int:
        return self.quants.shape[0] * self.quants.shape[1]

    @property
    def out_features(self) -> int:
        return self.quants.shape[2]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.in_features, self.out_features)

    @property
    def nbytes(self) -> int:
        offsets = 0 if self.offsets is None else self.offsets.nbytes
        return self.scales.nbytes + self.quants.nbytes + offsets

    def dequantize(self) -> np.ndarray:
        """The float32 matrix ``(in, out)``, a new array."""
        kernel = kernels.dequantize_q8 if compiled.enabled() else dequantize_q8
        return kernels.select(dequantize_q8, kernel)(self.scales, self.quants, self.offsets)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of ``W^T`` (the columns ``ids`` of ``W``): ``(len(ids), in)`` float32."""
        offsets = None if self.offsets is None else self.offsets[:, ids]
        picked = dequantize_q8(self.scales[:, ids], self.quants[..., ids], offsets)
        return np.ascontiguousarray(picked.T)


def _transposed(a: np.ndarray, dtype: type) -> np.ndarray:
    """A file's ``(out, nb, ...)`` as ``(nb, ..., out)``, contiguous and read-only."""
    result = np.ascontiguousarray(np.moveaxis(a, 0, -1), dtype=dtype)
    result.flags.writeable = False
    return result


def dequantize_q4(scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """``W[32 b + j, o] = q d + m`` with ``q`` the low (``j < 16``) or high four bits of
    ``nibbles[b, j mod 16, o]``, ``d, m = scales, offsets[b, o]``: ``(in, out)`` float32."""
    blocks, half, outputs = nibbles.shape
    d, m = scales[:, None, :], offsets[:, None, :]  # (nb, 1, out)
    low = (nibbles & 15).astype(np.float32) * d + m  # (nb, 16, out): weights 32 b + j
    high = (nibbles >> 4).astype(np.float32) * d + m  # weights 32 b + 16 + j
    return np.concatenate([low, high], axis=1).reshape(blocks * 2 * half, outputs)


def dequantize_q8(
    scales: np.ndarray, quants: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """``W[size b + j, o] = q d`` (``+ m`` with ``offsets``) with ``q = quants[b, j, o]``, ``d``,
    ``m = scales, offsets[b, o]``, ``size`` the blocks' (32 or 16): ``(in, out)`` float32."""
    blocks, size, outputs = quants.shape
    w = quants.astype(np.float32) * scales[:, None, :]  # (nb, size, out)
    if offsets is not None:
        w += offsets[:, None, :]
    return w.reshape(blocks * size, outputs)


def _q4_matmul_definition(
    x2: np.ndarray, scales: np.ndarray, offsets: np.ndarray, nibbles: np.ndarray
) -> np.ndarray:
    """``X W`` for rows ``X (N, in)``: the matrix dequantized, then one BLAS product."""
    return x2 @ as_dtype(dequantize_q4(scales, offsets, nibbles), x2.dtype)


def _q8_matmul_definition(
    x2: np.ndarray, scales: np.ndarray, quants: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """``X W`` for rows ``X (N, in)``: the matrix dequantized, then one BLAS product."""
    return x2 @ as_dtype(dequantize_q8(scales, quants, offsets), x2.dtype)


def quantized_linear(x: Tensor, weight: Q4Weight | Q8Weight, bias: Tensor | None = None) -> Tensor:
    """``y = x @ W + b`` over the last axis of ``x``, ``W`` the `Q4Weight` or `Q8Weight`
    ``(in, out)``.

    Forward: ``x (..., in)`` viewed as ``X (N, in)``; one row (a decoding step) is summed on
    the blocks themselves (`glassllm.kernels.q4_matmul`, `glassllm.kernels.q8_matmul`), more
    rows dequantize ``W`` and take one BLAS product. VJP with ``G = dL/dY (N, out)``: ``dX = G
    W^T``, ``db = 1^T G``; ``W`` has no gradient.
    """
    x = float_tensor(x, "quantized_linear: x")
    if not isinstance(weight, (Q4Weight, Q8Weight)):
        raise TypeError(
            "quantized_linear: weight must be a Q4Weight or a Q8Weight, got "
            f"{type(weight).__name__}"
        )
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
    out = quantized_linear_array(x2, weight, None if bias is None else bias.data)  # (N, out)
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


def quantized_embedding(ids: object, weight: Q4Weight | Q8Weight) -> Tensor:
    """Rows ``ids`` of ``W^T`` (``W (dim, V)`` the blocks of a tied head), dequantized: ``y[...] =
    W^T[ids[...]]``, ``(*ids.shape, dim)`` float32, `embedding`'s rows for the dequantized table.
    A constant: the blocks have no gradient. ``ids`` must lie in ``[0, V)``."""
    if not isinstance(weight, Q4Weight | Q8Weight):
        raise TypeError(
            f"quantized_embedding: weight must be a Q4Weight or a Q8Weight, got "
            f"{type(weight).__name__}"
        )
    index = np.asarray(integer_array(ids, "quantized_embedding: ids"))
    dim, num_rows = weight.shape
    if index.size and (index.min() < 0 or index.max() >= num_rows):
        bad = index[(index < 0) | (index >= num_rows)].flat[0]
        raise IndexError(f"quantized_embedding: id {bad} is outside [0, {num_rows})")
    rows = weight.lookup(index.reshape(-1))  # (n, dim)
    return Tensor(rows.reshape(*index.shape, dim)).named("quantized_embedding")


def quantized_linear_array(
    x2: np.ndarray, weight: Q4Weight | Q8Weight, bias: np.ndarray | None
) -> np.ndarray:
    """`quantized_linear`'s forward on rows ``x2 (N, in)`` of a plain array, for decoding under
    ``no_grad`` (`glassllm.models.decoding`): the product on the blocks (or the definition), no
    Tensor and no checks."""
    if isinstance(weight, Q4Weight):
        definition, kernel = _q4_matmul_definition, kernels.q4_matmul
        blocks = (weight.scales, weight.offsets, weight.nibbles)
    else:
        definition, kernel = _q8_matmul_definition, kernels.q8_matmul
        blocks = (weight.scales, weight.quants, weight.offsets)
    product = kernels.select(definition, kernel if compiled.enabled() else definition)
    out = product(x2, *blocks)  # (N, out)
    if bias is not None:
        out += bias
    return out
