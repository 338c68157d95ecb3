"""Fuzzing a Hugging Face directory: a fixed-seed set of mutations of the committed fixture's
config.json (values and structure), model.safetensors (header bytes, header JSON, lengths),
shard index and tokenizer files. Each case loads, or raises HFFormatError with a one-line
message (FileNotFoundError or MissingDependencyError being the other documented errors), at
once; a directory that loads holds exactly what the reference safetensors reader reads."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from conftest import optional

from glassllm.data import MissingDependencyError
from glassllm.hf import HFFormatError, load_pretrained, model_from_hf, name_from_hf

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"
SEED = 20261130
CASES = 400
# JSON texts of values no GPT-2 file holds: wrong types, bounds, numbers Python cannot hold.
VALUES = ["0", "-1", "1", "2", "3", "1024", "1025", "65537", "2.0", "1e-05", "1e400", "-1e400",
          "1" + "0" * 400, "9" * 5000, "NaN", "Infinity", "true", "false", "null", '"x"', '""',
          "[]", "[1, 2]", "[1.5, 2]", "[-1, 8]", "[0, 18446744073709551616]", "{}",
          '{"a": 1}', "[" * 3000 + "]" * 3000, "[" * 70 + "]" * 70]  # fmt: skip
CONFIG_KEYS = ["model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
               "n_inner", "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
               "scale_attn_weights", "add_cross_attention", "n_ctx"]  # fmt: skip
LLAMA_CONFIG_KEYS = ["model_type", "vocab_size", "hidden_size", "intermediate_size",
                     "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "rms_norm_eps", "hidden_act", "tie_word_embeddings", "rope_parameters",
                     "rope_theta", "rope_scaling", "attention_bias", "mlp_bias",
                     "max_position_embeddings"]  # fmt: skip
LLAMA_TENSOR_NAMES = [
    "model.layers.99.input_layernorm.weight", "lm_head.weight", "embed_out.weight",
    "model.layers.0.self_attn.rotary_emb.inv_freq", "model.norm.bias",
    "model.layers.0.self_attn.q_proj.bias", "layers.0.mlp.up_proj.weight",
    "model.layers.1.self_attn.q_norm.weight",
]  # fmt: skip
TENSOR_NAMES = ["h.99.ln_1.weight", "h.2.ln_1.weight", "transformer.wte.weight", "h.01.ln_1.bias",
                "lm_head.weight", "h.0.attn.bias", "", "__metadata__",
                "h." + "9" * 5000 + ".x"]  # fmt: skip


def _set_raw(text: str, key: str, raw: str) -> str:
    value = json.loads(text)
    if not isinstance(value, dict):
        return text
    value[key] = "@@HOLE@@"
    return json.dumps(value).replace('"@@HOLE@@"', raw)


def _flip(data: bytes, rng, start: int = 0, end: int | None = None) -> bytes:
    end = len(data) if end is None else end
    if end <= start:
        return data
    at = int(rng.integers(start, end))
    flipped = bytearray(data)
    flipped[at] ^= 1 << int(rng.integers(0, 8))
    return bytes(flipped)


def _split(data: bytes) -> tuple[int, bytes, bytes]:
    length = int.from_bytes(data[:8], "little")
    return length, data[8 : 8 + length], data[8 + length :]


def _join(header: bytes, body: bytes, length: int | None = None) -> bytes:
    return (len(header) if length is None else length).to_bytes(8, "little") + header + body


def mutate(directory: Path, rng, config_keys=CONFIG_KEYS, tensor_names=TENSOR_NAMES) -> str:
    """Apply one random mutation to the copy ``directory``; return its description."""
    config, weights = directory / "config.json", directory / "model.safetensors"
    kind = int(rng.integers(0, 12))
    if kind == 0:
        key, raw = rng.choice(config_keys), rng.choice(VALUES)
        config.write_text(_set_raw(config.read_text(), str(key), str(raw)))
        return f"config {key}={raw[:20]}"
    if kind == 1:
        text = config.read_text()
        choice = int(rng.integers(0, 5))
        if choice == 0:
            config.write_text(text[: int(rng.integers(0, len(text)))])
        elif choice == 1:
            config.write_bytes(_flip(text.encode(), rng))
        elif choice == 2:
            config.write_text(str(rng.choice(VALUES)))
        elif choice == 3:
            value = json.loads(text)
            del value[str(rng.choice(sorted(value)))]
            config.write_text(json.dumps(value))
        else:
            config.write_text(text.replace("{", '{"n_layer": 3,', 1))  # a key twice
        return f"config structure {choice}"
    data = weights.read_bytes()
    length, header, body = _split(data)
    if kind == 2:  # a flipped bit in the header
        weights.write_bytes(_flip(data, rng, 0, 8 + length))
        return "header bit"
    if kind == 3:  # a flipped bit in the data: loads (safetensors has no checksum)
        weights.write_bytes(_flip(data, rng, 8 + length))
        return "data bit"
    if kind == 4:
        choice = int(rng.integers(0, 4))
        new = [length + int(rng.integers(-9, 10)), 2**64 - 1, 0, 2**63][choice]
        weights.write_bytes(_join(header, body, max(0, new) % 2**64))
        return f"header length {new}"
    if kind == 5:
        cut = int(rng.integers(0, len(data)))
        weights.write_bytes(data[:cut] if rng.random() < 0.7 else data + b"\0" * cut)
        return f"size {cut}"
    entries = json.loads(header)
    names = sorted(n for n in entries if n != "__metadata__")
    if kind == 6:
        name, field = rng.choice(names), rng.choice(["dtype", "shape", "data_offsets"])
        raw = str(rng.choice(VALUES + ['"BF16"', '"I64"', '"F8_E4M3"', "[300, 16]", "[0]"]))
        text = _set_raw(json.dumps(entries[name]), str(field), raw)
        weights.write_bytes(_join(header.replace(json.dumps(entries[name]).encode(),
                                                 text.encode()), body))  # fmt: skip
        if json.dumps(entries[name]).encode() not in header:  # written compactly: rebuild
            entries[name] = "@@E@@"
            weights.write_bytes(_join(json.dumps(entries).replace('"@@E@@"', text).encode(),
                                      body))  # fmt: skip
        return f"entry {name}.{field}={raw[:20]}"
    if kind == 7:
        name = str(rng.choice(names))
        new = str(rng.choice(tensor_names))
        info = entries.pop(name)
        if new != "__metadata__":
            entries[new] = info
        weights.write_bytes(_join(json.dumps(entries).encode(), body))
        return f"rename {name} -> {new[:20]}"
    if kind == 8:
        raw = str(rng.choice(VALUES + ['{"format": "pt"}', '{"a": 1}']))
        weights.write_bytes(_join(_set_raw(json.dumps(entries), "__metadata__", raw).encode(),
                                  body))  # fmt: skip
        return f"metadata {raw[:20]}"
    if kind == 9:  # shards named by a hostile index
        shards = ["../model.safetensors", "/etc/passwd", "model.safetensors", "x.safetensors",
                  ".safetensors", "..", "a/../model.safetensors", "nul\0.safetensors",
                  "model.safetensors/", None, 7, ["a"], {"a": 1}]  # fmt: skip
        shard = shards[int(rng.integers(0, len(shards)))]
        weights.rename(directory / "model-1.safetensors")
        weight_map = {n: shard if rng.random() < 0.5 else "model-1.safetensors" for n in names}
        index = {"weight_map": weight_map} if rng.random() < 0.8 else rng.choice(VALUES)
        (directory / "model.safetensors.index.json").write_text(
            index if isinstance(index, str) else json.dumps(index)
        )
        return f"index {shard!r}"
    tokenizer = directory / "tokenizer.json"
    if kind == 10:
        text = tokenizer.read_text(encoding="utf-8")
        choice = int(rng.integers(0, 3))
        if choice == 0:
            tokenizer.write_bytes(_flip(text.encode(), rng))
        elif choice == 1:
            tokenizer.write_text(text[: int(rng.integers(0, len(text)))], encoding="utf-8")
        else:
            key = str(rng.choice(["model", "version", "added_tokens", "decoder", "normalizer"]))
            tokenizer.write_text(_set_raw(text, key, str(rng.choice(VALUES))), encoding="utf-8")
        return f"tokenizer.json {choice}"
    tokenizer.unlink()  # vocab.json + merges.txt are read instead
    target = directory / str(rng.choice(["vocab.json", "merges.txt"]))
    original = target.read_bytes()
    choice = int(rng.integers(0, 3))
    if choice == 0:
        target.write_bytes(_flip(original, rng))
    elif choice == 1:
        target.write_bytes(original[: int(rng.integers(0, len(original)))])
    else:
        target.write_text(str(rng.choice(VALUES)))
    return f"{target.name} {choice}"


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


def _reference_tensors(directory: Path) -> dict[str, np.ndarray]:
    files = sorted(directory.glob("*.safetensors"))
    tensors = {}
    for file in files:
        tensors.update(safetensors.numpy.load_file(file))
    return tensors


@pytest.fixture(scope="module")
def llama_fixture(tmp_path_factory) -> Path:
    """A Llama-style directory (GQA, untied head, llama3 rope scaling, q/k/v biases) written by
    glassllm's exporter: tokenizer files as for GPT-2, tensors in torch's layout."""
    optional("tokenizers")
    from glassllm.data import train_bpe
    from glassllm.hf import save_pretrained
    from glassllm.models import GPT
    from glassllm.models.config import llama_config

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}  # fmt: skip
    config = llama_config(vocab_size=300, block_size=32, n_layer=2, n_head=4, n_embd=16,
                          tied_head=False, qkv_bias=True, rope_scaling=scaling)  # fmt: skip
    tokenizer = train_bpe("def f(x):\n    return x + 1\n" * 40, 300)
    out = tmp_path_factory.mktemp("llama_fuzz") / "llama"
    return save_pretrained(GPT(config, rng=np.random.default_rng(0)), tokenizer, out)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_mutated_directories_load_or_raise_the_documented_error(tmp_path, request, family):
    fixture = FIXTURE if family == "gpt2" else request.getfixturevalue("llama_fixture")
    keys = (CONFIG_KEYS, TENSOR_NAMES) if family == "gpt2" else (LLAMA_CONFIG_KEYS,
                                                                  LLAMA_TENSOR_NAMES)  # fmt: skip
    optional("tokenizers")  # the tokenizer files are fuzzed too
    rng = np.random.default_rng(SEED)
    outcomes: dict[str, int] = {}
    previous = signal.signal(signal.SIGALRM, _alarm)
    start = time.perf_counter()
    try:
        for case in range(CASES):
            directory = tmp_path / str(case)
            shutil.copytree(fixture, directory)
            what = mutate(directory, rng, *keys)
            signal.setitimer(signal.ITIMER_REAL, 5.0)
            try:
                model, _ = load_pretrained(directory, require_tokenizer=True)
                outcome = "loaded"
            except HFFormatError as err:
                message = str(err)
                assert "\n" not in message and len(message) < 4000, (what, message[:500])
                outcome = "HFFormatError"
            except (FileNotFoundError, MissingDependencyError) as err:
                outcome = type(err).__name__
            except _Hang:
                pytest.fail(f"case {case} ({what}): no answer within 5 s")
            except BaseException as err:  # anything else is a bug
                raise AssertionError(f"case {case} ({what}): {type(err).__name__}: {err}") from err
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if outcome == "loaded" and family != "gpt2":  # what the reference reader reads
                config = json.loads((directory / "config.json").read_text())
                params = dict(model.named_parameters())
                reference = model_from_hf(config, _reference_tensors(directory), "reference")
                for name, value in reference.state_dict().items():
                    assert np.array_equal(params[name].data, value, equal_nan=True), (what, name)
            elif outcome == "loaded":  # exactly what the reference reader reads from the files
                params = dict(model.named_parameters())
                for name, value in _reference_tensors(directory).items():
                    if name_from_hf(name) in params:
                        param = params[name_from_hf(name)].data
                        expected = value.astype(np.float32)
                        assert np.array_equal(param, expected, equal_nan=True), (what, name)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            shutil.rmtree(directory)
    finally:
        signal.signal(signal.SIGALRM, previous)
    elapsed = time.perf_counter() - start
    assert outcomes["loaded"] > 10 and outcomes["HFFormatError"] > CASES // 2, outcomes
    assert elapsed < 30, elapsed  # about 2.5 s on one core
