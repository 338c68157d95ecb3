"""glassllm sample --top-p / --min-p: the bounds as one-line errors, --explain showing the
distribution after the filters, and the same tokens with and without --explain."""

from __future__ import annotations

import pytest
from conftest import TEXT
from conftest import run_cli as run
from test_cli import TINY, assert_one_line_error

from glassllm.app.cli import main
from glassllm.app.config import CHECKPOINT_NAME


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    (root / "tiny.txt").write_text(TEXT)
    assert main(["train", *TINY, "--data", str(root / "tiny.txt"), "--out-dir", str(root)]) == 0
    return root / CHECKPOINT_NAME


@pytest.mark.parametrize(
    "options, fragments",
    [
        (["--top-p", "0"], ["top-p must be in (0, 1], got 0"]),
        (["--top-p", "1.5"], ["top-p must be in (0, 1]"]),
        (["--top-p", "nan"], ["top-p"]),
        (["--min-p", "1"], ["min-p must be in [0, 1), got 1"]),
        (["--min-p", "-0.5"], ["min-p must be in [0, 1)"]),
    ],
)
def test_bad_filters(checkpoint, capsys, options, fragments):
    argv = ["sample", "--checkpoint", checkpoint, *options]
    assert_one_line_error(*run(argv, capsys)[::2], *fragments)


def explained_rows(out: str) -> list[list[float]]:
    rows = [line for line in out.splitlines() if "|" in line and "%" in line]
    return [
        [float(p.rstrip("%")) for p in r.split("|")[1].split() if p.endswith("%")] for r in rows
    ]


@pytest.mark.parametrize(
    "options", [["--top-p", "0.1"], ["--min-p", "0.8"], ["--top-p", "0.3", "--min-p", "0.9"]]
)
def test_explain_shows_the_distribution_after_the_filters(checkpoint, capsys, options):
    base = ["sample", "--checkpoint", checkpoint, "--num-samples", "1", "--max-new-tokens", "16"]
    status, out, err = run([*base, "--temperature", "0.5", *options, "--explain"], capsys)
    assert status == 0, err
    unfiltered = explained_rows(run([*base, "--temperature", "0.5", "--explain"], capsys)[1])
    rows = explained_rows(out)
    assert len(rows) == 16
    fewer = 0
    for probs in rows:  # what was kept sums to one; ruled-out tokens are not listed
        if len(probs) < 5:
            assert abs(sum(probs) - 100.0) < 0.2, probs
            fewer += 1
    assert fewer > 0 and sum(len(r) for r in rows) < sum(len(r) for r in unfiltered)
    assert all(abs(sum(r) - 100.0) > 0.2 for r in unfiltered)  # 5 of ~40 tokens: never all
    plain = run([*base, "--temperature", "0.5", *options], capsys)[1]
    assert out.endswith(plain)  # the same tokens as without --explain


def test_the_filters_at_their_off_values_change_nothing(checkpoint, capsys):
    base = ["sample", "--checkpoint", checkpoint, "--num-samples", "2", "--max-new-tokens", "12"]
    plain = run(base, capsys)[1]
    assert run([*base, "--top-p", "1", "--min-p", "0"], capsys)[1] == plain
