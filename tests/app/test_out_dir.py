"""A new ``glassllm train`` into an out_dir that holds a run: refused unless ``--resume`` or
``--overwrite``; ``--overwrite`` replaces the old run's files as a whole (glassllm.app.out_dir),
also when the run is killed at a random moment."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TEXT
from conftest import run_cli as run

from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME, OUT_FILES, STATS_NAME
from glassllm.app.out_dir import check_new_run, remove_run, run_files
from glassllm.app.train import TrainConfig, Trainer
from glassllm.checkpoint import read

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8",
        "--batch-size", "4", "--eval-iters", "2", "--sample-tokens", "0",
        "--warmup-iters", "1", "--stats-interval", "1"]  # fmt: skip


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def train(capsys, text, out_dir, *extra):
    argv = ["train", *TINY, "--data", text, "--out-dir", out_dir, *extra]
    return run(argv, capsys)


def snapshot(out_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())}


def test_a_second_run_is_refused_with_one_line_and_changes_nothing(text, tmp_path, capsys):
    out_dir = tmp_path / "run"
    status, _, err = train(capsys, text, out_dir, "--max-iters", "2")
    assert status == 0, err
    before = snapshot(out_dir)
    status, out, err = train(capsys, text, out_dir, "--max-iters", "3", "--seed", "7")
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(
        f"glassllm: error: out_dir '{out_dir}' holds a run"
    )
    assert "--resume" in err and "--overwrite" in err
    assert snapshot(out_dir) == before
    status, _, err = train(capsys, text, out_dir, "--resume", "--overwrite")
    assert status == 2 and "give only one" in err and err.count("\n") == 1
    assert snapshot(out_dir) == before


def test_overwrite_gives_what_a_fresh_directory_gives(text, tmp_path, capsys):
    """No line of the old log or statistics survives, and the checkpoint is bit for bit the one
    the same run writes into an empty directory."""
    out_dir = tmp_path / "run"
    assert train(capsys, text, out_dir, "--max-iters", "6", "--eval-interval", "2")[0] == 0
    new = ["--max-iters", "3", "--eval-interval", "1", "--seed", "7"]
    status, _, err = train(capsys, text, out_dir, *new, "--overwrite")
    assert status == 0, err
    assert train(capsys, text, tmp_path / "fresh", *new)[0] == 0
    for name in (LOG_NAME, STATS_NAME):
        mine, theirs = (
            [{k: v for k, v in json.loads(line).items() if "elapsed" not in k and "time" not in k}
             for line in (d / name).read_text().splitlines()]
            for d in (out_dir, tmp_path / "fresh")
        )  # fmt: skip
        assert mine == theirs, name
    assert [r["iter"] for r in map(json.loads, (out_dir / LOG_NAME).open())] == [0, 1, 2, 3]
    a, b = (
        read(out_dir / CHECKPOINT_NAME).tensors,
        read(tmp_path / "fresh" / CHECKPOINT_NAME).tensors,
    )
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", list(OUT_FILES))
def test_any_one_run_file_is_a_run_and_other_files_are_not(tmp_path, name):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data.txt").write_text(TEXT)
    check_new_run(tmp_path, overwrite=False)  # nothing of a run here
    (tmp_path / name).write_text("")
    assert run_files(tmp_path) == [name]
    with pytest.raises(ValueError, match=f"holds a run \\({name}\\)"):
        check_new_run(tmp_path, overwrite=False)
    check_new_run(tmp_path, overwrite=True)
    assert remove_run(tmp_path) == [name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt", "notes.txt"]


def test_the_python_api_refuses_too_unless_overwrite(text, tmp_path):
    config = TrainConfig(data=str(text), out_dir=str(tmp_path / "o"), max_iters=1, n_layer=1,
                         n_head=2, n_embd=16, block_size=8, batch_size=4, eval_iters=1,
                         sample_tokens=0)  # fmt: skip
    Trainer(config).fit(progress=False)
    with pytest.raises(ValueError, match="holds a run"):
        Trainer(config)
    Trainer(config, overwrite=True).fit(progress=False)
    Trainer(TrainConfig(**{**config.to_dict(), "max_iters": 2}), resume=True).fit(progress=False)


# ---------------------------------------------------------------- killed at a random moment

KILLS = int(os.environ.get("GLASSLLM_KILLS", "6"))


def run_of(out_dir: Path) -> str | None:
    """Which run the checkpoint in ``out_dir`` belongs to (its seed), None without one."""
    path = out_dir / CHECKPOINT_NAME
    return str(read(path).metadata["train_config"]["seed"]) if path.exists() else None


def test_overwrite_killed_at_random_moments_never_mixes_two_runs(text, tmp_path, capsys):
    """SIGKILL at a random moment of ``--overwrite``: the checkpoint, the log and the statistics
    left belong to one run, the old (seed 1) or the new (seed 2), never to both."""
    out_dir = tmp_path / "run"
    old = ["--max-iters", "4", "--eval-interval", "2", "--seed", "1"]
    assert train(capsys, text, out_dir, *old)[0] == 0
    old_files = snapshot(out_dir)
    old_lines = {n: set((out_dir / n).read_text().splitlines()) for n in (LOG_NAME, STATS_NAME)}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "glassllm", "train", *TINY, "--data", str(text),
               "--out-dir", str(out_dir), "--max-iters", "30", "--eval-interval", "2",
               "--seed", "2", "--overwrite"]  # fmt: skip
    started = time.monotonic()  # one whole run, unkilled, to spread the kills over its length
    subprocess.run(command, env=env, capture_output=True, timeout=300, check=True)
    whole = time.monotonic() - started
    assert run_of(out_dir) == "2"
    rng = random.Random(0)
    seen = set()
    for _ in range(KILLS):
        for name in OUT_FILES:  # the old run, whole, before each try
            (out_dir / name).unlink(missing_ok=True)
        for name, data in old_files.items():
            (out_dir / name).write_bytes(data)
        job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.3, 1.0) * whole)
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        owner = run_of(out_dir)
        for name in (LOG_NAME, STATS_NAME):
            path = out_dir / name
            lines = path.read_text().splitlines() if path.exists() else []
            from_old = [line in old_lines[name] for line in lines]
            if owner == "1":  # the old checkpoint: only the old run's lines
                assert all(from_old), name
            elif owner == "2":  # the new checkpoint: not one old line
                assert not any(from_old), name
            else:  # no checkpoint (removed, the new one not written yet): nothing old beside new
                assert all(from_old) or not any(from_old), name
        seen.add(owner)
    assert seen  # what the kills found: reported by -rA
    print(f"kills {KILLS}: checkpoints left {sorted(map(str, seen))}")
