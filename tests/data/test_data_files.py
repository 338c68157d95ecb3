"""Hostile data files: what cannot be a corpus is refused with one line, before it costs more
than reading a bounded number of bytes (glassllm.data.corpus)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from glassllm.data import DataError, corpus, load_text, read_text_file, shakespeare_text

REPO = Path(__file__).resolve().parents[2]
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs, devices and sockets are POSIX")


# A child reading an endless file must fail its test, not take the machine's memory with it.
CHILD_ADDRESS_SPACE = 8 << 30


def _cap_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))


def run_python(*args: str, timeout: float = 60.0, **env_vars: str) -> subprocess.CompletedProcess:
    """``python ARGS`` with this tree on the path and its memory capped; a run that blocks (e.g.
    opening a FIFO) fails the test at ``timeout`` instead of hanging it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_vars}
    try:
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=_cap_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"python {' '.join(args)} was still running after {timeout} s")


def run_cli(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
    """``python -m glassllm ARGS`` as a user runs it (see `run_python`)."""
    return run_python("-m", "glassllm", *args, **env_vars)


def assert_one_line_refusal(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassllm: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def load_with_deadline(path: str, seconds: float = 10.0) -> BaseException | str:
    """``load_text(path)`` in a thread: what it returned or raised, or a failure when it is still
    blocked after ``seconds`` (the thread stays behind; the caller unblocks it)."""
    outcome: list[BaseException | str] = []

    def target():
        try:
            outcome.append(load_text(path))
        except BaseException as err:  # handed back to the test thread
            outcome.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"load_text({path!r}) blocked for {seconds} s")
    return outcome[0]


@contextlib.contextmanager
def fifo_without_writer(directory: Path):
    path = directory / "corpus.fifo"
    os.mkfifo(path)
    try:
        yield path
    finally:
        # Should a reader be stuck in open() (the bug), a writer opening its end releases it.
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


# --- what is not a regular file ----------------------------------------------------------------


@posix_only
def test_a_fifo_without_a_writer_is_refused_without_blocking(tmp_path):
    with fifo_without_writer(tmp_path) as path:
        outcome = load_with_deadline(str(path))
        assert isinstance(outcome, DataError), outcome
        assert str(outcome) == f"data file {str(path)!r} is a FIFO (named pipe), not a regular file"


@posix_only
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused_before_it_is_read(device):
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    # In a child: a reader without a limit would read /dev/zero until memory runs out.
    code = "import sys; from glassllm.data import load_text; load_text(sys.argv[1])"
    result = run_python("-c", code, device)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last == f"glassllm.data.corpus.DataError: data file '{device}' is a character device, "
        "not a regular file"
    ), result.stderr[-500:]


@posix_only
def test_a_symlink_to_a_device_is_judged_by_what_it_points_to(tmp_path):
    link = tmp_path / "corpus.txt"
    link.symlink_to("/dev/zero")
    code = "import sys; from glassllm.data import load_text; load_text(sys.argv[1])"
    result = run_python("-c", code, str(link))
    assert "is a character device, not a regular file" in result.stderr, result.stderr[-500:]


@posix_only
def test_a_socket_is_refused():
    # A short directory: a socket's path must fit in about 100 bytes.
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        path = os.path.join(directory, "s")
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(path)
            with pytest.raises(DataError, match="is a socket, not a regular file"):
                load_text(path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"is a directory, not a regular file"):
        load_text(str(tmp_path))


def test_a_file_replaced_by_a_fifo_after_the_stat_is_still_refused(tmp_path, monkeypatch):
    # The race: the path was a regular file at os.stat, is a FIFO by the time it is opened. The
    # open must not block and the descriptor's own type must be checked.
    if os.name != "posix":
        pytest.skip("FIFOs are POSIX")
    with fifo_without_writer(tmp_path) as fifo:
        regular = tmp_path / "plain.txt"
        regular.write_text("some text")
        real_stat = os.stat
        monkeypatch.setattr(
            os, "stat", lambda p, *a, **k: real_stat(regular if p == str(fifo) else p, *a, **k)
        )
        outcome = load_with_deadline(str(fifo))
        monkeypatch.undo()
        assert isinstance(outcome, DataError) and "is a FIFO" in str(outcome), outcome


# --- size ------------------------------------------------------------------------------------


def test_the_limit_is_documented_and_sensible():
    assert corpus.MAX_CORPUS_BYTES == 1 << 30
    assert "MAX_CORPUS_BYTES" in corpus.__doc__


def test_a_file_over_the_limit_is_refused_naming_limit_and_size(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("a" * 1001)
    with pytest.raises(DataError) as raised:
        read_text_file(path, max_bytes=1000)
    message = str(raised.value)
    assert "1,001 bytes" in message and "limit of 1,000 bytes" in message, message
    assert str(path) in message and "GLASSLLM_MAX_CORPUS_BYTES" in message
    assert read_text_file(path, max_bytes=1001) == "a" * 1001  # the limit itself is allowed


def test_the_limit_comes_from_the_constant_and_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "big.txt"
    path.write_text("a" * 50)
    monkeypatch.setattr(corpus, "MAX_CORPUS_BYTES", 49)
    with pytest.raises(DataError, match="limit of 49 bytes"):
        load_text(str(path))
    monkeypatch.setenv("GLASSLLM_MAX_CORPUS_BYTES", "50")
    assert load_text(str(path)) == "a" * 50
    for bad in ("0", "-3", "1e9", "lots"):
        monkeypatch.setenv("GLASSLLM_MAX_CORPUS_BYTES", bad)
        with pytest.raises(DataError, match="GLASSLLM_MAX_CORPUS_BYTES must be a positive"):
            load_text(str(path))


def test_a_file_that_reports_no_size_is_read_no_further_than_the_limit(tmp_path, monkeypatch):
    # Files in /proc report size 0 and a file may grow after the stat: the reader must stop
    # at limit + 1 bytes, whatever the file turns out to hold.
    path = tmp_path / "growing.txt"
    path.write_bytes(b"x" * 5_000_000)
    real_stat, real_fstat, real_fdopen = os.stat, os.fstat, os.fdopen

    def sizeless(result):
        fields = list(result)
        fields[stat.ST_SIZE] = 0
        return os.stat_result(fields)

    read = []

    class Counting:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def fileno(self):
            return self.handle.fileno()

        def read(self, n=-1):
            chunk = self.handle.read(n)
            read.append(len(chunk))
            return chunk

    monkeypatch.setattr(os, "stat", lambda *a, **k: sizeless(real_stat(*a, **k)))
    monkeypatch.setattr(os, "fstat", lambda *a, **k: sizeless(real_fstat(*a, **k)))
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: Counting(real_fdopen(*a, **k)))
    with pytest.raises(DataError, match="larger than the limit of 1,000 bytes"):
        read_text_file(path, max_bytes=1000)
    assert sum(read) == 1001


