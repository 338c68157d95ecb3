"""The glassllm command with Hugging Face models: ``sample --checkpoint DIR`` and ``export``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import optional
from conftest import run_cli as run

from glassllm.app.cli import main
from glassllm.app.config import CHECKPOINT_NAME

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny"
EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "hf_gpt2_tiny.expected.npz"
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--max-iters", "3", "--eval-interval", "2", "--eval-iters", "1",
        "--sample-tokens", "0", "--warmup-iters", "1"]  # fmt: skip


def assert_one_line_error(status, err, *fragments):
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassllm: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# ------------------------------------------------------------------------------ sample


@pytest.mark.parametrize("path", [FIXTURE, FIXTURE / "model.safetensors"])
@pytest.mark.parametrize("explain", [False, True])
def test_sample_a_hugging_face_model_gives_transformers_greedy_ids(path, explain, capsys):
    optional("tokenizers")
    from glassllm.hf import find_tokenizer

    tokenizer = find_tokenizer(FIXTURE)
    expected = np.load(EXPECTED)
    for row, greedy in zip(expected["input_ids"], expected["greedy_ids"], strict=True):
        prompt = tokenizer.decode(row.tolist())
        assert tokenizer.encode(prompt) == row.tolist()  # the prompt is those very ids
        new = len(greedy) - len(row)
        argv = ["sample", "--checkpoint", path, "--prompt", prompt, "--top-k", "1",
                "--num-samples", "1", "--max-new-tokens", new]  # fmt: skip
        status, out, err = run([*argv, "--explain"] if explain else argv, capsys)
        assert status == 0, err
        assert out.endswith(tokenizer.decode(greedy.tolist()) + "\n---------------\n")
        if explain:
            steps = out.splitlines()[1 : 1 + new]
            tokens = [line.split()[1] for line in steps]
            assert tokens == [tokenizer.token_repr(int(i)).split()[0] for i in greedy[len(row) :]]
            assert all("100.0%" in line for line in steps)  # top-k 1: certain


def test_sample_a_hugging_face_model_without_the_tokenizers_package(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    status, _, err = run(["sample", "--checkpoint", FIXTURE], capsys)
    assert_one_line_error(status, err, "pip install -e '.[hf]' in glassllm's source checkout")


def test_sample_a_hugging_face_model_without_tokenizer_files(tmp_path, capsys):
    copy = tmp_path / "gpt2"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, copy / name)
    status, _, err = run(["sample", "--checkpoint", copy], capsys)
    assert_one_line_error(status, err, str(copy), "no tokenizer.json or vocab.json + merges.txt")


@pytest.mark.parametrize(
    "setup, fragment",
    [
        (lambda d: None, "no config.json"),
        (lambda d: (d / "config.json").write_text('{"model_type": "mamba"}'), "'mamba'"),
        (lambda d: ((d / "config.json").write_text('{"model_type": "gpt2"}'),
                    (d / "pytorch_model.bin").write_bytes(b"x")), "no pickle"),
    ],
)  # fmt: skip
def test_sample_from_a_directory_glassllm_cannot_read(tmp_path, capsys, setup, fragment):
    setup(tmp_path)
    status, _, err = run(["sample", "--checkpoint", tmp_path], capsys)
    assert_one_line_error(status, err, fragment)


# ------------------------------------------------------------------------------ export


RUNS = {"char": [], "bpe-bias": ["--tokenizer", "bpe", "--vocab-size", "300", "--bias"]}


@pytest.fixture(scope="module", params=list(RUNS))
def trained(request, tmp_path_factory):
    """A tiny run's checkpoint path: char-level with bias off, or BPE with bias on."""
    if "bpe" in request.param:
        optional("tokenizers")
    root = tmp_path_factory.mktemp("run")
    (root / "tiny.txt").write_text(TEXT)
    argv = ["train", *TINY, *RUNS[request.param], "--data", str(root / "tiny.txt")]
    assert main([*argv, "--out-dir", str(root)]) == 0
    return root / CHECKPOINT_NAME


def _export(checkpoint, out_dir, capsys, *extra):
    return run(["export", "--checkpoint", checkpoint, "--format", "hf", "--out-dir", out_dir,
                *extra], capsys)  # fmt: skip


