"""glassllm.data.shards: batches from memory-mapped shards equal batches from the one array
(the same draws, windows across shard boundaries), and every way the files on disk can be wrong
is one DataError naming the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from corpus_files import write_corpus

from glassllm.data import DataError, get_batch, sequential_batches
from glassllm.data.dataset import load_prepared
from glassllm.data.prepare import MANIFEST_NAME, PrepareOptions, prepare
from glassllm.data.shards import PreparedCorpus, is_prepared
from glassllm.data.sources import find_sources


@pytest.fixture
def prepared(tmp_path) -> Path:
    root = write_corpus(tmp_path / "corpus")
    options = PrepareOptions(tokenizer="char", shard_tokens=97, val_fraction=0.2)
    prepare(find_sources([str(root)]), tmp_path / "out", options)
    return tmp_path / "out"


def test_batches_from_shards_equal_batches_from_the_array(prepared):
    stream = PreparedCorpus(prepared).splits["train"]
    array = stream.to_array()
    assert len(stream.names) > 10 and len(stream) == len(array)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(20):
        xs, ys = get_batch(stream, 64, 16, a)  # 64 > 97 / 2: many windows cross a boundary
        xa, ya = get_batch(array, 64, 16, b)
        assert xs.dtype == xa.dtype == np.int64
        assert np.array_equal(xs, xa) and np.array_equal(ys, ya)
    assert a.bit_generator.state == b.bit_generator.state
    for (xs, ys), (xa, ya) in zip(
        sequential_batches(stream, 50, 7), sequential_batches(array, 50, 7), strict=True
    ):
        assert np.array_equal(xs, xa) and np.array_equal(ys, ya)
    assert stream[len(stream) - 1] == array[-1]
    with pytest.raises(IndexError):
        stream.windows(np.array([len(stream) - 3]), 4)


def test_the_shards_are_read_only_maps(prepared):
    stream = PreparedCorpus(prepared).splits["val"]
    stream.windows(np.array([0]), 2)
    mapped = stream._map(0)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable


def rewrite_manifest(directory: Path, change) -> None:
    path = directory / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_a_shard_of_the_wrong_size_is_refused_at_open(prepared):
    shard = prepared / "train_00003.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"train_00003.bin' is 192 bytes, not the 194 of 97"):
        PreparedCorpus(prepared)


def test_a_changed_shard_is_refused_when_first_read(prepared):
    shard = prepared / "train_00002.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    stream = PreparedCorpus(prepared).splits["train"]  # opens: only sizes are checked
    stream.windows(np.array([0]), 97)  # shard 0 is fine
    with pytest.raises(DataError, match=r"train_00002.bin' has sha256 .* not the manifest's"):
        stream.windows(np.array([2 * 97]), 3)


def test_an_id_outside_the_vocabulary_is_refused_even_with_its_digest(prepared):
    shard = prepared / "val_00000.bin"
    data = np.fromfile(shard, dtype="<u2")
    data[3] = 1000
    data.tofile(shard)
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    rewrite_manifest(prepared, lambda m: m["splits"]["val"]["shards"][0].update(sha256=digest))
    with pytest.raises(DataError, match="holds token id 1000, outside the vocabulary of"):
        PreparedCorpus(prepared).splits["val"].windows(np.array([0]), 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(format="other"), "its format is not 'glassllm-tokens'"),
        (lambda m: m.update(version=2), "version 2, this glassllm reads 1"),
        (lambda m: m["splits"]["train"]["shards"][0].update(name="../x.bin"), "is malformed"),
        (lambda m: m["splits"]["train"].update(tokens=1), "do not add up"),
        (lambda m: m.update(dtype="uint32"), "dtype uint32 and vocabulary"),
        (lambda m: m.update(tokenizer={"type": "nope"}), "unknown tokenizer type"),
        (lambda m: m.pop("splits"), "not a valid manifest"),
    ],
)
def test_a_malformed_manifest_is_one_error_naming_it(prepared, change, message):
    rewrite_manifest(prepared, change)
    with pytest.raises(DataError, match=message) as caught:
        PreparedCorpus(prepared)
    assert "manifest.json" in str(caught.value) and "\n" not in str(caught.value)


def test_not_json_and_a_directory_without_a_manifest(prepared, tmp_path):
    (prepared / MANIFEST_NAME).write_text("{nope")
    with pytest.raises(DataError, match="not a valid manifest"):
        PreparedCorpus(prepared)
    assert not is_prepared(str(tmp_path)) and is_prepared(str(prepared))


def test_load_prepared_needs_a_window_per_split(prepared):
    splits = load_prepared(str(prepared), 8)
    assert splits.prepared and splits.characters_per_token()["train"] == 1.0
    with pytest.raises(DataError, match="validation split has .* fewer than block_size"):
        load_prepared(str(prepared), len(splits.val))


def test_a_corpus_name_wins_over_a_prepared_directory_of_that_name(prepared, monkeypatch):
    monkeypatch.chdir(prepared.parent)
    prepared.rename(prepared.parent / "builtin")
    assert not is_prepared("builtin") and is_prepared("./builtin")
