"""glassllm train --stats-interval: stats.jsonl is written, changes nothing, and resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from glassllm.app.cli import main
from glassllm.app.stats import HISTOGRAM_BINS, StatsLog, histogram, kept_lines
from glassllm.checkpoint import read

TINY = [
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--eval-interval",
    "10",
    "--eval-iters",
    "2",
    "--sample-tokens",
    "0",
    "--warmup-iters",
    "2",
    "--lr-decay-iters",
    "30",
    "--dropout",
    "0.1",
]


def train(capsys, text_file, out_dir, *options):
    status = main(
        ["train", "--data", str(text_file), "--out-dir", str(out_dir), *TINY, *map(str, options)]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return out_dir


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_stats_change_nothing_in_the_checkpoint(capsys, text_file, tmp_path):
    """Stats at every step vs none: every tensor (model and optimizer) bit for bit, and the
    metadata but for the option itself, the directory and the wall time."""
    on = train(capsys, text_file, tmp_path / "on", "--max-iters", 25, "--stats-interval", 1)
    off = train(capsys, text_file, tmp_path / "off", "--max-iters", 25, "--stats-interval", 0)
    assert not (off / "stats.jsonl").exists()
    assert len(lines(on / "stats.jsonl")) == 25 + 1  # and the last evaluation's histograms
    a, b = read(on / "ckpt.safetensors"), read(off / "ckpt.safetensors")
    assert sorted(a.tensors) == sorted(b.tensors) and any(k.startswith("optim.") for k in a.tensors)
    for name, value in a.tensors.items():
        assert value.dtype == b.tensors[name].dtype
        assert value.tobytes() == b.tensors[name].tobytes(), name
    assert a.optimizer == b.optimizer
    for meta in (a.metadata, b.metadata):
        meta.pop("elapsed_s")
        meta["last_eval_record"].pop("elapsed_s")  # wall time, the one field that may differ
        meta["train_config"].pop("stats_interval")
        meta["train_config"].pop("out_dir")
    assert a.metadata == b.metadata
    logs = [lines(out / "log.jsonl") for out in (on, off)]
    for log in logs:
        for record in log:
            record.pop("elapsed_s")
    assert logs[0] == logs[1]


def test_stats_lines_hold_the_step_and_histograms_after_each_evaluation(
    capsys, text_file, tmp_path
):
    out = train(
        capsys, text_file, tmp_path, "--max-iters", 25, "--stats-interval", 4, "--grad-clip", "0.5"
    )
    records = lines(out / "stats.jsonl")
    # every 4th step, and the first step after each evaluation (0, 10, 20) with histograms;
    # the last evaluation (25), which no step follows, on a line of its own: weights only
    assert [r["iter"] for r in records] == [1, 4, 8, 11, 12, 16, 20, 21, 24, 26]
    assert [r["iter"] for r in records if "hist" in r] == [1, 11, 21, 26]
    last = records.pop()
    assert set(last) == {"iter", "hist"} and set(last["hist"]) == set(records[0]["hist"])
    assert all(h["g"] is None and sum(h["w"][2]) > 0 for h in last["hist"].values())
    for record in records:
        assert set(record) >= {"iter", "loss", "lr", "grad_norm", "clipped", "params"}
        assert record["clipped"] == (record["grad_norm"] > 0.5) and record["grad_clip"] == 0.5
        assert len(record["params"]) == 2 + 2 * 6 + 1  # wte, wpe, 6 per block, ln_f
    assert set(records[0]["hist"]) == set(records[0]["params"])
    hist = records[0]["hist"]["blocks.0.attn.qkv.weight"]
    lo, hi, counts = hist["w"]
    assert lo < 0 < hi and len(counts) == HISTOGRAM_BINS and sum(counts) > 0
    assert hist["g"] is not None and sum(hist["g"][2]) == sum(counts)
    text = (out / "stats.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text


def test_resume_keeps_stats_up_to_the_checkpoint_and_continues_as_a_straight_run(
    capsys, text_file, tmp_path
):
    straight = train(
        capsys, text_file, tmp_path / "straight", "--max-iters", 30, "--stats-interval", 3
    )
    split = train(capsys, text_file, tmp_path / "split", "--max-iters", 20, "--stats-interval", 3)
    with open(split / "stats.jsonl", "a") as file:  # a crash after the checkpoint left these
        file.write(json.dumps({"iter": 24, "loss": 9.0}) + "\n" + '{"iter": 27, "lo')
    status = main(["train", "--resume", "--out-dir", str(split), "--max-iters", "30"])
    assert status == 0, capsys.readouterr().err
    assert (split / "stats.jsonl").read_text() == (straight / "stats.jsonl").read_text()


def test_stats_interval_rules(capsys, text_file, tmp_path):
    status = main(
        ["train", "--data", str(text_file), "--out-dir", str(tmp_path), "--stats-interval", "-1"]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "stats_interval must be in [0, 1000000000], got -1" in err


def test_histogram_and_kept_lines(tmp_path):
    assert histogram(None) is None
    assert histogram(np.array([np.nan, np.inf], dtype=np.float32)) is None
    lo, hi, counts = histogram(np.zeros(5, dtype=np.float32))
    assert lo == hi == 0.0 and sum(counts) == 5
    lo, hi, counts = histogram(np.arange(64, dtype=np.float32), bins=4)
    assert (lo, hi, counts) == (0.0, 63.0, [16, 16, 16, 16])
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    lo, hi, counts = histogram(values)
    expected = np.histogram(values, bins=HISTOGRAM_BINS, range=(lo, hi))[0]
    assert sum(counts) == 10_000 and np.abs(np.array(counts) - expected).max() <= 1
    path = tmp_path / "stats.jsonl"
    assert kept_lines(path, 3) == ""
    path.write_text('{"iter": 1}\n{"iter": 3}\ngarbage\n{"iter": 4}\n')
    assert kept_lines(path, 3) == '{"iter": 1}\n{"iter": 3}\n'


def test_stats_log_off_leaves_no_file_and_never_writes(tmp_path):
    from glassllm import Tensor

    w = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    log = StatsLog(tmp_path / "stats.jsonl", [("w", w)], interval=0, grad_clip=1.0)
    log.start(None)
    log.before_update(9, 1.0, evaluated=True)
    assert log.after_update(1.0, 0.1) is None
    assert not (tmp_path / "stats.jsonl").exists()


@pytest.mark.parametrize("interval", [2])
def test_a_logged_step_without_clipping_measures_the_norm(tmp_path, interval):
    from glassllm import Tensor

    w = Tensor(np.array([3.0, 4.0], dtype=np.float32), requires_grad=True)
    w.grad = np.array([3.0, 4.0], dtype=np.float32)
    log = StatsLog(tmp_path / "stats.jsonl", [("w", w)], interval=interval, grad_clip=0.0)
    log.start(None)
    log.before_update(1, None, evaluated=False)
    record = log.after_update(0.5, 0.1)
    assert record["iter"] == 2 and record["grad_norm"] == pytest.approx(5.0)
    assert record["clipped"] is False and "hist" not in record
    assert lines(tmp_path / "stats.jsonl") == [record]


def test_the_viewer_reads_what_the_trainer_wrote(capsys, text_file, tmp_path):
    from glassllm.app.view import api
    from glassllm.app.view.run import Run

    out = train(capsys, text_file, tmp_path, "--max-iters", 12, "--stats-interval", 5)
    run = Run(out)
    answer = api.log(run, {})
    assert [e["iter"] for e in answer["evals"]] == [0, 10, 12]
    assert [s["iter"] for s in answer["stats"]] == [1, 5, 10, 11, 13]
    assert [s["iter"] for s in answer["stats"] if "hist" in s] == [1, 11, 13]
    assert api.info(run, {})["checkpoint"]["iteration"] == 12
