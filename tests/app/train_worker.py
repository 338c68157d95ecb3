"""``glassllm train`` with a fault injected on one rank; run by tests/app/test_train_mpi.py.

Usage: ``python tests/app/train_worker.py FAULT RANK STEP RECORD_DIR -- <glassllm arguments>``.
The worker patches `glassllm.app.train.Trainer` (nothing in glassllm itself knows of faults),
then runs the real command, ``glassllm.app.main``:

* FAULT ``raise``: rank RANK raises a RuntimeError at the start of step STEP; ``kill``: it sends
  itself SIGKILL there; ``hang``: it sleeps for ever there; ``desync``: it changes one weight
  there (the replica check at the next evaluation must catch it); ``disk-full``: its checkpoint
  at step STEP raises ENOSPC (an error of one rank: rank 0 writes); ``none``: no fault.
* Every rank that leaves ``Trainer.fit`` writes the step it stopped at to ``RECORD_DIR/rank<r>``.
* The faulty rank writes the time (``time.time()``) of its fault to ``RECORD_DIR/fault``, so a
  test can measure from the fault to the end of the job.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path

from glassllm.app import main
from glassllm.app.train import Trainer


def patch(fault: str, fault_rank: int, fault_step: int, record_dir: Path) -> None:
    step, fit, save = Trainer.train_step, Trainer.fit, Trainer.save_checkpoint

    def record_fault() -> None:
        (record_dir / "fault").write_text(repr(time.time()))

    def train_step(self: Trainer, lr: float | None = None) -> float:
        if self.world.rank == fault_rank and self.iteration == fault_step:
            if fault in ("raise", "kill", "desync", "hang"):
                record_fault()
            if fault == "raise":
                raise RuntimeError("deliberate failure for the test")
            if fault == "kill":
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "desync":
                next(iter(self.model.parameters())).data.flat[0] += 0.01
            if fault == "hang":
                while True:
                    time.sleep(1)
        return step(self, lr)

    def save_checkpoint(self: Trainer):
        if fault == "disk-full" and self.world.rank == fault_rank and self.iteration == fault_step:
            record_fault()
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self)

    def recorded_fit(self: Trainer, *args, **kwargs):
        result = fit(self, *args, **kwargs)
        (record_dir / f"rank{self.world.rank}").write_text(str(self.iteration))
        return result

    Trainer.train_step = train_step
    Trainer.fit = recorded_fit
    Trainer.save_checkpoint = save_checkpoint


if __name__ == "__main__":
    fault, rank, step, record, separator, *arguments = sys.argv[1:]
    assert separator == "--", "usage: FAULT RANK STEP RECORD_DIR -- <glassllm arguments>"
    patch(fault, int(rank), int(step), Path(record))
    sys.exit(main(arguments))
