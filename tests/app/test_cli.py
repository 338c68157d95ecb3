"""The glassllm command as a user drives it: train, sample, and every bad input -> one line, exit 2.

Most runs call ``glassllm.app.cli.main`` in-process (the console script calls exactly that); a few
run real subprocesses to prove the entry points and that no traceback escapes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_cli as run

import glassllm
import glassllm.app.run_state
import glassllm.nn as nn
from glassllm.app.cli import main
from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--max-iters",
    "12",
    "--eval-interval",
    "5",
    "--eval-iters",
    "2",
    "--sample-tokens",
    "20",
    "--warmup-iters",
    "2",
]


def assert_one_line_error(status, err, *fragments):
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("glassllm: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run shared by the sampling tests: (out_dir, stdout of the run)."""
    root = tmp_path_factory.mktemp("trained")
    data = root / "tiny.txt"
    data.write_text(TEXT)
    out_dir = root / "out"
    status = main(["train", *TINY, "--data", str(data), "--out-dir", str(out_dir)])
    assert status == 0
    return out_dir


def test_train_writes_checkpoint_log_and_prints_a_sample(text_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    status, out, err = run(["train", *TINY, "--data", text_file, "--out-dir", out_dir], capsys)
    assert status == 0, err
    assert (out_dir / CHECKPOINT_NAME).is_file()
    records = [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]
    assert [r["iter"] for r in records] == [0, 5, 10, 12]
    assert set(records[0]) >= {"iter", "train_loss", "val_loss", "lr", "tokens", "elapsed_s"}
    assert "step 12: train loss" in out
    assert "--- sample (20 tokens" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out_dir / "loss.png").stat().st_size > 0
    else:  # one line saying how to get it
        assert not (out_dir / "loss.png").exists() and "pip install matplotlib" in out


