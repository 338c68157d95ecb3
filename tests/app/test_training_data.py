"""glassllm.app.training_data: training on a prepared directory equals, bit for bit, training
on the same token stream held in memory (char, byte, BPE); resuming across shards is exact; the
corpus's tokenizer and digest are enforced."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import optional, run_cli
from corpus_files import write_corpus

import glassllm.app.run_start as run_start
from glassllm.app.config import CHECKPOINT_NAME
from glassllm.app.train import TrainConfig, Trainer
from glassllm.app.training_data import check_init_tokenizer, load_training_data
from glassllm.checkpoint import read
from glassllm.data import ByteTokenizer, TokenSplits
from glassllm.data.prepare import PrepareOptions, prepare
from glassllm.data.sources import find_sources


def prepared_dir(tmp_path: Path, kind: str, name: str = "prepared", seed: int = 0) -> str:
    root = write_corpus(tmp_path / f"corpus-{name}", seed=seed)
    options = PrepareOptions(tokenizer=kind, vocab_size=300 if kind == "bpe" else None,
                             shard_tokens=53, val_fraction=0.2)  # fmt: skip
    prepare(find_sources([str(root)]), tmp_path / name, options)
    return str(tmp_path / name)


def tiny(data: str, out_dir: Path, tokenizer: str, **changes) -> TrainConfig:
    values = dict(
        n_layer=1, n_head=2, n_embd=16, block_size=32, batch_size=4, max_iters=12,
        warmup_iters=2, lr_decay_iters=12, lr=1e-2, min_lr=1e-3, eval_interval=4, eval_iters=2,
        sample_tokens=5,
        data=data, out_dir=str(out_dir), tokenizer=tokenizer,
    )  # fmt: skip
    return TrainConfig(**{**values, **changes})


def checkpoint(out_dir: Path):
    return read(out_dir / CHECKPOINT_NAME)


def assert_same_checkpoints(a: Path, b: Path) -> None:
    first, second = checkpoint(a), checkpoint(b)
    assert first.tensors.keys() == second.tensors.keys()
    for name in first.tensors:
        assert np.array_equal(first.tensors[name], second.tensors[name]), name
    for key in ("best_val_loss", "iteration", "rng", "data_sha256", "tokenizer"):
        assert first.metadata[key] == second.metadata[key], key
    records = [without_time(c.metadata["last_eval_record"]) for c in (first, second)]
    assert records[0] == records[1]


def without_time(record):
    if isinstance(record, str):
        import json

        record = json.loads(record)
    return {k: v for k, v in record.items() if k != "elapsed_s"}


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_a_prepared_corpus_trains_as_the_same_stream_in_memory(tmp_path, kind, monkeypatch):
    if kind == "bpe":
        optional("tokenizers")
    data = prepared_dir(tmp_path, kind)
    on_disk = Trainer(tiny(data, tmp_path / "disk", kind)).fit(progress=False)
    assert not isinstance(Trainer(tiny(data, tmp_path / "probe", kind)).corpus.train, np.ndarray)

    def in_memory(config, saved=None):  # the same tokens as one array each, nothing on disk
        corpus = load_training_data(config, saved)
        arrays = {s: ids.to_array() for s, ids in corpus.splits().items()}
        return TokenSplits(corpus.tokenizer, arrays["train"], arrays["val"], corpus.sha256,
                           corpus.characters, prepared=True)  # fmt: skip

    monkeypatch.setattr(run_start, "load_training_data", in_memory)
    in_ram = Trainer(tiny(data, tmp_path / "memory", kind))
    assert isinstance(in_ram.corpus.train, np.ndarray)
    result = in_ram.fit(progress=False)
    assert result.losses == on_disk.losses and result.sample == on_disk.sample
    assert list(map(without_time, result.evaluations)) == list(
        map(without_time, on_disk.evaluations)
    )
    assert_same_checkpoints(tmp_path / "disk", tmp_path / "memory")


def test_resume_across_shards_is_bit_for_bit(tmp_path):
    data = prepared_dir(tmp_path, "char")  # shards of 53 tokens: every batch crosses some
    Trainer(tiny(data, tmp_path / "straight", "char")).fit(progress=False)
    Trainer(tiny(data, tmp_path / "legs", "char", max_iters=6)).fit(progress=False)
    Trainer(tiny(data, tmp_path / "legs", "char"), resume=True).fit(progress=False)
    assert_same_checkpoints(tmp_path / "straight", tmp_path / "legs")


def test_resume_refuses_a_changed_prepared_corpus_by_name(tmp_path, capsys):
    data = prepared_dir(tmp_path, "char")
    Trainer(tiny(data, tmp_path / "run", "char", max_iters=2)).fit(progress=False)
    shutil.rmtree(data)
    prepared_dir(tmp_path, "char", seed=1)  # other text at the same path
    status, _, err = run_cli(["train", "--resume", "--out-dir", tmp_path / "run",
                              "--max-iters", "4"], capsys)  # fmt: skip
    assert status == 2 and err.count("\n") == 1
    assert f"--resume: the prepared corpus {data!r} (manifest sha256" in err
    assert "is not the one this checkpoint trained on" in err


def test_the_cli_takes_the_manifest_tokenizer_and_refuses_another(tmp_path, capsys):
    data = prepared_dir(tmp_path, "byte")
    common = ["train", "--data", data, "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
              "--block-size", "8", "--max-iters", "1", "--eval-iters", "1", "--sample-tokens",
              "0"]  # fmt: skip
    status, out, err = run_cli([*common, "--out-dir", tmp_path / "a"], capsys)
    assert status == 0, err
    assert "byte tokenizer, vocabulary 256" in out
    status, _, err = run_cli([*common, "--out-dir", tmp_path / "b", "--tokenizer", "char"], capsys)
    assert status == 2 and err.count("\n") == 1
    assert "was prepared with a 'byte' tokenizer, not --tokenizer 'char'" in err
    assert not (tmp_path / "b").exists()


def test_a_prepared_corpus_and_an_init_checkpoint_must_share_the_tokenizer(tmp_path):
    corpus = load_training_data(tiny(prepared_dir(tmp_path, "char"), tmp_path / "x", "char"))
    check_init_tokenizer(corpus, corpus.tokenizer, "init.safetensors")
    with pytest.raises(ValueError, match="prepared with another tokenizer than 'init"):
        check_init_tokenizer(corpus, ByteTokenizer(), "init.safetensors")


def test_a_directory_without_a_manifest_says_to_prepare_it(tmp_path, capsys):
    (tmp_path / "texts").mkdir()
    status, _, err = run_cli(["train", "--data", tmp_path / "texts", "--out-dir", tmp_path / "r"],
                             capsys)  # fmt: skip
    assert status == 2 and err.count("\n") == 1
    assert "is a directory without a manifest.json: make one with glassllm prepare" in err
