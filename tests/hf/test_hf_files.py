"""Hugging Face GPT-2 directories on disk: the committed fixture, export -> load, and every error.

These run without torch, transformers or tokenizers (tests needing tokenizers say so)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from conftest import optional

import glassllm
import glassllm.nn.init as nn_init
from glassllm.hf import (
    HFFormatError,
    is_pretrained_path,
    load_model,
    load_pretrained,
    name_from_hf,
    save_pretrained,
)
from glassllm.models import GPT, GPTConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"
EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny.expected.npz"
PROMPTS = ["def f(x):\n    return", "The quick brown fox"]  # as make_gpt2_fixture.py


def tiny(bias: bool = True, seed: int = 0) -> GPT:
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=8, bias=bias)
    model = GPT(config, rng=np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    for p in model.parameters():  # no parameter left at an initial constant
        p.data += rng.standard_normal(p.shape).astype(np.float32) * 0.1
    return model.eval()


# ---------------------------------------------------------------------------- the fixture


@pytest.mark.parametrize("target", [FIXTURE, FIXTURE / "model.safetensors"])
def test_fixture_matches_transformers_logits_and_greedy_ids(target):
    expected = np.load(EXPECTED)
    model = load_model(target)
    assert model.config == GPTConfig(
        vocab_size=300, block_size=32, n_layer=2, n_head=2, n_embd=16, bias=True
    )
    assert not model.training and model.wte.weight.dtype == np.float32
    logits = model(expected["input_ids"])[0].data
    assert np.abs(logits - expected["logits"]).max() < 1e-5
    width = expected["input_ids"].shape[1]
    for use_cache in (True, False):
        ids = model.generate(expected["input_ids"], 20, top_k=1, use_cache=use_cache)
        assert np.array_equal(ids, expected["greedy_ids"]), use_cache
    assert expected["greedy_ids"].shape[1] == width + 20


def test_fixture_tokenizer_from_tokenizer_json_and_from_vocab_merges(tmp_path):
    optional("tokenizers")
    expected = np.load(EXPECTED)
    width = expected["input_ids"].shape[1]
    model, tokenizer = load_pretrained(FIXTURE)
    assert tokenizer.vocab_size == model.config.vocab_size == 300
    for row, prompt in zip(expected["input_ids"], PROMPTS, strict=True):
        assert tokenizer.encode(prompt)[:width] == row.tolist()
    legacy = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, legacy)
    (legacy / "tokenizer.json").unlink()
    _, from_pair = load_pretrained(legacy)
    text = "def naïve(x):\n    return x  # 日本 <|endoftext|>"
    assert from_pair.encode(text) == tokenizer.encode(text)
    assert from_pair.decode(from_pair.encode(text)) == text


# ---------------------------------------------------------------------------- export -> load


@pytest.mark.parametrize("bias", [True, False])
def test_export_then_load_is_bit_identical(tmp_path, bias):
    model = tiny(bias)
    out = save_pretrained(model, None, tmp_path / "exported")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]  # not safetensors' own 0o600
    loaded = load_model(out)
    state, back = model.state_dict(), loaded.state_dict()
    for name, value in back.items():
        assert np.array_equal(value, state.get(name, np.zeros_like(value))), name
    idx = np.random.default_rng(0).integers(0, 40, size=(2, 16))
    assert np.array_equal(model(idx)[0].data, loaded(idx)[0].data)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_export_refuses_a_non_empty_directory_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    save_pretrained(tiny(), None, out)  # an empty directory is fine
    with pytest.raises(HFFormatError, match="exists and is not empty"):
        save_pretrained(tiny(seed=3), None, out)
    assert np.array_equal(load_model(out).wte.weight.data, tiny().wte.weight.data)
    (out / "stale.txt").write_text("from before")
    save_pretrained(tiny(seed=3), None, out, overwrite=True)
    assert not (out / "stale.txt").exists()
    assert np.array_equal(load_model(out).wte.weight.data, tiny(seed=3).wte.weight.data)
    with pytest.raises(HFFormatError, match="not a directory"):
        save_pretrained(tiny(), None, out / "config.json", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_replaces_only_a_model_directory_holding_neither_source_nor_cwd(
    tmp_path, monkeypatch
):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    with pytest.raises(HFFormatError, match="no config.json"):
        save_pretrained(tiny(), None, mine, overwrite=True)
    (mine / "config.json").write_text("{}")
    monkeypatch.chdir(mine / ".")
    with pytest.raises(HFFormatError, match="holds the working directory"):
        save_pretrained(tiny(), None, mine, overwrite=True)
    monkeypatch.chdir(tmp_path)
    (mine / "sub").mkdir()
    with pytest.raises(HFFormatError, match="holds the model's source"):
        save_pretrained(tiny(), None, tmp_path / "." / "mine", overwrite=True, source=mine / "sub")
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "keep.txt", "sub"]
    save_pretrained(tiny(), None, mine, overwrite=True, source=tmp_path / "elsewhere")
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(tiny(), None, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_loading_draws_no_random_numbers_and_leaves_initialisation_on(tmp_path):
    out = save_pretrained(tiny(), None, tmp_path / "m")
    before = glassllm.manual_seed(7).bit_generator.state
    load_model(out)
    assert glassllm.get_rng().bit_generator.state == before
    assert not nn_init.init_skipped()
    assert GPT(tiny().config, rng=np.random.default_rng(0)).wte.weight.data.std() > 0.01


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file written by hand: {name: (dtype name, raw array)}; allows BF16."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, raw) in tensors.items():
        data = np.ascontiguousarray(raw).tobytes()
        offsets = [offset, offset + len(data)]
        header[name] = {"dtype": dtype, "shape": list(raw.shape), "data_offsets": offsets}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def _bf16_exact(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F64"])
def test_half_and_double_precision_files_load_as_float32(tmp_path, dtype):
    model = tiny()
    out = save_pretrained(model, None, tmp_path / "m")
    tensors = safetensors.numpy.load_file(out / "model.safetensors")
    if dtype == "F16":
        values = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
        raw = {k: ("F16", v.astype(np.float16)) for k, v in values.items()}
    elif dtype == "BF16":
        values = {k: _bf16_exact(v) for k, v in tensors.items()}
        raw = {k: ("BF16", (v.view(np.uint32) >> 16).astype(np.uint16)) for k, v in values.items()}
    else:
        values = tensors
        raw = {k: ("F64", v.astype(np.float64)) for k, v in tensors.items()}
    _write_safetensors(out / "model.safetensors", raw)
    loaded = load_model(out).state_dict()
    for name, value in values.items():
        ours = name_from_hf(name)
        assert loaded[ours].dtype == np.float32 and np.array_equal(loaded[ours], value), name


def test_sharded_weights(tmp_path):
    model = tiny()
    out = save_pretrained(model, None, tmp_path / "m")
    tensors = safetensors.numpy.load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-1.safetensors": names[:10], "model-2.safetensors": names[10:]}
    for file, part in shards.items():
        safetensors.numpy.save_file({k: tensors[k] for k in part}, str(out / file))
    weight_map = {k: file for file, part in shards.items() for k in part}
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert np.array_equal(load_model(out).wte.weight.data, model.wte.weight.data)


def test_is_pretrained_path(tmp_path):
    out = save_pretrained(tiny(), None, tmp_path / "m")
    assert is_pretrained_path(out) and is_pretrained_path(out / "model.safetensors")
    ours = out / "ckpt.safetensors"
    glassllm.save(ours, tiny())
    assert not is_pretrained_path(ours)
    assert not is_pretrained_path(out / "config.json")


def test_kv_cache_generation_at_block_size_1024(tmp_path):
    config = GPTConfig(vocab_size=50, block_size=1024, n_layer=1, n_head=2, n_embd=8, bias=True)
    model = GPT(config, rng=np.random.default_rng(0))
    for p in model.parameters():
        p.data *= 20.0  # logits far apart: greedy ids do not hinge on rounding
    model = load_model(save_pretrained(model, None, tmp_path / "m"))
    prompt = np.random.default_rng(1).integers(0, 50, size=(1, 1012))
    cached = model.generate(prompt, 24, top_k=1)  # fills the window, then slides past it
    assert np.array_equal(cached, model.generate(prompt, 24, top_k=1, use_cache=False))
    assert cached.shape == (1, 1036)


def test_float64_load():
    expected = np.load(EXPECTED)
    model = load_model(FIXTURE, dtype=np.float64)
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert np.abs(model(expected["input_ids"])[0].data - expected["logits"]).max() < 1e-5
