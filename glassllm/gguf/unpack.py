"""Which ggml block types a GGUF load can keep as blocks, and how their bytes become them.

`unpack(ggml_type, blocks)` turns a tensor's raw blocks ``(rows, n, block_bytes)`` into the
arrays of a `glassllm.functional.Q4Weight` or `Q8Weight` in the file's order (rows first), or
None for a type that cannot be kept. Every mapping is exact: the weight's dequantized value is
the float32 llama.cpp's ``gguf`` package computes from the same bytes, bit for bit
(`glassllm.gguf.blocks` checks each kept matrix against that at load, and the tests check each
type here against the package).

- **Q4_0** (``d``; 16 bytes of nibbles, weight ``j`` the low four bits of byte ``j``, weight
  ``16 + j`` the high ones): 4-bit, ``q d + m`` with ``m = -8 d`` (``(q - 8) d``; ``q d`` and
  ``8 d`` are exact in float32, so is their difference). The one difference: a zero weight (``q
  = 8``) is ``+0.0`` here where the package's ``(q - 8) d`` is ``-0.0`` for a negative ``d``,
  which ``==`` does not tell apart, and nor does a product (but for the sign of an all-zero sum).
- **Q4_1** (``d``, ``m``; the same 16 bytes): 4-bit, ``q d + m``.
- **Q4_K** (256 weights: ``d``, ``dmin``, 12 bytes packing eight 6-bit scales and eight 6-bit
  mins, 128 bytes of nibbles): 4-bit, each 32 weights ``q (d sc) - dmin mn``; ``d sc`` and
  ``dmin mn`` are exact in float32 (11 + 6 bits), so that is ``q d' + m'`` with ``d' = d sc`` and
  ``m' = -(dmin mn)``. Its nibbles lie differently (32 weights in the low four bits of 32 bytes,
  the next 32 in their high four bits) and are repacked into Q4_1's order.
- **Q8_0** (``d``; 32 signed bytes): 8-bit, ``q d``.
- **Q5_0** (``d``; 32 fifth bits; 16 bytes of nibbles as Q4_0's): 8-bit, ``(q - 16) d`` with
  ``q - 16`` in ``[-16, 15]``.
- **Q5_1** (``d``, ``m``; the same): 8-bit with offsets, ``q d + m``, ``q`` in ``[0, 31]``.
- **Q5_K** (256 weights: Q4_K's scales and mins, 32 bytes of fifth bits, 128 of nibbles): 8-bit
  with offsets, each 32 weights ``q (d sc) - dmin mn``.
- **Q6_K** (256 weights: 128 bytes of low nibbles, 64 of high two-bit pairs, sixteen signed
  8-bit scales, ``d``): 8-bit in blocks of 16, ``q (d sc)`` with ``q`` in ``[-32, 31]``: ``d sc``
  has at most 19 significant bits and ``q`` 5 (32 is a power of two), so the product is exact.

A 5-bit ``q`` times a scale of at most 17 bits is exact too, so every ``q d + m`` rounds once.
The other types (F16, BF16, F32) stay float32.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14
KEPT = {Q4_0: 4, Q4_1: 4, Q4_K: 4, Q8_0: 8, Q5_0: 8, Q5_1: 8, Q5_K: 8, Q6_K: 8}  # id -> bits


class Unpacked(NamedTuple):
    """A tensor's blocks in the file's order: ``scales (rows, nb)``; ``offsets (rows, nb)`` (all
    4-bit blocks have them, 8-bit ones may: else None); ``quants`` ``(rows, nb, 16)`` packed
    nibbles (4-bit) or ``(rows, nb, size)`` signed bytes (8-bit, ``size`` 32 or 16)."""

    bits: int
    scales: np.ndarray
    offsets: np.ndarray | None
    quants: np.ndarray


def unpack(ggml_type: int, blocks: np.ndarray) -> Unpacked | None:
    """``blocks (rows, n, block_bytes)`` (uint8) of one ggml type as `Unpacked`, or None when that
    type is not kept."""
    if ggml_type == Q4_0:
        d = _float16(blocks[:, :, 0:2])
        return Unpacked(4, d, d * np.float32(-8), blocks[:, :, 2:18])
    if ggml_type == Q4_1:
        return Unpacked(
            4, _float16(blocks[:, :, 0:2]), _float16(blocks[:, :, 2:4]), blocks[:, :, 4:]
        )
    if ggml_type == Q4_K:
        return _q4_k(blocks)
    if ggml_type == Q8_0:
        return Unpacked(8, _float16(blocks[:, :, 0:2]), None, blocks[:, :, 2:].view(np.int8))
    if ggml_type in (Q5_0, Q5_1):
        return _q5(blocks, ggml_type == Q5_1)
    if ggml_type == Q5_K:
        return _q5_k(blocks)
    if ggml_type == Q6_K:
        return _q6_k(blocks)
    return None


def in_blocks_of(unpacked: Unpacked, size: int) -> Unpacked:
    """8-bit ``unpacked`` with each scale covering ``size`` weights (16 from 32: each block cut
    in two halves under the same scale and offset, the same values)."""
    rows, blocks, now = unpacked.quants.shape
    if now == size:
        return unpacked
    if unpacked.bits != 8 or now % size:
        raise ValueError(f"blocks of {now} cannot be cut into blocks of {size}")
    parts = now // size
    offsets = None if unpacked.offsets is None else np.repeat(unpacked.offsets, parts, axis=1)
    quants = unpacked.quants.reshape(rows, blocks * parts, size)
    return Unpacked(8, np.repeat(unpacked.scales, parts, axis=1), offsets, quants)


def widened(unpacked: Unpacked) -> Unpacked:
    """``unpacked`` as 8-bit blocks with offsets (a layer whose tensors mix types shares one
    weight): 4-bit ``q`` (0..15) as signed bytes in weight order, the same ``q d + m``; 8-bit
    blocks without offsets get ``m = -0.0``, which adds to any ``q d`` exactly (``-0.0`` stays
    ``-0.0`` and ``+0.0`` stays ``+0.0``, where ``+0.0`` would turn a ``-0.0`` into ``+0.0``)."""
    if unpacked.bits == 4:
        nibbles = unpacked.quants  # (rows, nb, 16): weights j and 16 + j in byte j
        quants = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).view(np.int8)
        return Unpacked(8, unpacked.scales, unpacked.offsets, quants)
    if unpacked.offsets is not None:
        return unpacked
    return Unpacked(8, unpacked.scales, np.full_like(unpacked.scales, -0.0), unpacked.quants)


def _float16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields ``(..., 2)`` (bytes) as float32 ``(...)``."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def _nibbles_in_q4_1_order(values: np.ndarray) -> np.ndarray:
    """4-bit values ``(..., 32)`` packed as Q4_1's 16 bytes: byte ``j`` holds value ``j`` in its
    low four bits and value ``16 + j`` in its high four."""
    return values[..., :16] | (values[..., 16:] << np.uint8(4))


def _q4_k(blocks: np.ndarray) -> Unpacked:
    rows, n, _ = blocks.shape
    scales, offsets = _q4_k_scales(blocks)  # (rows, n, 8), exact
    nibbles = blocks[:, :, 16:].reshape(rows, n, 4, 1, 32)  # sub-blocks 2g and 2g + 1 share bytes
    values = (nibbles >> np.array([0, 4], np.uint8).reshape(2, 1)) & np.uint8(0x0F)
    quants = _nibbles_in_q4_1_order(values.reshape(rows, n * 8, 32))
    return Unpacked(4, scales.reshape(rows, n * 8), offsets.reshape(rows, n * 8), quants)


def _fifth_bits(quants: np.ndarray, nibbles: np.ndarray, high_bits: np.ndarray) -> None:
    """``quants (..., 32)`` = weight ``i``'s low four bits (``nibbles (..., 16)``: weights 0-15
    in the low halves, 16-31 in the high ones) and its fifth, bit ``i`` of the little-endian
    32-bit field ``high_bits (..., 4)`` (byte ``i // 8``, bit ``i % 8``): 0..31."""
    np.bitwise_and(nibbles, 0x0F, out=quants[..., :16])
    np.right_shift(nibbles, 4, out=quants[..., 16:])
    high = np.unpackbits(high_bits, axis=-1, bitorder="little")
    quants |= np.left_shift(high, 4, out=high)


def _q5(blocks: np.ndarray, with_offset: bool) -> Unpacked:
    """Q5_0 (``d``, 4 bytes of fifth bits, 16 of nibbles) or Q5_1 (``d``, ``m``, the same)."""
    rows, n, _ = blocks.shape
    start = 4 if with_offset else 2
    quants = np.empty((rows, n, 32), np.uint8)
    _fifth_bits(quants, blocks[:, :, start + 4 : start + 20], blocks[:, :, start : start + 4])
    d = _float16(blocks[:, :, 0:2])
    if with_offset:  # q d + m, q 0..31
        return Unpacked(8, d, _float16(blocks[:, :, 2:4]), quants.view(np.int8))
    quants -= np.uint8(16)  # 0..31 -> -16..15 as signed bytes (two's complement)
    return Unpacked(8, d, None, quants.view(np.int8))


def _q4_k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's ``(d sc, -(dmin mn))`` ``(rows, n, 8)``, from ``d``, ``dmin`` and the
    12 bytes that pack eight 6-bit scales and eight 6-bit mins."""
    d, dmin = _float16(blocks[:, :, 0:2]), _float16(blocks[:, :, 2:4])  # (rows, n)
    packed = blocks[:, :, 4:16]
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    # sub-blocks 0-3: the low six bits of bytes 0-3 (scales) and 4-7 (mins); 4-7: the four bits
    # of bytes 8-11 (low half: scale, high half: min) under the two top bits of bytes 0-3 / 4-7
    scale = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    least = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], axis=-1)
    return d[..., None] * scale.astype(np.float32), -(dmin[..., None] * least.astype(np.float32))


def _q5_k(blocks: np.ndarray) -> Unpacked:
    """Q5_K (256 weights: ``d``, ``dmin``, 12 bytes of scales and mins, 32 bytes of fifth bits,
    128 of nibbles): each 32 weights ``q (d sc) - dmin mn`` with ``q`` 0..31."""
    rows, n, _ = blocks.shape
    scales, offsets = _q4_k_scales(blocks)
    nibbles = blocks[:, :, 48:].reshape(rows, n, 4, 1, 32)  # as Q4_K's
    low = (nibbles >> np.array([0, 4], np.uint8).reshape(2, 1)) & np.uint8(0x0F)  # (.., 4, 2, 32)
    # byte i of the 32 holds weight i's fifth bit of sub-block k in its bit k
    fifth = blocks[:, :, 16:48].reshape(rows, n, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
    high = (fifth & np.uint8(1)).reshape(rows, n, 4, 2, 32)
    quants = (low | (high << np.uint8(4))).reshape(rows, n * 8, 32).view(np.int8)
    return Unpacked(8, scales.reshape(rows, n * 8), offsets.reshape(rows, n * 8), quants)


def _q6_k(blocks: np.ndarray) -> Unpacked:
    rows, n, _ = blocks.shape
    # two halves of 128 weights; in each, bytes 0-63 of the low nibbles give weights 0-63 (low four
    # bits) and 64-127 (high four), and 32 bytes of high bits give weights 32 k + i from bits 2k
    low = blocks[:, :, 0:128].reshape(rows, n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
    low = (low & np.uint8(0x0F)).reshape(rows, n, 2, 4, 32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    high = (blocks[:, :, 128:192].reshape(rows, n, 2, 1, 32) >> shifts) & np.uint8(0x03)
    quants = (low | (high << np.uint8(4))).view(np.int8) - np.int8(32)  # 0..63 -> -32..31
    scales = blocks[:, :, 192:208].view(np.int8).astype(np.float32)  # (rows, n, 16)
    d = _float16(blocks[:, :, 208:210])
    sub_scales = (d[..., None] * scales).reshape(rows, n * 16)
    return Unpacked(8, sub_scales, None, quants.reshape(rows, n * 16, 16))
