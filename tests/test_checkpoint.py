"""Checkpoints: bit-for-bit round trips, the file layout, ties, metadata, bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import safetensors.numpy

import glassllm
import glassllm.checkpoint
import glassllm.nn as nn
from glassllm import Tensor
from glassllm.checkpoint import CheckpointError
from glassllm.optim import SGD, Adam, AdamW


class Tied(nn.Module):
    """Two layers sharing one weight, plus a parameter whose array is a transposed view."""

    def __init__(self, seed: int = 0, dtype=np.float32) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.first = nn.Linear(4, 4, dtype=dtype, rng=rng)
        self.second = nn.Linear(4, 4, dtype=dtype, rng=rng)
        self.second.weight = self.first.weight  # tied: one parameter, two names
        # Non-C-contiguous storage, what safetensors 0.8.0 writes wrongly (upstream #825).
        self.out = Tensor(rng.standard_normal((3, 4)).astype(dtype).T, requires_grad=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.second(self.first(x).tanh()) @ self.out  # (B, 3)


def batch(step: int, dtype=np.float32) -> Tensor:
    return Tensor(np.random.default_rng(100 + step).standard_normal((5, 4)).astype(dtype))


def train(model, optimizer, steps: range) -> None:
    for step in steps:
        optimizer.zero_grad()
        y = model(batch(step))
        (y * y).mean().backward()
        optimizer.step()


def adamw(model, named=True):
    params = list(model.named_parameters()) if named else list(model.parameters())
    return AdamW(
        [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}],
        lr=0.01,
    )


def snapshot(model, optimizer=None):
    return model.state_dict(), (optimizer.state_dict() if optimizer is not None else None)


def assert_same(a, b):
    model_a, opt_a = a
    model_b, opt_b = b
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        np.testing.assert_array_equal(model_a[key], model_b[key])
    if opt_a is not None:
        assert opt_a["param_groups"] == opt_b["param_groups"]
        assert opt_a["state"].keys() == opt_b["state"].keys()
        for name, entry in opt_a["state"].items():
            for key, value in entry.items():
                np.testing.assert_array_equal(value, opt_b["state"][name][key])


@pytest.mark.parametrize("named", [True, False], ids=["named_parameters", "parameters"])
def test_round_trip_continues_bit_for_bit(tmp_path, named):
    straight = Tied(seed=0)
    straight_opt = adamw(straight, named)
    train(straight, straight_opt, range(6))

    first = Tied(seed=0)
    first_opt = adamw(first, named)
    train(first, first_opt, range(3))
    glassllm.save(tmp_path / "ckpt.safetensors", first, first_opt, metadata={"iter": 3})

    resumed = Tied(seed=7)  # different initial values: everything must come from the file
    resumed_opt = adamw(resumed, named)
    resumed_opt.param_groups[0]["lr"] = 0.5
    assert glassllm.load(tmp_path / "ckpt.safetensors", resumed, resumed_opt) == {"iter": 3}
    train(resumed, resumed_opt, range(3, 6))
    assert_same(snapshot(resumed, resumed_opt), snapshot(straight, straight_opt))


def test_gpt_round_trip_with_configure_optimizer(tmp_path):
    from glassllm.models import GPT, GPTConfig

    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    rng = np.random.default_rng(0)
    data = [(rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))) for _ in range(4)]

    def steps(model, opt, batches):
        for idx, targets in batches:
            opt.zero_grad()
            model(idx, targets)[1].backward()
            opt.step()

    straight = GPT(config, rng=np.random.default_rng(1))
    straight_opt = straight.configure_optimizer(1e-2, 0.1, (0.9, 0.99))
    steps(straight, straight_opt, data)
    first = GPT(config, rng=np.random.default_rng(1))
    first_opt = first.configure_optimizer(1e-2, 0.1, (0.9, 0.99))
    steps(first, first_opt, data[:2])
    glassllm.save(tmp_path / "gpt.safetensors", first, first_opt)
    resumed = GPT(config, rng=np.random.default_rng(2))
    resumed_opt = resumed.configure_optimizer(1e-2, 0.1, (0.9, 0.99))
    glassllm.load(tmp_path / "gpt.safetensors", resumed, resumed_opt)
    steps(resumed, resumed_opt, data[2:])
    assert_same(snapshot(resumed, resumed_opt), snapshot(straight, straight_opt))


def test_file_is_plain_safetensors_with_named_optimizer_state(tmp_path):
    model = Tied()
    optimizer = adamw(model, named=False)  # positional optimizer names still map to model names
    train(model, optimizer, range(2))
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, model, optimizer, metadata={"note": "hi"})

    tensors = safetensors.numpy.load_file(path)
    model_keys = ["first.weight", "first.bias", "second.bias", "out"]
    assert sorted(k for k in tensors if not k.startswith("optim.")) == sorted(model_keys)
    assert "second.weight" not in tensors  # the tied weight is stored once
    assert sorted(k for k in tensors if k.startswith("optim.")) == sorted(
        f"optim.{key}.{name}" for key in ("exp_avg", "exp_avg_sq") for name in model_keys
    )
    np.testing.assert_array_equal(tensors["out"], model.out.data)  # transposed view, right values
    optimizer_name = {id(p): n for n, p in optimizer.named_parameters()}[id(model.first.weight)]
    assert optimizer_name == "1"  # model order: a module's own parameters ("out") first
    np.testing.assert_array_equal(
        tensors["optim.exp_avg.first.weight"], optimizer.state[optimizer_name]["exp_avg"]
    )
    with safetensors.safe_open(str(path), framework="np") as handle:
        header = handle.metadata()
    assert json.loads(header["glassllm.metadata"]) == {"note": "hi"}
    optimizer_header = json.loads(header["glassllm.optimizer"])
    assert optimizer_header["class"] == "AdamW"
    assert optimizer_header["scalar_state"]["first.weight"] == {"step": 2}
    assert optimizer_header["param_groups"][0]["params"] == ["out", "first.weight"]
    assert optimizer_header["param_groups"][0]["betas"] == [0.9, 0.999]


def test_transposed_parameter_and_tie_survive(tmp_path):
    model = Tied(seed=0)
    assert not model.out.data.flags.c_contiguous
    glassllm.save(tmp_path / "m.safetensors", model)
    fresh = Tied(seed=1)
    arrays = {name: param.data for name, param in fresh.named_parameters()}
    glassllm.load(tmp_path / "m.safetensors", fresh)
    for name, param in fresh.named_parameters():
        assert param.data is arrays[name]  # copied into the existing arrays, in place
    assert fresh.second.weight is fresh.first.weight
    np.testing.assert_array_equal(fresh.out.data, model.out.data)
    np.testing.assert_array_equal(fresh.second.weight.data, model.first.weight.data)


class WithScalar(nn.Module):
    """A 0-d parameter (a learned temperature, say) beside a matrix."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.scale = Tensor(np.array(value, dtype=np.float32), requires_grad=True)
        self.weight = Tensor(np.full((2, 3), value, dtype=np.float32), requires_grad=True)