def test_missing_matplotlib_says_how_to_install_it_from_a_checkout(
    text_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    argv = ["train", *TINY, "--max-iters", "1", "--data", text_file, "--out-dir", tmp_path / "o"]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    skipped = [line for line in out.splitlines() if line.startswith("loss.png skipped")]
    assert len(skipped) == 1 and "pip install matplotlib" in skipped[0], out
    assert not (tmp_path / "o" / "loss.png").exists()


def test_options_map_onto_the_config_with_types(text_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    argv = [
        "train",
        *TINY,
        "--data",
        text_file,
        "--out-dir",
        out_dir,
        "--lr",
        "3e-3",
        "--bias",
        "--dropout",
        "0.1",
        "--lr-decay-iters",
        "20",
        "--beta2",
        "0.95",
        "--tokenizer",
        "byte",
        "--max-iters",
        "1",
        "--sample-tokens",
        "0",
    ]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    metadata = glassllm.app.run_state.read_checkpoint_metadata(out_dir / CHECKPOINT_NAME)
    config = metadata["train_config"]
    assert config["lr"] == 3e-3 and config["bias"] is True and config["dropout"] == 0.1
    assert config["lr_decay_iters"] == 20 and config["beta2"] == 0.95
    assert metadata["tokenizer"] == {"type": "byte"}
    assert metadata["model_config"]["vocab_size"] == 256 and metadata["model_config"]["bias"]


def test_sample_rebuilds_everything_from_the_checkpoint(trained, capsys):
    ckpt = trained / CHECKPOINT_NAME
    argv = [
        "sample",
        "--checkpoint",
        ckpt,
        "--prompt",
        "the quick",
        "--num-samples",
        "2",
        "--max-new-tokens",
        "15",
        "--seed",
        "3",
    ]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    samples = out.split("---------------\n")[:-1]
    assert len(samples) == 2
    assert all(s.startswith("the quick") and len(s) == len("the quick") + 15 + 1 for s in samples)
    assert run(argv, capsys)[1] == out  # same seed, same text
    status, other, _ = run([*argv[:-1], "4"], capsys)
    assert other != out


def test_sample_top_k_one_is_greedy(trained, capsys):
    base = [
        "sample",
        "--checkpoint",
        trained / CHECKPOINT_NAME,
        "--prompt",
        "line",
        "--num-samples",
        "1",
        "--max-new-tokens",
        "10",
        "--top-k",
        "1",
    ]
    first = run([*base, "--seed", "1"], capsys)[1]
    second = run([*base, "--seed", "2", "--temperature", "1.5"], capsys)[1]
    assert first == second


def test_explain_shows_each_token_probability_and_alternatives(trained, capsys):
    argv = [
        "sample",
        "--checkpoint",
        trained / CHECKPOINT_NAME,
        "--prompt",
        "line",
        "--num-samples",
        "1",
        "--max-new-tokens",
        "6",
        "--explain",
    ]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    rows = [line for line in out.splitlines() if "|" in line and "%" in line]
    assert len(rows) == 6
    for step, row in enumerate(rows, start=1):
        chosen, alternatives = row.split("|")
        assert chosen.split()[0] == str(step)
        probs = [float(p.rstrip("%")) for p in alternatives.split() if p.endswith("%")]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True)
        assert float(chosen.split()[-1].rstrip("%")) <= probs[0] + 1e-9
    # The explained tokens are the sampled text: same seed, same text as without --explain.
    plain = run(argv[:-1], capsys)[1]
    assert out.endswith(plain)


def test_explain_with_top_k_lists_only_the_tokens_it_could_draw(trained, capsys):
    """Tokens top-k ruled out (probability 0) are not alternatives the model weighed."""
    argv = ["sample", "--checkpoint", trained / CHECKPOINT_NAME, "--num-samples", "2",
            "--max-new-tokens", "4", "--top-k", "2", "--explain"]  # fmt: skip
    status, out, err = run(argv, capsys)
    assert status == 0, err
    rows = [line for line in out.splitlines() if "|" in line and "%" in line]
    assert len(rows) == 8
    for row in rows:
        alternatives = row.split("|")[1]
        probs = [float(p.rstrip("%")) for p in alternatives.split() if p.endswith("%")]
        assert 1 <= len(probs) <= 2, row
        assert abs(sum(probs) - 100.0) < 0.2, row


def test_default_corpus_is_builtin(tmp_path, capsys):
    status, out, err = run(["train", *TINY, "--max-iters", "2", "--out-dir", tmp_path], capsys)
    assert status == 0, err
    assert "data builtin:" in out


def test_resume_from_the_command_line_matches_a_straight_run(text_file, tmp_path, capsys):
    from safetensors.numpy import load_file

    common = [*TINY, "--data", text_file, "--lr-decay-iters", "12", "--dropout", "0.1"]
    assert run(["train", *common, "--out-dir", tmp_path / "straight"], capsys)[0] == 0
    half = ["train", *common, "--max-iters", "7", "--out-dir", tmp_path / "split"]
    assert run(half, capsys)[0] == 0
    status, out, err = run(["train", "--resume", "--out-dir", tmp_path / "split",
                            "--max-iters", "12"], capsys)  # fmt: skip
    assert status == 0, err
    assert "resuming at step 7" in out
    straight = load_file(tmp_path / "straight" / CHECKPOINT_NAME)
    resumed = load_file(tmp_path / "split" / CHECKPOINT_NAME)
    assert straight.keys() == resumed.keys()  # weights and optimizer moments
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


# --- bad input: one clear line, exit status 2 ------------------------------------------------


@pytest.mark.parametrize(
    "make_data, fragments",
    [
        (lambda d: None, ["not found"]),
        (lambda d: d.write_text(""), ["is empty"]),
        (lambda d: d.write_text("too short\n" * 3), ["too short for block_size=16"]),
        (lambda d: d.write_bytes(b"\xff\xfe\xfa" * 400), ["not UTF-8"]),
        (lambda d: d.mkdir(), ["is a directory"]),
    ],
    ids=["missing", "empty", "shorter-than-a-block", "not-utf8", "directory"],
)
@pytest.mark.parametrize("tokenizer", ["char", "byte"])
def test_bad_data(tmp_path, capsys, make_data, fragments, tokenizer):
    data = tmp_path / "data.txt"
    make_data(data)
    argv = ["train", *TINY, "--data", data, "--out-dir", tmp_path / "o", "--tokenizer", tokenizer]
    status, out, err = run(argv, capsys)
    assert_one_line_error(status, err, *fragments)
    assert not (tmp_path / "o").exists()  # nothing written


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--n-embd", "18", "--n-head", "4"], ["n_embd (18) must be divisible by n_head (4)"]),
        (["--n-layer", "0"], ["n_layer must be in [1, 1024], got 0"]),
        (["--n-layer", "1000000"], ["n_layer must be in [1, 1024], got 1000000"]),
        (["--dropout", "1.0"], ["dropout"]),
        (["--tokenizer", "wordpiece"], ["--tokenizer: invalid choice: 'wordpiece'"]),
        (["--lr", "nan"], ["--lr", "invalid float value"]),
        (["--n-layer", "two"], ["--n-layer", "invalid int value"]),
        (["--no-such-option"], ["unrecognized arguments"]),
        (["--warmup-iters", "50", "--lr-decay-iters", "10"], ["lr_decay_iters (10)"]),
        (["--seed", "-5"], ["seed must be >= 0, got -5"]),
        (["--max-iters", "-1"], ["max_iters must be in [0, 1000000000], got -1"]),
        (["--batch-size", "0"], ["batch_size must be in [1, 65536], got 0"]),
        (["--eval-iters", "0"], ["eval_iters must be in [1, 100000], got 0"]),
        (["--eval-iters", str(10**57)], ["eval_iters must be in [1, 100000], got 1000000000"]),
        (["--lr", "1e308"], ["lr (1e+308) is too large for a warm-up of 2 steps"]),
        (["--block-size", "100000"], ["block_size must be in [1, 65536], got 100000"]),
        (["--block-size", "60000"], ["too short for block_size=60000"]),
    ],
)
def test_bad_training_options(text_file, tmp_path, capsys, options, fragments):
    argv = ["train", *TINY, "--data", text_file, "--out-dir", tmp_path / "o", *options]
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", [CHECKPOINT_NAME, LOG_NAME, "loss.png"])
def test_out_dir_file_that_is_a_directory(text_file, tmp_path, capsys, name):
    out_dir = tmp_path / "o"
    (out_dir / name).mkdir(parents=True)
    argv = ["train", *TINY, "--data", text_file, "--out-dir", out_dir]
    assert_one_line_error(*run(argv, capsys)[::2], f"{out_dir / name}' is a directory")
    assert [p.name for p in out_dir.iterdir()] == [name]  # nothing written


