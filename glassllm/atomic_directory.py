"""Replace a directory so that after a kill at any moment the old one or the new one is there.

A writer builds the new directory beside the target (`make_temporary`: ``.<name>.<pid>.<8
hex>.tmp``) and hands it to `replace_directory`:

* no target, or an empty one: one ``rename(2)``, atomic (POSIX renames a directory over an empty
  one);
* a non-empty target, on Linux: ``renameat2(RENAME_EXCHANGE)`` swaps the two names in one atomic
  step, then the temporary name, now holding the old directory, is removed. A kill before the
  swap leaves the old directory at the path, one after it the new one;
* where the swap is not available (another system, a file system without it): the old directory
  is renamed to ``.<name>.<pid>.<8 hex>.old``, the new one into place, the old one removed. A kill
  between the two renames leaves no directory at the path, and `recover` puts the old one back.

`recover` (run by the next writer, before it checks the target) handles what a writer that died
left: an ``.old`` directory is renamed back to the path when nothing is there, and every other
leftover (temporaries, ``.old`` copies of a path that is there) is removed. A leftover of a live
process, or anything else in the folder, is left alone; symlinks are never followed or removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import stat
import sys
from pathlib import Path

from glassllm.atomic_file import fsync_path, process_exists

_LEFTOVER = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.(tmp|old)")
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
# The swap is unsupported by the system or the file system: fall back to two renames.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}


def make_temporary(target: str | os.PathLike[str], suffix: str = "tmp") -> Path:
    """Create and return an empty directory beside ``target`` named for this process."""
    target = Path(target)
    temporary = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}"
    os.mkdir(temporary)
    return temporary


def replace_directory(temporary: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move the directory ``temporary`` (beside ``target``) to ``target``, replacing what is there
    as described in the module docstring; the parent folder is flushed after."""
    temporary, target = Path(temporary), Path(target)
    if not target.is_dir() or not any(target.iterdir()):
        try:
            os.rename(temporary, target)
        except OSError:
            if not target.is_dir():
                raise
            target.rmdir()  # Windows does not rename over an empty directory
            os.rename(temporary, target)
    elif exchange(temporary, target):  # the temporary name now holds the old directory
        shutil.rmtree(temporary, ignore_errors=True)
    else:
        old = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
        os.rename(target, old)
        os.rename(temporary, target)  # a kill before this line: `recover` puts ``old`` back
        shutil.rmtree(old, ignore_errors=True)
    fsync_path(target.parent)


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap the names ``a`` and ``b`` (both existing) in one atomic step; False, with nothing
    changed, where the system or the file system cannot (anything but Linux 3.15+ with glibc
    2.28+, or e.g. some network file systems)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    status = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if status == 0:
        return True
    error = ctypes.get_errno()
    if error in _NO_EXCHANGE:
        return False
    raise OSError(error, os.strerror(error), os.fspath(a), None, os.fspath(b))


def _renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


def recover(target: str | os.PathLike[str]) -> list[str]:
    """Deal with what writers of ``target`` that died left beside it (see the module
    docstring); returns one sentence per leftover handled, for the user."""
    target = Path(target)
    prefix = f".{target.name}"
    try:
        names = sorted(os.listdir(target.parent))
    except OSError:
        return []
    leftovers = []
    for name in names:
        match = _LEFTOVER.fullmatch(name, len(prefix)) if name.startswith(prefix) else None
        if match is None or process_exists(int(match.group(1))):
            continue
        path = target.parent / name
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                leftovers.append((match.group(2), path))
    done = []
    # The newest .old first: the last directory that stood at the path.
    for kind, path in sorted(leftovers, key=lambda item: (item[0] != "old", -_mtime(item[1]))):
        if kind == "old" and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.rename(path, target)
                fsync_path(target.parent)
                done.append(f"put back {target} from {path.name}, left by a killed replacement")
                continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            done.append(f"removed {path.name}, left beside {target.name} by a killed writer")
    return done


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0
