"""Each ggml type glassllm reads, dequantized through a GGUF file that the gguf package's own
GGUFWriter wrote, against an independent NumPy transcription of llama.cpp's ``dequantize_row_*``
(ggml-quants.c) on random blocks: every bit pattern of the quants, scales of both signs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

import glassllm.gguf.dequantize as dequantize_module
from glassllm.gguf import read_header
from glassllm.gguf.dequantize import dequantize
from glassllm.gguf.types import GGML_TYPES

ROWS, BLOCKS = 3, 2  # per tensor: 3 rows of 2 blocks each


def f16(raw: np.ndarray) -> np.ndarray:
    """fp16 fields (uint8 pairs, little-endian) as float32."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def reference(name: str, blocks: np.ndarray) -> np.ndarray:
    """ggml-quants.c's dequantize_row_<name> of ``blocks`` (n, block bytes) -> (n, weights)."""
    if name == "F32":
        return blocks.view("<f4")
    if name == "F16":
        return f16(blocks)
    if name == "BF16":  # the high half of a float32
        return (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if name == "Q8_0":  # d, qs[32]: y = d * q
        return f16(blocks[:, :2]) * blocks[:, 2:].view(np.int8).astype(np.float32)
    if name in ("Q4_0", "Q4_1"):  # d, (m,) qs[16]: elements 0-15 the low nibbles, 16-31 the high
        d, start = f16(blocks[:, :2]), (2 if name == "Q4_0" else 4)
        qs = blocks[:, start:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)
        return (q - 8) * d if name == "Q4_0" else q * d + f16(blocks[:, 2:4])
    if name in ("Q5_0", "Q5_1"):  # d, (m,) qh (u32: bit j is the 5th bit of element j), qs[16]
        start = 2 if name == "Q5_0" else 4
        qh = blocks[:, start : start + 4].copy().view("<u4")  # (n, 1)
        qs = blocks[:, start + 4 :].astype(np.uint32)
        j = np.arange(16, dtype=np.uint32)
        low = (qs & 0xF) | (((qh >> j) << 4) & 0x10)
        high = (qs >> 4) | ((qh >> (j + 12)) & 0x10)
        q = np.concatenate([low, high], axis=1).astype(np.float32)
        d = f16(blocks[:, :2])
        return (q - 16) * d if name == "Q5_0" else q * d + f16(blocks[:, 2:4])
    if name in ("Q4_K", "Q5_K"):
        return _q45_k(blocks, five=name == "Q5_K")
    if name == "Q6_K":
        return _q6_k(blocks)
    raise AssertionError(name)


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4: 8 six-bit (scale, min) pairs packed in 12 bytes."""
    if j < 4:
        return q[:, j] & 63, q[:, j + 4] & 63
    return (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4), (q[:, j + 4] >> 4) | (
        (q[:, j] >> 6) << 4
    )


def _q45_k(blocks: np.ndarray, five: bool) -> np.ndarray:
    """Q4_K: d, dmin, scales[12], qs[128]; Q5_K adds qh[32] before qs (bit u of qh[l] is the
    5th bit). Each 64 weights: 32 low nibbles at (d*sc1, dmin*m1), 32 high at (d*sc2, dmin*m2)."""
    d, dmin, scales = f16(blocks[:, :2]), f16(blocks[:, 2:4]), blocks[:, 4:16]
    qh = blocks[:, 16:48] if five else None
    qs = blocks[:, 48:] if five else blocks[:, 16:]
    out = []
    for group in range(4):
        q = qs[:, 32 * group : 32 * group + 32]
        for half, nibbles in enumerate((q & 0xF, q >> 4)):
            sc, m = _scale_min_k4(2 * group + half, scales)
            values = nibbles.astype(np.float32)
            if five:
                bit = 1 << (2 * group + half)
                values = values + np.where(qh & bit, 16.0, 0.0).astype(np.float32)
            d1 = d * sc.astype(np.float32)[:, None]
            m1 = dmin * m.astype(np.float32)[:, None]
            out.append(d1 * values - m1)
    return np.concatenate(out, axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K: ql[128], qh[64], scales[16] (int8), d. Each 128 weights: 4 runs of 32, the low 4
    bits from ql, the high 2 from qh, minus 32, times d * scale (one scale per 16)."""
    ql, qh = blocks[:, :128].astype(np.int32), blocks[:, 128:192].astype(np.int32)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = f16(blocks[:, 208:210])
    y = np.empty((blocks.shape[0], 256), dtype=np.float32)
    for n in range(2):
        l_ = ql[:, 64 * n : 64 * n + 64]
        h = qh[:, 32 * n : 32 * n + 32]
        s = sc[:, 8 * n : 8 * n + 8]
        quads = [
            (l_[:, :32] & 0xF) | (((h >> 0) & 3) << 4),
            (l_[:, 32:] & 0xF) | (((h >> 2) & 3) << 4),
            (l_[:, :32] >> 4) | (((h >> 4) & 3) << 4),
            (l_[:, 32:] >> 4) | (((h >> 6) & 3) << 4),
        ]
        for k, q in enumerate(quads):
            scale = np.repeat(s[:, [2 * k, 2 * k + 1]], 16, axis=1)  # is = l // 16
            y[:, 128 * n + 32 * k : 128 * n + 32 * k + 32] = d * scale * (q - 32).astype(np.float32)
    return y


def random_blocks(name: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` blocks of random bytes whose fp16 fields are ordinary numbers."""
    kind = next(t for t in GGML_TYPES.values() if t.name == name)
    blocks = rng.integers(0, 256, size=(count, kind.block_bytes), dtype=np.uint8)
    fields = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2]}
    fields |= {"Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "F16": "all"}
    where = fields.get(name, [])
    if where == "all":
        return rng.normal(0, 2, size=(count, 1)).astype("<f2").view(np.uint8)
    if name == "F32":
        return rng.normal(0, 2, size=(count, 1)).astype("<f4").view(np.uint8)
    if name == "BF16":  # normal float32s, their high halves
        return (
            (rng.normal(0, 2, size=(count, 1)).astype("<f4").view("<u4") >> 16)
            .astype("<u2")
            .view(np.uint8)
        )
    for at in where:
        blocks[:, at : at + 2] = rng.normal(0, 0.05, size=(count, 1)).astype("<f2").view(np.uint8)
    return blocks


@pytest.mark.parametrize("name", [t.name for t in GGML_TYPES.values()])
def test_dequantize_matches_ggml_formula(tmp_path, name):
    gguf = optional("gguf")
    rng = np.random.default_rng(sum(map(ord, name)))
    kind = next(t for t in GGML_TYPES.values() if t.name == name)
    per_row = BLOCKS * kind.block_elements
    blocks = random_blocks(name, ROWS * BLOCKS, rng)  # a float type: a block is one value
    raw = blocks.reshape(ROWS, -1)  # (rows, bytes per row)
    path = tmp_path / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("t", raw, raw_dtype=gguf.GGMLQuantizationType(kind.id))  # shape in bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_header(path)
    info = header.tensors["t"]
    assert info.shape == (ROWS, per_row) and info.type_name == name
    got = dequantize(header, info)
    expected = reference(name, blocks.reshape(-1, kind.block_bytes)).reshape(ROWS, per_row)
    assert got.dtype == np.float32 and got.flags.writeable
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    # ggml computes in float32; the gguf package's NumPy groups a few products differently
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    if kind.block_elements == 1:
        np.testing.assert_array_equal(got, expected)  # widening is exact


@pytest.mark.parametrize("name", [t.name for t in GGML_TYPES.values()])
def test_dequantize_in_chunks_gives_the_gguf_packages_bits(tmp_path, monkeypatch, name):
    """Row chunks (here of 2 rows, the last one short) through the block type's own arithmetic:
    the same bits as gguf.quants.dequantize on the whole tensor."""
    gguf = optional("gguf")
    kind = next(t for t in GGML_TYPES.values() if t.name == name)
    raw = random_blocks(name, ROWS * BLOCKS, np.random.default_rng(1)).reshape(ROWS, -1)
    path = tmp_path / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("t", raw, raw_dtype=gguf.GGMLQuantizationType(kind.id))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    monkeypatch.setattr(dequantize_module, "_CHUNK", 2 * BLOCKS * kind.block_elements)
    got = dequantize(header, header.tensors["t"])
    whole = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(kind.id))
    np.testing.assert_array_equal(got, np.asarray(whole, dtype=np.float32).reshape(got.shape))
    assert got.dtype == np.float32 and got.flags.writeable


def test_a_wrong_formula_is_caught():
    """The check above can fail: Q4_1 read with Q4_0's rule (no minimum, minus 8) is far off."""
    rng = np.random.default_rng(0)
    blocks = random_blocks("Q4_1", 4, rng)
    right = reference("Q4_1", blocks)
    wrong = reference("Q4_0", np.concatenate([blocks[:, :2], blocks[:, 4:]], axis=1))
    assert np.abs(right - wrong).max() > 1e-3
