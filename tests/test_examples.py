"""The scripts in examples/ run as a user runs them (tiny settings for the GPT ones)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))
TINY_GPT = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
            "--batch-size", "4", "--max-iters", "30", "--eval-interval", "10", "--eval-iters",
            "2", "--warmup-iters", "5", "--lr", "1e-2", "--log-interval", "10"]  # fmt: skip


def run_example(name, *args, cwd=None):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_train_mlp_learns_the_spirals():
    out = run_example("train_mlp.py", "--steps", "300")
    accuracy = float(re.findall(r"accuracy ([\d.]+)%", out)[-1])
    assert accuracy > 90.0, out
    losses = [float(v) for v in re.findall(r"loss ([\d.]+)", out)]
    first_loss, last_loss = losses[0], losses[-1]
    assert last_loss < first_loss / 5
    assert "A" in out and "b" in out  # the decision map


def test_train_tiny_gpt_then_sample(tmp_path):
    data = tmp_path / "tiny.txt"
    data.write_text(TEXT)
    out_dir = tmp_path / "out"
    out = run_example("train_tiny_gpt.py", "--data", data, "--out-dir", out_dir, *TINY_GPT)
    evaluations = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", out)
    assert [int(step) for step, _, _ in evaluations] == [0, 10, 20, 30]
    assert float(evaluations[-1][1]) < float(evaluations[0][1])
    assert "trained 30 steps" in out
    checkpoint = out_dir / "ckpt.safetensors"
    assert checkpoint.is_file()

    out = run_example("sample.py", checkpoint, "--prompt", "the", "--max-new-tokens", "12")
    assert "next-token guesses:" in out
    assert out.splitlines()[-1].startswith("the") or "\nthe" in out

    # A prompt character the model never saw: argparse's one-line error, not a traceback.
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "sample.py"), str(checkpoint), "--prompt", "Zé"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "'Z'" in done.stderr, done.stderr

    # The example's checkpoint is a full citizen: the glassllm command samples from it too.
    done = subprocess.run(
        [sys.executable, "-m", "glassllm", "sample", "--checkpoint", str(checkpoint),
         "--num-samples", "1", "--max-new-tokens", "5", "--explain"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("%  |") == 5


def test_train_tiny_gpt_grad_clip_zero_turns_clipping_off(tmp_path):
    """--grad-clip 0 means no clipping, as in nanoGPT and `glassllm train` (not: zero gradients)."""
    data = tmp_path / "tiny.txt"
    data.write_text(TEXT)
    out = run_example("train_tiny_gpt.py", "--data", data, "--out-dir", tmp_path / "out",
                      *TINY_GPT, "--grad-clip", "0")  # fmt: skip
    evaluations = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", out)
    assert float(evaluations[-1][1]) < float(evaluations[0][1]) - 0.5, out
