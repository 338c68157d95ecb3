"""The boundary around compiled third-party libraries (``tokenizers``, ``safetensors``) called on
untrusted input: whatever they raise, a Rust panic included, comes out as the caller's own error.

A Rust library built with pyo3 turns a panic into ``pyo3_runtime.PanicException``, which derives
from BaseException, not Exception, so ``except Exception`` lets it through; and Rust's panic hook
has already written the panic (with a backtrace under ``RUST_BACKTRACE``) to file descriptor 2.
`foreign_call` catches the panic by its type (every pyo3 library has its own copy of that type,
so it is recognised by name: `is_panic`), lets KeyboardInterrupt, SystemExit and every other
BaseException pass untouched, and sends file descriptor 2 to the null device for the length of
the call, so the one line the program prints is the only one. (Another thread's writes to
stderr in that moment are lost with it; the library's message is kept in the error.)

>>> with foreign_call(lambda why: ValueError(f"the parser failed ({why})")):
...     int("twelve")
Traceback (most recent call last):
ValueError: the parser failed (ValueError: invalid literal for int() with base 10: 'twelve')
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from glassllm._text import shown

_STDERR_LOCK = threading.RLock()
_NULL: list[int] = []  # the null device, opened once (a call costs 3 system calls, not 5)
_DEPTH = [0]  # how deep the lock's owner is nested in silenced blocks


def stderr_silenced() -> _StderrSilenced:
    """File descriptor 2 on the null device for a block of many library calls (a vocabulary
    decoded token by token), so that each call inside costs no system call of its own."""
    return _StderrSilenced()


def is_panic(err: BaseException) -> bool:
    """Whether ``err`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``)."""
    kind = type(err)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


def one_line(err: BaseException, limit: int = 300) -> str:
    """``err`` as ``Type: message`` on one line, at most about ``limit`` characters."""
    text = " ".join(str(err).split())
    kind = "panic" if is_panic(err) else type(err).__name__
    return f"{kind}: {shown(text, limit)[1:-1]}" if text else kind


class _StderrSilenced:
    """File descriptor 2 on the null device until the block ends (nothing where it cannot).
    A class, not a generator: it is entered once per library call (~2 us)."""

    def __enter__(self) -> None:
        _STDERR_LOCK.acquire()
        self.saved = None
        _DEPTH[0] += 1
        if _DEPTH[0] > 1:  # already silenced by this thread (it holds the lock): nothing to do
            return
        try:
            if not _NULL:
                _NULL.append(os.open(os.devnull, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)))
            self.saved = os.dup(2)
            os.dup2(_NULL[0], 2)
        except OSError:  # no stderr, or no null device: nothing to keep quiet
            if self.saved is not None:
                os.close(self.saved)
                self.saved = None

    def __exit__(self, *exc_info: object) -> None:
        _DEPTH[0] -= 1
        try:
            if self.saved is not None:
                os.dup2(self.saved, 2)
                os.close(self.saved)
        finally:
            _STDERR_LOCK.release()


class foreign_call:  # noqa: N801 - used as a function: ``with foreign_call(error):``
    """Run the block as a call into a third-party library: an Exception or a Rust panic raised in
    it becomes ``error(one_line(err))`` (``"panic: ..."`` for a panic), raised from None;
    ``quiet`` silences file descriptor 2 meanwhile (see the module docstring)."""

    def __init__(self, error: Callable[[str], BaseException], quiet: bool = True) -> None:
        self.error = error
        self.quiet = _StderrSilenced() if quiet else None

    def __enter__(self) -> None:
        if self.quiet is not None:
            self.quiet.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: object
    ) -> bool:
        if self.quiet is not None:
            self.quiet.__exit__()
        if err is None:
            return False
        # KeyboardInterrupt, SystemExit and every other BaseException pass on untouched
        if isinstance(err, Exception) or is_panic(err):
            raise self.error(one_line(err)) from None
        return False