def test_zero_dimensional_parameter_and_its_adam_state_round_trip(tmp_path):
    model = WithScalar(0.5)
    optimizer = Adam(model.named_parameters(), lr=0.1)
    (model.weight * model.scale).sum().backward()
    optimizer.step()
    glassllm.save(tmp_path / "s.safetensors", model, optimizer)
    with safetensors.safe_open(tmp_path / "s.safetensors", framework="np") as handle:
        assert handle.get_tensor("scale").shape == ()
    fresh = WithScalar(2.0)
    fresh_optimizer = Adam(fresh.named_parameters(), lr=0.1)
    glassllm.load(tmp_path / "s.safetensors", fresh, fresh_optimizer)
    assert fresh.scale.shape == ()
    np.testing.assert_array_equal(fresh.scale.data, model.scale.data)
    assert fresh_optimizer.state_dict()["state"]["scale"]["exp_avg"].shape == ()
    np.testing.assert_array_equal(
        fresh_optimizer.state_dict()["state"]["scale"]["exp_avg"],
        optimizer.state_dict()["state"]["scale"]["exp_avg"],
    )


def test_metadata_comes_back_equal(tmp_path):
    metadata = {
        "iter": 2000,
        "best_val_loss": 1.8812345678901234,
        "config": {"n_layer": 4, "bias": False},
        "vocab": ["\n", " ", "é", "字"],
        "none": None,
        "rng": {"state": 2**127 + 3, "inc": 5},
    }
    glassllm.save(tmp_path / "a.safetensors", Tied(), metadata=metadata)
    assert glassllm.load(tmp_path / "a.safetensors", Tied()) == metadata
    glassllm.save(tmp_path / "b.safetensors", Tied())
    assert glassllm.load(tmp_path / "b.safetensors", Tied()) == {}


