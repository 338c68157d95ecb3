"""Hardening, round three, as a user meets it on the command line (issue 20, classes 1 to 3):

1. a tokenizer that passes every check but panics at encode time (a pre-tokenizer regex past the
   regex engine's backtracking limit: a real one, no mock), a prompt that is not UTF-8, garbage
   in stats.jsonl, a full disk during export and training: one line, exit status 2, nothing
   half-written;
2. a FIFO where the run keeps its logs: refused at once, never waited on;
3. one reader for log.jsonl and stats.jsonl: a bad line is skipped and counted (a warning line),
   never a traceback.

Every command runs in a subprocess with a timeout: a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import optional, small_disk

import glassllm
from glassllm.app.run_state import RunState
from glassllm.app.sample import open_checkpoint
from glassllm.data.bpe import BPETokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "hf_gpt2_tiny"
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--max-iters", "6", "--eval-interval", "3", "--eval-iters", "1",
        "--sample-tokens", "0", "--warmup-iters", "1"]  # fmt: skip
# A Split pre-tokenizer whose regex backtracks exponentially on "aaaa...b": the regex engine
# (Oniguruma) gives up at its retry limit, and the tokenizers library panics.
CATASTROPHIC = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
                "invert": False}  # fmt: skip
PANIC_PROMPT = "a" * 5000 + "b"
TIMEOUT = 120


def glassllm_cli(*argv, timeout=TIMEOUT, preexec_fn=None, cwd=None):
    """``python -m glassllm ARGV`` (bytes allowed, as a shell passes them): (status, out, err)."""
    command = [sys.executable, "-m", "glassllm", *(a if isinstance(a, bytes) else str(a)
                                                   for a in argv)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_BACKTRACE": "1"}
    done = subprocess.run(
        command, capture_output=True, timeout=timeout, env=env, preexec_fn=preexec_fn, cwd=cwd
    )
    return (
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


def assert_one_line_error(status, err, *fragments):
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, (status, err[-3000:])
    assert lines[0].startswith("glassllm: error: "), err
    assert "Traceback" not in err and "panicked" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def hostile_hf_directory(path: Path) -> Path:
    shutil.copytree(FIXTURE, path)
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = CATASTROPHIC
    (path / "tokenizer.json").write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("h3")
    (root / "tiny.txt").write_text(TEXT)
    status, _, err = glassllm_cli("train", *TINY, "--data", root / "tiny.txt", "--out-dir",
                                  root / "o")  # fmt: skip
    assert status == 0, err
    return root / "o"


def fresh_copy(trained, tmp_path):
    out = tmp_path / "o"
    shutil.copytree(trained, out)
    return out


# ------------------------------------------------------------------------ 1. tokenizers


def test_a_tokenizer_that_panics_at_encode_time_is_one_line_from_a_hf_directory(tmp_path):
    optional("tokenizers")  # a BPE tokenizer
    model = hostile_hf_directory(tmp_path / "gpt2")
    status, _, err = glassllm_cli("sample", "--checkpoint", model, "--prompt", PANIC_PROMPT,
                                  "--max-new-tokens", 2)  # fmt: skip
    assert_one_line_error(status, err, "the prompt cannot be encoded", "panic")


def test_a_tokenizer_that_panics_inside_a_verified_glassllm_checkpoint_is_one_line(tmp_path):
    optional("tokenizers")  # a BPE tokenizer
    opened = open_checkpoint(FIXTURE)
    spec = json.loads(opened.tokenizer.to_json())
    spec["pre_tokenizer"] = CATASTROPHIC
    state = RunState(model_config=opened.model.config, tokenizer=BPETokenizer.from_json(
        json.dumps(spec)))  # fmt: skip
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, opened.model, metadata=state.to_metadata())  # a valid digest
    status, _, err = glassllm_cli("sample", "--checkpoint", path, "--prompt", "hello")
    assert status == 0, err  # an ordinary prompt still works
    status, _, err = glassllm_cli("sample", "--checkpoint", path, "--prompt", PANIC_PROMPT,
                                  "--max-new-tokens", 2)  # fmt: skip
    assert_one_line_error(status, err, "the prompt cannot be encoded", "panic")


@pytest.mark.parametrize("kind", ["hf-bpe", "char"])
def test_a_prompt_that_is_not_utf8_is_one_line(kind, trained, tmp_path):
    if kind == "hf-bpe":
        optional("tokenizers")
    checkpoint = FIXTURE if kind == "hf-bpe" else trained / "ckpt.safetensors"
    status, _, err = glassllm_cli("sample", "--checkpoint", checkpoint, "--prompt", b"caf\xe9 \xff")
    assert_one_line_error(status, err, "the prompt cannot be encoded")
    if kind == "hf-bpe":
        assert "not valid UTF-8 (byte 0xe9 at character 3)" in err, err


# ------------------------------------------------------------------------ 2. FIFOs


@pytest.mark.parametrize("name", ["log.jsonl", "stats.jsonl"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_fifo_where_the_run_writes_its_logs_is_refused_not_waited_on(
    name, resume, trained, tmp_path
):
    out = fresh_copy(trained, tmp_path) if resume else tmp_path / "o"
    out.mkdir(exist_ok=True)
    (tmp_path / "tiny.txt").write_text(TEXT)
    with contextlib.suppress(FileNotFoundError):
        (out / name).unlink()
    os.mkfifo(out / name)
    argv = ["--resume", "--max-iters", 9] if resume else [*TINY, "--data", tmp_path / "tiny.txt"]
    status, _, err = glassllm_cli("train", *argv, "--out-dir", out, "--stats-interval", 1)
    assert_one_line_error(status, err, name, "FIFO")


# ------------------------------------------------------------------------ 3. JSON lines

GARBAGE = [
    b'{"iter": 4, "loss": 1.0, "lr"',  # a line cut by a kill
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in Python's json
    b'{"iter": 5, "loss": NaN, "lr": 0.1, "grad_norm": 1.0, "clipped": false, "params": {}}',
    b'{"iter": 5, "loss": \xff\xfe}',  # not UTF-8
    b'{"iter": "5"}',
    b"x" * (10 << 20),  # a 10 MB line
    b'{"iter": 1e999}',
]


def test_train_resume_over_garbage_in_both_logs_skips_and_counts_it(trained, tmp_path):
    out = fresh_copy(trained, tmp_path)
    for name in ("log.jsonl", "stats.jsonl"):
        with open(out / name, "ab") as file:
            file.write(b"\n".join(GARBAGE) + b"\n")
    status, _, err = glassllm_cli("train", "--resume", "--out-dir", out, "--max-iters", 9,
                                  "--stats-interval", 1)  # fmt: skip
    assert status == 0, err[-3000:]
    warnings = [line for line in err.splitlines() if line.startswith("glassllm: warning:")]
    assert any("log.jsonl: 7 unreadable lines skipped" in w for w in warnings), err[-2000:]
    assert any("stats.jsonl: 7 unreadable lines skipped" in w for w in warnings), err[-2000:]
    assert "Traceback" not in err
    for name in ("log.jsonl", "stats.jsonl"):  # the kept files are strict JSON records again
        records = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert all(isinstance(r["iter"], int) for r in records)
    assert [r["iter"] for r in map(json.loads, (out / "log.jsonl").open())] == [0, 3, 6, 9]


# ------------------------------------------------------------------------ a full disk


def file_size_limit(limit: int):
    """A preexec_fn: writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored)."""

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    optional("tokenizers")  # a BPE tokenizer
    with small_disk(tmp_path / "disk", "64k") as disk:
        status, _, err = glassllm_cli("export", "--checkpoint", FIXTURE, "--out-dir",
                                      disk / "model")  # fmt: skip
        assert_one_line_error(status, err, "No space left on device")
        assert list(disk.iterdir()) == []


def test_export_past_a_file_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    optional("tokenizers")  # a BPE tokenizer
    status, _, err = glassllm_cli("export", "--checkpoint", FIXTURE, "--out-dir", tmp_path / "m",
                                  preexec_fn=file_size_limit(20_000))  # fmt: skip
    assert_one_line_error(status, err, "File too large")
    assert list(tmp_path.iterdir()) == []


def test_training_onto_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path):
    (tmp_path / "tiny.txt").write_text(TEXT)
    with small_disk(tmp_path / "disk", "64k") as disk:
        status, _, err = glassllm_cli("train", *TINY, "--n-embd", 64, "--data",
                                      tmp_path / "tiny.txt", "--out-dir", disk / "o")  # fmt: skip
        assert_one_line_error(status, err, "No space left on device", "ckpt.safetensors")
        left = {p.name: p.stat().st_size for p in (disk / "o").iterdir()}
        assert left in ({}, {"stats.jsonl": 0}), left  # no temporary, no half a file


def test_a_char_vocabulary_with_a_lone_surrogate_is_one_line_from_export(tmp_path):
    """A verified checkpoint's JSON can spell a lone surrogate (\\ud800) in its characters:
    sampling copes, export (which hands the vocabulary to the tokenizers library) refuses it."""
    import numpy as np

    from glassllm.data import CharTokenizer
    from glassllm.models import GPT, GPTConfig

    tokenizer = CharTokenizer.from_text("ab\ud800")
    config = GPTConfig(vocab_size=3, block_size=8, n_layer=1, n_head=1, n_embd=8)
    model = GPT(config, rng=np.random.default_rng(0))
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, model, metadata=RunState(model_config=config, tokenizer=tokenizer)
                  .to_metadata())  # fmt: skip
    status, _, err = glassllm_cli("sample", "--checkpoint", path, "--prompt", "ab",
                                  "--max-new-tokens", 3)  # fmt: skip
    assert status == 0, err
    status, _, err = glassllm_cli("export", "--checkpoint", path, "--out-dir", tmp_path / "m")
    assert_one_line_error(status, err, "lone surrogate U+D800")
    assert not (tmp_path / "m").exists()