@posix_only
def test_cli_refuses_dev_zero_and_a_fifo_in_one_line(tmp_path):
    out_dir = tmp_path / "out"
    assert_one_line_refusal(
        run_cli("train", "--data", "/dev/zero", "--out-dir", str(out_dir)),
        "'/dev/zero' is a character device, not a regular file",
    )
    with fifo_without_writer(tmp_path) as fifo:
        assert_one_line_refusal(
            run_cli("train", "--data", str(fifo), "--out-dir", str(out_dir)),
            "is a FIFO (named pipe), not a regular file",
        )
    big = tmp_path / "big.txt"
    big.write_text("ab" * 100)
    result = run_cli(
        "train", "--data", str(big), "--out-dir", str(out_dir), GLASSLLM_MAX_CORPUS_BYTES="100"
    )
    assert_one_line_refusal(result, "200 bytes, over the limit of 100 bytes")
    assert not out_dir.exists()


# --- contents ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", r"is binary, not text \(a NUL byte at offset 7\)"),
        (b"\x00" * 4096, r"is binary, not text \(a NUL byte at offset 0\)"),
        ("h\0i".encode("utf-16-le"), r"is binary"),  # UTF-16 text: NULs too
        (b"caf\xe9 au lait", r"not UTF-8 text \(undecodable byte 0xe9 at offset 3\)"),
        (b"\x89PNG\r\n\x1a\n", r"not UTF-8 text \(undecodable byte 0x89 at offset 0\)"),
    ],
    ids=["elf", "zeros", "utf16", "latin1", "png"],
)
def test_binary_and_non_utf8_files_get_one_clear_error(tmp_path, raw, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=message):
        load_text(str(path))


# --- the download cache ------------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Endless(http.server.BaseHTTPRequestHandler):
    """A body without a length that goes on (up to 64 MiB, so a reader without a limit ends)."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        block = b"First Citizen:\n" * 4096
        with contextlib.suppress(OSError):
            for _ in range((64 << 20) // len(block)):
                self.wfile.write(block)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(handler):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/input.txt"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_oversized_download_is_refused_unsaved(serve, tmp_path, monkeypatch):
    root = tmp_path / "www"
    root.mkdir()
    (root / "input.txt").write_bytes(b"First Citizen:\n" * 1000)  # 15,000 bytes
    monkeypatch.setattr(corpus, "MAX_DOWNLOAD_BYTES", 10_000)
    url = serve(functools.partial(_Quiet, directory=str(root)))
    with pytest.raises(DataError, match=r"larger than 10,000 bytes.*not saved.*--data PATH"):
        shakespeare_text(cache=tmp_path / "cache", url=url)
    assert not (tmp_path / "cache").exists()


def test_an_endless_download_is_cut_at_the_limit(serve, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_DOWNLOAD_BYTES", 100_000)
    with pytest.raises(DataError, match=r"larger than 100,000 bytes.*not saved"):
        shakespeare_text(cache=tmp_path / "cache", url=serve(_Endless))
    assert not (tmp_path / "cache").exists()


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "symlink-to-fifo", "oversized"])
def test_a_cached_copy_that_is_not_a_small_regular_file_is_fetched_again(
    serve, tmp_path, monkeypatch, kind
):
    text = b"First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", hashlib.sha256(text).hexdigest())
    root = tmp_path / "www"
    root.mkdir()
    (root / "input.txt").write_bytes(text)
    cache = tmp_path / "cache"
    cache.mkdir()
    cached = cache / "tinyshakespeare.txt"
    if kind == "fifo":
        os.mkfifo(cached)
    elif kind == "symlink-to-fifo":
        # Never a symlink to a real device here: a writer that replaced what a link points to
        # would replace the device itself when the tests run as root.
        os.mkfifo(tmp_path / "elsewhere.fifo")
        cached.symlink_to(tmp_path / "elsewhere.fifo")
    else:
        monkeypatch.setattr(corpus, "MAX_DOWNLOAD_BYTES", 10_000)
        cached.write_bytes(text * 10)  # 31,000 bytes: refused unread, not hashed

    url = serve(functools.partial(_Quiet, directory=str(root)))
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(shakespeare_text(cache=cache, url=url)), daemon=True
    )
    thread.start()
    thread.join(20)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(cached, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading the cache blocked")
    assert result == [text.decode()]
    if kind != "oversized":  # and the writer does not replace a FIFO (it warns instead)
        assert stat.S_ISFIFO(os.stat(cached).st_mode)
    else:
        assert cached.is_file() and not cached.is_symlink() and cached.read_bytes() == text
