"""Every way a Hugging Face directory, an export or a BPE request can be wrong: one clear message
(one line) listing every problem, as HFFormatError or MissingDependencyError (both ValueErrors)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from conftest import optional

from glassllm.data import (
    MissingDependencyError,
    build_tokenizer,
    tokenizer_from_dict,
    train_bpe,
)
from glassllm.hf import HFFormatError, load_model, load_pretrained, save_pretrained
from glassllm.models import GPT, GPTConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"


@pytest.fixture
def gpt2(tmp_path):
    """A copy of the committed fixture, model files only."""
    directory = tmp_path / "gpt2"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, directory / name)
    return directory


def _error(path, **kwargs) -> HFFormatError:
    with pytest.raises(HFFormatError) as caught:
        load_pretrained(path, **kwargs)
    assert "\n" not in str(caught.value)
    return caught.value


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def _edit_tensors(directory: Path, edit) -> None:
    tensors = safetensors.numpy.load_file(directory / "model.safetensors")
    edit(tensors)
    safetensors.numpy.save_file(tensors, str(directory / "model.safetensors"))


def test_no_such_path_and_no_config(tmp_path):
    assert "no such file or directory" in str(_error(tmp_path / "nowhere"))
    message = str(_error(tmp_path))
    assert "is not a Hugging Face model directory" in message and "no config.json" in message
    weights = tmp_path / "model.safetensors"
    shutil.copy(FIXTURE / "model.safetensors", weights)
    assert "no config.json" in str(_error(weights))


def test_another_model_type_is_named(gpt2):
    _edit_config(gpt2, model_type="mamba")
    assert (
        "holds a 'mamba' model; glassllm loads model_type 'gpt2', 'llama', 'qwen2', 'qwen3', "
        "'gpt_neox', 'gpt_neo'" in str(_error(gpt2))
    )
    (gpt2 / "config.json").write_text("[]")
    assert "config.json has no model_type" in str(_error(gpt2))


def test_pickle_only_directories_are_refused(gpt2):
    (gpt2 / "model.safetensors").rename(gpt2 / "pytorch_model.bin")
    message = str(_error(gpt2))
    assert "pytorch_model.bin but no model.safetensors" in message and "no pickle" in message
    (gpt2 / "pytorch_model.bin").unlink()
    assert "no model.safetensors" in str(_error(gpt2))


def test_config_and_weight_file_problems_are_listed_together(gpt2):
    _edit_config(gpt2, activation_function="relu", layer_norm_epsilon=-1.0, n_inner=0)
    (gpt2 / "model.safetensors").unlink()
    problems = _error(gpt2).problems
    assert len(problems) == 4
    for part in ("activation_function='relu'", "layer_norm_epsilon=-1.0", "n_inner=0"):
        assert any(part in p and "unsupported config.json value" in p for p in problems), part
    assert "no model.safetensors" in problems[3]


def test_tensor_problems_are_listed_together(gpt2):
    def edit(tensors):
        del tensors["h.1.mlp.c_fc.bias"]
        tensors["h.0.attn.c_proj.weight"] = np.zeros((16, 15), np.float32)
        tensors["h.0.attn.c_attn.bias"] = tensors["h.0.attn.c_attn.bias"].astype(np.int32)
        tensors["score.weight"] = np.zeros((2, 16), np.float32)

    _edit_tensors(gpt2, edit)
    message = str(_error(gpt2))
    assert "missing tensors: h.1.mlp.c_fc.bias" in message
    assert "unexpected tensors: score.weight" in message
    assert "h.0.attn.c_proj.weight (16, 15) (expected (16, 16))" in message
    assert "h.0.attn.c_attn.bias has dtype I32" in message


def test_a_stored_head_must_be_the_tied_one_unless_untied(gpt2):
    _edit_tensors(gpt2, lambda t: t.update({"lm_head.weight": t["wte.weight"] * 2.0}))
    assert "untied lm_head.weight" in str(_error(gpt2))
    _edit_tensors(gpt2, lambda t: t.update({"lm_head.weight": t["wte.weight"]}))
    load_model(gpt2)  # a stored copy of the tied head is fine
    _edit_config(gpt2, tie_word_embeddings=False)  # then lm_head.weight is the head
    _edit_tensors(gpt2, lambda t: t.update({"lm_head.weight": t["wte.weight"] * 2.0}))
    model = load_model(gpt2)
    assert np.array_equal(model.lm_head.weight.data, 2.0 * model.wte.weight.data.T)
    _edit_tensors(gpt2, lambda t: t.pop("lm_head.weight"))
    assert "missing tensors: lm_head.weight" in str(_error(gpt2))


def test_malformed_files(gpt2):
    data = (gpt2 / "model.safetensors").read_bytes()
    (gpt2 / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "malformed entries for tensors" in str(_error(gpt2))
    (gpt2 / "model.safetensors").write_bytes(b"\xff" * 16)
    assert "not a valid safetensors file" in str(_error(gpt2))
    (gpt2 / "config.json").write_text("{")
    assert "config.json: unreadable" in str(_error(gpt2))


def test_missing_tokenizer_files(gpt2):
    model, tokenizer = load_pretrained(gpt2)
    assert tokenizer is None and isinstance(model, GPT)
    assert "no tokenizer.json or vocab.json + merges.txt (needed to sample)" in str(
        _error(gpt2, require_tokenizer=True)
    )
    shutil.copy(FIXTURE / "vocab.json", gpt2 / "vocab.json")
    assert "vocab.json without merges.txt" in str(_error(gpt2))


def test_a_tokenizer_larger_than_the_model(gpt2):
    optional("tokenizers")
    shutil.copy(FIXTURE / "tokenizer.json", gpt2 / "tokenizer.json")
    _edit_config(gpt2, vocab_size=200)
    _edit_tensors(gpt2, lambda t: t.update({"wte.weight": t["wte.weight"][:200]}))
    assert "its tokenizer has 300 tokens but the model's vocabulary only 200" in str(_error(gpt2))
    config = GPTConfig(vocab_size=200, block_size=8, n_layer=1, n_head=1, n_embd=4)
    _, tokenizer = load_pretrained(FIXTURE)
    with pytest.raises(HFFormatError, match="300 tokens but the model's vocabulary only 200"):
        save_pretrained(GPT(config), tokenizer, gpt2.parent / "out")


def test_bpe_without_the_tokenizers_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now fails
    for call in (
        lambda: train_bpe("some text", 300),
        lambda: build_tokenizer("bpe", "some text"),
        lambda: tokenizer_from_dict({"type": "bpe", "tokenizer_json": "{}"}),
        lambda: load_pretrained(FIXTURE),
    ):
        with pytest.raises(
            MissingDependencyError, match=r"the glassllm\[hf\] extra: pip install -e '\.\[hf\]'"
        ) as err:
            call()
        assert isinstance(err.value, ValueError) and isinstance(err.value, ImportError)


def test_bpe_vocabulary_sizes():
    with pytest.raises(ValueError, match="vocab_size >= 257"):
        train_bpe("some text", 256)
    with pytest.raises(ValueError, match="integer"):
        train_bpe("some text", 300.0)
    with pytest.raises(ValueError, match="for the 'bpe' tokenizer only"):
        build_tokenizer("byte", "some text", vocab_size=300)
