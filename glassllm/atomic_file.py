"""Write a file so that readers see the old contents or the new, never half of either.

The bytes go to a temporary file beside the target, named ``.<target name>.<pid>.<8 hex>.tmp``
(the writer's process id, then a random tag), which is renamed over the target once complete. A
writer killed mid-save leaves its temporary behind; the next successful save of the same target
removes every such temporary whose writer is gone (POSIX: ``os.kill(pid, 0)`` finds no process).
A temporary of a live writer, of another target, or anything else in the directory is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat

# Temporary names stay under the usual 255-byte limit: a target name longer than this (in
# bytes) is cut, and a digest of the whole name keeps two such targets' temporaries apart.
_MAX_STEM_BYTES = 200
_TEMP_SUFFIX = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp")


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``,
    then fsync the directory so the rename itself survives a crash; then remove the temporaries
    of ``path`` left by writers that died (see the module docstring).

    A crash (or SIGKILL) at any moment leaves either the previous file or the new one; the
    temporary file is removed when writing fails. A symlink is written through, not replaced;
    a target that exists and is not a regular file (a device, a FIFO, a socket, a directory) is
    refused with an ``OSError``, never replaced. The file gets ordinary permissions (0o666 minus
    the umask), unlike ``tempfile.mkstemp``'s 0o600.
    """
    # Through a symlink to its target, as torch.save and a plain open() do: renaming over the
    # link itself would replace it with a regular file.
    path = os.path.realpath(os.fspath(path))
    _refuse_non_regular(path)
    directory = os.path.dirname(os.path.abspath(path))
    stem = _temporary_stem(os.path.basename(path))
    temporary = os.path.join(directory, f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(temporary, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(err, OSError) and err.filename is None:  # a full disk: name the file
            raise OSError(err.errno, err.strerror or str(err), path) from None
        raise
    fsync_path(directory)
    remove_stale_temporaries(path)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[str]:
    """Remove the temporaries of ``path`` whose writer process no longer exists; return their
    names. POSIX only (elsewhere nothing is removed). A process id that was reused since keeps
    its file (removed at a later save); a writer in another PID namespace sharing the directory
    is not visible to this check, so such a setup must not save the same target from both."""
    if os.name != "posix":  # os.kill(pid, 0) on Windows would terminate the process
        return []
    path = os.path.realpath(os.fspath(path))
    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{_temporary_stem(os.path.basename(path))}"
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TEMP_SUFFIX.fullmatch(name, len(prefix)) if name.startswith(prefix) else None
        if match is None or process_exists(int(match.group(1))):
            continue
        candidate = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(candidate).st_mode):  # never a link, never a directory
                os.unlink(candidate)
                removed.append(name)
    return removed


def _temporary_stem(name: str) -> str:
    """``name`` itself if short enough, else its start and a digest of all of it."""
    if len(os.fsencode(name)) <= _MAX_STEM_BYTES:
        return name
    tag = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    stem = name
    while len(os.fsencode(stem + tag)) > _MAX_STEM_BYTES:  # bytes, not characters
        stem = stem[:-1]
    return stem + tag


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (ours, or another user's: EPERM says it does)."""
    if pid <= 0:  # 0 and negatives address process groups, not one process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists, or cannot tell: keep the file
    return True


def _refuse_non_regular(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError:
        return  # the write itself will report what is wrong
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise OSError(errno.EEXIST, f"{path} is {kind}, not a regular file; not replaced")


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file or a directory (making a rename in it durable) to disk; silently nothing where
    the platform cannot (a directory on Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
