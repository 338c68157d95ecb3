"""glassllm sample --checkpoint model.gguf as a user runs it, and a broken GGUF file as one
line with exit status 2 (no traceback)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from conftest import run_cli as run
from gguf_files import gguf_bytes, tiny_llama, write_gguf


@pytest.fixture
def tiny(tmp_path):
    optional("gguf")
    optional("tokenizers")
    meta, tensors = tiny_llama(np.random.default_rng(2), layers=2, embed=16, heads=4, kv_heads=2)
    return write_gguf(tmp_path / "tiny.gguf", meta, tensors)


def test_sample_from_a_gguf_file(tiny, capsys):
    argv = ["sample", "--checkpoint", tiny, "--prompt", "ab", "--num-samples", "2",
            "--max-new-tokens", "6", "--top-p", "0.9", "--explain"]  # fmt: skip
    status, out, err = run(argv, capsys)
    assert status == 0, err
    assert out.count("---------------") == 2 and out.count("|") >= 12


def test_a_gguf_file_without_the_suffix_is_recognised(tiny, tmp_path, capsys):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(tiny.read_bytes())
    status, out, err = run(["sample", "--checkpoint", renamed, "--max-new-tokens", "2",
                            "--prompt", "a"], capsys)  # fmt: skip
    assert status == 0, err


@pytest.mark.parametrize(
    "data, words",
    [
        (b"GGUF\x03\x00", "truncated"),
        (gguf_bytes({"general.architecture": "mamba"}), "'mamba' model"),
        (gguf_bytes({}, counts=(0, 2**62)), "metadata entries"),
    ],
)
def test_a_broken_gguf_is_one_line(tmp_path, capsys, data, words):
    optional("gguf")
    (tmp_path / "bad.gguf").write_bytes(data)
    status, out, err = run(["sample", "--checkpoint", tmp_path / "bad.gguf"], capsys)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassllm: error: "), err
    assert "bad.gguf" in lines[0] and words in lines[0]


def test_sample_keep_quantized_runs_on_the_blocks(tmp_path, capsys, monkeypatch):
    """--keep-quantized: the file's Q8_0 / Q4_1 tensors stay blocks (seen in the model the
    command opened) and greedy sampling writes what the float32 model writes."""
    gguf = optional("gguf")
    import glassllm.hf
    import glassllm.nn as nn
    from glassllm.kernels import compiled

    optional("tokenizers")
    optional("numba")
    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")
    meta, tensors = tiny_llama(np.random.default_rng(3), layers=1, embed=32, heads=2, kv_heads=2)
    for t in tensors:
        kinds = {"token_embd": "Q8_0", "ffn_gate": "Q4_1", "ffn_up": "Q4_1"}
        kind = kinds.get(t.name.split(".")[-2])
        if kind:
            values = np.frombuffer(t.data, "<f4").reshape(list(reversed(t.dims)))
            t.ggml_type = int(gguf.GGMLQuantizationType[kind])
            t.data = gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind]).tobytes()
    path = write_gguf(tmp_path / "blocks.gguf", meta, tensors)
    opened, load = [], glassllm.hf.load_gguf

    def recording(*args, **kwargs):
        result = load(*args, **kwargs)
        opened.append(result[0])
        return result

    monkeypatch.setattr(glassllm.hf, "load_gguf", recording)
    argv = ["sample", "--checkpoint", path, "--prompt", "ab", "--num-samples", "1",
            "--max-new-tokens", "8", "--top-k", "1"]  # fmt: skip
    outputs = []
    for extra in ([], ["--keep-quantized"]):
        status, out, err = run([*argv, *extra], capsys)
        assert status == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]
    plain, kept = opened
    assert isinstance(plain.wte, nn.Embedding) and isinstance(kept.wte, nn.QuantizedEmbedding)
    assert isinstance(kept.blocks[0].mlp.gate, nn.QuantizedLinear)


def test_keep_quantized_is_for_gguf_files_only(tmp_path, capsys):
    (tmp_path / "ckpt.pt").write_bytes(b"not a gguf file")
    argv = ["sample", "--checkpoint", tmp_path / "ckpt.pt", "--keep-quantized"]
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--keep-quantized is for GGUF files" in lines[0], err
