"""Tokenizers, corpora and batch sampling (glassllm.data); downloads: test_data_download.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.data.tokenizers
from glassllm.data import (
    ByteTokenizer,
    CharTokenizer,
    DataError,
    UnknownCharacterError,
    build_tokenizer,
    builtin_text,
    get_batch,
    load_text,
    sequential_batches,
    split_train_val,
    tokenize_corpus,
    tokenizer_from_dict,
)

# --- tokenizers --------------------------------------------------------------------------------


def test_char_vocabulary_is_sorted_set_as_nanogpt():
    text = "First Citizen:\nBefore we proceed"
    tok = CharTokenizer.from_text(text)
    assert tok.chars == sorted(set(text))
    assert tok.vocab_size == len(set(text))
    assert tok.encode("\n")[0] == 0  # '\n' sorts first, as in nanoGPT's shakespeare_char meta


@given(st.text(min_size=1))
@settings(max_examples=50, deadline=None)
def test_char_round_trip(text):
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode_array(text).dtype == np.int64
    assert tok.encode_array(text).tolist() == ids


@given(st.lists(st.characters(), min_size=1, unique=True), st.data(), st.integers(1, 5))
@settings(max_examples=100, deadline=None)
def test_char_encode_array_equals_encode_for_any_vocabulary_order(chars, data, chunk):
    # The vectorised lookup against the per-character dict, for a vocabulary in any order (as
    # tokenizer_from_dict may give), astral characters and lone surrogates, across chunk edges.
    tok = CharTokenizer(chars)
    text = "".join(data.draw(st.lists(st.sampled_from(chars), max_size=40)))
    original = glassllm.data.tokenizers._ENCODE_CHUNK
    glassllm.data.tokenizers._ENCODE_CHUNK = chunk
    try:
        ids = tok.encode_array(text)
        assert ids.dtype == np.int64 and ids.tolist() == tok.encode(text)
        unknown = data.draw(st.characters().filter(lambda c: c not in tok.stoi))
        with pytest.raises(UnknownCharacterError, match=f"position {len(text)} "):
            tok.encode_array(text + unknown)
    finally:
        glassllm.data.tokenizers._ENCODE_CHUNK = original


@given(st.text())
@settings(max_examples=50, deadline=None)
def test_byte_round_trip_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids


def test_byte_decode_of_a_cut_character_replaces_instead_of_failing():
    ids = ByteTokenizer().encode("a€")[:-1]  # the euro sign is 3 bytes; drop the last one
    assert ByteTokenizer().decode(ids) == "a\ufffd"


def test_unknown_character_error_names_the_character_and_position():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(UnknownCharacterError, match=r"'z'.*position 2"):
        tok.encode("abz")
    assert isinstance(UnknownCharacterError("x"), ValueError)


@pytest.mark.parametrize("tok", [CharTokenizer.from_text("hi there\n"), ByteTokenizer()])
def test_to_dict_is_json_and_rebuilds_the_same_tokenizer(tok):
    spec = json.loads(json.dumps(tok.to_dict()))
    rebuilt = tokenizer_from_dict(spec)
    assert type(rebuilt) is type(tok)
    assert rebuilt.vocab_size == tok.vocab_size
    assert rebuilt.encode("hi there\n") == tok.encode("hi there\n")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"type": "wordpiece"}, "unknown tokenizer type"),
        ({"type": "bpe"}, "'tokenizer_json'"),
        ({"chars": "ab"}, "'type'"),
        ({"type": "char"}, "'chars'"),
        ("char", "'type'"),
    ],
)
def test_tokenizer_from_bad_dict(spec, message):
    with pytest.raises(ValueError, match=message):
        tokenizer_from_dict(spec)


def test_char_tokenizer_rejects_bad_vocabularies():
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(ValueError, match="distinct"):
        CharTokenizer("aa")
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab"])


def test_build_tokenizer():
    assert isinstance(build_tokenizer("char", "ab"), CharTokenizer)
    assert isinstance(build_tokenizer("byte", "ab"), ByteTokenizer)
    with pytest.raises(ValueError, match="unknown tokenizer 'wordpiece'"):
        build_tokenizer("wordpiece", "ab")
    with pytest.raises(ValueError, match="'bpe' tokenizer only"):
        build_tokenizer("char", "ab", vocab_size=300)


def test_token_repr_is_printable():
    assert CharTokenizer.from_text("a\n").token_repr(0) == "'\\n'"
    assert ByteTokenizer().token_repr(ord("a")) == "'a'"
    assert ByteTokenizer().token_repr(0xE2) == "'\\xe2'"


# --- corpora -----------------------------------------------------------------------------------


def test_builtin_corpus_is_the_python_docs():
    from pydoc_data.topics import topics

    text = builtin_text()
    assert text == "".join(topics[k] for k in sorted(topics))
    assert len(text) > 100_000
    assert load_text("builtin") == text


def test_text_file_is_read_as_utf8(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("héllo\n", encoding="utf-8")
    assert load_text(str(path)) == "héllo\n"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "not found"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"ok \xff\xfe"), "not UTF-8 text.*offset 3"),
    ],
    ids=["missing", "empty", "directory", "not-utf8"],
)
def test_bad_data_files_give_one_clear_error(tmp_path, make, message):
    path = tmp_path / "corpus.txt"
    make(path)
    with pytest.raises(DataError, match=message):
        load_text(str(path))


# --- batches -----------------------------------------------------------------------------------


def test_split_is_ninety_ten_and_contiguous():
    ids = np.arange(1000)
    train, val = split_train_val(ids)
    assert len(train) == 900 and len(val) == 100
    np.testing.assert_array_equal(np.concatenate([train, val]), ids)
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(ids, 0.0)


def test_get_batch_matches_nanogpt_indexing():
    data = np.arange(100, dtype=np.int64) * 3
    block, batch = 8, 5
    x, y = get_batch(data, block, batch, np.random.default_rng(7))
    ix = np.random.default_rng(7).integers(len(data) - block, size=batch)
    expected_x = np.stack([data[i : i + block] for i in ix])
    expected_y = np.stack([data[i + 1 : i + 1 + block] for i in ix])
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    assert x.dtype == np.int64 and y.dtype == np.int64
    assert x.flags.writeable  # a copy, not a view into the corpus


def test_get_batch_reaches_the_last_token_and_rejects_short_data():
    data = np.arange(5)
    x, y = get_batch(data, 4, 50, np.random.default_rng(0))
    assert (y[:, -1] == 4).all()  # only one window fits: it ends on the last token
    with pytest.raises(ValueError, match="fewer than block_size"):
        get_batch(np.arange(4), 4, 1, np.random.default_rng(0))


@given(st.integers(5, 60), st.integers(1, 6), st.integers(1, 4))
@settings(max_examples=50, deadline=None)
def test_sequential_batches_cover_each_target_once(length, block, batch):
    data = np.arange(length)
    if length < block + 1:
        return
    pairs = list(sequential_batches(data, block, batch))
    xs = np.concatenate([x for x, _ in pairs])
    ys = np.concatenate([y for _, y in pairs])
    assert all(len(x) <= batch for x, _ in pairs)
    np.testing.assert_array_equal(ys, xs + 1)
    targets = ys.ravel()
    assert len(set(targets.tolist())) == len(targets)  # no token scored twice
    assert len(targets) == (length - 1) // block * block


# --- a corpus as a run uses it -----------------------------------------------------------------


def test_tokenize_corpus_splits_and_fingerprints(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 30)
    splits = tokenize_corpus(str(path), "char", block_size=8)
    assert splits.tokenizer.vocab_size == 10
    assert len(splits.train) == 270 and len(splits.val) == 30
    assert splits.tokenizer.decode(splits.train[:10].tolist()) == "abcdefghij"
    assert len(splits.sha256) == 64
    byte_splits = tokenize_corpus(str(path), "byte", block_size=8)
    assert byte_splits.tokenizer.vocab_size == 256 and byte_splits.sha256 == splits.sha256


def test_tokenize_corpus_errors(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 30)
    with pytest.raises(ValueError, match=r"too short for block_size=30: 300 tokens.*validation"):
        tokenize_corpus(str(path), "char", block_size=30)
    tokenizer = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"does not fit the tokenizer: character 'd'"):
        tokenize_corpus(str(path), "char", block_size=8, tokenizer=tokenizer)
