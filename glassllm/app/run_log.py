"""A run's log, ``OUT_DIR/log.jsonl``: one `EvalRecord` per evaluation, and what a resume keeps.

The log is strict JSON, one object per line (no NaN: a run whose losses are not finite stops
before it logs them). The checkpoint written at an evaluation carries that evaluation's record
too (``RunState.last_eval_record``), so checkpoint and log agree after a kill at any moment:
`kept_log` drops what a crash wrote after the checkpoint and restores what it lost before.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glassllm._files import open_regular
from glassllm._text import shown
from glassllm.app import jsonl
from glassllm.app.config import MAX_STEPS
from glassllm.app.jsonl import JsonLines, integer, number, number_or_null, read_json_lines
from glassllm.app.options import field_problems, option

# Keys of a record that a checkpoint written before they were logged lacks.
OPTIONAL_KEYS = ("train_bpc", "val_bpc")


@dataclasses.dataclass
class EvalRecord:
    """One evaluation as ``log.jsonl`` records it (one JSON object per line, in this order).

    The checkpoint written at an evaluation carries that evaluation's record too, so a resume
    can restore the log line a crash lost between the checkpoint and the log (see `kept_log`).
    """

    iter: int = option(0, "the step evaluated", min=0, max=MAX_STEPS)
    train_loss: float = option(0.0, "mean loss on the training split")
    val_loss: float = option(0.0, "mean loss on the validation split")
    # The losses in bits per character of text (comparable across tokenizers); absent from
    # checkpoints written before they were logged.
    train_bpc: float | None = option(None, "training loss in bits per character", min=0.0)
    val_bpc: float | None = option(None, "validation loss in bits per character", min=0.0)
    lr: float = option(0.0, "the learning rate of the step", min=0.0)
    tokens: int = option(0, "tokens trained on so far", min=0)
    elapsed_s: float = option(0.0, "training time so far", min=0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_line(self) -> str:
        """The record as a ``log.jsonl`` line: strict JSON (no NaN), newline-terminated."""
        return json.dumps(self.to_dict(), allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, values: Any, label: str = "last_eval_record") -> EvalRecord:
        """Inverse of `to_dict`, every value checked; a ValueError naming the bad field."""
        names = [f.name for f in dataclasses.fields(cls)]
        keys = sorted(values) if isinstance(values, dict) else None
        if keys not in (sorted(names), sorted(set(names) - set(OPTIONAL_KEYS))):
            raise ValueError(f"must be a JSON object with the keys {names}, got {shown(values)}")
        record = cls(**values)
        problems = field_problems(record, label=lambda name: f"{label}.{name}")
        if problems:
            raise ValueError("; ".join(problems))
        return record


# What each key of a log record must be, when the line has it (only "iter" is required: a log
# written by an older glassllm, or by hand, may lack the others).
_LOG_FIELDS = {
    "train_loss": (number, "a number"),
    "val_loss": (number, "a number"),
    "train_bpc": (number_or_null, "a number or null"),
    "val_bpc": (number_or_null, "a number or null"),
    "lr": (number, "a number"),
    "tokens": (integer, "an integer"),
    "elapsed_s": (number, "a number"),
}


def record_problem(value: Any) -> str | None:
    """Why the JSON value of a ``log.jsonl`` line is not a record, or None: an object with an
    integer ``iter`` and, of the keys an `EvalRecord` has, each present one of its type."""
    return jsonl.record_problem(value, _LOG_FIELDS)


def read_log(path: str | os.PathLike[str], live: bool = False) -> JsonLines:
    """The records of ``log.jsonl`` (each checked by `record_problem`), a bad
    line skipped and counted (`glassllm.app.jsonl`: the one reader, and why). ``live``: a run
    may be writing the last line. A file that cannot be read raises FileProblem (a ValueError)."""
    return read_json_lines(path, record_problem, live=live, label=f"log {os.fspath(path)!r}")


def kept_log(
    log_path: str | os.PathLike[str],
    last_eval_iteration: int | None,
    last_eval_record: EvalRecord | None = None,
    warn: Callable[[str], None] | None = None,
) -> str:
    """The lines of a resumed run's log to keep: the records up to the checkpoint's last
    evaluation, in order. Later records (a crash wrote them after the checkpoint) are dropped,
    and bad lines (`read_log`) skipped, ``warn`` called with one line saying so; a missing log
    keeps nothing. When the record of the last evaluation itself is missing (a kill between the
    checkpoint's rename and the log's append), ``last_eval_record`` (the checkpoint's copy)
    takes its place."""
    lines = read_log(log_path)
    last = -1 if last_eval_iteration is None else last_eval_iteration
    kept, last_logged = [], None
    for line in lines.records:
        if line.value["iter"] <= last:
            kept.append(line.text + "\n")
            last_logged = line.value["iter"]
    if last_eval_record is not None and last_logged != last_eval_record.iter:
        kept.append(last_eval_record.to_line())
    message = lines.warning(Path(log_path).name)
    if message is not None and warn is not None:
        warn(message)
    return "".join(kept)


class RunLog:
    """``log.jsonl`` while a run trains: ``kept`` (the records a resume keeps, "" for a fresh
    run) is written together with the first new record, so a run that fails before its first
    evaluation leaves an old log as it was; later records are appended."""

    def __init__(self, path: str | os.PathLike[str], kept: str) -> None:
        self.path = Path(path)
        self._head: str | None = kept
        self._label = f"log {str(self.path)!r}"

    def append(self, record: EvalRecord) -> None:
        """Add ``record``'s line: the first one rewrites the file, later ones are appended. A
        FIFO (or a socket, a directory) there is refused, never waited on (`glassllm._files`)."""
        line = record.to_line()
        if self._head is not None:  # the run's first evaluation: start the log
            with open_regular(self.path, self._label, "write") as log:
                log.write((self._head + line).encode("utf-8"))
            self._head = None
        else:
            with open_regular(self.path, self._label, "append") as log:
                log.write(line.encode("utf-8"))
