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

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from glassllm._text import shown

_STDERR_LOCK = threading.RLock()


def is_panic(err: BaseException) -> bool:
    """Whether ``err`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``)."""
    kind = type(err)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


def one_line(err: BaseException, limit: int = 300) -> str:
    """``err`` as ``Type: message`` on one line, at most about ``limit`` characters."""
    text = " ".join(str(err).split())
    kind = "panic" if is_panic(err) else type(err).__name__
    return f"{kind}: {shown(text, limit)[1:-1]}" if text else kind


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 on the null device until the block ends (nothing where it cannot)."""
    with _STDERR_LOCK:
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: nothing to keep quiet
            yield
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            os.close(saved)
            yield
            return
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def foreign_call(error: Callable[[str], BaseException], quiet: bool = True) -> Iterator[None]:
    """Run the block as a call into a third-party library: an Exception or a Rust panic raised in
    it becomes ``error(one_line(err))`` (``"panic: ..."`` for a panic), raised from None;
    ``quiet`` silences file descriptor 2 meanwhile (see the module docstring)."""
    with _stderr_silenced() if quiet else contextlib.nullcontext():
        try:
            yield
        except Exception as err:
            raise error(one_line(err)) from None
        except BaseException as err:  # KeyboardInterrupt, SystemExit, ... pass on untouched
            if not is_panic(err):
                raise
            raise error(one_line(err)) from None
