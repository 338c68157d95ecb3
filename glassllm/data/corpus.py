"""Text corpora, named by what ``--data`` accepts.

- ``builtin``: the English reference text of the Python documentation that ships with every
  CPython (``pydoc_data.topics``, what ``help("assert")`` prints): about 465,000 characters, no
  network needed, so the main job runs on a fresh machine.
- ``shakespeare``: tiny Shakespeare from karpathy/char-rnn (1.1 MB), downloaded once into a cache
  directory and checked against its sha256.
- anything else: a path to a UTF-8 text file.

A name wins over a file of the same name in the current directory; write ``./builtin`` for the file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

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
    that no longer matches (truncated, edited) is fetched again.
    """
    path = (cache or cache_dir()) / "tinyshakespeare.txt"
    if path.is_file():
        data = path.read_bytes()
        if _sha256(data) == SHAKESPEARE_SHA256:
            return data.decode("utf-8")
    url = url or os.environ.get(SHAKESPEARE_URL_ENV) or SHAKESPEARE_URL
    hint = "pass a local copy of the text with --data PATH"
    # URLError and timeouts are OSErrors; a connection dropped mid-body raises http.client's
    # IncompleteRead, an HTTPException (as does a malformed response).
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
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


def read_text_file(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's contents, with one clear :class:`DataError` for each way it can fail."""
    path = Path(path)
    if not path.exists():
        raise DataError(
            f"data file {str(path)!r} not found (built-in corpora: builtin, shakespeare)"
        )
    if path.is_dir():
        raise DataError(f"data path {str(path)!r} is a directory, not a text file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read data file {str(path)!r}: {err.strerror or err}") from None
    if not raw:
        raise DataError(f"data file {str(path)!r} is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file {str(path)!r} is not UTF-8 text (undecodable byte at offset {err.start})"
        ) from None


def load_text(spec: str) -> str:
    """The text named by ``spec``: ``"builtin"``, ``"shakespeare"`` or a file path."""
    if spec == "builtin":
        return builtin_text()
    if spec == "shakespeare":
        return shakespeare_text()
    return read_text_file(spec)
