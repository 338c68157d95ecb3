"""The tokenizer files of an export: a char or byte tokenizer is written without the
``tokenizers`` package, byte for byte as that library writes the same tokenizer."""

from __future__ import annotations

import sys

import pytest
from conftest import optional

from glassllm.data.bpe import byte_level_alphabet
from glassllm.data.tokenizers import ByteTokenizer, CharTokenizer
from glassllm.hf import save_pretrained
from glassllm.hf.export import tokenizer_spec
from glassllm.models import GPT, GPTConfig

TEXT = 'line 1: the "quick" brown fox\tjumps\\over the lazy dog.\nété, 中文\n'
FILES = ("tokenizer.json", "vocab.json", "merges.txt")


def library_form(tokenizer):
    """The tokenizer as the library builds it (the export's form before it wrote it itself)."""
    tokenizers = optional("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        hf = tokenizers.Tokenizer(models.BPE(vocab=dict(tokenizer.stoi), merges=[]))
        hf.decoder = decoders.Fuse()
        return hf
    hf = tokenizers.Tokenizer(models.BPE(vocab=dict(byte_level_alphabet()), merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def export(tokenizer, path):
    config = GPTConfig(vocab_size=max(tokenizer.vocab_size, 8), block_size=8, n_layer=1,
                       n_head=2, n_embd=8)  # fmt: skip
    return save_pretrained(GPT(config), tokenizer, path)


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_written_without_the_library_as_the_library_writes_it(kind, tmp_path, monkeypatch):
    tokenizer = CharTokenizer.from_text(TEXT) if kind == "char" else ByteTokenizer()
    theirs = library_form(tokenizer)
    (tmp_path / "theirs").mkdir()
    theirs.save(str(tmp_path / "theirs" / "tokenizer.json"))
    theirs.model.save(str(tmp_path / "theirs"))
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    mine = export(tokenizer, tmp_path / "mine")
    for name in FILES:
        assert (mine / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    monkeypatch.delitem(sys.modules, "tokenizers")
    loaded = optional("tokenizers").Tokenizer.from_file(str(mine / "tokenizer.json"))
    ids = tokenizer.encode(TEXT)
    assert loaded.encode(TEXT).ids == ids and loaded.decode(ids) == TEXT


def test_an_unknown_tokenizer_kind_is_refused_before_anything_is_written(tmp_path):
    class Other:
        vocab_size = 4

    with pytest.raises(ValueError, match="no Hugging Face form for Other"):
        tokenizer_spec(Other())
    with pytest.raises(ValueError, match="no Hugging Face form for Other"):
        export(Other(), tmp_path / "x")
    assert list(tmp_path.iterdir()) == []
