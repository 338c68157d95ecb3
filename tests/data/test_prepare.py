"""glassllm.data.prepare and glassllm.data.sources: what a prepared directory holds, checked
against a token stream built here from the definition (documents in file order, each followed
by the end-of-text id, split by the seeded draws), and the output whole or absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from corpus_files import write_corpus

from glassllm.data import ByteTokenizer, CharTokenizer, DataError
from glassllm.data.prepare import (
    MANIFEST_NAME,
    PrepareOptions,
    end_of_text_id,
    prepare,
    shard_dtype,
)
from glassllm.data.shards import PreparedCorpus
from glassllm.data.sources import BadSource, find_sources, read_documents


def expected_streams(root: Path, tokenizer, options: PrepareOptions) -> dict[str, np.ndarray]:
    """The definition: each file's documents, split by ``default_rng([seed, i])`` draws."""
    eot = end_of_text_id(tokenizer)
    streams: dict[str, list[int]] = {"train": [], "val": []}
    for index, source in enumerate(find_sources([str(root)])):
        docs = read_documents(source).documents
        draws = np.random.default_rng([options.seed, index]).random(len(docs))
        for doc, draw in zip(docs, draws, strict=True):
            streams["val" if draw < options.val_fraction else "train"] += [
                *tokenizer.encode(doc),
                eot,
            ]
    return {split: np.array(ids) for split, ids in streams.items()}


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
@pytest.mark.parametrize("workers", [1, 2])
def test_the_shards_hold_the_defined_token_stream(tmp_path, kind, workers):
    if kind == "bpe":
        optional("tokenizers")
    root = write_corpus(tmp_path / "corpus")
    options = PrepareOptions(tokenizer=kind, shard_tokens=500, workers=workers, val_fraction=0.2)
    manifest = prepare(find_sources([str(root)]), tmp_path / "out", options)
    corpus = PreparedCorpus(tmp_path / "out")
    expected = expected_streams(root, corpus.tokenizer, options)
    for split in ("train", "val"):
        assert np.array_equal(corpus.splits[split].to_array(), expected[split])
        assert manifest["splits"][split]["tokens"] == len(expected[split])
    assert len(manifest["splits"]["train"]["shards"]) > 3  # the stream crosses shards
    assert all(s["tokens"] <= 500 for s in manifest["splits"]["train"]["shards"])
    assert [Path(s["path"]).name for s in manifest["sources"]] == [
        *(f"doc{i}.txt" for i in range(5)),
        "lines.jsonl",
    ]
    assert manifest["dtype"] == "uint16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]  # no leftovers


def test_char_and_byte_separate_documents_with_nul(tmp_path):
    root = write_corpus(tmp_path / "corpus", files=2, lines=10)
    prepare(find_sources([str(root)]), tmp_path / "out", PrepareOptions(tokenizer="char"))
    tokenizer = PreparedCorpus(tmp_path / "out").tokenizer
    assert isinstance(tokenizer, CharTokenizer) and tokenizer.chars[0] == "\0"
    assert end_of_text_id(tokenizer) == 0
    assert end_of_text_id(ByteTokenizer()) == 0


def test_the_split_does_not_depend_on_the_workers_and_follows_the_seed(tmp_path):
    root = write_corpus(tmp_path / "corpus", lines=60)
    digests = []
    for name, workers, seed in (("a", 1, 1), ("b", 2, 1), ("c", 1, 2)):
        options = PrepareOptions(tokenizer="byte", workers=workers, seed=seed)
        manifest = prepare(find_sources([str(root)]), tmp_path / name, options)
        digests.append([s["sha256"] for s in manifest["splits"]["val"]["shards"]])
    assert digests[0] == digests[1] != digests[2]