@pytest.mark.parametrize(
    "out_dir, fragments",
    [
        ("afile", ["out_dir", "afile' is not a directory"]),
        ("afile/sub", ["cannot create out_dir", "afile' is not a directory"]),
        ("", ["out_dir must name a directory"]),
    ],
    ids=["a-file", "under-a-file", "empty"],
)
def test_out_dir_that_cannot_be_a_directory(
    text_file, tmp_path, capsys, monkeypatch, out_dir, fragments
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    argv = ["train", *TINY, "--data", text_file, "--out-dir", out_dir]
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "tiny.txt"]


def test_out_dir_that_is_not_writable(text_file, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write anywhere: os.access answers as for another user
        real_access = os.access
        monkeypatch.setattr(
            os,
            "access",
            lambda path, mode, **kw: (
                not (mode & os.W_OK and str(path).startswith(str(locked)))
                and real_access(path, mode, **kw)
            ),
        )
    argv = ["train", *TINY, "--data", text_file, "--out-dir", locked / "o"]
    assert_one_line_error(*run(argv, capsys)[::2], "cannot create out_dir", "not writable")
    argv = ["train", *TINY, "--data", text_file, "--out-dir", locked]
    assert_one_line_error(*run(argv, capsys)[::2], "is not writable")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_during_training_is_one_line(text_file, tmp_path, capsys):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / LOG_NAME).symlink_to("/dev/full")  # every write there: ENOSPC
    argv = ["train", *TINY, "--data", text_file, "--out-dir", out_dir]
    status, out, err = run(argv, capsys)
    assert_one_line_error(status, err, "training stopped at step 0", "No space left on device")


