"""``quantized_linear`` and `Q4Weight`: the dequantization against llama.cpp's ``gguf`` package
(Q4_1 blocks byte for byte), the kernels against the definition (the same bits where they do
the same operations, the row product against a sequential sum in its order), the VJP against
finite differences in float64, the shape rules by hypothesis, and `QuantizedLinear`'s state."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.functional as F
import glassllm.nn as nn
from glassllm import Tensor, gradcheck, kernels
from glassllm.functional.quantized import Q4Weight, Q8Weight
from glassllm.kernels import compiled


def random_blocks(rng, outputs, inputs):
    """Float16-valued scales and offsets and random bytes: a Q4_1 file's blocks."""
    blocks = inputs // 32
    d = rng.normal(0, 0.1, (outputs, blocks)).astype(np.float16)
    m = rng.normal(0, 0.1, (outputs, blocks)).astype(np.float16)
    q = rng.integers(0, 256, (outputs, blocks, 16), dtype=np.uint8)
    return d, m, q


def needs_kernels():
    optional("numba")
    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")


def weight_of(d, m, q):
    return Q4Weight.from_blocks(d.astype(np.float32), m.astype(np.float32), q)


def test_dequantize_is_the_gguf_packages():
    gguf = optional("gguf")
    d, m, q = random_blocks(np.random.default_rng(0), 48, 96)
    raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), q], axis=2)
    theirs = gguf.quants.dequantize(raw.reshape(48, -1), gguf.GGMLQuantizationType.Q4_1)
    w = weight_of(d, m, q)
    with kernels.use("reference"):
        assert np.array_equal(w.dequantize(), theirs.T)  # (in, out): their rows are our columns
    assert np.array_equal(w.dequantize(), theirs.T)  # the kernel's, the same bits


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_the_kernels_against_the_definition(rows):
    optional("numba")
    rng = np.random.default_rng(rows)
    w = weight_of(*random_blocks(rng, 64, 128))
    x = rng.standard_normal((rows, 128), dtype=np.float32)
    fast = F.quantized_linear(Tensor(x), w).data
    with kernels.use("reference"):
        reference = F.quantized_linear(Tensor(x), w).data
    assert fast.dtype == np.float32
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64)
    assert np.all(np.abs(fast - exact) <= 128 * 2**-24 * scale * 2)
    assert np.all(np.abs(reference - exact) <= 128 * 2**-24 * scale * 2)


def test_one_row_is_summed_in_the_kernels_order():
    """Each output: per block, the low-nibble terms q x (j = 0..15) in one float32 sum, the
    high-nibble terms in another, the block's inputs summed in order, then d (low + high) + m sum
    x added to the total, block after block: the kernel's bits exactly."""
    needs_kernels()
    rng = np.random.default_rng(3)
    d, m, q = random_blocks(rng, 37, 96)  # any number of outputs
    d, m, w = d.astype(np.float32), m.astype(np.float32), weight_of(d, m, q)
    x = rng.standard_normal(96, dtype=np.float32)
    total = np.zeros(37, np.float32)
    for b in range(3):
        low, high, x_sum = np.zeros(37, np.float32), np.zeros(37, np.float32), np.float32(0)
        for j in range(32):
            x_sum = np.float32(x_sum + x[32 * b + j])
        for j in range(16):
            low += (q[:, b, j] & 15).astype(np.float32) * x[32 * b + j]
            high += (q[:, b, j] >> 4).astype(np.float32) * x[32 * b + 16 + j]
        total += d[:, b] * (low + high) + m[:, b] * x_sum
    out = np.empty(37, np.float32)
    compiled.kernels().q4_row_product(
        w.scales, w.offsets, w.nibbles, x, out, 0, 37, 0, 3, np.zeros((0, 0), np.float32)
    )
    assert np.array_equal(out, total)
    assert np.array_equal(F.quantized_linear(Tensor(x[None]), w).data[0], total)


def test_gradcheck_quantized_linear():
    rng = np.random.default_rng(4)
    w = weight_of(*random_blocks(rng, 16, 64))
    x = Tensor(rng.standard_normal((2, 3, 64)), requires_grad=True)
    b = Tensor(rng.standard_normal(16), requires_grad=True)
    assert gradcheck(lambda x, b: F.quantized_linear(x, w, b), [x, b])
    y = F.quantized_linear(x, w, b)
    assert y.dtype == np.float64 and y.shape == (2, 3, 16)


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    outputs=st.integers(1, 40),
    blocks=st.integers(1, 3),
)
def test_shapes(lead, outputs, blocks):
    w = weight_of(*random_blocks(np.random.default_rng(0), outputs, 32 * blocks))
    assert w.shape == (32 * blocks, outputs)
    x = np.ones((*lead, 32 * blocks), np.float32)
    y = F.quantized_linear(Tensor(x), w)
    assert y.shape == (*lead, outputs) and y.dtype == np.float32


