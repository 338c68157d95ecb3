"""The loss curve of a run, drawn from its log (``loss.png``); matplotlib is optional."""

from __future__ import annotations

import json
from pathlib import Path

from glassllm._install import install_hint


def plot_losses(log_path: str | Path, png_path: str | Path) -> bool:
    """Draw the train and val loss of every evaluation in ``log_path`` into ``png_path``.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line]
    iters = [r["iter"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(iters, [r["train_loss"] for r in records], marker=".", label="train")
    ax.plot(iters, [r["val_loss"] for r in records], marker=".", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title("glassllm training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return True


def plot_or_say_how(log_path: str | Path, png_path: str | Path) -> None:
    """`plot_losses`, or one line saying how to get the plot when matplotlib is missing."""
    if not plot_losses(log_path, png_path):
        print(
            f"{Path(png_path).name} skipped: matplotlib is not installed (pip install matplotlib, "
            f"or {install_hint('plot')})",
            flush=True,
        )
