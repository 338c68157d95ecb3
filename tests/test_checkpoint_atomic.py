"""Atomic saves: a failure or a SIGKILL in the middle of a save leaves the previous file intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import glassllm
import glassllm.nn as nn
from glassllm.checkpoint import CheckpointError

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

# A child that saves a Linear whose weights all equal the version number, with that number in
# the metadata, so any file on disk tells which save produced it and whether it is whole.
CHILD_PRELUDE = """
import sys, time
import numpy as np
import glassllm, glassllm.nn as nn

path = sys.argv[1]
model = nn.Linear(256, 256)

def save(version):
    model.weight.data[...] = version
    model.bias.data[...] = version
    glassllm.save(path, model, metadata={"version": version})
"""


def versioned(path, version):
    model = nn.Linear(256, 256)
    model.weight.data[...] = version
    model.bias.data[...] = version
    glassllm.save(path, model, metadata={"version": version})


def check_whole(path) -> int:
    """Load ``path``; assert every weight equals the version its metadata names; return it."""
    model = nn.Linear(256, 256)
    version = glassllm.load(path, model)["version"]
    assert np.all(model.weight.data == version) and np.all(model.bias.data == version)
    return version


def start_child(path, body: str) -> subprocess.Popen:
    code = CHILD_PRELUDE + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )


def wait_for_line(child: subprocess.Popen, expected: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.strip() == expected:
            return
        if not line and child.poll() is not None:
            break
    child.kill()
    pytest.fail(f"child did not print {expected!r}")


def test_sigkill_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    versioned(path, 1)
    # The child's write stops half way, then it waits to be killed: a crash mid-write.
    child = start_child(
        path,
        """
        import os
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, handle):
                self.handle = handle
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return False
            def write(self, data):
                self.handle.write(data[: len(data) // 2])
                self.handle.flush()
                print("half written", flush=True)
                time.sleep(120)

        os.fdopen = lambda fd, mode: HalfWriter(real_fdopen(fd, mode))
        save(2)
    """,
    )
    wait_for_line(child, "half written")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    leftovers = [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert len(leftovers) == 1  # the kill really happened mid-save, in the same directory
    assert check_whole(path) == 1
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        glassllm.load(tmp_path / leftovers[0], nn.Linear(256, 256))
    versioned(path, 3)  # and the next save goes through
    assert check_whole(path) == 3


def test_sigkill_during_repeated_saves_always_leaves_a_whole_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    versioned(path, 0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        child = start_child(
            path,
            """
            print("saving", flush=True)
            version = 1
            while True:
                save(version)
                version += 1
        """,
        )
        wait_for_line(child, "saving")
        time.sleep(float(rng.uniform(0.05, 0.3)))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        check_whole(path)


def test_failed_write_cleans_up_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    versioned(path, 1)

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        versioned(path, 2)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    assert check_whole(path) == 1


def test_longest_legal_file_name_can_be_saved(tmp_path):
    # The temporary file's name adds a prefix and a suffix to the target's: it must stay under
    # the file-system limit (255 bytes) when the target name itself is legal.
    for name in ("c" * 240 + ".safetensors", "é" * 120 + ".st"):  # 251 and 123 characters
        path = tmp_path / name
        model = nn.Linear(2, 3)
        glassllm.save(path, model)
        fresh = nn.Linear(2, 3)
        glassllm.load(path, fresh)
        assert np.array_equal(fresh.weight.data, model.weight.data)
    assert sorted(os.listdir(tmp_path)) == sorted(["c" * 240 + ".safetensors", "é" * 120 + ".st"])


def test_saving_through_a_symlink_writes_its_target(tmp_path):
    target = tmp_path / "runs" / "ckpt.safetensors"
    target.parent.mkdir()
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    model = nn.Linear(3, 2)
    glassllm.save(link, model)
    assert link.is_symlink() and target.is_file()
    fresh = nn.Linear(3, 2, rng=np.random.default_rng(5))
    glassllm.load(target, fresh)
    np.testing.assert_array_equal(fresh.weight.data, model.weight.data)