@pytest.mark.parametrize(
    "metadata, match",
    [
        ({"betas": (0.9, 0.95)}, "unchanged"),
        ({1: "one"}, "unchanged"),
        ({"loss": float("nan")}, "JSON"),
        ({"array": np.zeros(2)}, "JSON"),
        (["not", "a", "dict"], "must be a dict"),
    ],
)
def test_bad_metadata_raises_before_writing(tmp_path, metadata, match):
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, Tied(), metadata={"version": 1})
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=match):
        glassllm.save(path, Tied(seed=3), metadata=metadata)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_read_metadata_from_the_header_alone(tmp_path):
    path = tmp_path / "m.safetensors"
    glassllm.save(path, Tied(), metadata={"model_config": {"n_layer": 2}})
    assert glassllm.checkpoint.read_metadata(path) == {"model_config": {"n_layer": 2}}
    path.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        glassllm.checkpoint.read_metadata(path)
    with pytest.raises(FileNotFoundError):
        glassllm.checkpoint.read_metadata(tmp_path / "gone.safetensors")


def test_load_without_optimizer_ignores_its_state(tmp_path):
    model, optimizer = Tied(), None
    optimizer = adamw(model)
    train(model, optimizer, range(1))
    glassllm.save(tmp_path / "c.safetensors", model, optimizer)
    fresh = Tied(seed=4)
    glassllm.load(tmp_path / "c.safetensors", fresh)
    assert_same(snapshot(fresh), snapshot(model))


def test_optimizer_with_foreign_parameter_cannot_be_saved(tmp_path):
    model = Tied()
    stranger = Tensor(np.zeros(2, np.float32), requires_grad=True)
    optimizer = Adam([*model.parameters(), stranger])
    with pytest.raises(CheckpointError, match="not the model's"):
        glassllm.save(tmp_path / "d.safetensors", model, optimizer)
    assert not os.listdir(tmp_path)


def test_file_permissions_are_ordinary(tmp_path):
    glassllm.save(tmp_path / "p.safetensors", Tied())
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "p.safetensors").st_mode & 0o777 == 0o666 & ~umask


# ---------------------------------------------------------------------- bad input changes nothing


@pytest.fixture
def saved(tmp_path):
    """A trained model and optimizer saved to disk, and a second pair to load into."""
    model = Tied(seed=0)
    optimizer = adamw(model)
    train(model, optimizer, range(2))
    path = tmp_path / "ckpt.safetensors"
    glassllm.save(path, model, optimizer, metadata={"iter": 2})
    target = Tied(seed=5)
    target_opt = adamw(target)
    train(target, target_opt, range(1))
    return path, target, target_opt


def _flip_byte(path, offset_from_end):
    data = bytearray(path.read_bytes())
    data[len(data) - offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


class Other(nn.Module):
    def __init__(self, dtype=np.float32, extra=False, width=4):
        super().__init__()
        self.first = nn.Linear(4, width, dtype=dtype)
        self.second = nn.Linear(width, 4, dtype=dtype)
        self.second.weight = self.first.weight if width == 4 else self.second.weight
        self.out = Tensor(np.zeros((4, 3), dtype), requires_grad=True)
        if extra:
            self.more = nn.Linear(2, 2, dtype=dtype)


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-37]),
    "empty": lambda p: p.write_bytes(b""),
    "not_safetensors": lambda p: p.write_text("step,loss\n1,4.17\n" * 20),
    "flipped_data_byte": lambda p: _flip_byte(p, 5),
    "flipped_header_byte": lambda p: _flip_byte(p, len(p.read_bytes()) - 20),
    "saved_without_optimizer": lambda p: glassllm.save(p, Tied()),
    "unexpected_keys": lambda p: glassllm.save(p, Other(extra=True)),
    "another_model": lambda p: glassllm.save(p, nn.Linear(4, 4)),
    "wrong_shapes": lambda p: glassllm.save(p, Other(width=5)),
    "wrong_dtypes": lambda p: glassllm.save(p, Tied(dtype=np.float64)),
    "optimizer_of_sgd_kind": lambda p: glassllm.save(p, (m := Tied()), SGD(m.parameters(), 0.1)),
    "optimizer_groups_differ": lambda p: glassllm.save(p, (m := Tied()), AdamW(m.parameters())),
    "optimizer_of_adam_kind": lambda p: glassllm.save(p, (m := Tied()), Adam(m.parameters())),
    "plain_state_dict_file": lambda p: safetensors.numpy.save_file(
        {"first.weight": np.zeros((4, 4), np.float32)}, str(p)
    ),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_bad_checkpoint_raises_and_changes_nothing(saved, corruption):
    path, model, optimizer = saved
    CORRUPTIONS[corruption](path)
    before = snapshot(model, optimizer)
    arrays = [param.data for param in model.parameters()]
    with pytest.raises(CheckpointError, match="checkpoint|safetensors"):
        glassllm.load(path, model, optimizer)
    assert_same(snapshot(model, optimizer), before)
    assert [param.data for param in model.parameters()] == arrays


