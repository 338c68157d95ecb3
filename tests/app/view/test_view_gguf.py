"""glassllm view --checkpoint model.gguf: the viewer opens a GGUF file like a Hugging Face
directory (read once), and its endpoints work on the Llama-style model inside."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gguf"))
from gguf_files import tiny_llama, write_gguf  # noqa: E402

from glassllm.app.view import api  # noqa: E402
from glassllm.app.view.run import Run  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    optional("gguf")
    optional("tokenizers")
    root = tmp_path_factory.mktemp("gguf-view")
    meta, tensors = tiny_llama(np.random.default_rng(1), layers=2, embed=16, heads=4, kv_heads=2)
    path = write_gguf(root / "tiny.gguf", meta, tensors)
    return Run(root, path)


def test_info_names_the_gguf_model(run):
    answer = api.info(run, {})
    assert answer["checkpoint"]["file"] == "tiny.gguf"
    assert answer["checkpoint"]["iteration"] is None
    assert answer["checkpoint"]["model_config"]["n_kv_head"] == 2
    assert run.source.kind == "gguf" and run.follows is False


def test_generate_and_inspect(run):
    answer = api.generate(run, {"prompt": "ab ab", "max_new_tokens": 5, "top_p": 0.9})
    assert len(answer["tokens"]) == 5
    assert "--checkpoint" in answer["command"] and "tiny.gguf" in answer["command"]
    seen = api.inspect(run, {"prompt": "ab ab"})
    assert seen["logits_diff"] < 1e-5 and seen["n_layer"] == 2


def test_a_broken_gguf_is_one_line(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(40))
    with pytest.raises(ValueError) as caught:
        Run(tmp_path, tmp_path / "bad.gguf")
    assert "bad.gguf" in str(caught.value) and "\n" not in str(caught.value)
