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
