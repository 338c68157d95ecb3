"""BPETokenizer on the tokenizers package: training, round trips, files, checkpoint storage."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import optional

from glassllm.data import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    build_tokenizer,
    builtin_text,
    characters_per_token,
    tokenizer_from_dict,
    train_bpe,
)
from glassllm.data.tokenizers import token_text

NON_ASCII = "naïve café — 日本語 🙂\r\n\t  x\n\n\n  y<|endoftext|>z\x00"


@pytest.fixture(scope="module")
def corpus() -> str:
    return builtin_text()[:200_000]


@pytest.fixture(scope="module")
def bpe(corpus) -> BPETokenizer:
    optional("tokenizers")
    return train_bpe(corpus, 400)


def test_round_trip_on_the_corpus_and_on_non_ascii_text(bpe, corpus):
    ids = bpe.encode(corpus)
    assert bpe.decode(ids) == corpus
    assert len(ids) < 0.7 * len(corpus.encode("utf-8"))  # merges do compress
    assert bpe.decode(bpe.encode(NON_ASCII)) == NON_ASCII
    assert bpe.vocab_size == 400 and max(ids) < 400
    assert np.array_equal(bpe.encode_array(NON_ASCII), bpe.encode(NON_ASCII))
    assert bpe.encode_array(NON_ASCII).dtype == np.int64


def test_training_is_deterministic(bpe, corpus):
    assert train_bpe(corpus, 400).to_json() == bpe.to_json()
    assert build_tokenizer("bpe", corpus, vocab_size=400).to_json() == bpe.to_json()
    assert bpe.token_id("<|endoftext|>") == 0
    assert bpe.encode("<|endoftext|>") == [0]


def test_a_small_text_gives_a_smaller_vocabulary():
    optional("tokenizers")
    tok = train_bpe("abababab", 1000)
    assert 257 < tok.vocab_size < 270
    assert tok.decode(tok.encode("abba")) == "abba"


def test_stored_in_checkpoint_metadata(bpe):
    spec = json.loads(json.dumps(bpe.to_dict()))
    assert spec["type"] == "bpe" and isinstance(spec["tokenizer_json"], str)
    rebuilt = tokenizer_from_dict(spec)
    assert isinstance(rebuilt, BPETokenizer) and rebuilt.vocab_size == bpe.vocab_size
    assert rebuilt.encode(NON_ASCII) == bpe.encode(NON_ASCII)
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        tokenizer_from_dict({"type": "bpe", "tokenizer_json": "{}"})


def test_files_round_trip(bpe, tmp_path):
    bpe.tokenizer.save(str(tmp_path / "tokenizer.json"))
    bpe.tokenizer.model.save(str(tmp_path))
    from_json = BPETokenizer.from_file(tmp_path / "tokenizer.json")
    from_pair = BPETokenizer.from_vocab_merges(tmp_path / "vocab.json", tmp_path / "merges.txt")
    for tok in (from_json, from_pair):
        assert tok.encode(NON_ASCII) == bpe.encode(NON_ASCII)
        assert tok.decode(tok.encode(NON_ASCII)) == NON_ASCII
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json"):
        BPETokenizer.from_file(tmp_path / "broken.json")


def test_token_repr(bpe):
    space_the = bpe.encode(" the")
    assert [bpe.token_repr(i) for i in space_the] in ([repr(" the")], [repr(" "), repr("the")],
                                                      [repr(" t"), repr("he")])  # fmt: skip
    assert bpe.token_repr(0) == "<|endoftext|>"
    first = bpe.encode("é")[0]  # byte 0xC3 alone, when é is not one token
    assert bpe.token_repr(first) in ("'é'", "'\\xc3'")
    assert bpe.token_repr(bpe.encode("\n")[0]) == "'\\n'"
    assert "not in the tokenizer" in bpe.token_repr(10_000)


def test_token_text_shows_a_split_character_as_its_bytes_never_u_fffd(bpe):
    ids = bpe.encode("🙂")  # unseen in training: one token per byte F0 9F 99 82
    assert [token_text(bpe, i) for i in ids] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert [bpe.token_bytes(i) for i in ids] == [bytes([b]) for b in "🙂".encode()]
    for i in bpe.encode(NON_ASCII):
        assert "\ufffd" not in token_text(bpe, i)
    whole = bpe.encode(" the")[-1]
    assert token_text(bpe, whole) == bpe.decode([whole])  # whole characters show as decoded
    assert token_text(bpe, 0) == "<|endoftext|>" and bpe.token_bytes(0) is None


def test_token_text_of_byte_fallback_tokens_and_of_other_tokenizers():
    tokenizers = optional("tokenizers")
    vocab = {"<0xC3>": 0, "<0x41>": 1, "ab": 2, "a": 3, "b": 4}
    fallback = BPETokenizer(tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [("a", "b")])))
    assert [token_text(fallback, i) for i in range(3)] == ["<0xC3>", "A", "ab"]
    assert token_text(ByteTokenizer(), 0xC3) == "<0xC3>"
    assert token_text(ByteTokenizer(), ord("é".encode()[1:2].decode("latin-1"))) == "<0xA9>"
    assert token_text(ByteTokenizer(), ord("a")) == "a"
    char = CharTokenizer.from_text("é\ufffd")
    assert [token_text(char, i) for i in range(2)] == ["é", "\ufffd"]  # a real U+FFFD stays


def test_characters_per_token(bpe, corpus):
    ids = bpe.encode_array(corpus)
    assert characters_per_token(bpe, ids) == pytest.approx(len(corpus) / len(ids))
    assert characters_per_token(bpe, ids) > 1.5
    char = CharTokenizer.from_text(corpus)
    assert characters_per_token(char, char.encode_array(corpus)) == 1.0
    assert characters_per_token(ByteTokenizer(), ByteTokenizer().encode("日本")) == 2 / 6
    with pytest.raises(ValueError, match="at least one token"):
        characters_per_token(char, [])
