"""The tiny Shakespeare download path, against a local HTTP server on 127.0.0.1 (no network)."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
from pathlib import Path

import pytest

from glassllm.data import SHAKESPEARE_SHA256, DataError, shakespeare_text
from glassllm.data.corpus import SHAKESPEARE_URL_ENV

REPO = Path(__file__).resolve().parents[1]
# The test copy lives in shared/ beside the repository (or inside it, in some checkouts).
SHARED_COPIES = [
    REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt",
    REPO / "shared" / "data" / "tinyshakespeare" / "input.txt",
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def local_server(tmp_path):
    """Serve a directory over HTTP on 127.0.0.1 from a thread; yields (root dir, base url)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def shakespeare_bytes():
    for path in SHARED_COPIES:
        if path.is_file():
            return path.read_bytes()
    pytest.skip("no shared copy of tiny Shakespeare")


def test_download_verifies_caches_and_reuses(
    local_server, shakespeare_bytes, tmp_path, monkeypatch
):
    root, base = local_server
    (root / "input.txt").write_bytes(shakespeare_bytes)
    cache = tmp_path / "cache"
    monkeypatch.setenv(SHAKESPEARE_URL_ENV, f"{base}/input.txt")

    text = shakespeare_text(cache=cache)
    assert text.startswith("First Citizen:")
    assert (cache / "tinyshakespeare.txt").read_bytes() == shakespeare_bytes
    assert [p.name for p in cache.iterdir()] == ["tinyshakespeare.txt"]  # no temporary left

    (root / "input.txt").unlink()  # the second call must not touch the network
    assert shakespeare_text(cache=cache) == text


def test_wrong_checksum_is_refused_and_not_cached(local_server, tmp_path):
    root, base = local_server
    (root / "input.txt").write_text("not shakespeare\n")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=rf"sha256 .* expected {SHAKESPEARE_SHA256}.*--data PATH"):
        shakespeare_text(cache=cache, url=f"{base}/input.txt")
    assert not (cache / "tinyshakespeare.txt").exists()


def test_corrupted_cache_is_downloaded_again(local_server, shakespeare_bytes, tmp_path):
    root, base = local_server
    (root / "input.txt").write_bytes(shakespeare_bytes)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tinyshakespeare.txt").write_bytes(shakespeare_bytes[:1000])  # truncated earlier
    assert shakespeare_text(cache=cache, url=f"{base}/input.txt").startswith("First Citizen:")
    assert (cache / "tinyshakespeare.txt").read_bytes() == shakespeare_bytes


def test_missing_file_on_server_is_a_clear_error(local_server, tmp_path):
    _, base = local_server
    with pytest.raises(DataError, match="could not download.*404.*--data PATH"):
        shakespeare_text(cache=tmp_path / "cache", url=f"{base}/input.txt")


def test_no_server_is_a_clear_error(tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(DataError, match=r"could not download.*--data PATH"):
        shakespeare_text(cache=tmp_path / "cache", url=f"http://127.0.0.1:{port}/input.txt")
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()
