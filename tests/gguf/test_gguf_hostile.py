"""Hostile GGUF files: every malformed header raises GGUFFormatError (one line naming the file
and the field) before anything is sized from it, at no more cost than reading the header; what
the file asks for that glassllm cannot honour is refused by name. No gguf package needed: the
files are written byte by byte (gguf_files.py)."""

from __future__ import annotations

import os
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from gguf_files import (
    ARRAY,
    STRING,
    U64,
    Tensor,
    Typed,
    f32_tensor,
    gguf_bytes,
    tiny_llama,
    write_gguf,
)

from glassllm.gguf import GGUFFormatError, hf_config, read_header
from glassllm.gguf.convert import tensor_names

PEAK_BYTES = 16 * 2**20  # what refusing any file below may allocate


def refused(path: Path, *words: str) -> str:
    """The one-line message of reading ``path``, checked to name the file and ``words``."""
    tracemalloc.start()
    try:
        with pytest.raises(GGUFFormatError) as caught:
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    for word in words:
        assert word in message, (word, message)
    assert peak < PEAK_BYTES, f"refusing took {peak:,} bytes"
    return message


@pytest.fixture
def honest(tmp_path):
    """A tiny, well-formed Llama GGUF: (path, metadata, tensors)."""
    meta, tensors = tiny_llama(np.random.default_rng(0))
    return write_gguf(tmp_path / "tiny.gguf", meta, tensors), meta, tensors


def test_the_honest_file_reads(honest):
    path, meta, tensors = honest
    header = read_header(path)
    assert header.metadata["llama.block_count"] == 1
    assert header.metadata["tokenizer.ggml.tokens"] == meta["tokenizer.ggml.tokens"]
    assert [t.name for t in tensors] == list(header.tensors)
    embd = header.tensors["token_embd.weight"]
    assert embd.shape == (6, 8) and embd.type_name == "F32" and embd.start % 32 == 0
    values = np.frombuffer(header.raw(embd).tobytes(), "<f4").reshape(6, 8)
    np.testing.assert_array_equal(values, np.frombuffer(tensors[0].data, "<f4").reshape(6, 8))


def test_not_gguf(tmp_path):
    refused(write_gguf(tmp_path / "m.gguf", {}, magic=b"GGML"), "not a GGUF file")
    (tmp_path / "short.gguf").write_bytes(b"GGUF\x03")
    refused(tmp_path / "short.gguf", "truncated", "5 bytes")
    (tmp_path / "empty.gguf").write_bytes(b"")
    refused(tmp_path / "empty.gguf", "truncated")
    refused(tmp_path / "missing.gguf", "unreadable")
    (tmp_path / "dir.gguf").mkdir()
    refused(tmp_path / "dir.gguf", "not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.gguf")
    refused(tmp_path / "pipe.gguf", "not a regular file")


@pytest.mark.parametrize("version", [1, 4, 2**31])
def test_unknown_versions(tmp_path, version):
    refused(write_gguf(tmp_path / "v.gguf", {}, version=version), "version", str(version))


def test_truncated_anywhere(honest, tmp_path):
    """Cut at every 97th byte: the header or a tensor's data ends early, never another error."""
    path, _, _ = honest
    data = path.read_bytes()
    for cut in range(24, len(data) - 1, 97):
        short = tmp_path / "cut.gguf"
        short.write_bytes(data[:cut])
        message = refused(short)
        assert any(
            words in message
            for words in ("the file ends", "more than the file can hold", "past the end")
        ), message
    short.write_bytes(data[:-1])
    refused(short, "output_norm.weight", "past the end of the file")


@pytest.mark.parametrize("counts", [(0, 2**60), (2**60, 0), (2**20 + 1, 0)])
def test_absurd_counts(tmp_path, counts):
    refused(write_gguf(tmp_path / "c.gguf", {}, counts=counts), "claims", "more than the file")