def test_uint32_beyond_65536_tokens_and_refused_beyond_uint32():
    assert shard_dtype(65536) == np.uint16
    assert shard_dtype(65537) == np.uint32
    with pytest.raises(DataError, match="does not fit uint32"):
        shard_dtype((1 << 32) + 1)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.txt", b"abc\0def", r"binary, not text \(a NUL byte at offset 3\)"),
        ("bad.txt", b"caf\xe9", "not UTF-8"),
        ("bad.jsonl", b'{"text": "a"}\n{"body": "b"}\n', "line 2 has no string field 'text'"),
        ("bad.jsonl", b'{"text": "a"}\n{oops\n', "line 2 is not JSON"),
    ],
)
def test_a_bad_file_is_named_and_nothing_is_written(tmp_path, name, content, message):
    root = write_corpus(tmp_path / "corpus", files=2)
    (root / name).write_bytes(content)
    with pytest.raises(BadSource, match=message) as caught:
        prepare(find_sources([str(root)]), tmp_path / "out", PrepareOptions(tokenizer="byte"))
    assert name in str(caught.value) and "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_skipped_bad_files_are_counted(tmp_path):
    root = write_corpus(tmp_path / "corpus", files=2)
    (root / "bad.txt").write_bytes(b"\0\1\2")
    options = PrepareOptions(tokenizer="char", skip_bad_files=True)
    manifest = prepare(find_sources([str(root)]), tmp_path / "out", options)
    assert manifest["skipped_count"] == 1
    assert Path(manifest["skipped_files"][0]["path"]).name == "bad.txt"
    assert "binary" in manifest["skipped_files"][0]["reason"]
    assert len(manifest["sources"]) == 3


def test_an_empty_corpus_and_an_empty_validation_split_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="the corpus is empty"):
        prepare(find_sources([str(tmp_path / "empty")]), tmp_path / "o", PrepareOptions("byte"))
    with pytest.raises(DataError, match="no corpus files"):
        find_sources([str(tmp_path / "o")]) if (tmp_path / "o").mkdir() is None else None
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(DataError, match="no document went to validation"):
        prepare(find_sources([str(tmp_path / "one.txt")]), tmp_path / "p", PrepareOptions("byte"))
    assert not (tmp_path / "p").exists()


def test_a_non_empty_out_dir_is_refused(tmp_path):
    root = write_corpus(tmp_path / "corpus")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="exists and is not empty"):
        prepare(find_sources([str(root)]), tmp_path / "out", PrepareOptions("byte"))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_a_manifest_lists_sources_with_sizes_and_digests(tmp_path):
    import hashlib

    root = write_corpus(tmp_path / "corpus", files=1)
    manifest = prepare(find_sources([str(root)]), tmp_path / "out", PrepareOptions("byte"))
    first = manifest["sources"][0]
    data = (root / "doc0.txt").read_bytes()
    assert first["bytes"] == len(data) and first["sha256"] == hashlib.sha256(data).hexdigest()
    on_disk = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert on_disk == manifest and on_disk["tokenizer"] == {"type": "byte"}


def test_a_given_char_tokenizer_needs_the_separator(tmp_path):
    root = write_corpus(tmp_path / "corpus", files=2)
    options = PrepareOptions(tokenizer=CharTokenizer("abc"))
    with pytest.raises(DataError, match="the char tokenizer has no NUL character"):
        prepare(find_sources([str(root)]), tmp_path / "out", options)


def test_a_killed_prepare_leaves_nothing_train_reads_and_the_next_one_cleans_up(tmp_path):
    root = write_corpus(tmp_path / "corpus", files=2)
    leftover = tmp_path / ".out.999999999.0123abcd.tmp"  # a dead process's temporary directory
    leftover.mkdir()
    (leftover / "train_00000.bin").write_bytes(b"\0\0")
    prepare(find_sources([str(root)]), tmp_path / "out", PrepareOptions("byte"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]


def test_a_json_string_holding_a_line_separator_is_one_document(tmp_path):
    """U+2028 and U+2029 are valid, unescaped, inside a JSON string: not line ends."""
    path = tmp_path / "docs.jsonl"
    records = [{"text": "one\u2028line"}, {"text": "two\u2029paragraphs"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records))
    documents = read_documents(find_sources([str(path)])[0]).documents
    assert documents == ["one\u2028line", "two\u2029paragraphs"]
