"""``load_gguf(path, keep_quantized=True)``: tiny Llama and Qwen2 GGUF files whose projections and
embeddings are Q4_0, Q4_1 and Q8_0 blocks (made by llama.cpp's ``gguf`` package), against the same
files loaded in
float32 (the path tested against transformers in test_gguf_tiny.py): the layers replaced, their
weights bit for bit, the logits to float32 rounding, the state dict, and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from gguf_files import Tensor, f32_tensor, tiny_llama, write_gguf

import glassllm.nn as nn
from glassllm import Tensor as GTensor
from glassllm import no_grad
from glassllm.functional import Q4Weight, Q8Weight

F16, Q4_0, Q4_1, Q8_0 = 1, 2, 3, 8
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(autouse=True)
def _needs_the_extras():
    optional("gguf")
    optional("tokenizers")
    optional("numba")
    from glassllm.kernels import compiled

    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")


def quantized(tensor: Tensor, ggml_type: int) -> Tensor:
    """``tensor`` (F32) re-encoded as ``ggml_type`` blocks by the gguf package."""
    import gguf

    values = np.frombuffer(tensor.data, "<f4").reshape(list(reversed(tensor.dims)))
    blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType(ggml_type))
    return Tensor(tensor.name, tensor.dims, ggml_type, blocks.tobytes())


def write_file(tmp_path, arch="llama", types=None, name="tiny.gguf", tied=True):
    """A 2-block model (E 64, 4 heads of 16, 2 key/value heads, M 96); ``types`` maps a
    projection (``attn_q``...) to its ggml type, Q4_1 for those not named, and ``token_embd`` or
    ``output`` (with ``tied=False``) to theirs, F32 when not named."""
    types = types or {}
    meta, tensors = tiny_llama(
        np.random.default_rng(0), layers=2, embed=64, heads=4, ffn=96, tied=tied
    )
    meta["llama.attention.head_count_kv"] = 2
    tensors = [t for t in tensors if not t.name.endswith(("attn_k.weight", "attn_v.weight"))]
    rng = np.random.default_rng(1)
    for i in range(2):
        for part in ("attn_k", "attn_v"):
            tensors.append(f32_tensor(f"blk.{i}.{part}.weight", rng.normal(0, 0.5, (32, 64))))
    if arch == "qwen2":
        meta = {k.replace("llama.", "qwen2."): v for k, v in meta.items()}
        meta["general.architecture"] = "qwen2"
        for i in range(2):
            for part, rows in (("attn_q", 64), ("attn_k", 32), ("attn_v", 32)):
                tensors.append(f32_tensor(f"blk.{i}.{part}.bias", rng.normal(0, 0.5, rows)))
    out = []
    for t in tensors:
        part = t.name.split(".")[-2]
        if part in PROJECTIONS and t.name.endswith(".weight"):
            t = quantized(t, types.get(part, Q4_1))
        elif part in ("token_embd", "output") and part in types:
            t = quantized(t, types[part])
        out.append(t)
    return write_gguf(tmp_path / name, meta, out)


def load(path, **kw):
    from glassllm.hf import load_gguf

    return load_gguf(path, **kw)[0]


def logits(model, ids):
    with no_grad():
        return model(np.array([ids]))[0].data[0]


def assert_computes_the_same(kept, plain):
    """Logits to float32 rounding for one row on the blocks, two, and seven dequantized; then
    the same greedy tokens with the cache."""
    ids = [1, 2, 3, 4, 5, 1, 2]
    for steps in (ids[:1], ids[:2], ids):
        a, b = logits(kept, steps), logits(plain, steps)
        assert np.allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max()), steps
    greedy = kept.generate(np.array([ids[:2]]), 8, top_k=1)
    assert np.array_equal(greedy, plain.generate(np.array([ids[:2]]), 8, top_k=1))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q8_0])
def test_the_blocks_compute_what_the_float32_model_computes(tmp_path, arch, ggml_type):
    path = write_file(tmp_path, arch, dict.fromkeys(PROJECTIONS, ggml_type))
    plain, kept = load(path), load(path, keep_quantized=True)
    layers = {n for n, m in kept.named_modules() if isinstance(m, nn.QuantizedLinear)}
    expected = {f"blocks.{i}.{p}" for i in range(2) for p in ("attn.qkv", "attn.proj")}
    expected |= {f"blocks.{i}.mlp.{p}" for i in range(2) for p in ("gate", "up", "proj")}
    assert layers == expected
    ours, theirs = kept.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():  # the file's values, bit for bit (and the biases kept)
        assert np.array_equal(ours[name], value), name
    # the blocks are not parameters; everything else (biases included) still is
    expected_parameters = {n for n, _ in plain.named_parameters()} - {f"{n}.weight" for n in layers}
    assert {n for n, _ in kept.named_parameters()} == expected_parameters
    assert_computes_the_same(kept, plain)


def test_a_mix_is_widened_and_other_types_stay_float32(tmp_path):
    path = write_file(tmp_path, types={"ffn_down": Q8_0, "attn_k": Q8_0, "ffn_up": F16})
    kept, plain = load(path, keep_quantized=True), load(path)
    layers = {n: m for n, m in kept.named_modules() if isinstance(m, nn.QuantizedLinear)}
    # q, k and v share one layer: a Q8_0 k beside Q4_1 q and v makes it 8-bit blocks with
    # offsets (k's -0.0); F16 stays F16's float32; the Q8_0 down projection is 8-bit blocks
    assert set(layers) == {
        f"blocks.{i}.{p}"
        for i in range(2)
        for p in ("attn.qkv", "attn.proj", "mlp.gate", "mlp.proj")
    }
    qkv = layers["blocks.0.attn.qkv"].blocks
    assert isinstance(qkv, Q8Weight) and qkv.offsets is not None
    assert np.all(qkv.offsets[:, 64:96] == 0) and np.all(np.signbit(qkv.offsets[:, 64:96]))
    assert isinstance(layers["blocks.0.mlp.proj"].blocks, Q8Weight)
    assert layers["blocks.0.mlp.proj"].blocks.offsets is None
    assert isinstance(layers["blocks.0.mlp.gate"].blocks, Q4Weight)
    assert isinstance(kept.blocks[0].mlp.up, nn.Linear)
    assert isinstance(kept.wte, nn.Embedding)  # the file's F32 table
    ours, theirs = kept.state_dict(), plain.state_dict()
    for name, value in theirs.items():  # the file's values, bit for bit, signed zeros too
        assert np.array_equal(np.signbit(ours[name]), np.signbit(value)), name
        assert np.array_equal(ours[name], value), name
    assert_computes_the_same(kept, plain)


@pytest.mark.parametrize(
    "tied, types",
    [
        (True, {"token_embd": Q8_0}),
        (True, {"token_embd": Q4_0}),
        (False, {"token_embd": Q4_1, "output": Q8_0}),
    ],
)
def test_the_embedding_and_the_head_keep_their_blocks(tmp_path, tied, types):
    path = write_file(tmp_path, types=types, tied=tied)
    plain, kept = load(path), load(path, keep_quantized=True)
    assert isinstance(kept.wte, nn.QuantizedEmbedding)
    assert isinstance(kept.wte.blocks, Q8Weight if types["token_embd"] == Q8_0 else Q4Weight)
    assert (kept.lm_head is None) == tied
    if not tied:
        assert isinstance(kept.lm_head, nn.QuantizedLinear)
        assert isinstance(kept.lm_head.blocks, Q8Weight)
    assert np.array_equal(kept.wte.weight.data, plain.wte.weight.data)  # the file's values
    ours, theirs = kept.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert np.array_equal(ours[name], value), name
    assert "wte.weight" not in {n for n, _ in kept.named_parameters()}
    assert_computes_the_same(kept, plain)
    with pytest.raises(IndexError, match=r"id 6 is outside \[0, 6\)"):
        kept.wte(np.array([[1, 6]]))


def test_a_state_dict_cannot_be_loaded_into_the_blocks(tmp_path):
    kept = load(write_file(tmp_path), keep_quantized=True)
    state = kept.state_dict()
    before = kept.blocks[0].mlp.gate.weight.data
    state["blocks.0.mlp.gate.weight"] = np.zeros_like(state["blocks.0.mlp.gate.weight"])
    with pytest.raises(
        ValueError,
        match=r"blocks\.0\.mlp\.gate\.weight: the model's array is "
        r"read-only.*nothing was changed|nothing was changed",
    ):
        kept.load_state_dict(state)
    assert np.array_equal(kept.blocks[0].mlp.gate.weight.data, before)
    kept.blocks[0].mlp.gate.weight.data[:] = 0  # a copy: the layer is unchanged
    assert np.array_equal(kept.blocks[0].mlp.gate.weight.data, before)


def test_gradients_reach_the_input_and_the_biases(tmp_path):
    kept = load(write_file(tmp_path, "qwen2"), keep_quantized=True)
    kept.train()
    loss = kept(np.array([[1, 2, 3, 4]]), np.array([[2, 3, 4, 5]]))[1]
    loss.backward()
    bias = kept.blocks[0].attn.qkv.bias
    assert bias.grad is not None and np.abs(bias.grad).max() > 0
    assert kept.wte.weight.grad is not None


def test_what_is_refused(tmp_path):
    from glassllm.hf import load_model

    path = write_file(tmp_path)
    with pytest.raises(ValueError, match="float32"):
        load(path, dtype=np.float64, keep_quantized=True)
    directory = tmp_path / "hf"
    directory.mkdir()
    with pytest.raises(ValueError, match="GGUF files only"):
        load_model(directory, keep_quantized=True)
    layer = load(path, keep_quantized=True).blocks[0].mlp.up
    with pytest.raises(ValueError, match="last axis"):
        layer(GTensor(np.ones((1, 63), np.float32)))


def test_without_the_compiled_kernels_it_says_which_extra(tmp_path):
    from glassllm.data.bpe import MissingDependencyError
    from glassllm.kernels import compiled

    path = write_file(tmp_path)
    compiled.set_enabled(False)
    try:
        with pytest.raises(MissingDependencyError, match=r"glassllm\[fast\] extra"):
            load(path, keep_quantized=True)
    finally:
        compiled.set_enabled(True)


@pytest.mark.parametrize("kind", ["q8", "q8 with offsets", "q4"])
def test_a_table_that_is_not_the_blocks_is_refused(kind):
    """The load's check of a tied embedding: the table ``W^T`` bit for bit, one changed value
    (the last, or the first) and it is not."""
    from glassllm.gguf.blocks import _is_table

    rng = np.random.default_rng(7)
    d = rng.normal(0, 0.1, (40, 2)).astype(np.float16).astype(np.float32)
    if kind.startswith("q8"):
        m = -d if kind.endswith("offsets") else None
        q8 = rng.integers(-128, 128, (40, 2, 32), dtype=np.int8)
        blocks = Q8Weight.from_blocks(d, q8, m)
    else:
        q = rng.integers(0, 256, (40, 2, 16), dtype=np.uint8)
        blocks = Q4Weight.from_blocks(d, -8 * d, q)
    table = np.ascontiguousarray(blocks.dequantize().T)  # (40, 64)
    assert _is_table(blocks, table)
    for where in ((39, 63), (0, 0)):
        changed = table.copy()
        changed[where] = np.nextafter(changed[where], np.float32(np.inf))
        assert not _is_table(blocks, changed), where


@pytest.mark.parametrize("kind", ["q8", "q8 with offsets", "q4"])
def test_a_projection_that_is_not_the_blocks_is_refused(kind):
    """The load's check of a projection, compared in place: it agrees with ``np.array_equal``
    against the dequantized matrix for the matrix itself, one value one step off anywhere (a low
    and a high nibble's row, the first and the last output), a NaN, and -0.0 for 0.0."""
    from glassllm.gguf.blocks import _is_matrix

    rng = np.random.default_rng(8)
    d = rng.normal(0, 0.1, (37, 3)).astype(np.float16).astype(np.float32)  # 37 outputs, in 96
    if kind.startswith("q8"):
        m = rng.normal(0, 0.1, (37, 3)).astype(np.float32) if kind.endswith("offsets") else None
        q8 = rng.integers(-128, 128, (37, 3, 32), dtype=np.int8)
        blocks = Q8Weight.from_blocks(d, q8, m)
    else:
        m = rng.normal(0, 0.1, (37, 3)).astype(np.float16).astype(np.float32)
        blocks = Q4Weight.from_blocks(d, m, rng.integers(0, 256, (37, 3, 16), dtype=np.uint8))
    matrix = blocks.dequantize()  # (96, 37)
    assert _is_matrix(blocks, matrix)
    changes = [((0, 0), np.inf), ((95, 36), -np.inf), ((5, 17), np.inf), ((16 + 37, 1), np.inf)]
    for where, towards in changes:
        changed = matrix.copy()
        changed[where] = np.nextafter(changed[where], np.float32(towards))
        assert not _is_matrix(blocks, changed), where
    changed = matrix.copy()
    changed[40, 20] = np.nan
    assert not _is_matrix(blocks, changed)
    zero = Q8Weight.from_blocks(np.ones((2, 1), np.float32), np.zeros((2, 1, 32), np.int8))
    signed = -zero.dequantize()  # every value -0.0, equal to 0.0 as array_equal says
    assert _is_matrix(zero, signed) and np.array_equal(zero.dequantize(), signed)


def test_each_kept_layers_float32_weight_is_freed_before_the_next_is_made(tmp_path, monkeypatch):
    """The float32 weights of the kept layers are never all in memory at once: when a weight is
    filled, every weight replaced before it is already gone (so the load's peak is one layer's
    float32 more than the blocks, not the whole float32 model's)."""
    import weakref

    from glassllm.gguf import blocks

    path = write_file(tmp_path, "qwen2")  # Q4_1 projections, with q, k, v biases
    replaced, alive_at_fill = [], []
    keep = blocks.Keeper.__call__

    def spy(self, model, name):
        alive_at_fill.append(sum(ref() is not None for ref in replaced))
        path_, _, leaf = name.rpartition(".")
        modules = dict(model.named_modules())
        layer = modules.get(path_) if leaf == "weight" else None
        before = isinstance(layer, nn.Linear) and weakref.ref(layer.weight.data)
        keep(self, model, name)
        if before and not isinstance(dict(model.named_modules())[path_], nn.Linear):
            replaced.append(before)

    monkeypatch.setattr(blocks.Keeper, "__call__", spy)
    kept = load(path, keep_quantized=True)
    assert len(replaced) == 10  # 2 blocks x (qkv, proj, gate, up, proj)
    assert max(alive_at_fill) == 0 and all(ref() is None for ref in replaced)
    assert_computes_the_same(kept, load(path))
