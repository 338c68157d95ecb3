"""``glassllm prepare``: the command's output, the tokenizer taken from a path, and every refusal
one line with exit status 2 and nothing written (a full disk included)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import TEXT, optional, run_cli, small_disk
from corpus_files import write_corpus

from glassllm.data.shards import PreparedCorpus


def one_line_error(status: int, err: str, *fragments: str) -> None:
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("glassllm: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def test_prepare_writes_a_directory_that_train_reads(tmp_path, capsys):
    root = write_corpus(tmp_path / "corpus")
    status, out, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "out",
                                "--workers", "2", "--shard-tokens", "1000"], capsys)  # fmt: skip
    assert status == 0, err
    assert out.startswith(f"glassllm: prepared {tmp_path / 'out'}: 6 files, ")
    assert "uint16 shards, char tokenizer of" in out
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names[0] == "manifest.json" and names[1] == "train_00000.bin"
    status, out, err = run_cli(["train", "--data", tmp_path / "out", "--out-dir", tmp_path / "run",
                                "--max-iters", "2", "--n-layer", "1", "--n-embd", "16",
                                "--block-size", "8", "--eval-iters", "1", "--sample-tokens",
                                "0"], capsys)  # fmt: skip
    assert status == 0, err
    assert "char tokenizer" in out


def test_the_tokenizer_of_a_checkpoint_or_a_tokenizer_json(tmp_path, capsys):
    optional("tokenizers")
    root = write_corpus(tmp_path / "corpus")
    status, _, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "bpe",
                              "--tokenizer", "bpe", "--vocab-size", "300"], capsys)  # fmt: skip
    assert status == 0, err
    learned = PreparedCorpus(tmp_path / "bpe").tokenizer
    (tmp_path / "tokenizer.json").write_text(learned.to_json())
    status, _, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "again",
                              "--tokenizer", tmp_path / "tokenizer.json"], capsys)  # fmt: skip
    assert status == 0, err
    assert (tmp_path / "again" / "train_00000.bin").read_bytes() == (
        tmp_path / "bpe" / "train_00000.bin"
    ).read_bytes()
    status, _, err = run_cli(["train", "--data", tmp_path / "bpe", "--out-dir", tmp_path / "run",
                              "--max-iters", "1", "--n-layer", "1", "--n-embd", "16",
                              "--block-size", "8", "--eval-iters", "1", "--sample-tokens", "0"],
                             capsys)  # fmt: skip
    assert status == 0, err
    status, _, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "ckpt",
                              "--tokenizer", tmp_path / "run"], capsys)  # fmt: skip
    assert status == 0, err
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["tokenizer"] == learned.to_dict() and manifest["end_of_text"] == 0


@pytest.mark.parametrize(
    ("setup", "args", "fragments"),
    [
        (lambda r: (r / "x.txt").write_bytes(b"\x89PNG\0\0"), [], ["x.txt", "is binary"]),
        (lambda r: (r / "x.txt").write_bytes(b"caf\xe9"), [], ["x.txt", "is not UTF-8"]),
        (lambda r: (r / "x.jsonl").write_text('{"body": 1}\n'), [],
         ["x.jsonl' line 1 has no string field 'text'"]),
        (lambda r: (r / "x.txt").write_text(""), [], ["x.txt' is empty"]),
        (None, ["--val-fraction", "1.5"], ["--val-fraction must be in (0, 1)"]),
        (None, ["--vocab-size", "300"], ["--vocab-size is for the 'bpe' tokenizer only"]),
        (None, ["--resume"], ["prepare --resume: a stopped prepare keeps nothing"]),
        (None, ["--tokenizer", "nowhere/tok.json"], ["neither char, byte, bpe nor an existing"]),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_write_nothing(tmp_path, capsys, setup, args, fragments):
    root = write_corpus(tmp_path / "corpus", files=2)
    if setup is not None:
        setup(root)
    status, _, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "out", *args],
                             capsys)  # fmt: skip
    one_line_error(status, err, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_skip_bad_files_counts_them(tmp_path, capsys):
    root = write_corpus(tmp_path / "corpus", files=2)
    (root / "x.txt").write_bytes(b"\0")
    status, out, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "out",
                                "--skip-bad-files"], capsys)  # fmt: skip
    assert status == 0, err
    assert out.rstrip().endswith("; 1 bad files skipped")


def test_an_empty_directory_and_a_missing_path(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, _, err = run_cli(["prepare", "--data", tmp_path / "empty", "--out-dir",
                              tmp_path / "out"], capsys)  # fmt: skip
    one_line_error(status, err, "no corpus files under")
    status, _, err = run_cli(["prepare", "--data", tmp_path / "nope", "--out-dir",
                              tmp_path / "out"], capsys)  # fmt: skip
    one_line_error(status, err, "nope' not found")


def test_prepare_refuses_to_run_under_mpiexec(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    root = write_corpus(tmp_path / "corpus", files=2)
    status, _, err = run_cli(["prepare", "--data", root, "--out-dir", tmp_path / "out"], capsys)
    one_line_error(status, err, "glassllm prepare runs once, without mpiexec")


def test_a_full_disk_mid_shard_is_one_line_and_leaves_nothing(tmp_path, capsys):
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(4):  # 4 x 200 kB of text: 1.6 MB of uint16 byte tokens
        (root / f"{i}.txt").write_text(TEXT * 60)
    with small_disk(tmp_path / "disk", "512k") as disk:
        status, _, err = run_cli(["prepare", "--data", root, "--out-dir", disk / "out",
                                  "--tokenizer", "byte", "--val-fraction", "0.3"],
                                 capsys)  # fmt: skip
        one_line_error(status, err, "No space left on device")
        assert list(disk.iterdir()) == []


def test_standard_input_is_one_document(tmp_path, capsys, monkeypatch):
    import io

    root = write_corpus(tmp_path / "corpus", files=3)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    status, _, err = run_cli(["prepare", "--data", root, "-", "--out-dir", tmp_path / "out",
                              "--tokenizer", "byte"], capsys)  # fmt: skip
    assert status == 0, err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["sources"][-1] == {**manifest["sources"][-1], "path": "-", "bytes": 10}