def test_huge_arrays_and_strings(tmp_path):
    lie = Typed(ARRAY, ["a"], element_type=STRING, count=2**60)
    refused(
        write_gguf(tmp_path / "a.gguf", {"tokenizer.ggml.tokens": lie}),
        "tokenizer.ggml.tokens",
        "more than the",
    )
    lie = Typed(ARRAY, [1, 2], element_type=U64, count=2**22)  # within the bound, past the end
    refused(write_gguf(tmp_path / "b.gguf", {"x.ids": lie}), "x.ids", "the file ends")
    lie = Typed(ARRAY, ["a"], element_type=STRING, count=2**22)
    refused(write_gguf(tmp_path / "c.gguf", {"x.names": lie}), "x.names", "the file ends")
    refused(
        write_gguf(tmp_path / "d.gguf", {"general.name": Typed(STRING, "x", count=2**62)}),
        "general.name",
        "more than the",
    )
    refused(
        write_gguf(tmp_path / "e.gguf", {"general.name": Typed(STRING, "x", count=2**20)}),
        "general.name",
        "the file ends",
    )


def test_malformed_metadata(tmp_path):
    refused(write_gguf(tmp_path / "a.gguf", {"k": Typed(13, b"")}), "k has value type 13")
    nested = Typed(ARRAY, [], element_type=ARRAY, count=1)
    refused(write_gguf(tmp_path / "b.gguf", {"nested": nested}), "nested", "array of type 9")
    data = gguf_bytes({"ab": 1, "cd": 2}).replace(b"cd", b"ab")
    (tmp_path / "c.gguf").write_bytes(data)
    refused(tmp_path / "c.gguf", "'ab' is given twice")
    data = gguf_bytes({"ab": "\u00e9"}).replace("\u00e9".encode(), b"\xff\xfe")
    (tmp_path / "d.gguf").write_bytes(data)
    refused(tmp_path / "d.gguf", "ab is not UTF-8")
    for bad in (0, 3, 2**21):
        path = write_gguf(tmp_path / "e.gguf", {"general.alignment": bad})
        refused(path, "general.alignment", "power of two")


def tensor(name: str = "t", dims=(32, 2), ggml_type: int = 0, offset=None, nbytes=None) -> Tensor:
    size = nbytes if nbytes is not None else int(np.prod(dims)) * 4
    return Tensor(name, list(dims), ggml_type, bytes(size), offset)


def test_tensors_past_the_end_or_absurd(tmp_path):
    def write(*tensors: Tensor) -> Path:
        return write_gguf(tmp_path / "t.gguf", {}, list(tensors))

    refused(write(tensor(offset=2**40, nbytes=0)), "tensor 't'", "past the end of the file")
    refused(write(tensor(offset=2**64 - 32, nbytes=0)), "past the end of the file")
    refused(write(tensor(dims=(2**40, 2**40), nbytes=0)), "past the end of the file")
    refused(write(tensor(dims=(2**63, 2**63, 2**63, 2**63), nbytes=0)), "past the end")
    refused(write(tensor(dims=(4, 0))), "empty dimension")
    refused(write(tensor(dims=(1,) * 5)), "5 dimensions")
    refused(write(tensor(offset=4, nbytes=0)), "not a multiple of the alignment 32")
    refused(write(tensor(ggml_type=20, nbytes=0)), "IQ4_NL", "does not read", "Q4_K")
    refused(write(tensor(ggml_type=77, nbytes=0)), "type 77")
    refused(write(tensor(dims=(33, 1), ggml_type=2, nbytes=0)), "33", "Q4_0 blocks of 32")
    refused(write(tensor("a"), tensor("a")), "'a' is given twice")
    refused(write(tensor("a", offset=0), tensor("b", offset=32, nbytes=0)), "'a' and 'b' overlap")
    many = [tensor(f"t{i}", offset=2**40 + 256 * i, nbytes=0) for i in range(30)]
    message = refused(write(*many), "and 20 more problems")
    assert message.count("past the end") == 10


