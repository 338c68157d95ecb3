"""The loss curve of a run, drawn from its log (``loss.png``); matplotlib is optional."""

from __future__ import annotations

import sys
from pathlib import Path

from glassllm._files import open_regular
from glassllm._install import install_hint
from glassllm.app.run_log import read_log


def plot_losses(log_path: str | Path, png_path: str | Path) -> bool:
    """Draw the train and val loss of every evaluation in ``log_path`` into ``png_path``.

    Returns False (and writes nothing) when matplotlib is not installed. The log is read by
    `glassllm.app.run_log.read_log`: a bad line is left out, with a warning on stderr; a log
    that cannot be read raises FileProblem (a ValueError).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    lines = read_log(log_path)  # the one reader of log.jsonl: a bad line skipped and counted
    message = lines.warning(Path(log_path).name)
    if message is not None:
        print(f"glassllm: warning: {message} (not plotted)", file=sys.stderr, flush=True)
    records = [r.value for r in lines.records if {"train_loss", "val_loss"} <= set(r.value)]
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
    try:
        with open_regular(png_path, f"loss plot {str(png_path)!r}", "write") as png:  # no FIFO
            fig.savefig(png, format="png", dpi=100)
    finally:
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