def test_bad_input_is_refused():
    w = weight_of(*random_blocks(np.random.default_rng(0), 16, 32))
    with pytest.raises(ValueError, match="last axis"):
        F.quantized_linear(Tensor(np.ones((2, 31), np.float32)), w)
    with pytest.raises(ValueError, match="bias shape"):
        F.quantized_linear(Tensor(np.ones((2, 32), np.float32)), w, Tensor(np.ones(15)))
    with pytest.raises(TypeError, match="Q4Weight"):
        F.quantized_linear(Tensor(np.ones((2, 32), np.float32)), np.ones((32, 16)))
    with pytest.raises(ValueError, match="do not describe one matrix"):
        Q4Weight.from_blocks(np.ones((8, 1)), np.ones((8, 1)), np.ones((8, 1, 8), np.uint8))
    with pytest.raises(ValueError, match="do not describe one matrix"):
        Q4Weight.from_blocks(np.ones((8, 1)), np.ones((8, 2)), np.ones((8, 1, 16), np.uint8))
    assert not w.nibbles.flags.writeable and not w.scales.flags.writeable


def test_the_layer_reads_as_a_linear_and_saves_its_weight():
    rng = np.random.default_rng(5)
    w = weight_of(*random_blocks(rng, 32, 64))
    layer = nn.QuantizedLinear(w, Tensor(np.zeros(32, np.float32), requires_grad=True))
    assert [name for name, _ in layer.named_parameters()] == ["bias"]
    state = layer.state_dict()
    assert np.array_equal(state["weight"], w.dequantize()) and list(state) == ["bias", "weight"]
    x = rng.standard_normal((4, 64), dtype=np.float32)
    assert np.allclose(layer(Tensor(x)).data, x @ layer.weight.data, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="weight: the model's array is read-only"):
        layer.load_state_dict(state)
    assert layer.load_state_dict({"bias": state["bias"]}, strict=False).missing_keys == ["weight"]