def test_bad_checkpoint_error_lists_every_problem(saved, tmp_path):
    path, model, optimizer = saved
    glassllm.save(path, Other(extra=True, width=5))
    with pytest.raises(CheckpointError) as info:
        glassllm.load(path, model, optimizer)
    message = str(info.value)
    # the model's problems as Module.check_state_dict words them, the optimizer's after them
    for part in (
        "4 problems",
        "unexpected keys: more.bias, more.weight, second.weight (tied to first.weight",
        "first.weight: shape mismatch, checkpoint (4, 5) vs model (4, 4)",
        "first.bias: shape mismatch, checkpoint (5,) vs model (4,)",
        "no optimizer state",
        "not changed",
    ):
        assert part in message
    glassllm.save(path, nn.Linear(4, 4))
    with pytest.raises(CheckpointError, match="missing keys: out, first.weight"):
        glassllm.load(path, model)


def test_optimizer_state_of_wrong_shape_is_caught(saved):
    path, model, optimizer = saved
    tensors = safetensors.numpy.load_file(path)
    with safetensors.safe_open(str(path), framework="np") as handle:
        header = handle.metadata()
    tensors["optim.exp_avg.out"] = np.zeros((3, 4), np.float32)
    del header["glassllm.sha256"]  # a hand-edited file: no digest to check against
    safetensors.numpy.save_file(tensors, str(path), metadata=header)
    before = snapshot(model, optimizer)
    with pytest.raises(CheckpointError, match="exp_avg of 'out'"):
        glassllm.load(path, model, optimizer)
    assert_same(snapshot(model, optimizer), before)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        glassllm.load(tmp_path / "nope.safetensors", Tied())
    with pytest.raises(CheckpointError, match="not a file"):
        glassllm.load(tmp_path, Tied())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        glassllm.save(tmp_path / "missing_dir" / "x.safetensors", Tied())


# ---------------------------------------------------------------------- read once, verified


def rewrite(path, tensors=None, **entries):
    """Rewrite ``path`` with header entries replaced (None deletes) and the digest recomputed:
    a self-consistent file, as a hostile or buggy writer would make."""
    with safetensors.safe_open(str(path), framework="np") as handle:
        header = dict(handle.metadata())
        stored = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    tensors = stored if tensors is None else tensors
    for key, value in entries.items():
        key = "glassllm." + key
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    header["glassllm.sha256"] = glassllm.checkpoint._digest(tensors, header)
    safetensors.numpy.save_file(tensors, str(path), metadata=header)


def test_read_returns_verified_tensors_and_metadata(saved):
    path, model, optimizer = saved
    checkpoint = glassllm.checkpoint.read(path)
    assert isinstance(checkpoint, glassllm.checkpoint.Checkpoint)
    assert checkpoint.path == str(path)
    assert checkpoint.metadata == {"iter": 2}
    assert sorted(checkpoint.tensors) == sorted(safetensors.numpy.load_file(path))
    assert checkpoint.optimizer["class"] == "AdamW"
    with pytest.raises(AttributeError):
        checkpoint.metadata = {}  # frozen


def test_load_from_a_checkpoint_does_not_read_the_file_again(saved):
    path, model, optimizer = saved
    expected = Tied(seed=9)
    expected_opt = adamw(expected)
    glassllm.load(path, expected, expected_opt)
    checkpoint = glassllm.checkpoint.read(path)
    os.remove(path)
    assert glassllm.load(checkpoint, model, optimizer) == {"iter": 2}
    assert_same(snapshot(model, optimizer), snapshot(expected, expected_opt))


def test_read_checks_the_digest_before_decoding_metadata(saved):
    path, _, _ = saved
    data = path.read_bytes()
    # "iter": 2 -> "iter": 7 in the JSON metadata, digest left as it was
    assert data.count(b'{\\"iter\\": 2}') == 1
    path.write_bytes(data.replace(b'{\\"iter\\": 2}', b'{\\"iter\\": 7}'))
    with pytest.raises(CheckpointError, match="corrupted"):
        glassllm.checkpoint.read(path)
    # and a self-consistent file whose metadata is no dict is refused too
    rewrite(path, metadata="[1, 2]")
    with pytest.raises(CheckpointError, match="metadata is a JSON list, not an object"):
        glassllm.checkpoint.read(path)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        glassllm.checkpoint.read(path.with_name("gone.safetensors"))