def test_export_loads_in_transformers_with_the_same_logits(trained, tmp_path, capsys):
    torch = optional("torch")
    transformers = optional("transformers")
    from glassllm.app.sample import open_model

    status, out, err = _export(trained, tmp_path / "hf", capsys)
    assert status == 0, err
    assert str(tmp_path / "hf") in out and len(out.strip().splitlines()) == 1
    model, tokenizer, _ = open_model(trained)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "lazy dog.\nline"
    ids = tokenizer.encode(text)
    assert their_tokenizer(text)["input_ids"] == ids
    with torch.no_grad():
        their_logits = theirs(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(their_logits, model([ids])[0].data, atol=1e-5, rtol=0)
    # ... and glassllm reads its own export back: sampling from it is sampling from the run.
    for checkpoint in (trained, tmp_path / "hf"):
        argv = ["sample", "--checkpoint", checkpoint, "--prompt", "line", "--num-samples", "1"]
        status, out, err = run([*argv, "--max-new-tokens", "10"], capsys)
        assert status == 0, err
        if checkpoint == trained:
            first = out
    assert out == first


def test_export_refuses_a_non_empty_directory_unless_overwrite(trained, tmp_path, capsys):
    optional("tokenizers")
    out_dir = tmp_path / "hf"
    status, _, err = _export(trained, out_dir, capsys)
    assert status == 0, err
    (out_dir / "stale.txt").write_text("from before")
    status, _, err = _export(trained, out_dir, capsys)
    assert_one_line_error(status, err, str(out_dir), "not empty", "--overwrite")
    assert (out_dir / "stale.txt").exists()
    status, _, err = _export(trained, out_dir, capsys, "--overwrite")
    assert status == 0, err
    assert not (out_dir / "stale.txt").exists()
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == "gpt2"
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # nothing left beside it


def test_overwrite_replaces_only_a_model_directory(trained, tmp_path, capsys, monkeypatch):
    optional("tokenizers")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    status, _, err = _export(trained, mine, capsys, "--overwrite")
    assert_one_line_error(status, err, str(mine), "no config.json")
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]
    (mine / "config.json").write_text("{}")
    monkeypatch.chdir(mine)
    status, _, err = _export(trained, mine, capsys, "--overwrite")
    assert_one_line_error(status, err, "holds the working directory")
    monkeypatch.chdir(tmp_path)
    shutil.copy(trained, mine / CHECKPOINT_NAME)
    status, _, err = _export(mine / CHECKPOINT_NAME, mine, capsys, "--overwrite")
    assert_one_line_error(status, err, "holds the model's source", str(mine / CHECKPOINT_NAME))
    assert sorted(p.name for p in mine.iterdir()) == [CHECKPOINT_NAME, "config.json", "keep.txt"]


def test_export_a_hugging_face_directory_again(tmp_path, capsys):
    optional("tokenizers")
    from glassllm.hf import load_pretrained

    status, _, err = _export(FIXTURE, tmp_path / "copy", capsys)
    assert status == 0, err
    (a, _), (b, _) = load_pretrained(FIXTURE), load_pretrained(tmp_path / "copy")
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert np.array_equal(p.data, q.data), name


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--format", "hf"], ["--out-dir"]),
        (["--checkpoint", "nowhere.safetensors", "--out-dir", "x"], ["nowhere", "not found"]),
        (["--out-dir", "x", "--format", "onnx"], ["--format", "onnx"]),
    ],
)
def test_export_errors_are_one_line(tmp_path, capsys, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    status, _, err = run(["export", *argv], capsys)
    assert_one_line_error(status, err, *fragments)
    assert not (tmp_path / "x").exists()


def test_export_onto_a_file(trained, tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    status, _, err = _export(trained, target, capsys)
    assert_one_line_error(status, err, str(target), "not a directory")
    assert target.read_text() == "x"


# ------------------------------------------------------------------------------ BPE training


def _train(argv, tmp_path, capsys, *extra):
    (tmp_path / "tiny.txt").write_text(TEXT)
    return run(["train", *TINY, "--data", tmp_path / "tiny.txt", "--out-dir", tmp_path / "o",
                *argv, *extra], capsys)  # fmt: skip


def test_bpe_train_sample_resume(tmp_path, capsys, monkeypatch):
    optional("tokenizers")
    from glassllm.app.run_state import SavedRun
    from glassllm.data import BPETokenizer, train_bpe

    status, out, err = _train(["--tokenizer", "bpe", "--vocab-size", "300"], tmp_path, capsys)
    assert status == 0, err
    checkpoint = tmp_path / "o" / CHECKPOINT_NAME
    state = SavedRun.read(checkpoint).state
    assert isinstance(state.tokenizer, BPETokenizer)
    assert state.config.tokenizer == "bpe" and state.config.vocab_size == 300
    # Learned on the training split's text only, deterministically: the first 90% of characters.
    expected = train_bpe(TEXT[: int(len(TEXT) * 0.9)], 300)
    assert state.tokenizer.to_json() == expected.to_json()
    assert 257 < state.model_config.vocab_size == state.tokenizer.vocab_size <= 300
    records = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert all(r["val_bpc"] < r["val_loss"] / np.log(2) for r in records)  # > 1 character/token

    def retrained(*args, **kwargs):
        raise AssertionError("the BPE was trained again")

    monkeypatch.setattr("glassllm.data.tokenizers.train_bpe", retrained)
    argv = ["sample", "--checkpoint", checkpoint, "--num-samples", "1", "--max-new-tokens", "5"]
    status, out, err = run([*argv, "--explain"], capsys)
    assert status == 0, err
    assert out.startswith("sample 1: step, token, probability")
    status, out, err = _train(["--resume", "--max-iters", "5"], tmp_path, capsys)
    assert status == 0, err
    assert "resuming at step 3" in out
    assert SavedRun.read(checkpoint).state.tokenizer.to_json() == expected.to_json()
    status, _, err = _train(["--resume", "--max-iters", "6", "--vocab-size", "400"], tmp_path,
                            capsys)  # fmt: skip
    assert_one_line_error(status, err, "cannot change vocab_size=400")


def test_bits_per_character_of_a_char_run_is_the_loss_in_bits(tmp_path, capsys):
    status, out, err = _train([], tmp_path, capsys)
    assert status == 0, err
    records = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    for r in records:
        assert r["train_bpc"] == pytest.approx(r["train_loss"] / np.log(2), rel=1e-12)
        assert r["val_bpc"] == pytest.approx(r["val_loss"] / np.log(2), rel=1e-12)
    last = records[-1]
    assert f"val loss {last['val_loss']:.4f} ({last['val_bpc']:.3f} bits/char)" in out


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--vocab-size", "300"], ["vocab_size (300) is for the 'bpe' tokenizer only"]),
        (["--tokenizer", "byte", "--vocab-size", "300"], ["not 'byte'"]),
        (["--tokenizer", "bpe", "--vocab-size", "256"], ["vocab_size must be in [257, "]),
    ],
)
def test_bad_vocab_sizes(tmp_path, capsys, argv, fragments):
    status, _, err = _train(argv, tmp_path, capsys)
    assert_one_line_error(status, err, *fragments)
    assert not (tmp_path / "o").exists()


