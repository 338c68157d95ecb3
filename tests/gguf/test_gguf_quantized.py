"""``load_gguf(path, keep_quantized=True)``: tiny Llama and Qwen2 GGUF files whose projections and
embeddings are Q4_0, Q4_1 and Q8_0 blocks (made by llama.cpp's ``gguf`` package), against the same
files loaded in
float32 (the path tested against transformers in test_gguf_tiny.py): the layers replaced, their
weights bit for bit, the logits to float32 rounding, the state dict, and what is refused."""

from __future__ import annotations

import dataclasses

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


def reversed_rows(w):
    """``w``'s outputs in the opposite order (a row order mistake)."""
    if isinstance(w, Q4Weight):
        return Q4Weight(w.scales[:, ::-1], w.offsets[:, ::-1], w.nibbles[..., ::-1])
    return Q8Weight(w.scales[:, ::-1], w.quants[..., ::-1], w.offsets)


def swapped_nibbles(w):
    """The low and high four bits of every byte swapped (a field mistake): Q4 only."""
    return Q4Weight(w.scales, w.offsets, (w.nibbles >> 4) | (w.nibbles << 4))


def last_output_off(w):
    """The last output's scales one float32 step up (a mistake in one row: the last)."""
    scales = w.scales.copy()
    scales[:, -1] = np.nextafter(scales[:, -1], np.float32(np.inf))
    return dataclasses.replace(w, scales=scales)


@pytest.mark.parametrize("mistake", [reversed_rows, swapped_nibbles, last_output_off])
def test_blocks_that_are_not_the_files_values_are_refused(tmp_path, monkeypatch, mistake):
    """A mistake in reading the blocks (made here in ``file_blocks``' result) fails the check
    against the gguf package's rows: each layer is read as float32 instead, and the model is the
    float32 load's, bit for bit."""
    from glassllm.gguf import blocks

    path = write_file(tmp_path, "qwen2", types={"token_embd": Q4_1})
    honest = blocks.file_blocks
    monkeypatch.setattr(blocks, "file_blocks", lambda *a: mistake(honest(*a)))
    kept, plain = load(path, keep_quantized=True), load(path)
    modules = dict(kept.named_modules())
    assert not any(isinstance(m, nn.QuantizedLinear) for m in modules.values())
    assert isinstance(kept.wte, nn.Embedding)
    theirs = plain.state_dict()
    assert all(np.array_equal(kept.state_dict()[n], v) for n, v in theirs.items())


def test_the_q_and_k_rows_order_is_checked(tmp_path, monkeypatch):
    """llama.cpp permutes a Llama q and k projection's rows; blocks left with q's rows in the
    file's order hold the right values in the wrong rows, and the check sees it (q, k and v
    share one layer, which is read as float32; the other layers keep their blocks)."""
    from glassllm.gguf import blocks
    from glassllm.gguf.convert import unpermute

    path = write_file(tmp_path, "llama")  # q: 4 heads of 16 rows, the layer's outputs 0-63
    honest = blocks.file_blocks
    in_file_order = np.argsort(unpermute(np.arange(64), 4))

    def q_unmoved(header, names, config):
        w = honest(header, names, config)
        if names[0].endswith("attn_q.weight"):
            outputs = np.concatenate([in_file_order, np.arange(64, w.shape[1])])
            w = Q4Weight(w.scales[:, outputs], w.offsets[:, outputs], w.nibbles[..., outputs])
        return w

    monkeypatch.setattr(blocks, "file_blocks", q_unmoved)
    kept = load(path, keep_quantized=True)
    assert all(isinstance(b.attn.qkv, nn.Linear) for b in kept.blocks)
    assert all(isinstance(b.mlp.up, nn.QuantizedLinear) for b in kept.blocks)
    assert_computes_the_same(kept, load(path))


def test_the_checked_rows():
    from glassllm.gguf.blocks import CHECKED_ROWS, checked_rows

    assert checked_rows(5).tolist() == [0, 1, 2, 3, 4]
    for rows in (CHECKED_ROWS + 1, 576, 49_152):
        picked = checked_rows(rows)
        assert len(picked) == CHECKED_ROWS and picked[0] == 0 and picked[-1] == rows - 1
        assert np.all(np.diff(picked) > 0)  # distinct, ascending
        assert np.array_equal(picked, checked_rows(rows))  # the same rows every load


def test_no_kept_layers_float32_weight_is_made(tmp_path, monkeypatch):
    """The kept layers' file tensors are never dequantized whole (only the rows the check
    compares): the load's peak is the blocks' and the float32 layers', not the float32 model's."""
    from glassllm.gguf import blocks, dequantize
    from glassllm.gguf import load as gguf_load

    path = write_file(tmp_path, "qwen2", types={"token_embd": Q8_0})  # q, k, v biases too
    whole, rows_read = [], []
    honest_tensor, honest_rows = gguf_load._tensor, dequantize.dequantize

    def tensor(header, name, config):
        whole.append(name)
        return honest_tensor(header, name, config)

    def some_rows(header, info, rows=None):
        rows_read.append(len(rows))
        return honest_rows(header, info, rows)

    monkeypatch.setattr(gguf_load, "_tensor", tensor)
    monkeypatch.setattr(blocks, "dequantize", some_rows)
    kept = load(path, keep_quantized=True)
    assert whole and all(n.endswith(("norm.weight", ".bias")) for n in whole), whole
    assert len(rows_read) == 2 * 7 + 1 and max(rows_read) == 32  # 7 tensors a block, the table
    assert_computes_the_same(kept, load(path))


def test_the_load_leaves_no_kernel_for_the_first_token_to_load(tmp_path):
    """In a fresh process, generating after a kept load loads no compiled kernel that the load
    did not (numba reads each from its cache on its first call; the first call of a process
    starts LLVM, ~0.3 s)."""
    import subprocess
    import sys
    import textwrap

    path = write_file(tmp_path, types={"token_embd": Q8_0, "ffn_down": Q8_0})
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from numba.core.registry import CPUDispatcher
        from glassllm.hf import load_gguf

        def loaded():
            return {{
                (name, attr, str(sig))
                for name, module in list(sys.modules.items()) if name.startswith("glassllm")
                for attr, value in vars(module).items() if isinstance(value, CPUDispatcher)
                for sig in value.signatures
            }}

        model = load_gguf({str(path)!r}, keep_quantized=True)[0]
        before = loaded()
        model.generate(np.array([[1, 2, 3, 4, 5]]), 4, top_k=1)
        print(len(before), sorted(loaded() - before))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    count, new = done.stdout.split(" ", 1)
    assert int(count) >= 4 and new.strip() == "[]", done.stdout
