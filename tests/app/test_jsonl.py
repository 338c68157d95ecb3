"""glassllm.app.jsonl and its two users (run_log.read_log, stats.read_stats): one reader, one
rule for a bad line (skipped and counted), and the same answer for training, resume, the plot
and the viewer."""

import json
import os

import pytest

from glassllm.app import jsonl
from glassllm.app.jsonl import read_json_lines
from glassllm.app.plot import plot_losses
from glassllm.app.run_log import kept_log, read_log
from glassllm.app.stats import kept_lines, read_stats
from glassllm.app.view.run import Run

GOOD_LOG = [{"iter": i, "train_loss": 2.0 - i / 10, "val_loss": 2.1 - i / 10} for i in (0, 5)]
BAD = {
    "cut": b'{"iter": 7, "train_loss": 1.',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "nan": b'{"iter": 7, "train_loss": NaN}',
    "infinity": b'{"iter": 7, "val_loss": -Infinity}',
    "overflow": b'{"iter": 7, "val_loss": 1e999}',
    "huge int": b'{"iter": ' + b"9" * 5000 + b"}",
    "not utf-8": b'{"iter": 7, "x": "\xff"}',
    "twice": b'{"iter": 7, "iter": 8}',
    "a list": b"[1, 2, 3]",
    "iter a string": b'{"iter": "7"}',
    "iter a bool": b'{"iter": true}',
    "iter negative": b'{"iter": -1}',
    "loss a string": b'{"iter": 7, "train_loss": "low"}',
    "long": b'{"iter": 7, "pad": "' + b"x" * (jsonl.MAX_LINE_BYTES + 10) + b'"}',
    "NUL": b"\0\0\0",
}


def write(path, *lines: bytes, end=b"\n"):
    path.write_bytes(b"\n".join(lines) + end)


def good_lines():
    return [json.dumps(record).encode() for record in GOOD_LOG]


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_kind_of_bad_line_is_skipped_counted_and_named(case, tmp_path):
    path = tmp_path / "log.jsonl"
    first, second = good_lines()
    write(path, first, BAD[case], second)
    lines = read_log(path)
    assert [line.value["iter"] for line in lines.records] == [0, 5]
    assert lines.skipped == 1 and lines.reasons[0].startswith("line 2: "), lines.reasons
    assert "log.jsonl: 1 unreadable line skipped (line 2: " in lines.warning("log.jsonl")


def test_one_reader_gives_the_same_records_to_resume_plot_and_viewer(tmp_path):
    first, second = good_lines()
    write(tmp_path / "log.jsonl", first, *BAD.values(), second)
    stats = [json.dumps({"iter": i, "loss": 1.0}).encode() for i in (1, 6)]
    write(tmp_path / "stats.jsonl", stats[0], *BAD.values(), stats[1])
    warnings = []
    kept = kept_log(tmp_path / "log.jsonl", 5, warn=warnings.append)
    assert kept == (first + b"\n" + second + b"\n").decode()
    kept = kept_lines(tmp_path / "stats.jsonl", 5, warnings.append)
    assert kept == stats[0].decode() + "\n"
    assert [w.split(":")[0] for w in warnings] == ["log.jsonl", "stats.jsonl"]
    # "loss a string" is a bad log line (train_loss) but a stats line like any other
    counts = {"log": len(BAD), "stats": len(BAD) - 1}
    assert f"{counts['log']} unreadable lines skipped" in warnings[0], warnings
    assert f"{counts['stats']} unreadable lines skipped" in warnings[1], warnings
    answer = Run(tmp_path).read_log(-1)
    assert answer["evals"] == GOOD_LOG and [s["iter"] for s in answer["stats"]] == [1, 7, 6]
    assert {k: v["count"] for k, v in answer["skipped"].items()} == counts
    pytest.importorskip("matplotlib")
    assert plot_losses(tmp_path / "log.jsonl", tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_a_cut_last_line_counts_for_resume_not_for_a_live_reader(tmp_path):
    path = tmp_path / "stats.jsonl"
    write(path, b'{"iter": 1}', b'{"iter": 2, "lo', end=b"")
    assert read_stats(path).skipped == 1 and "cut short" in read_stats(path).reasons[0]
    live = read_stats(path, live=True)
    assert live.skipped == 0 and [line.value["iter"] for line in live.records] == [1]


def test_missing_empty_and_blank_files_have_no_lines_and_nothing_skipped(tmp_path):
    assert read_log(tmp_path / "absent.jsonl").records == []
    write(tmp_path / "blank.jsonl", b"", b"   ", b"")
    lines = read_log(tmp_path / "blank.jsonl")
    assert lines.records == [] and lines.skipped == 0 and lines.warning("x") is None


def test_the_file_read_stops_at_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_FILE_BYTES", 100)
    path = tmp_path / "log.jsonl"
    write(path, *[b'{"iter": %d}' % i for i in range(100)])
    lines = read_json_lines(path, lambda value: None)
    assert len(lines.records) < 20 and lines.skipped == 1
    assert "goes on past 100 bytes" in lines.reasons[0]


def test_a_fifo_is_refused_by_the_reader(tmp_path):
    os.mkfifo(tmp_path / "log.jsonl")
    with pytest.raises(ValueError, match="FIFO"):
        read_log(tmp_path / "log.jsonl")
