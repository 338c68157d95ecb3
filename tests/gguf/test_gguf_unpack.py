"""`glassllm.gguf.unpack`: each kept ggml type's random blocks against llama.cpp's ``gguf``
package, bit for bit, as they are and widened; then a tiny Llama GGUF of K-quant and Q5 tensors
(blocks made from random bytes: the package cannot quantize to them) loaded with
``keep_quantized=True`` against the same file in float32: every projection and the embedding
kept, the file's values, the same logits and greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from gguf_files import Tensor, tiny_llama, write_gguf

import glassllm.nn as nn
from glassllm import no_grad
from glassllm.functional import Q4Weight, Q8Weight
from glassllm.gguf.unpack import (
    KEPT,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    in_blocks_of,
    unpack,
    widened,
)

WITH_OFFSETS = {Q4_0, Q4_1, Q4_K, Q5_1, Q5_K}
# where each type's float16 fields lie in its block, and the block's bytes and weights
FLOAT16_AT = {Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q8_0: [0], Q4_K: [0, 2]}
FLOAT16_AT |= {Q5_K: [0, 2], Q6_K: [208]}
BLOCKS = {Q4_0: (18, 32), Q4_1: (20, 32), Q5_0: (22, 32), Q5_1: (24, 32), Q8_0: (34, 32)}
BLOCKS |= {Q4_K: (144, 256), Q5_K: (176, 256), Q6_K: (210, 256)}


def random_blocks(rng, ggml_type, rows, width):
    """``(rows, width / weights a block, block bytes)`` random bytes, with float16 scales of both
    signs where the type keeps them (random bytes there could be NaN or inf)."""
    block_bytes, weights = BLOCKS[ggml_type]
    blocks = rng.integers(0, 256, (rows, width // weights, block_bytes), dtype=np.uint8)
    for at in FLOAT16_AT[ggml_type]:
        scale = rng.normal(0, 0.02, blocks.shape[:2]).astype("<f2")
        blocks[:, :, at : at + 2] = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks


def weight_of(unpacked):
    if unpacked.bits == 4:
        return Q4Weight.from_blocks(unpacked.scales, unpacked.offsets, unpacked.quants)
    return Q8Weight.from_blocks(unpacked.scales, unpacked.quants, unpacked.offsets)


@pytest.mark.parametrize("ggml_type", sorted(KEPT))
def test_each_kept_type_is_the_gguf_packages_values(ggml_type):
    gguf = optional("gguf")
    rows, width = 7, 512
    blocks = random_blocks(np.random.default_rng(ggml_type), ggml_type, rows, width)
    theirs = gguf.quants.dequantize(blocks.reshape(rows, -1), gguf.GGMLQuantizationType(ggml_type))
    unpacked = unpack(ggml_type, blocks)
    assert unpacked.bits == KEPT[ggml_type]
    assert (unpacked.offsets is not None) == (ggml_type in WITH_OFFSETS)
    size = {Q6_K: 16}.get(ggml_type, 32)  # the weights one scale covers
    assert unpacked.quants.shape == (rows, width // size, 16 if unpacked.bits == 4 else size)
    weight = weight_of(unpacked)
    assert weight.shape == (width, rows)
    assert np.array_equal(weight.dequantize().T, theirs)  # (in, out): their rows are our columns
    wide = widened(unpacked)  # 8-bit with offsets (-0.0 where it had none): the same values
    assert wide.bits == 8 and wide.offsets is not None
    for same in (unpacked, wide, in_blocks_of(wide, 16)):  # cut into blocks of 16: the same
        values = weight_of(same).dequantize().T
        assert np.array_equal(values, theirs)
        if ggml_type != Q4_0:  # its q d - 8 d is +0.0 where the package's (q - 8) d may be -0.0
            assert np.array_equal(np.signbit(values), np.signbit(theirs))


@pytest.mark.parametrize("ggml_type", [0, 1, 30])
def test_float_tensors_are_not_kept(ggml_type):  # F32, F16, BF16
    assert unpack(ggml_type, np.zeros((2, 8, 4), np.uint8)) is None and ggml_type not in KEPT


def test_blocks_cannot_be_cut_unevenly():
    unpacked = unpack(Q6_K, random_blocks(np.random.default_rng(1), Q6_K, 2, 256))
    with pytest.raises(ValueError, match="blocks of 16 cannot be cut into blocks of 32"):
        in_blocks_of(unpacked, 32)


# the tiny model's parts -> their types in blocks 0 and 1; q, k, v of one layer share a weight:
# block 0's are 8-bit blocks of 32, block 1's 4-bit Q4_K beside Q6_K, widened and cut to 16
TYPES = {
    "attn_q": (Q5_0, Q4_K),
    "attn_k": (Q5_0, Q4_K),
    "attn_v": (Q8_0, Q6_K),
    "attn_output": (Q4_K, Q5_1),
    "ffn_gate": (Q4_K, Q5_K),
    "ffn_up": (Q6_K, Q4_1),
    "ffn_down": (Q5_K, Q4_K),
}


def write_file(tmp_path, embedding=Q4_K):
    """A 2-block model of widths that are multiples of 256 (K-quants' blocks): E 256, 4 heads of
    64, 2 key/value heads, M 512; its projections of `TYPES`, its tied embedding ``embedding``."""
    rng = np.random.default_rng(0)
    meta, tensors = tiny_llama(rng, layers=2, embed=256, heads=4, kv_heads=2, ffn=512)
    out = []
    for tensor in tensors:
        part = tensor.name.split(".")[-2]
        layer = int(tensor.name.split(".")[1]) if tensor.name.startswith("blk.") else None
        ggml_type = (
            TYPES[part][layer] if part in TYPES else embedding if part == "token_embd" else 0
        )
        if ggml_type:
            width, rows = tensor.dims
            data = random_blocks(rng, ggml_type, rows, width).tobytes()
            tensor = Tensor(tensor.name, tensor.dims, ggml_type, data)
        out.append(tensor)
    return write_gguf(tmp_path / "kquants.gguf", meta, out)


def load(path, **kw):
    from glassllm.hf import load_gguf

    return load_gguf(path, **kw)[0]


def needs_the_extras():
    for package in ("gguf", "tokenizers", "numba"):
        optional(package)
    from glassllm.kernels import compiled

    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")


@pytest.mark.parametrize("embedding", [Q4_K, Q6_K, Q5_1])
def test_a_file_of_k_quants_keeps_every_projection(tmp_path, embedding):
    needs_the_extras()
    path = write_file(tmp_path, embedding)
    plain, kept = load(path), load(path, keep_quantized=True)
    layers = {n: m.blocks for n, m in kept.named_modules() if isinstance(m, nn.QuantizedLinear)}
    kinds = {  # 4-bit blocks, or 8-bit ones of 32 or 16 weights a scale, with offsets or not
        name: "4"
        if isinstance(w, Q4Weight)
        else f"8/{w.quants.shape[1]}{'' if w.offsets is None else '+m'}"
        for name, w in layers.items()
    }
    assert kinds == {
        "blocks.0.attn.qkv": "8/32",  # Q5_0, Q5_0, Q8_0
        "blocks.1.attn.qkv": "8/16+m",  # Q4_K, Q4_K, Q6_K: widened, cut to Q6_K's 16
        "blocks.0.attn.proj": "4",  # Q4_K
        "blocks.1.attn.proj": "8/32+m",  # Q5_1
        "blocks.0.mlp.gate": "4",  # Q4_K
        "blocks.1.mlp.gate": "8/32+m",  # Q5_K
        "blocks.0.mlp.up": "8/16",  # Q6_K
        "blocks.1.mlp.up": "4",  # Q4_1
        "blocks.0.mlp.proj": "8/32+m",  # Q5_K
        "blocks.1.mlp.proj": "4",  # Q4_K
    }
    assert isinstance(kept.wte, nn.QuantizedEmbedding)
    assert isinstance(kept.wte.blocks, Q4Weight if embedding == Q4_K else Q8Weight)
    ours, theirs = kept.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():  # the file's values, bit for bit, signed zeros too
        assert np.array_equal(ours[name], value), name
        assert np.array_equal(np.signbit(ours[name]), np.signbit(value)), name
    ids = [1, 2, 3, 4, 5, 1, 2]
    with no_grad():
        for steps in (ids[:1], ids[:2], ids):  # one row on the blocks, two, seven dequantized
            a, b = (m(np.array([steps]))[0].data[0] for m in (kept, plain))
            assert np.allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max()), steps
    greedy = kept.generate(np.array([ids[:2]]), 8, top_k=1)
    assert np.array_equal(greedy, plain.generate(np.array([ids[:2]]), 8, top_k=1))


def test_an_f32_embedding_beside_them_stays_float32(tmp_path):
    needs_the_extras()
    kept = load(write_file(tmp_path, embedding=0), keep_quantized=True)
    assert isinstance(kept.wte, nn.Embedding) and kept.wte.weight.dtype == np.float32
    assert isinstance(kept.blocks[0].mlp.gate, nn.QuantizedLinear)
