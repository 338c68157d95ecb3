"""Hostile Hugging Face directories: every malformed file raises HFFormatError (one line, every
problem), costs no more than reading it, and reads nothing outside the model directory; the
command says so in one line with exit status 2."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import optional

from glassllm.app.cli import main
from glassllm.hf import HFFormatError, load_pretrained

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"


def copy_fixture(directory: Path) -> Path:
    shutil.copytree(FIXTURE, directory)
    return directory


def edit_config_text(directory: Path, key: str, raw: str) -> None:
    """Set ``key`` to the JSON text ``raw`` (which json.dumps could not write, e.g. 10**400)."""
    config = json.loads((directory / "config.json").read_text())
    config[key] = "@@"
    (directory / "config.json").write_text(json.dumps(config).replace('"@@"', raw))


def header_of(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def write_header(path: Path, header: bytes, body: bytes) -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + body)


def edit_header(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    header, body = header_of(path)
    edit(header)
    write_header(path, json.dumps(header).encode(), body)


def first_weight(header: dict) -> str:
    return next(n for n in header if n == "wte.weight")


# A hostile file is refused before any work its contents ask for: no model is built, and the
# memory the refusal takes stays far below what the file claims (10**8 layers, shapes of 10**4000).
# Counted, not timed: the same on a loaded machine as on a quiet one.
PEAK_BYTES = 64 * 2**20  # the biggest case reads a 5 MiB config file


@contextmanager
def refused_cheaply(monkeypatch):
    """Assert that the body builds no GPT and allocates at most PEAK_BYTES at its peak."""
    from glassllm.models import gpt

    built = []
    original_init = gpt.GPT.__init__

    def counting_init(self, *args, **kwargs):
        built.append(args)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(gpt.GPT, "__init__", counting_init)
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not built, f"a model was built for a hostile file: {built}"
    assert peak < PEAK_BYTES, f"refusing the file took {peak:,} bytes at its peak"


def deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def _float_offsets(header):
    header["wte.weight"]["data_offsets"] = [float(x) for x in header["wte.weight"]["data_offsets"]]


def _raw_deep_header(directory):
    path = directory / "model.safetensors"
    _, body = header_of(path)
    write_header(path, f'{{"x": {deep()}}}'.encode(), body)


def _overlapping(header):
    """Every block tensor of a kind points at the same bytes: a small file claiming a big model."""
    header["h.1.mlp.c_fc.weight"]["data_offsets"] = header["h.0.mlp.c_fc.weight"]["data_offsets"]


def _head_instead_of_wte(header):
    header["lm_head.weight"] = header.pop("wte.weight")


HOSTILE = {
    "lm_head, no wte": (lambda d: edit_header(d, _head_instead_of_wte), "missing tensors: wte"),
    "n_layer 10**8": (lambda d: edit_config_text(d, "n_layer", str(10**8)), "n_layer"),
    "n_layer 1000": (lambda d: edit_config_text(d, "n_layer", "1000"), "n_layer=1000"),
    "n_embd too wide": (lambda d: edit_config_text(d, "n_embd", str(2**20)), "n_embd"),
    "vocab not wte's": (lambda d: edit_config_text(d, "vocab_size", "301"), "wte.weight"),
    "positions not wpe's": (lambda d: edit_config_text(d, "n_positions", "64"), "wpe.weight"),
    "deep config": (lambda d: (d / "config.json").write_text(f'{{"x": {deep()}}}'), "nested"),
    "deep config value": (lambda d: edit_config_text(d, "n_inner", deep(500)), "config.json"),
    "eps 10**400": (lambda d: edit_config_text(d, "layer_norm_epsilon", "1" + "0" * 400), "eps"),
    "huge int": (lambda d: edit_config_text(d, "n_layer", "9" * 5000), "config.json"),
    "duplicate key": (
        lambda d: (d / "config.json").write_text(
            '{"model_type": "gpt2", "n_layer": 2, "n_layer": 3}'
        ),
        "n_layer",
    ),  # fmt: skip
    "huge config": (
        lambda d: (d / "config.json").write_text('{"x": "' + "a" * 5 * 2**20 + '"}'),
        "larger than 4,194,304 bytes",
    ),
    "deep header": (_raw_deep_header, "nested"),
    "shape of huge numbers": (
        lambda d: edit_header(d, lambda h: h["wte.weight"].update(shape=[10**4000] * 2000)),
        "malformed entries",
    ),
    "metadata list": (
        lambda d: edit_header(d, lambda h: h.update(__metadata__=[1, 2])),
        "__metadata__",
    ),  # fmt: skip
    "float offsets": (lambda d: edit_header(d, _float_offsets), "wte.weight"),
    "overlapping tensors": (lambda d: edit_header(d, _overlapping), "overlap"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_raise_hf_format_error_at_once(tmp_path, monkeypatch, case):
    make, fragment = HOSTILE[case]
    directory = copy_fixture(tmp_path / "gpt2")
    make(directory)
    with refused_cheaply(monkeypatch), pytest.raises(HFFormatError) as caught:
        load_pretrained(directory)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 2000, message
    assert fragment in message, message


def test_the_guard_sees_a_model_being_built(tmp_path, monkeypatch):
    """refused_cheaply can fail: loading the intact fixture builds a model, and it says so."""
    with pytest.raises(AssertionError, match="a model was built"):
        with refused_cheaply(monkeypatch):
            optional("tokenizers")
            load_pretrained(copy_fixture(tmp_path / "gpt2"))


@pytest.mark.parametrize("case", ["n_layer 10**8", "deep config", "metadata list",
                                  "float offsets", "eps 10**400"])  # fmt: skip
def test_the_command_says_one_line_and_exits_2(tmp_path, capsys, monkeypatch, case):
    make, fragment = HOSTILE[case]
    directory = copy_fixture(tmp_path / "gpt2")
    make(directory)
    for path in (directory, directory / "model.safetensors"):
        with refused_cheaply(monkeypatch):
            status = main(["sample", "--checkpoint", str(path), "--max-new-tokens", "2"])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and lines[0].startswith("glassllm: error: "), err
        assert fragment in lines[0] and "try a smaller" not in lines[0], lines[0]


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/ABS/outside.safetensors", "sub/model.safetensors",
     "model.bin", "..", ".safetensors/..", "a\\..\\outside.safetensors", ["a"], None, 7],
)  # fmt: skip
def test_shard_names_cannot_leave_the_directory(tmp_path, shard):
    directory = copy_fixture(tmp_path / "gpt2")
    header, _ = header_of(directory / "model.safetensors")
    (directory / "sub").mkdir()
    shutil.copy(directory / "model.safetensors", directory / "sub" / "model.safetensors")
    (directory / "model.safetensors").rename(tmp_path / "outside.safetensors")
    if isinstance(shard, str):
        shard = shard.replace("/ABS", str(tmp_path))
    index = {"weight_map": {name: shard for name in header if name != "__metadata__"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HFFormatError, match="model.safetensors.index.json") as caught:
        load_pretrained(directory)
    assert "shard" in str(caught.value)


@pytest.mark.parametrize(
    "name, text",
    [("tokenizer.json", '{"model": {"type": "BPE", "vocab": [1, 2]}}'),
     ("tokenizer.json", "[" * 10_000), ("merges.txt", "#version: 0.2\nnot-a-pair\n")],
)  # fmt: skip
def test_a_malformed_tokenizer_file_is_an_hf_format_error(tmp_path, name, text):
    optional("tokenizers")
    directory = copy_fixture(tmp_path / "gpt2")
    if name != "tokenizer.json":
        (directory / "tokenizer.json").unlink()
    (directory / name).write_text(text)
    with pytest.raises(HFFormatError, match="unreadable tokenizer") as caught:
        load_pretrained(directory)
    assert "\n" not in str(caught.value)


def test_a_shard_named_plainly_loads(tmp_path):
    optional("tokenizers")  # loading builds the directory's tokenizer too
    directory = copy_fixture(tmp_path / "gpt2")
    header, _ = header_of(directory / "model.safetensors")
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    index = {"weight_map": {n: "model-00001-of-00001.safetensors" for n in header
                            if n != "__metadata__"}}  # fmt: skip
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    load_pretrained(directory)


def test_a_tensor_given_in_two_shards_is_refused(tmp_path):
    directory = copy_fixture(tmp_path / "gpt2")
    header, _ = header_of(directory / "model.safetensors")
    shutil.copy(directory / "model.safetensors", directory / "b.safetensors")
    (directory / "model.safetensors").rename(directory / "a.safetensors")
    names = [n for n in header if n != "__metadata__"]
    index = {"weight_map": {n: ("a" if i % 2 else "b") + ".safetensors"
                            for i, n in enumerate(names)}}  # fmt: skip
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HFFormatError, match="given twice"):
        load_pretrained(directory)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    directory = copy_fixture(tmp_path / "gpt2")
    fifo = directory / "fifo.safetensors"
    os.mkfifo(fifo)
    from glassllm.hf import is_pretrained_path
    from glassllm.hf.safetensors_file import read_header
    from glassllm.hf.untrusted import read_json

    assert is_pretrained_path(fifo)  # loading it says what is wrong
    with pytest.raises(HFFormatError, match="not a regular file"):
        read_header(str(fifo))
    with pytest.raises(HFFormatError, match="not a regular file"):
        read_json(fifo)
    with pytest.raises(HFFormatError):
        load_pretrained(fifo)


# ---------------------------------------------------------------------------- Llama-style files


@pytest.fixture(scope="module")
def llama_directory(tmp_path_factory) -> Path:
    """A Llama-style directory (GQA, untied head) written by glassllm's exporter, model only."""
    import numpy as np

    from glassllm.hf import save_pretrained
    from glassllm.models import GPT
    from glassllm.models.config import llama_config

    config = llama_config(vocab_size=300, block_size=32, n_layer=2, n_head=4, n_embd=16,
                          tied_head=False)  # fmt: skip
    out = tmp_path_factory.mktemp("hostile_llama") / "llama"
    return save_pretrained(GPT(config, rng=np.random.default_rng(0)), None, out)