def test_a_dimension_count_of_2_to_the_32(tmp_path):
    """n_dims itself is held to 1..4 before the dimensions are read."""
    data = bytearray(gguf_bytes({}, [tensor()]))
    at = data.index(b"t", 24) + 1  # after the name: the u32 n_dims
    data[at : at + 4] = struct.pack("<I", 2**32 - 1)
    (tmp_path / "n.gguf").write_bytes(bytes(data))
    refused(tmp_path / "n.gguf", "4,294,967,295 dimensions")


# ---------------------------------------------------------------------------- the model's terms


def config_refused(path: Path, *words: str) -> None:
    with pytest.raises(GGUFFormatError) as caught:
        header = read_header(path)
        tensor_names(header, hf_config(header))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    for word in words:
        assert word in message, (word, message)


def test_architectures_and_keys_it_cannot_honour_are_named(tmp_path):
    meta, tensors = tiny_llama(np.random.default_rng(0))

    def write(edit: dict, extra: list[Tensor] = ()) -> Path:
        return write_gguf(tmp_path / "m.gguf", {**meta, **edit}, [*tensors, *extra])

    config_refused(write({"general.architecture": "mamba"}), "'mamba'", "llama, qwen2")
    config_refused(write({"general.architecture": "gpt2"}), "'gpt2' model")
    config_refused(write({"llama.rope.scaling.type": "yarn"}), "llama.rope.scaling.type = 'yarn'")
    config_refused(write({"llama.expert_count": 8}), "llama.expert_count")
    config_refused(write({"llama.rope.dimension_count": 2}), "llama.rope.dimension_count = 2")
    config_refused(
        write({"llama.attention.head_count": "9"}), "head_count must be a positive number"
    )
    config_refused(write({"llama.embedding_length": 0}), "embedding_length must be a positive")
    config_refused(write({"split.count": 2}), "split.count", "several files")
    no_blocks = {k: v for k, v in meta.items() if k != "llama.block_count"}
    path = write_gguf(tmp_path / "n.gguf", no_blocks, tensors)
    config_refused(path, "no llama.block_count")
    freqs = f32_tensor("rope_freqs.weight", np.ones(2, np.float32))
    config_refused(write({}, [freqs]), "rope_freqs.weight")
    config_refused(
        write({}, [f32_tensor("blk.7.attn_q.weight", np.ones((8, 8), np.float32))]), "blk.7"
    )


def test_a_config_and_tensors_that_disagree(tmp_path):
    optional("gguf")
    optional("tokenizers")
    from glassllm.gguf import read_gguf

    meta, tensors = tiny_llama(np.random.default_rng(0))
    path = write_gguf(tmp_path / "m.gguf", {**meta, "llama.feed_forward_length": 12}, tensors)
    with pytest.raises(
        GGUFFormatError, match=r"ffn_gate.weight is 16 x 8, the config implies 12 x 8"
    ):
        read_gguf(path)


def test_without_the_gguf_package_one_line_names_the_extra(honest, monkeypatch):
    import builtins

    from glassllm.data.bpe import MissingDependencyError
    from glassllm.gguf import read_gguf

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf" or name.startswith("gguf."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(
        MissingDependencyError,
        match=r"gguf package: the glassllm\[gguf\] extra: pip install -e '\.\[gguf\]'",
    ):
        read_gguf(honest[0])
    read_header(honest[0])  # the header needs no package


def test_only_gguf_files_are_taken_for_gguf(tmp_path, honest):
    from glassllm.gguf import is_gguf_path

    assert is_gguf_path(honest[0]) and is_gguf_path(tmp_path / "missing.gguf")
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(honest[0].read_bytes())
    assert is_gguf_path(renamed)
    (tmp_path / "ckpt.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert not is_gguf_path(tmp_path / "ckpt.safetensors")
    assert not is_gguf_path(tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        assert not is_gguf_path(tmp_path / "pipe")  # never opened: it would block
