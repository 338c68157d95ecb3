"""Opening files the program did not make: regular files only, never blocking, reads bounded.

The one rule for every file glassllm opens to read (a corpus, a run's logs, a checkpoint, a
Hugging Face directory's files): it must be a regular file (a symlink is followed to one). A
FIFO, device, socket or directory is refused with `FileProblem` naming what it is. A file
written in place (a run's logs) may also be a character device (``/dev/null``), never a FIFO,
socket, directory or block device. Nothing waits on a file: each is opened with
``O_NONBLOCK`` (``open`` of a FIFO without a writer blocks otherwise) and its type checked on the
open descriptor with ``fstat``, so a file swapped for a FIFO between a check and the open is
refused too. Reads stop at a limit given by
the caller, so a file that grows, or claims no size (``/proc``), costs no more than the limit.

>>> import os, tempfile
>>> fifo = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> os.mkfifo(fifo)
>>> try:
...     read_regular(fifo, 100, "log")
... except FileProblem as err:
...     print(err.problem)
is a FIFO (named pipe), not a regular file
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_CHUNK_BYTES = 1 << 20
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


class FileProblem(ValueError):
    """``label`` (e.g. ``"data file 'x.txt'"``) cannot be read: ``problem`` says why, as the end of
    a sentence that starts with the label (``"is a FIFO (named pipe), not a regular file"``)."""

    def __init__(self, label: str, problem: str, message: str | None = None) -> None:
        self.label, self.problem = label, problem
        super().__init__(message or f"{label} {problem}")


def not_regular(mode: int) -> str | None:
    """What a file of mode ``mode`` is when it is not a regular file (``"a FIFO (named pipe)"``),
    else None."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _NOT_REGULAR if test(mode)), "not a regular file")


def _refuse(label: str, info: os.stat_result) -> None:
    kind = not_regular(info.st_mode)
    if kind is not None:
        raise FileProblem(label, f"is {kind}, not a regular file")


def not_writable_kind(mode: int) -> str | None:
    """What a file of mode ``mode`` is when the program must not write to it: a FIFO (a write
    waits for a reader), a socket, a directory or a block device; else None. A character device
    is written as any file (``/dev/null`` discards a log; ``/dev/full`` answers ENOSPC)."""
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode):
        return None
    return not_regular(mode)


def _refuse_for_writing(label: str, info: os.stat_result) -> None:
    kind = not_writable_kind(info.st_mode)
    if kind is not None:
        raise FileProblem(label, f"is {kind}, not a regular file")


def _unreadable(label: str, err: OSError) -> FileProblem:
    if isinstance(err, FileNotFoundError):
        return FileProblem(label, "not found")
    reason = err.strerror or str(err)
    return FileProblem(label, f"cannot be read ({reason})", f"cannot read {label}: {reason}")


def open_regular(path: str | os.PathLike[str], label: str, mode: str = "read") -> BinaryIO:
    """``path`` opened in binary mode to ``"read"`` (a regular file only), or to ``"write"``
    (truncated) or ``"append"``, created if absent (a regular file or a character device:
    `not_writable_kind`); else `FileProblem` (missing, unreadable, or a kind refused). Never
    blocks on a FIFO."""
    flags = {
        "read": os.O_RDONLY,
        "write": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "append": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    }[mode]
    refuse = _refuse if mode == "read" else _refuse_for_writing
    try:
        descriptor = os.open(path, flags | _NONBLOCK | _BINARY, 0o666)
    except OSError as err:  # a FIFO opened to write without a reader: ENXIO
        with contextlib.suppress(OSError):
            refuse(label, os.stat(path))
        if mode != "read":
            raise  # a write's own error (permissions, a full disk) as it is
        raise _unreadable(label, err) from None
    try:
        refuse(label, os.fstat(descriptor))
        if _NONBLOCK:  # a regular file ignores it; cleared all the same, for plain semantics
            import fcntl

            flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
            fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~_NONBLOCK)
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, {"read": "rb", "write": "wb", "append": "ab"}[mode])


def read_regular(path: str | os.PathLike[str], limit: int, label: str, hint: str = "") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: `FileProblem` when it is
    missing, unreadable, not a regular file or larger than ``limit`` (``hint``: what to add to
    that message, e.g. the variable that sets the limit). Never reads more than ``limit + 1``
    bytes."""
    try:
        info = os.stat(path)  # follows a symlink: the file it points to must qualify
    except OSError as err:
        raise _unreadable(label, err) from None
    _check(label, info, limit, hint)  # before the open: a huge file is refused unopened
    with open_regular(path, label) as handle:
        try:
            info = os.fstat(handle.fileno())  # the file actually opened
            _check(label, info, limit, hint)
            # One read of the size the file says it has (plus one byte to see it grew), then
            # chunks for files that report no size (/proc) or grew since, up to the limit.
            chunks = [handle.read(min(info.st_size, limit) + 1)]
            total = len(chunks[0])
            while total <= limit and chunks[-1]:
                chunks.append(handle.read(min(_CHUNK_BYTES, limit + 1 - total)))
                total += len(chunks[-1])
        except OSError as err:  # EISDIR and EIO come from the read itself
            raise _unreadable(label, err) from None
    if total > limit:
        raise FileProblem(label, f"is larger than the limit of {limit:,} bytes{hint}")
    return b"".join(chunks)


def _check(label: str, info: os.stat_result, limit: int, hint: str) -> None:
    _refuse(label, info)
    if info.st_size > limit:
        raise FileProblem(
            label, f"is {info.st_size:,} bytes, over the limit of {limit:,} bytes{hint}"
        )