def random_q8_blocks(rng, outputs, inputs, size=32):
    """Float16-valued scales of both signs and random signed bytes: a Q8_0 file's blocks (with
    ``size`` 16, blocks of 16 weights, as `glassllm.gguf.unpack` makes of Q6_K's)."""
    d = rng.normal(0, 0.1, (outputs, inputs // size)).astype(np.float16)
    q = rng.integers(-128, 128, (outputs, inputs // size, size), dtype=np.int8)
    return d, q


def q8_weight_of(d, q):
    return Q8Weight.from_blocks(d.astype(np.float32), q)


def test_q8_dequantize_is_the_gguf_packages():
    gguf = optional("gguf")
    d, q = random_q8_blocks(np.random.default_rng(10), 40, 96)
    raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=2)
    theirs = gguf.quants.dequantize(raw.reshape(40, -1), gguf.GGMLQuantizationType.Q8_0)
    w = q8_weight_of(d, q)
    with kernels.use("reference"):
        assert np.array_equal(w.dequantize(), theirs.T)
    assert np.array_equal(w.dequantize(), theirs.T)
    ids = np.array([3, 0, 39, 3])
    assert np.array_equal(w.lookup(ids), theirs[ids])  # rows of W^T: the file's rows


def test_q4_lookup_is_the_dequantized_columns():
    w = weight_of(*random_blocks(np.random.default_rng(11), 24, 64))
    ids = np.array([23, 0, 5, 5])
    assert np.array_equal(w.lookup(ids), w.dequantize()[:, ids].T)


@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("size", [32, 16])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_the_q8_kernels_against_the_definition(rows, size, offsets):
    optional("numba")
    rng = np.random.default_rng(20 + rows)
    d, q = random_q8_blocks(rng, 72, 128, size)
    m = rng.normal(0, 0.1, d.shape).astype(np.float16).astype(np.float32) if offsets else None
    w = Q8Weight.from_blocks(d.astype(np.float32), q, m)
    assert w.shape == (128, 72) and (w.offsets is None) == (not offsets)
    dequantized = w.dequantize()  # W[size b + j, o] = q d (+ m)
    expected = q[:, 1, 3].astype(np.float32) * d[:, 1] + (m[:, 1] if offsets else 0)
    assert np.array_equal(dequantized[size + 3], expected)
    with kernels.use("reference"):
        assert np.array_equal(w.dequantize(), dequantized)
    ids = np.array([5, 0, 71])
    assert np.array_equal(w.lookup(ids), dequantized[:, ids].T)
    x = rng.standard_normal((rows, 128), dtype=np.float32)
    fast = F.quantized_linear(Tensor(x), w).data
    with kernels.use("reference"):
        reference = F.quantized_linear(Tensor(x), w).data
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(w.dequantize()).astype(np.float64)
    assert fast.dtype == np.float32
    assert np.all(np.abs(fast - exact) <= 128 * 2**-24 * scale * 2)
    assert np.all(np.abs(reference - exact) <= 128 * 2**-24 * scale * 2)


@pytest.mark.parametrize("offsets", [False, True])
def test_one_q8_row_is_summed_in_the_kernels_order_on_any_thread_count(offsets):
    """Each output: per block, q x for j = 0..31 added in order into one float32 sum, then d
    times it (plus m times the block's inputs summed in order, with offsets) added to the
    total, block after block: the kernel's bits exactly, whether the outputs are split over
    threads or not."""
    needs_kernels()
    from glassllm import threads
    from glassllm.kernels import row_pool

    rng = np.random.default_rng(12)
    outputs = 2 * row_pool.COLUMNS_PER_THREAD + 37  # wide enough to be split by outputs
    d, q = random_q8_blocks(rng, outputs, 64)
    m = rng.normal(0, 0.1, d.shape).astype(np.float32) if offsets else None
    w = Q8Weight.from_blocks(d.astype(np.float32), q, m)
    x = rng.standard_normal(64, dtype=np.float32)
    total = np.zeros(outputs, np.float32)
    for b in range(2):
        block_sum = np.zeros(outputs, np.float32)
        x_sum = np.float32(0)
        for j in range(32):
            block_sum += q[:, b, j].astype(np.float32) * x[32 * b + j]
            x_sum = np.float32(x_sum + x[32 * b + j])
        scaled = d[:, b].astype(np.float32) * block_sum
        total += scaled + m[:, b] * x_sum if offsets else scaled
    before = threads.get_num_threads()
    try:
        for count in (1, 2):
            threads.set_num_threads(count)
            assert np.array_equal(F.quantized_linear(Tensor(x[None]), w).data[0], total), count
    finally:
        threads.set_num_threads(before)


def test_gradcheck_quantized_linear_on_8_bit_blocks():
    rng = np.random.default_rng(13)
    w = q8_weight_of(*random_q8_blocks(rng, 12, 64))
    x = Tensor(rng.standard_normal((2, 64)), requires_grad=True)
    assert gradcheck(lambda x: F.quantized_linear(x, w), [x])


def test_quantized_embedding_is_the_tables_rows():
    rng = np.random.default_rng(14)
    w = q8_weight_of(*random_q8_blocks(rng, 10, 32))  # the head W (32, 10): a table of 10 rows
    table = nn.QuantizedEmbedding(w)
    ids = np.array([[9, 0], [3, 3]])
    assert np.array_equal(table(ids).data, w.dequantize().T[ids])
    assert table(ids).shape == (2, 2, 32) and not table(ids).requires_grad
    x = rng.standard_normal((1, 32), dtype=np.float32)
    assert np.allclose(table.attend(Tensor(x)).data, x @ w.dequantize(), rtol=1e-5, atol=1e-5)
    assert list(table.state_dict()) == ["weight"] and not list(table.parameters())
    assert np.array_equal(table.state_dict()["weight"], w.dequantize().T)
    with pytest.raises(ValueError, match="read-only"):
        table.load_state_dict(table.state_dict())
    with pytest.raises(IndexError, match=r"id -1 is outside \[0, 10\)"):
        table(np.array([0, -1]))
    with pytest.raises(TypeError, match="must hold integers"):
        table(np.array([0.5]))
    with pytest.raises(ValueError, match="do not describe one matrix"):
        Q8Weight.from_blocks(np.ones((4, 1)), np.ones((4, 1, 8), np.int8))
    with pytest.raises(TypeError, match="Q4Weight or a Q8Weight"):
        nn.QuantizedEmbedding(np.ones((32, 10)))
    assert (
        repr(table) == "QuantizedEmbedding(10, 32, 8-bit blocks 360 bytes)"
    )  # 320 bytes + 10 scales
