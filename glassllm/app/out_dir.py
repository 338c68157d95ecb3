"""Whether an out_dir can take a run's files (`check_out_dir`), whether it already holds a run,
and replacing one (``glassllm train --overwrite``).

A fresh ``glassllm train`` into a directory holding a run's files (`OUT_FILES`: checkpoint, log,
statistics, plot) would silently replace that run, so it is refused, as Hugging Face's Trainer
refuses a non-empty output directory, unless ``--resume`` continues the run or ``--overwrite``
replaces it. Other files in the directory are never looked at nor touched.

``--overwrite`` removes the old run's files (rank 0, once the new run has started, before its
first file is written), the checkpoint first: after a kill at any moment the directory holds what
is left of the old run or files of the new one, never old log lines beside a new checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from glassllm._files import not_writable_kind
from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME, OUT_FILES, PLOT_NAME, STATS_NAME

# The checkpoint first: once it is gone, no --resume can continue a half-removed run.
_REMOVAL_ORDER = (CHECKPOINT_NAME, LOG_NAME, STATS_NAME, PLOT_NAME)
assert set(_REMOVAL_ORDER) == set(OUT_FILES)


def run_files(out_dir: str | os.PathLike[str]) -> list[str]:
    """The names of the run files in ``out_dir``: regular files (or links to one) only, so a
    device or FIFO there is no run (`check_out_dir` judges those)."""
    return [name for name in OUT_FILES if (Path(out_dir) / name).is_file()]


def check_new_run(out_dir: str | os.PathLike[str], overwrite: bool, resuming: bool = False) -> None:
    """ValueError (one line) when a fresh run would replace the run in ``out_dir`` and
    ``overwrite`` does not allow it, or when ``overwrite`` comes with ``resuming``."""
    if resuming:
        if overwrite:
            raise ValueError(
                "--overwrite starts a new run and --resume continues the one there: give only one"
            )
        return
    present = run_files(out_dir)
    if present and not overwrite:
        raise ValueError(
            f"out_dir {str(out_dir)!r} holds a run ({', '.join(present)}): pass --resume to "
            "continue it, --overwrite to replace it, or choose another --out-dir"
        )


def remove_run(out_dir: str | os.PathLike[str]) -> list[str]:
    """Remove the run files of ``out_dir`` (see the module docstring); returns their names."""
    removed = []
    for name in _REMOVAL_ORDER:
        path = Path(out_dir) / name
        if path.is_file():  # a link to a file: the link goes, what it points at stays
            path.unlink()
            removed.append(name)
    return removed


def check_out_dir(out_dir: str | os.PathLike[str]) -> None:
    """Raise ValueError unless a run can write its files in ``out_dir``, creating it if needed.

    Checks without creating anything: ``out_dir`` is a writable directory, or the nearest
    existing folder above it is one; none of the run's files there is a directory, a FIFO (a
    write would wait on it), a socket or a block device; an existing
    log or plot (rewritten in place, where the checkpoint is replaced by a rename) is writable.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        if os.path.lexists(out_dir):
            raise ValueError(f"out_dir {str(out_dir)!r} is not a directory")
        ancestor = out_dir.parent
        while not os.path.lexists(ancestor):
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ValueError(
                f"cannot create out_dir {str(out_dir)!r}: {str(ancestor)!r} is not a directory"
            )
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ValueError(
                f"cannot create out_dir {str(out_dir)!r}: {str(ancestor)!r} is not writable"
            )
        return
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir {str(out_dir)!r} is not writable")
    for name, what in OUT_FILES.items():
        path = out_dir / name
        try:
            kind = not_writable_kind(os.stat(path).st_mode)
        except OSError:
            kind = None  # absent (or a dangling link: written through, as a plain open would)
        if kind is not None:  # a FIFO would block the run's first write, or a read of it
            raise ValueError(
                f"{str(path)!r} is {kind}, where the run writes its {what}: remove it or "
                "choose another --out-dir"
            )
        if name != CHECKPOINT_NAME and path.exists() and not os.access(path, os.W_OK):
            raise ValueError(f"the {what} {str(path)!r} is not writable")
