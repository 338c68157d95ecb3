"""The one safetensors reader (glassllm/safetensors_file.py) against the reference implementation
(safetensors' own reader), and the header checks it adds to it, as checkpoints see them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import glassllm
from glassllm.checkpoint import CheckpointError
from glassllm.safetensors_file import MAX_HEADER_BYTES, SafetensorsError, read_header, read_tensors


def _write(path, header_text: str, data: bytes = b"") -> str:
    raw = header_text.encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return str(path)


def _edit(path, edit) -> None:
    """Rewrite the header of the safetensors file ``path`` with ``edit(header, data) -> data``."""
    blob = path.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    header, data = json.loads(blob[8 : 8 + length]), blob[8 + length :]
    data = edit(header, data)
    _write(path, json.dumps(header), data)


def test_read_tensors_matches_the_reference_reader(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.standard_normal((3, 5)).astype(np.float32),
        "d": rng.standard_normal(7),
        "h": rng.standard_normal((2, 2)).astype(np.float16),
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "steps": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(3, dtype=np.uint8),
    }
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata={"a": "1", "b": "{}"})
    arrays, metadata = read_tensors(str(path))
    with safetensors.safe_open(str(path), framework="np") as handle:
        assert metadata == handle.metadata()
        expected = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    assert list(arrays) == sorted(tensors)
    for name, array in arrays.items():
        assert array.dtype == expected[name].dtype and array.shape == expected[name].shape
        assert array.tobytes() == expected[name].tobytes(), name
        assert array.flags.writeable and array.flags.c_contiguous and array.flags.owndata
    assert read_header(str(path))[1] == metadata


def test_a_tensor_stored_under_two_names_comes_back_as_two_arrays(tmp_path):
    weight = np.ones((2, 3), np.float32)
    path = tmp_path / "tied.safetensors"
    safetensors.numpy.save_file({"a": weight, "b": weight}, str(path))
    arrays, _ = read_tensors(str(path))
    arrays["a"][0, 0] = 5.0
    assert arrays["b"][0, 0] == 1.0


def _checkpoint(tmp_path):
    model = glassllm.nn.Linear(4, 4, rng=np.random.default_rng(0))
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, model, metadata={"iter": 1})
    return path


def _overlap(header, data):
    names = sorted(k for k in header if k != "__metadata__")
    header[names[1]]["data_offsets"] = [0, 4 * math.prod(header[names[1]]["shape"])]
    return data


def _gap(header, data):
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    header[last]["data_offsets"] = [n + 4 for n in header[last]["data_offsets"]]
    return data + bytes(4)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [(_overlap, "data_offsets overlap"), (_gap, "data_offsets leave a gap")],
)
def test_a_checkpoint_whose_tensors_overlap_or_leave_a_gap_is_refused(tmp_path, edit, problem):
    path = _checkpoint(tmp_path)
    _edit(path, edit)
    for reader in (glassllm.checkpoint.read, glassllm.checkpoint.read_metadata):
        with pytest.raises(CheckpointError, match="not a readable safetensors") as caught:
            reader(path)
        assert problem in str(caught.value)


def test_a_checkpoint_naming_a_tensor_twice_is_refused(tmp_path):
    # The reference reader keeps the last of two entries of one name and reads the file.
    path = _checkpoint(tmp_path)
    blob = path.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    text, data = blob[8 : 8 + length].decode().rstrip(), blob[8 + length :]
    header = json.loads(text)
    twice = json.dumps(header["bias"])[1:-1]
    _write(path, text[:-1] + f', "bias": {{{twice}}}}}', data)
    for reader in (glassllm.checkpoint.read, glassllm.checkpoint.read_metadata):
        with pytest.raises(CheckpointError, match="'bias' given twice"):
            reader(path)


def test_a_checkpoint_of_a_dtype_numpy_lacks_is_refused_by_name(tmp_path):
    path = _write(
        tmp_path / "bf16.safetensors",
        json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}),
        bytes(4),
    )
    with pytest.raises(CheckpointError, match=r"NumPy has no dtype for tensors w \(BF16\)"):
        glassllm.checkpoint.read(path)
    assert read_header(path)[0]["w"].dtype == "BF16"  # the header alone reads (HF widens it)


def test_hostile_headers_are_refused_at_the_cost_of_reading_them(tmp_path):
    deep = _write(tmp_path / "deep.safetensors", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SafetensorsError, match="nested deeper than"):
        read_tensors(deep)
    huge = tmp_path / "huge.safetensors"
    with open(huge, "wb") as handle:  # a sparse file: the header length fits it, not the bound
        handle.write((MAX_HEADER_BYTES + 1).to_bytes(8, "little"))
        handle.truncate(MAX_HEADER_BYTES + 16)
    with pytest.raises(SafetensorsError, match=f"header length {MAX_HEADER_BYTES + 1} does not"):
        read_tensors(str(huge))
    metadata = _write(tmp_path / "m.safetensors", '{"__metadata__": {"n": 1}}')
    with pytest.raises(SafetensorsError, match="is not an object of strings"):
        read_tensors(metadata)
    with pytest.raises(FileNotFoundError):  # an OSError is not a malformed file: it passes
        read_tensors(str(tmp_path / "gone.safetensors"))
