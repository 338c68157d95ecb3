"""Text corpora, named by what ``--data`` accepts.

- ``builtin``: the English reference text of the Python documentation that ships with every
  CPython (``pydoc_data.topics``, what ``help("assert")`` prints): about 465,000 characters, no
  network needed, so the main job runs on a fresh machine.
- ``shakespeare``: tiny Shakespeare from karpathy/char-rnn (1.1 MB), downloaded once into a cache
  directory and checked against its sha256.
- anything else: a path to a UTF-8 text file.

A name wins over a file of the same name in the current directory; write ``./builtin`` for the file.

Every file is read as untrusted input, and a bad one costs no more than reading it up to a limit:
only a regular file is opened (a FIFO, device, socket or directory is refused, never waited on:
`glassllm._files`, the rule for every file glassllm reads), at most :data:`MAX_CORPUS_BYTES` are
read (``$GLASSLLM_MAX_CORPUS_BYTES`` overrides it), and the bytes must be UTF-8 text without NUL
bytes. Each refusal is one :class:`DataError` naming the path and the reason.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from glassllm._files import FileProblem, read_regular
from glassllm.atomic_file import write_bytes_atomically

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# Environment variables: where downloads are cached, and where tiny Shakespeare is fetched from
# (tests point the latter at a local server).
CACHE_ENV = "GLASSLLM_CACHE"
SHAKESPEARE_URL_ENV = "GLASSLLM_SHAKESPEARE_URL"
DOWNLOAD_TIMEOUT_S = 30.0
# The largest corpus file read (1 GiB). Tokenized, each byte becomes up to one int64 id, so a
# corpus at the limit already needs several GiB; $GLASSLLM_MAX_CORPUS_BYTES sets another limit.
MAX_CORPUS_BYTES = 1 << 30
MAX_CORPUS_ENV = "GLASSLLM_MAX_CORPUS_BYTES"
# Tiny Shakespeare is 1,115,394 bytes: a download or cached copy larger than this is refused
# unread, whatever a server sends.
MAX_DOWNLOAD_BYTES = 16 << 20

CORPUS_NAMES = ("builtin", "shakespeare")


class DataError(ValueError):
    """No text to train on: a missing, empty or unreadable file, a failed download."""


def builtin_text() -> str:
    """The Python documentation topics of this interpreter, joined in sorted key order."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def cache_dir() -> Path:
    """``$GLASSLLM_CACHE``, else ``$XDG_CACHE_HOME/glassllm``, else ``~/.cache/glassllm``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "glassllm"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shakespeare_text(cache: Path | None = None, url: str | None = None) -> str:
    """Tiny Shakespeare, downloaded on first use into ``cache`` (default :func:`cache_dir`).

    The download is checked against :data:`SHAKESPEARE_SHA256` before it is saved; a cached copy
    that no longer matches (truncated, edited, replaced by something that is not a regular file)
    is fetched again. Neither is read past `MAX_DOWNLOAD_BYTES`.
    """
    path = (cache or cache_dir()) / "tinyshakespeare.txt"
    try:  # the cached copy is untrusted too: bounded, then checked like a download
        data = _read_regular_file(str(path), MAX_DOWNLOAD_BYTES, "cached file")
    except DataError:  # absent, not a regular file, too large: download again
        data = None
    if data is not None and _sha256(data) == SHAKESPEARE_SHA256:
        return data.decode("utf-8")
    url = url or os.environ.get(SHAKESPEARE_URL_ENV) or SHAKESPEARE_URL
    hint = "pass a local copy of the text with --data PATH"
    # URLError and timeouts are OSErrors; a connection dropped mid-body raises http.client's
    # IncompleteRead, an HTTPException (as does a malformed response).
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            # Never more than MAX_DOWNLOAD_BYTES + 1, whatever a server sends. With a declared
            # length, read() reads exactly that and raises IncompleteRead when the body is short.
            declared = response.length  # None when the server did not say
            if declared is None:
                data = response.read(MAX_DOWNLOAD_BYTES + 1)
            elif declared <= MAX_DOWNLOAD_BYTES:
                data = response.read()
            else:
                data = None
    except (OSError, ValueError, http.client.HTTPException) as err:
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {err.reason}"
        elif isinstance(err, http.client.IncompleteRead):
            got = len(err.partial)
            total = got + (err.expected or 0)
            reason = f"IncompleteRead: the connection closed after {got} of {total} bytes"
        else:
            reason = getattr(err, "reason", None) or f"{type(err).__name__}: {err}"
        reason = " ".join(str(reason).split())  # one line, even when a server sent line breaks
        raise DataError(
            f"could not download tiny Shakespeare from {url} ({reason}); "
            f"check the network connection, or {hint}"
        ) from None
    if data is None or len(data) > MAX_DOWNLOAD_BYTES:
        raise DataError(
            f"the file at {url} is larger than {MAX_DOWNLOAD_BYTES:,} bytes, so it is not tiny "
            f"Shakespeare; it was not saved. {hint[0].upper()}{hint[1:]}"
        )
    digest = _sha256(data)
    if digest != SHAKESPEARE_SHA256:
        raise DataError(
            f"the file downloaded from {url} ({len(data)} bytes) has sha256 {digest}, "
            f"expected {SHAKESPEARE_SHA256}; it was not saved. Retry later, or {hint}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(path, data)
    except OSError as err:
        # The text is good; failing to cache it only costs a download next time.
        import warnings

        warnings.warn(f"could not cache tiny Shakespeare at {path}: {err}", stacklevel=2)
    return data.decode("utf-8")


def max_corpus_bytes() -> int:
    """The corpus size limit: ``$GLASSLLM_MAX_CORPUS_BYTES`` if set, else `MAX_CORPUS_BYTES`."""
    raw = os.environ.get(MAX_CORPUS_ENV)
    if not raw:
        return MAX_CORPUS_BYTES
    value = int(raw) if raw.strip().isdigit() else 0
    if value < 1:
        raise DataError(f"${MAX_CORPUS_ENV} must be a positive number of bytes, got {raw!r}")
    return value


def read_text_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> str:
    """A UTF-8 text file's contents, with one clear :class:`DataError` for each way it can fail.

    Refused, each before more than ``max_bytes`` (default `max_corpus_bytes`) are read: a path
    that is not a regular file, a file over the limit, bytes with a NUL (a binary file) or that
    are not UTF-8, an empty file.
    """
    name = os.fspath(path)
    limit = max_corpus_bytes() if max_bytes is None else max_bytes
    raw = _read_regular_file(name, limit, "data file")
    if not raw:
        raise DataError(f"data file {name!r} is empty")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DataError(
            f"data file {name!r} is binary, not text (a NUL byte at offset {nul}); "
            "a corpus is a UTF-8 text file"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file {name!r} is not UTF-8 text (undecodable byte 0x{raw[err.start]:02x} at "
            f"offset {err.start}); convert it to UTF-8"
        ) from None


def _read_regular_file(path: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused with a :class:`DataError` (whose message
    starts with ``what`` and the path) when it is missing, not a regular file, unreadable, or
    larger than ``limit`` bytes: `glassllm._files.read_regular`, the rule for every file read."""
    hint = f" (${MAX_CORPUS_ENV} sets the limit for a corpus)" if what == "data file" else ""
    try:
        return read_regular(path, limit, f"{what} {path!r}", hint)
    except FileProblem as err:
        names = " (built-in corpora: builtin, shakespeare)" if what == "data file" else ""
        raise DataError(str(err) + (names if err.problem == "not found" else "")) from None


def load_text(spec: str, max_bytes: int | None = None) -> str:
    """The text named by ``spec``: ``"builtin"``, ``"shakespeare"`` or a file path (read with
    :func:`read_text_file`, at most ``max_bytes``)."""
    if spec == "builtin":
        return builtin_text()
    if spec == "shakespeare":
        return shakespeare_text()
    return read_text_file(spec, max_bytes)