def test_failed_start_leaves_the_default_generator_alone(trained, tmp_path, capsys):
    glassllm.manual_seed(123)
    before = glassllm.get_rng().bit_generator.state
    argv = ["train", *TINY, "--data", tmp_path / "missing.txt", "--out-dir", tmp_path / "o"]
    assert_one_line_error(*run(argv, capsys)[::2], "not found")
    assert glassllm.get_rng().bit_generator.state == before
    # A resume that fails while restoring (the tensors are corrupted) leaves it alone too.
    out_dir = tmp_path / "copy"
    shutil.copytree(trained, out_dir)
    _flipped_byte(out_dir / CHECKPOINT_NAME, trained / CHECKPOINT_NAME)
    argv = ["train", "--resume", "--out-dir", out_dir, "--max-iters", "20"]
    assert_one_line_error(*run(argv, capsys)[::2], "corrupted")
    assert glassllm.get_rng().bit_generator.state == before


def test_shakespeare_without_network(tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("GLASSLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GLASSLLM_SHAKESPEARE_URL", f"http://127.0.0.1:{port}/input.txt")
    argv = ["train", *TINY, "--data", "shakespeare", "--out-dir", tmp_path / "o"]
    assert_one_line_error(*run(argv, capsys)[::2], "could not download", "--data PATH")


def test_no_command_is_an_error(capsys):
    status, _, err = run([], capsys)
    assert status == 2
    last = err.strip().splitlines()[-1]
    assert last == "glassllm: error: choose a command: train, prepare, sample, export or view"


def test_resume_without_checkpoint(tmp_path, capsys):
    status, _, err = run(["train", "--resume", "--out-dir", tmp_path / "nothing"], capsys)
    assert_one_line_error(status, err, "--resume: no checkpoint at")


def test_resume_cannot_change_the_model(trained, tmp_path, capsys):
    out_dir = tmp_path / "copy"
    shutil.copytree(trained, out_dir)
    argv = ["train", "--resume", "--out-dir", out_dir, "--n-layer", "3", "--max-iters", "20"]
    assert_one_line_error(*run(argv, capsys)[::2], "cannot change n_layer=3 (checkpoint: 1)")


def test_resume_when_already_done(trained, tmp_path, capsys):
    out_dir = tmp_path / "copy"
    shutil.copytree(trained, out_dir)
    argv = ["train", "--resume", "--out-dir", out_dir]
    assert_one_line_error(*run(argv, capsys)[::2], "already at iteration 12", "--max-iters")


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--temperature", "0"], ["temperature must be > 0"]),
        (["--temperature", "-1"], ["temperature must be > 0"]),
        (["--temperature", "1e-300"], ["temperature must be at least 1e-06", "--top-k 1"]),
        (["--top-k", "0"], ["top-k must be in [1, 1000000000]"]),
        (["--top-k", "-3"], ["top-k must be in [1, 1000000000], got -3"]),
        (["--num-samples", "0"], ["num-samples"]),
        (["--max-new-tokens", "-1"], ["max-new-tokens must be in [0, 1000000], got -1"]),
        (["--num-samples", str(10**15)], ["num-samples must be in [1, 10000]"]),
        (["--prompt", "ZQX"], ["'Z'", "not in the vocabulary"]),
        (["--prompt", "naïve €"], ["'ï'", "not in the vocabulary"]),
        (["--prompt", ""], ["prompt is empty"]),
        (["--seed", "-1"], ["seed must be >= 0, got -1"]),
    ],
)
def test_bad_sampling_options(trained, capsys, options, fragments):
    argv = ["sample", "--checkpoint", trained / CHECKPOINT_NAME, *options]
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)


