"""Write a file so that readers see the old contents or the new, never half of either."""

from __future__ import annotations

import contextlib
import os
import secrets


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``,
    then fsync the directory so the rename itself survives a crash.

    A crash (or SIGKILL) at any moment leaves either the previous file or the new one; the
    temporary file is removed when writing fails. A symlink is written through, not replaced.
    The file gets ordinary permissions
    (0o666 minus the umask), unlike ``tempfile.mkstemp``'s 0o600.
    """
    # Through a symlink to its target, as torch.save and a plain open() do: renaming over the
    # link itself would replace it with a regular file.
    path = os.path.realpath(os.fspath(path))
    directory = os.path.dirname(os.path.abspath(path))
    # The name is capped so that prefix and suffix keep it under the usual 255-byte limit even
    # when the target's own name is close to it.
    stem = os.path.basename(path)
    while len(os.fsencode(stem)) > 200:  # bytes, not characters: names may be non-ASCII
        stem = stem[:-1]
    temporary = os.path.join(directory, f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    """Make the rename durable; not possible on every platform (e.g. Windows)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
