"""Which ggml block types a GGUF load can keep as blocks, and how their bytes become them.

`unpack(ggml_type, blocks)` turns a tensor's raw blocks ``(rows, n, block_bytes)`` into the
arrays of a `glassllm.functional.Q4Weight` or `Q8Weight` in the file's order (rows first), or
None for a type that cannot be kept. Every mapping is exact: the weight's dequantized value is
the float32 llama.cpp's ``gguf`` package computes from the same bytes, bit for bit
(`glassllm.gguf.blocks` checks each kept matrix against that at load, and the tests check each
type here against the package).

- **Q4_0** (``d``; 16 bytes of nibbles, weight ``j`` the low four bits of byte ``j``, weight
  ``16 + j`` the high ones): 4-bit, ``q d + m`` with ``m = -8 d`` (``(q - 8) d``; ``q d`` and
  ``8 d`` are exact in float32, so is their difference).
- **Q4_1** (``d``, ``m``; the same 16 bytes): 4-bit, ``q d + m``.
- **Q4_K** (256 weights: ``d``, ``dmin``, 12 bytes packing eight 6-bit scales and eight 6-bit
  mins, 128 bytes of nibbles): 4-bit, each 32 weights ``q (d sc) - dmin mn``; ``d sc`` and
  ``dmin mn`` are exact in float32 (11 + 6 bits), so that is ``q d' + m'`` with ``d' = d sc`` and
  ``m' = -(dmin mn)``. Its nibbles lie differently (32 weights in the low four bits of 32 bytes,
  the next 32 in their high four bits) and are repacked into Q4_1's order.
- **Q8_0** (``d``; 32 signed bytes): 8-bit, ``q d``.
- **Q5_0** (``d``; 32 high bits; 16 bytes of nibbles as Q4_0's): 8-bit, ``(q - 16) d`` with
  ``q - 16`` in ``[-16, 15]``.
- **Q6_K** (256 weights: 128 bytes of low nibbles, 64 of high two-bit pairs, sixteen signed
  8-bit scales, ``d``): 8-bit in blocks of 16, ``q (d sc)`` with ``q`` in ``[-32, 31]``: ``d sc``
  has at most 19 significant bits and ``q`` 5 (32 is a power of two), so the product is exact.

Q5_1, Q5_K (whose 5-bit ``q`` comes with an offset) and the rest stay float32.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 2, 3, 6, 8, 12, 14
KEPT = {Q4_0: 4, Q4_1: 4, Q4_K: 4, Q8_0: 8, Q5_0: 8, Q6_K: 8}  # ggml type id -> bits kept


class Unpacked(NamedTuple):
    """A tensor's blocks in the file's order: ``scales (rows, nb)``; ``offsets (rows, nb)`` for
    4-bit blocks, else None; ``quants`` ``(rows, nb, 16)`` packed nibbles (4-bit) or
    ``(rows, nb, size)`` signed bytes (8-bit, ``size`` 32 or 16)."""

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
    if ggml_type == Q5_0:
        return _q5_0(blocks)
    if ggml_type == Q6_K:
        return _q6_k(blocks)
    return None


def in_blocks_of(unpacked: Unpacked, size: int) -> Unpacked:
    """8-bit ``unpacked`` with each scale covering ``size`` weights (16 from 32: each block cut
    in two halves under the same scale, the same values)."""
    rows, blocks, now = unpacked.quants.shape
    if now == size:
        return unpacked
    if unpacked.bits != 8 or now % size:
        raise ValueError(f"blocks of {now} cannot be cut into blocks of {size}")
    parts = now // size
    quants = unpacked.quants.reshape(rows, blocks * parts, size)
    return Unpacked(8, np.repeat(unpacked.scales, parts, axis=1), None, quants)


def _float16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields ``(..., 2)`` (bytes) as float32 ``(...)``."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def _nibbles_in_q4_1_order(values: np.ndarray) -> np.ndarray:
    """4-bit values ``(..., 32)`` packed as Q4_1's 16 bytes: byte ``j`` holds value ``j`` in its
    low four bits and value ``16 + j`` in its high four."""
    return values[..., :16] | (values[..., 16:] << np.uint8(4))


def _q4_k(blocks: np.ndarray) -> Unpacked:
    rows, n, _ = blocks.shape
    d, dmin = _float16(blocks[:, :, 0:2]), _float16(blocks[:, :, 2:4])  # (rows, n)
    packed = blocks[:, :, 4:16]  # (rows, n, 12): scales and mins of the 8 sub-blocks, 6 bits each
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    # sub-blocks 0-3: the low six bits of bytes 0-3 (scales) and 4-7 (mins); 4-7: the four bits
    # of bytes 8-11 (low half: scale, high half: min) under the two top bits of bytes 0-3 / 4-7
    scale = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    least = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], axis=-1)
    sub_scales = d[..., None] * scale.astype(np.float32)  # (rows, n, 8), exact
    sub_offsets = -(dmin[..., None] * least.astype(np.float32))
    nibbles = blocks[:, :, 16:].reshape(rows, n, 4, 1, 32)  # sub-blocks 2g and 2g + 1 share bytes
    values = (nibbles >> np.array([0, 4], np.uint8).reshape(2, 1)) & np.uint8(0x0F)
    quants = _nibbles_in_q4_1_order(values.reshape(rows, n * 8, 32))
    return Unpacked(4, sub_scales.reshape(rows, n * 8), sub_offsets.reshape(rows, n * 8), quants)


def _q5_0(blocks: np.ndarray) -> Unpacked:
    rows, n, _ = blocks.shape
    quants = np.empty((rows, n, 32), np.uint8)
    np.bitwise_and(blocks[:, :, 6:22], 0x0F, out=quants[..., :16])  # weights 0-15: low nibbles
    np.right_shift(blocks[:, :, 6:22], 4, out=quants[..., 16:])  # 16-31: high nibbles
    # bit i of the little-endian 32-bit field is weight i's fifth bit: byte i // 8, bit i % 8
    high = np.unpackbits(blocks[:, :, 2:6], axis=-1, bitorder="little")  # (rows, n, 32)
    quants |= np.left_shift(high, 4, out=high)
    quants -= np.uint8(16)  # 0..31 -> -16..15 as signed bytes (two's complement)
    return Unpacked(8, _float16(blocks[:, :, 0:2]), None, quants.view(np.int8))


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
