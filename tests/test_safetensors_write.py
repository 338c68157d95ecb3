"""Writing safetensors behind the boundary (glassllm.safetensors_file.serialize / write_file,
and checkpoint saves): the library's own errors become ours, and a full disk, on a real small
filesystem (a tmpfs; root only, else the test is skipped), is an OSError with errno ENOSPC
naming the file, leaving nothing half-written and the previous checkpoint intact."""

import errno

import numpy as np
import pytest
from conftest import small_disk

import glassllm
import glassllm.nn as nn
from glassllm.safetensors_file import SafetensorsWriteError, read_tensors, serialize, write_file


def test_what_the_library_cannot_serialise_is_our_error():
    with pytest.raises(SafetensorsWriteError, match="Unknown dtype"):
        serialize({"a": np.zeros(2, dtype=object)})
    with pytest.raises(SafetensorsWriteError, match="cannot serialise"):
        serialize({"a": "not an array"})


def test_write_file_round_trips(tmp_path):
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    write_file(tmp_path / "t.safetensors", tensors, {"format": "pt"})
    arrays, metadata = read_tensors(str(tmp_path / "t.safetensors"))
    assert np.array_equal(arrays["w"], tensors["w"]) and metadata == {"format": "pt"}


def test_write_file_onto_a_full_disk_is_enospc_and_leaves_nothing(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        with pytest.raises(OSError) as info:
            write_file(disk / "big.safetensors", {"w": np.zeros(100_000, np.float32)})
        assert info.value.errno == errno.ENOSPC and info.value.filename.endswith("big.safetensors")
        assert list(disk.iterdir()) == []


def test_a_checkpoint_save_onto_a_full_disk_keeps_the_old_one(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        path = disk / "ckpt.safetensors"
        small = nn.Linear(4, 4, rng=np.random.default_rng(0))
        glassllm.save(path, small, metadata={"step": 1})
        before = path.read_bytes()
        big = nn.Linear(4, 8000, rng=np.random.default_rng(0))  # 128 KB: more than is left
        with pytest.raises(OSError) as info:
            glassllm.save(path, big, metadata={"step": 2})
        assert info.value.errno == errno.ENOSPC and "ckpt.safetensors" in str(info.value)
        assert path.read_bytes() == before and [p.name for p in disk.iterdir()] == [path.name]