@pytest.mark.parametrize(
    "error, fragments",
    [
        (MemoryError("4 PiB"), ["not enough memory (4 PiB)", "--num-samples"]),
        (OverflowError("beyond a C long"), ["too large", "--num-samples"]),
    ],
    ids=["memory", "overflow"],
)
def test_sample_too_large_for_the_machine(trained, capsys, monkeypatch, error, fragments):
    """Sizes within the options' bounds can still exceed a machine: one line naming options."""

    def generate(*args, **kwargs):
        raise error

    monkeypatch.setattr(glassllm.models.GPT, "generate", generate)
    argv = ["sample", "--checkpoint", trained / CHECKPOINT_NAME]
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)


def test_training_too_large_for_the_machine(text_file, tmp_path, capsys, monkeypatch):
    def configure_optimizer(*args, **kwargs):
        raise MemoryError("Unable to allocate 64 TiB")

    monkeypatch.setattr(glassllm.models.GPT, "configure_optimizer", configure_optimizer)
    argv = ["train", *TINY, "--data", text_file, "--out-dir", tmp_path / "o"]
    assert_one_line_error(*run(argv, capsys)[::2], "not enough memory", "--n-embd")
    assert not (tmp_path / "o").exists()


def test_sample_zero_new_tokens_prints_the_prompt(trained, capsys):
    argv = ["sample", "--checkpoint", trained / CHECKPOINT_NAME, "--prompt", "line",
            "--max-new-tokens", "0", "--num-samples", "2"]  # fmt: skip
    status, out, err = run(argv, capsys)
    assert status == 0, err
    assert out == "line\n---------------\n" * 2


def _another_model(path):
    glassllm.save(path, nn.Linear(2, 3, rng=np.random.default_rng(0)), metadata={"note": "mlp"})


def _truncated(path, source):
    path.write_bytes(source.read_bytes()[: source.stat().st_size // 2])


def _flipped_byte(path, source):
    data = bytearray(source.read_bytes())
    data[-10] ^= 0xFF  # inside the last tensor: only the digest notices
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "make, fragments",
    [
        (lambda p, s: None, ["not found"]),
        (lambda p, s: p.write_bytes(b"definitely not safetensors"), ["not a readable"]),
        (_truncated, ["not a readable"]),
        (_flipped_byte, ["corrupted"]),
        (lambda p, s: _another_model(p), ["not a glassllm GPT checkpoint"]),
        (lambda p, s: p.mkdir(), ["is a directory"]),
    ],
    ids=["missing", "garbage", "truncated", "flipped-byte", "another-model", "directory"],
)
def test_bad_checkpoints(trained, tmp_path, capsys, make, fragments):
    path = tmp_path / "ckpt.safetensors"
    make(path, trained / CHECKPOINT_NAME)
    assert_one_line_error(*run(["sample", "--checkpoint", path], capsys)[::2], *fragments)


def test_resume_from_a_checkpoint_that_is_a_directory(tmp_path, capsys):
    (tmp_path / CHECKPOINT_NAME).mkdir()
    argv = ["train", "--resume", "--out-dir", tmp_path, "--max-iters", "5"]
    assert_one_line_error(*run(argv, capsys)[::2], CHECKPOINT_NAME, "is a directory")


def test_resume_from_a_checkpoint_with_incomplete_metadata(text_file, tmp_path, capsys):
    from glassllm.app.train import TrainConfig, Trainer

    shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4)
    trainer = Trainer(TrainConfig(**shape, data=str(text_file), out_dir=str(tmp_path)))
    metadata = trainer.metadata()
    del metadata["rng"]  # e.g. written by a hand-made script
    glassllm.save(tmp_path / CHECKPOINT_NAME, trainer.model, trainer.optimizer, metadata)
    argv = ["train", "--resume", "--out-dir", tmp_path, "--max-iters", "20"]
    assert_one_line_error(*run(argv, capsys)[::2], "incomplete or invalid metadata", "'rng'")