def _rename(name, new):
    return lambda header: header.update({new: header.pop(name)})


def _shape(name, shape):
    return lambda header: header[name].update(shape=shape)


LLAMA_HOSTILE = {
    "num_hidden_layers 10**8": ("num_hidden_layers", str(10**8), "num_hidden_layers"),
    "num_hidden_layers 1000": ("num_hidden_layers", "1000", "weights hold 2 blocks"),
    "hidden_size too wide": ("hidden_size", str(2**20), "hidden_size"),
    "intermediate_size 2**30": ("intermediate_size", str(2**30), "intermediate_size"),
    "intermediate_size not the file's": ("intermediate_size", "4096", "mlp.up_proj.weight"),
    "kv heads not the file's": ("num_key_value_heads", "4", "self_attn.k_proj.weight"),
    "head_dim 2**20": ("head_dim", str(2**20), "head_dim"),
    "head_dim not the file's": ("head_dim", "64", "self_attn.q_proj.weight"),
    "vocab not the embedding's": ("vocab_size", "301", "model.embed_tokens.weight"),
    "context 2**40": ("max_position_embeddings", str(2**40), "max_position_embeddings"),
    "rope_theta 10**400": ("rope_parameters", '{"rope_theta": ' + "1" + "0" * 400 + "}",
                           "rope_theta"),
    "deep rope_parameters": ("rope_parameters", deep(500), "config.json"),
    "llama3 original 10**400": ("rope_scaling", '{"rope_type": "llama3", "factor": 8, '
                                '"low_freq_factor": 1, "high_freq_factor": 4, '
                                '"original_max_position_embeddings": 1' + "0" * 400 + "}",
                                "original_max_position_embeddings"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(LLAMA_HOSTILE))
def test_hostile_llama_configs_are_refused_at_once(llama_directory, tmp_path, monkeypatch, case):
    key, raw, fragment = LLAMA_HOSTILE[case]
    directory = tmp_path / "llama"
    shutil.copytree(llama_directory, directory)
    edit_config_text(directory, key, raw)
    with refused_cheaply(monkeypatch), pytest.raises(HFFormatError) as caught:
        load_pretrained(directory)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 2000, message
    assert fragment in message, message


@pytest.mark.parametrize(
    "edit, fragment",
    [(_shape("model.layers.0.self_attn.q_proj.weight", [10**6, 16]), "q_proj.weight"),
     (_shape("lm_head.weight", [16, 300]), "lm_head.weight (16, 300) (expected (300, 16))"),
     (_rename("model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.w.weight"),
      "missing tensors: model.layers.1.self_attn.v_proj.weight"),
     (_rename("model.norm.weight", "../model.norm.weight"),
      "unexpected tensors: ../model.norm.weight")],
)  # fmt: skip
def test_hostile_llama_tensors_are_refused_at_once(llama_directory, tmp_path, monkeypatch, edit,
                                                   fragment):  # fmt: skip
    directory = tmp_path / "llama"
    shutil.copytree(llama_directory, directory)
    edit_header(directory, edit)
    with refused_cheaply(monkeypatch), pytest.raises(HFFormatError) as caught:
        load_pretrained(directory)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
