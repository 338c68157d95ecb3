"""How a training run stops early: Ctrl-C (`StopOnCtrlC`), and divergence (`TrainingDiverged`)."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from glassllm.app.config import DEFAULT_OUT_DIR


def stopped_message(iteration: int, checkpoint: Path, out_dir: str) -> str:
    """What a run stopped by Ctrl-C prints: where its checkpoint is and how to continue."""
    resume = "glassllm train --resume"
    if out_dir != DEFAULT_OUT_DIR:
        resume += f" --out-dir {shlex.quote(out_dir)}"  # pasteable as printed
    return f"stopped at step {iteration}; checkpoint saved to {checkpoint}. Continue with: {resume}"


class TrainingDiverged(ValueError):
    """A loss, learning rate or weight is NaN or infinite: the run stopped without saving it."""


class StopOnCtrlC:
    """First Ctrl-C: ask the loop to stop after the current step. Second: abort at once.

    Signal handlers can only be installed from the main thread; elsewhere Ctrl-C keeps Python's
    default behaviour.
    """

    def __init__(self, announce: bool = True, signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
        self.requested = False
        self._announce = announce  # on one rank only, under mpiexec
        self._signals = signals  # Open MPI's mpiexec forwards SIGUSR1, not SIGINT
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if not self._announce:
            return
        print(
            "\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )
