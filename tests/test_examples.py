"""The scripts in examples/ run as a user runs them (tiny settings for the GPT ones)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY_GPT = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
            "--batch-size", "4", "--max-iters", "30", "--eval-interval", "10", "--eval-iters",
            "2", "--warmup-iters", "5", "--lr", "1e-2", "--log-interval", "10"]  # fmt: skip


@pytest.fixture
def run_example(run_python):
    """``run_example(name, *args)``: run examples/<name>, assert it succeeded, return stdout."""

    def run(name, *args, cwd=None):
        done = run_python(EXAMPLES / name, *args, cwd=cwd)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


def test_train_mlp_learns_the_spirals(run_example):
    out = run_example("train_mlp.py", "--steps", "300")
    accuracy = float(re.findall(r"accuracy ([\d.]+)%", out)[-1])
    assert accuracy > 90.0, out
    losses = [float(v) for v in re.findall(r"loss ([\d.]+)", out)]
    first_loss, last_loss = losses[0], losses[-1]
    assert last_loss < first_loss / 5
    assert "A" in out and "b" in out  # the decision map


def test_train_tiny_gpt_then_sample(text_file, tmp_path, run_example, run_python):
    data = text_file
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
    done = run_python(EXAMPLES / "sample.py", checkpoint, "--prompt", "Zé", timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "'Z'" in done.stderr, done.stderr

    # The example's checkpoint is a full citizen: the glassllm command samples from it too.
    argv = ["sample", "--checkpoint", checkpoint, "--num-samples", "1", "--max-new-tokens", "5"]
    done = run_python("-m", "glassllm", *argv, "--explain", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("%  |") == 5


def test_train_tiny_gpt_grad_clip_zero_turns_clipping_off(text_file, tmp_path, run_example):
    """--grad-clip 0 means no clipping, as in nanoGPT and `glassllm train` (not: zero gradients)."""
    out = run_example("train_tiny_gpt.py", "--data", text_file, "--out-dir", tmp_path / "out",
                      *TINY_GPT, "--grad-clip", "0")  # fmt: skip
    evaluations = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", out)
    assert float(evaluations[-1][1]) < float(evaluations[0][1]) - 0.5, out


def run_notebook(path: Path, monkeypatch) -> dict:
    """A notebook's code cells run in order in one namespace (nbclient's run without a
    kernel; IPython's display, where absent, falls back to print)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "__main__"}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def test_induction_heads_notebook_runs_and_measures_what_it_says(monkeypatch, capsys):
    """At the quick size (30 steps) the heads have not formed: the mechanics are checked (the
    induction score against a loop over the pattern, the ablation hooks applied, the panels
    drawn); the full run's figures are in the notebook's last cell."""
    path = EXAMPLES / "induction_heads.ipynb"
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert all(c.get("outputs", []) == [] for c in notebook["cells"])  # stored without outputs
    monkeypatch.setenv("GLASSLLM_NOTEBOOK_QUICK", "1")
    ns = run_notebook(path, monkeypatch)
    half, context, config = ns["HALF"], ns["CONTEXT"], ns["config"]
    assert ns["STEPS"] == 30 and ns["test"].shape == (64, context)
    assert (ns["test"][:, half:] == ns["test"][:, :half]).all()  # the second half repeats
    # the training data: the tail repeats with the sequence's period, from its start on
    seq, rng = ns["seq"], np.random.default_rng(5)
    assert seq.shape == (ns["BATCH"], context) and seq.max() < ns["VOCAB"]
    other = ns["repeated"](rng, 8, period=7, start=3)
    assert (other[:, 10:] == other[:, 3:-7]).all()
    offsets = ns["OFFSETS"]
    for layer in range(config.n_layer):
        pattern = ns["cache"][f"blocks.{layer}.attn.hook_pattern"]
        for head in range(config.n_head):
            for n, d in enumerate(offsets):
                keys = [(b, i, i - half + 1 + d) for b in range(64) for i in range(half, 31)]
                by_hand = np.mean([pattern[b, head, i, k] for b, i, k in keys])
                assert np.isclose(ns["by_offset"][n, layer, head], by_hand, rtol=1e-5)
            by_hand = np.mean([pattern[b, head, i, i - 2] for b in range(64) for i in range(4, 31)])
            assert np.isclose(ns["by_lag"][ns["LAGS"].index(2), layer, head], by_hand, rtol=1e-5)
    assert (ns["scores"] == ns["by_offset"][offsets.index(0)]).all()  # the textbook offset
    # the ablation removed what it says: the ablated heads' hook_z is zero, the loss moved
    hooks = ns["interp"].ablation_hooks(ns["model"], heads=ns["induction_heads"])
    _, cache = ns["model"].run_with_cache(ns["inputs"][:2])
    with ns["model"].hooks(hooks):
        _, ablated_cache = ns["model"].run_with_cache(ns["inputs"][:2])
    for layer, head in ns["induction_heads"]:
        z = ablated_cache[f"blocks.{layer}.attn.hook_z"]
        assert (z[:, :, head] == 0).all() and (cache[f"blocks.{layer}.attn.hook_z"] != 0).any()
    assert not np.allclose(ns["ablated"], ns["losses"])
    assert np.isfinite(ns["losses"]).all() and np.isfinite(ns["control"]).all()
    out = capsys.readouterr().out
    assert "step 30: loss" in out and "induction heads: L" in out
