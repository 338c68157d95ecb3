"""The tiny Shakespeare download path, against a local HTTP server on 127.0.0.1 (no network)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from glassllm.data import SHAKESPEARE_SHA256, DataError, corpus, shakespeare_text
from glassllm.data.corpus import SHAKESPEARE_URL_ENV

REPO = Path(__file__).resolve().parents[2]
# The test copy lives in shared/ beside the repository (or inside it, in some checkouts);
# GLASSLLM_TINYSHAKESPEARE names another copy.
SHARED_COPIES = [
    Path(os.environ.get("GLASSLLM_TINYSHAKESPEARE", REPO / "missing")),
    REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt",
    REPO / "shared" / "data" / "tinyshakespeare" / "input.txt",
    Path("/work/shared/data/tinyshakespeare/input.txt"),
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


class _BrokenHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request in the way named by the server's ``mode``:

    - ``truncated``: promises 1,000,000 bytes, sends 105 and closes (a dropped connection);
    - ``garbage``: a reply that is not HTTP at all;
    - ``stall``: headers, then silence longer than the client's timeout.
    """

    def do_GET(self):
        mode = self.server.mode
        if mode == "garbage":
            self.wfile.write(b"this is not an HTTP response\r\n\r\n")
        else:
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            if mode == "truncated":
                self.wfile.write(b"First Citizen:\n" * 7)
            else:
                self.wfile.flush()
                time.sleep(1.0)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def broken_server():
    """Start a server on 127.0.0.1 answering as ``mode`` (see _BrokenHandler); returns its url."""
    servers = []

    def start(mode):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BrokenHandler)
        server.mode = mode
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/input.txt"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def shakespeare_bytes(monkeypatch):
    """The real file when a copy is at hand; otherwise a stand-in whose digest the download
    path is told to expect, so the path is still exercised end to end (never skipped)."""
    for path in SHARED_COPIES:
        if path.is_file():
            return path.read_bytes()
    stand_in = ("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 2000).encode()
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", hashlib.sha256(stand_in).hexdigest())
    return stand_in


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


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("truncated", "IncompleteRead: the connection closed after 105 of 1000000 bytes"),
        ("garbage", "BadStatusLine"),
        ("stall", "timed out"),
    ],
)
def test_broken_download_is_a_clear_error(broken_server, tmp_path, monkeypatch, mode, reason):
    monkeypatch.setattr(corpus, "DOWNLOAD_TIMEOUT_S", 0.2)
    with pytest.raises(DataError, match=r"could not download.*--data PATH") as raised:
        shakespeare_text(cache=tmp_path / "cache", url=broken_server(mode))
    assert reason in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()


def test_cli_reports_a_dropped_download_in_one_line(broken_server, tmp_path, capsys, monkeypatch):
    from glassllm.app.cli import main

    monkeypatch.setenv("GLASSLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(SHAKESPEARE_URL_ENV, broken_server("truncated"))
    status = main(["train", "--data", "shakespeare", "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("glassllm: error: could not download") and "--data PATH" in err
    assert "IncompleteRead" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "cache").exists()