def test_bpe_without_the_tokenizers_package(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    status, _, err = _train(["--tokenizer", "bpe"], tmp_path, capsys)
    assert_one_line_error(status, err, "pip install -e '.[hf]' in glassllm's source checkout")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------ open_checkpoint


def test_open_checkpoint_describes_a_glassllm_checkpoint(trained):
    from glassllm.app.run_state import SavedRun
    from glassllm.app.sample import open_checkpoint

    opened = open_checkpoint(trained)
    saved = SavedRun.read(trained)
    source = opened.source
    assert (source.kind, source.path) == ("glassllm", trained)
    assert source.config == saved.state.model_config == opened.model.config
    assert source.tokenizer_kind == opened.tokenizer.kind == saved.state.tokenizer.kind
    assert source.iteration == saved.state.iteration > 0
    assert source.best_val_loss == saved.state.best_val_loss
    assert source.metadata == saved.state.to_metadata()
    for name, value in saved.model().state_dict().items():
        np.testing.assert_array_equal(opened.model.state_dict()[name], value)


def test_open_checkpoint_describes_a_hugging_face_directory():
    optional("tokenizers")
    from glassllm.app.sample import open_checkpoint
    from glassllm.hf import load_pretrained

    opened = open_checkpoint(FIXTURE)
    model, tokenizer = load_pretrained(FIXTURE, require_tokenizer=True)
    source = opened.source
    assert (source.kind, source.path, source.config) == ("huggingface", FIXTURE, model.config)
    assert source.tokenizer_kind == tokenizer.kind
    # no training record is invented for a model that has none
    assert (source.iteration, source.best_val_loss, source.metadata, opened.state) == (None,) * 4
    ids = tokenizer.encode("Hello world")
    np.testing.assert_array_equal(opened.model([ids])[0].data, model([ids])[0].data)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda d: d, "no config.json"),
        (lambda d: d / "missing.safetensors", "missing.safetensors"),
        (lambda d: (d / "junk.safetensors").write_bytes(b"\x00" * 5) and d / "junk.safetensors",
         "junk.safetensors"),
    ],
)  # fmt: skip
def test_open_checkpoint_rejects_bad_inputs_with_a_message(tmp_path, make, fragment):
    from glassllm.app.sample import open_checkpoint

    with pytest.raises((ValueError, OSError), match=fragment):
        open_checkpoint(make(tmp_path))


def test_export_of_a_char_run_needs_no_tokenizers_package(tmp_path, capsys, monkeypatch):
    """A char (or byte) tokenizer is a table: written as tokenizer.json without the package."""
    import sys

    (tmp_path / "tiny.txt").write_text(TEXT)
    argv = ["train", *TINY, "--data", str(tmp_path / "tiny.txt"), "--out-dir", str(tmp_path / "o")]
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    assert main(argv) == 0
    status, out, err = _export(tmp_path / "o" / CHECKPOINT_NAME, tmp_path / "hf", capsys)
    assert status == 0 and err == "", err
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    monkeypatch.delitem(sys.modules, "tokenizers")
    optional("tokenizers")
    from glassllm.app.sample import open_model

    _, tokenizer, _ = open_model(tmp_path / "o" / CHECKPOINT_NAME)
    _, theirs, _ = open_model(tmp_path / "hf")
    assert theirs.encode("lazy dog.\nline") == tokenizer.encode("lazy dog.\nline")
