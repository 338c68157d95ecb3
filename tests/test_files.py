"""glassllm._files: regular files only, never waiting on a FIFO, reads bounded."""

import os
import threading

import pytest

from glassllm._files import FileProblem, not_writable_kind, open_regular, read_regular


def bounded(fn, *args, seconds=30):
    """``fn(*args)`` on a thread; still running after ``seconds``: the test fails (a hang)."""
    box = {}

    def call():
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed back below
            box["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("mode", ["read", "write", "append"])
def test_a_fifo_is_refused_in_every_mode_without_waiting(tmp_path, mode):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(FileProblem, match=r"is a FIFO \(named pipe\), not a regular file"):
        bounded(open_regular, fifo, "log", mode)


def test_a_fifo_with_a_writer_waiting_is_refused_too(tmp_path):
    """A reader already there (so a non-blocking open for writing succeeds): fstat refuses it."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(FileProblem, match="FIFO"):
            bounded(open_regular, fifo, "log", "append")
    finally:
        os.close(reader)


def test_reads_are_bounded_and_name_the_problem(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100, "file") == b"x" * 100
    with pytest.raises(FileProblem, match="100 bytes, over the limit of 99 bytes"):
        read_regular(path, 99, "file")
    with pytest.raises(FileProblem, match="not found"):
        read_regular(tmp_path / "missing", 10, "file")
    with pytest.raises(FileProblem, match="is a directory"):
        read_regular(tmp_path, 10, "file")
    with pytest.raises(FileProblem, match="character device"):
        read_regular("/dev/zero", 10, "file")  # never read to its (absent) end
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_regular(link, 100, "file") == b"x" * 100  # a link to a regular file is one


def test_writes_go_to_regular_files_and_character_devices_only(tmp_path):
    with open_regular(tmp_path / "new.jsonl", "log", "write") as handle:
        handle.write(b"a\n")
    with open_regular(tmp_path / "new.jsonl", "log", "append") as handle:
        handle.write(b"b\n")
    assert (tmp_path / "new.jsonl").read_bytes() == b"a\nb\n"
    with open_regular("/dev/null", "log", "append") as handle:  # discarding a log is a choice
        handle.write(b"gone\n")
    assert not_writable_kind(os.stat("/dev/null").st_mode) is None
    assert not_writable_kind(os.stat(tmp_path).st_mode) == "a directory"
    with pytest.raises(FileProblem, match="directory"):
        open_regular(tmp_path, "log", "append")