# ---------------------------------------------------------------------- malformed JSON entries


def _edit(change):
    def apply(header):
        change(header)
        return json.dumps(header)

    return apply


_HUGE = "1" + "0" * 400  # a JSON integer that no float can hold
_LR0 = lambda h: h["param_groups"][0].update(lr=12345)  # noqa: E731 (a marker to replace)

# Self-consistent files (digest recomputed) whose optimizer entry is malformed.
HOSTILE_OPTIMIZER_ENTRIES = {
    "hyper-parameter 10**400": lambda h: _edit(_LR0)(h).replace("12345", _HUGE),
    "hyper-parameter 1e400": lambda h: _edit(_LR0)(h).replace("12345", "1e400"),
    "hyper-parameter Infinity": lambda h: _edit(_LR0)(h).replace("12345", "Infinity"),
    "step 10**400": lambda h: _edit(lambda h: h["scalar_state"]["out"].update(step=12345))(
        h
    ).replace("12345", _HUGE),
    "step 2**63": _edit(lambda h: h["scalar_state"]["out"].update(step=2**63)),
    "step a list": _edit(lambda h: h["scalar_state"]["out"].update(step=[1])),
    "parameter name a list": _edit(lambda h: h["param_groups"][0]["params"].append(["x"])),
    "parameter name a dict": _edit(lambda h: h["param_groups"][1].update(params=[{"a": 1}])),
    "class a list": _edit(lambda h: h.update({"class": ["AdamW"]})),
    "betas a dict": _edit(lambda h: h["param_groups"][0].update(betas={"a": 1})),
    "groups a dict": _edit(lambda h: h.update(param_groups={"a": 1})),
    "nested too deeply": lambda h: json.dumps(h).replace('"AdamW"', "[" * 10**5 + "]" * 10**5),
    "not JSON": lambda h: "{",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_OPTIMIZER_ENTRIES))
def test_malformed_optimizer_entry_raises_checkpoint_error_and_changes_nothing(saved, case):
    path, model, optimizer = saved
    with safetensors.safe_open(str(path), framework="np") as handle:
        header = json.loads(handle.metadata()["glassllm.optimizer"])
    rewrite(path, optimizer=HOSTILE_OPTIMIZER_ENTRIES[case](header))
    before = snapshot(model, optimizer)
    with pytest.raises(CheckpointError, match="checkpoint"):
        glassllm.load(path, model, optimizer)
    assert_same(snapshot(model, optimizer), before)
    assert [group["lr"] for group in optimizer.param_groups] == [0.01, 0.01]
    optimizer.step()  # and the optimizer still works


@pytest.mark.parametrize(
    "metadata, match",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"elapsed_s": 1e400}', "1e400 does not fit a float"),
        ('{"iteration": Infinity}', "Infinity is not a JSON number"),
        ('{"loss": NaN}', "NaN is not a JSON number"),
        ('{"n": 1' + "0" * 5000 + "}", "not valid JSON"),
        ("[1, 2]", "metadata is a JSON list, not an object"),
        ('"text"', "metadata is a JSON str, not an object"),
    ],
    ids=["deep list", "deep dict", "1e400", "Infinity", "NaN", "5000 digits", "list", "str"],
)
def test_malformed_metadata_raises_checkpoint_error_everywhere(saved, metadata, match):
    path, model, optimizer = saved
    rewrite(path, metadata=metadata)
    before = snapshot(model, optimizer)
    for reader in (
        glassllm.checkpoint.read_metadata,
        glassllm.checkpoint.read,
        lambda p: glassllm.load(p, model, optimizer),
    ):
        with pytest.raises(CheckpointError, match=match):
            reader(path)
    assert_same(snapshot(model, optimizer), before)


def test_load_checks_the_model_without_copying_its_weights(saved, monkeypatch):
    path, model, optimizer = saved
    expected = Tied(seed=9)
    glassllm.load(path, expected)

    def no_copies(self):
        raise AssertionError("load copied the model's weights to check them")

    monkeypatch.setattr(nn.Module, "state_dict", no_copies)
    glassllm.load(path, model, optimizer)
    monkeypatch.undo()
    assert_same(snapshot(model), snapshot(expected))
