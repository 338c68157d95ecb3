"""glassllm.atomic_file: the temporaries of writers that died are removed by the next successful
save of the same target, and only those; a target that is not a regular file is never replaced."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

import glassllm
import glassllm.nn as nn
from glassllm.atomic_file import write_bytes_atomically

pytestmark = pytest.mark.skipif(os.name != "posix", reason="process ids are checked on POSIX")


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The id of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(ProcessLookupError):  # the premise of every test below
        os.kill(child.pid, 0)
    return child.pid


@pytest.fixture
def live_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child.pid
    child.kill()
    child.wait()


def temporary(directory, target: str, pid: int, tag: str = "0123abcd") -> str:
    name = f".{target}.{pid}.{tag}.tmp"
    (directory / name).write_bytes(b"half a checkpoint")
    return name


def test_a_dead_writers_temporary_is_removed_by_the_next_save(tmp_path, dead_pid):
    stale = temporary(tmp_path, "ckpt.safetensors", dead_pid)
    write_bytes_atomically(tmp_path / "ckpt.safetensors", b"new")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"], stale
    assert (tmp_path / "ckpt.safetensors").read_bytes() == b"new"


def test_live_writers_other_targets_and_other_files_are_left_alone(tmp_path, dead_pid, live_child):
    keep = [
        temporary(tmp_path, "ckpt.safetensors", os.getpid()),  # this process: a live writer
        temporary(tmp_path, "ckpt.safetensors", live_child),  # another live writer
        temporary(tmp_path, "other.safetensors", dead_pid),  # another target
        temporary(tmp_path, "ckpt.safetensors.5", dead_pid),  # a target whose name extends ours
        temporary(tmp_path, "ckpt", dead_pid),  # a target whose name ours extends
        temporary(tmp_path, "ckpt.safetensors", dead_pid, tag="not-hex!"),  # not our pattern
        f"ckpt.safetensors.{dead_pid}.0123abcd.tmp",  # no leading dot: not ours
    ]
    (tmp_path / keep[-1]).write_bytes(b"user file")
    linked = f".ckpt.safetensors.{dead_pid}.aaaaaaaa.tmp"
    (tmp_path / linked).symlink_to(tmp_path / "other.safetensors")  # a link, not a temporary
    folder = f".ckpt.safetensors.{dead_pid}.bbbbbbbb.tmp"
    (tmp_path / folder).mkdir()
    stale = temporary(tmp_path, "ckpt.safetensors", dead_pid, tag="ffffffff")

    write_bytes_atomically(tmp_path / "ckpt.safetensors", b"new")
    names = set(os.listdir(tmp_path))
    assert stale not in names
    assert names == {*keep, linked, folder, "ckpt.safetensors"}


def test_long_target_names_keep_their_temporaries_apart(tmp_path, dead_pid):
    # Two names equal in their first 200 bytes: their temporaries' names must differ.
    first, second = "a" * 230 + ".one", "a" * 230 + ".two"
    write_bytes_atomically(tmp_path / first, b"1")
    write_bytes_atomically(tmp_path / second, b"2")
    from glassllm.atomic_file import _temporary_stem

    stems = _temporary_stem(first), _temporary_stem(second)
    assert stems[0] != stems[1] and all(len(s.encode()) <= 200 for s in stems)
    stale_first = temporary(tmp_path, stems[0], dead_pid)
    stale_second = temporary(tmp_path, stems[1], dead_pid)
    write_bytes_atomically(tmp_path / second, b"2 again")
    assert stale_first in os.listdir(tmp_path) and stale_second not in os.listdir(tmp_path)


def test_a_save_killed_mid_write_leaves_nothing_after_the_next_save(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, nn.Linear(64, 64))
    code = (
        "import os, sys, time, glassllm, glassllm.nn as nn\n"
        "real = os.fsync\n"
        "def stop(fd):\n"
        "    print('written', flush=True); time.sleep(600)\n"
        "os.fsync = stop\n"
        "glassllm.save(sys.argv[1], nn.Linear(64, 64))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "written"
        assert len([n for n in os.listdir(tmp_path) if n.endswith(".tmp")]) == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    glassllm.save(path, nn.Linear(64, 64))
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_a_target_that_is_not_a_regular_file_is_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.safetensors"
    link.symlink_to(fifo)
    for target in (fifo, link):
        with pytest.raises(OSError, match="not a regular file; not replaced"):
            write_bytes_atomically(target, b"data")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["link.safetensors", "pipe"]