def test_resume_survives_a_garbled_log(trained, tmp_path, capsys):
    out_dir = tmp_path / "copy"
    shutil.copytree(trained, out_dir)
    log = out_dir / LOG_NAME
    log.write_bytes(log.read_bytes() + b"\xff\xfe garbage from a crashed editor\n")
    status, out, err = run(["train", "--resume", "--out-dir", out_dir, "--max-iters", "15"], capsys)
    assert status == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["iter"] for r in records] == [0, 5, 10, 12, 15]


def test_resume_from_a_checkpoint_of_another_model(tmp_path, capsys):
    _another_model(tmp_path / CHECKPOINT_NAME)
    argv = ["train", "--resume", "--out-dir", tmp_path, "--max-iters", "5"]
    assert_one_line_error(*run(argv, capsys)[::2], "not a glassllm GPT checkpoint")


# --- real processes ----------------------------------------------------------------------------


def _env():
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def test_python_dash_m_trains_and_samples(text_file, tmp_path):
    out_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "glassllm",
            "train",
            *TINY,
            "--data",
            str(text_file),
            "--out-dir",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "--- sample" in done.stdout
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "glassllm",
            "sample",
            "--checkpoint",
            str(out_dir / CHECKPOINT_NAME),
            "--max-new-tokens",
            "5",
            "--num-samples",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("---------------\n")


def test_console_script_reports_bad_input_without_traceback(tmp_path):
    script = shutil.which("glassllm")
    command = [script] if script else [sys.executable, "-m", "glassllm"]
    done = subprocess.run(
        [*command, "sample", "--checkpoint", str(tmp_path / "missing.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 2
    assert done.stderr.startswith("glassllm: error: checkpoint")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_help_lists_every_config_option(capsys):
    status, out, _ = run(["train", "--help"], capsys)
    assert status == 0
    for flag in [
        "--n-layer",
        "--n-head",
        "--n-embd",
        "--block-size",
        "--batch-size",
        "--max-iters",
        "--lr",
        "--min-lr",
        "--warmup-iters",
        "--lr-decay-iters",
        "--weight-decay",
        "--beta1",
        "--beta2",
        "--grad-clip",
        "--dropout",
        "--eval-interval",
        "--eval-iters",
        "--seed",
        "--out-dir",
        "--data",
        "--tokenizer",
        "--resume",
        "--bias",
        "--no-bias",
    ]:
        assert flag in out, flag
    status, out, _ = run(["sample", "--help"], capsys)
    for flag in [
        "--checkpoint",
        "--prompt",
        "--num-samples",
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--seed",
        "--explain",
    ]:
        assert flag in out, flag


def test_help_states_each_default_once(capsys):
    """--lr-decay-iters defaults to max_iters: its help says so, not also "(default: None)"."""
    status, out, _ = run(["train", "--help"], capsys)
    assert status == 0
    entry = " ".join(out.split("--lr-decay-iters N")[-1].split("--weight-decay")[0].split())
    assert entry.count("default:") == 1 and "None" not in entry, entry


def test_resume_from_a_checkpoint_without_a_training_configuration(trained, tmp_path, capsys):
    """A GPT checkpoint not written by glassllm train (examples/train_tiny_gpt.py writes one)."""
    import glassllm
    from glassllm.app.run_state import load_trained_model

    model, tokenizer, metadata = load_trained_model(trained / CHECKPOINT_NAME)
    del metadata["train_config"]
    glassllm.save(tmp_path / CHECKPOINT_NAME, model, metadata=metadata)
    status, _, err = run(["train", "--resume", "--out-dir", tmp_path], capsys)
    assert_one_line_error(status, err, "has no training configuration", "glassllm sample")


def test_fresh_run_that_fails_before_its_first_evaluation_keeps_the_old_log(
    text_file, tmp_path, capsys
):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    old_log = '{"iter": 0, "train_loss": 4.0, "val_loss": 4.0}\n'
    (out_dir / "log.jsonl").write_text(old_log)
    argv = ["train", *TINY, "--data", text_file, "--out-dir", out_dir, "--batch-size", 10**11]
    status, _, err = run(argv, capsys)
    assert status == 2, err
    assert (out_dir / "log.jsonl").read_text() == old_log
