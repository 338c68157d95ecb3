"""How a training run stops early: Ctrl-C (`StopOnCtrlC`), and divergence (`TrainingDiverged`)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


class TrainingDiverged(ValueError):
    """A loss, learning rate or weight is NaN or infinite: the run stopped without saving it."""


class StopOnCtrlC:
    """First Ctrl-C: ask the loop to stop after the current step. Second: abort at once.

    Signal handlers can only be installed from the main thread; elsewhere Ctrl-C keeps Python's
    default behaviour.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )
