"""Fuzzing the checkpoint loader and the run state's reader (fixed seeds, a few hundred cases each).

Every mutated file must either load exactly what it says (identically to the original when the
digest was not recomputed) or raise `CheckpointError` (`FileNotFoundError` for a missing file)
with the model and the optimizer unchanged; `RunState.from_metadata` must return a state or
raise `CheckpointError`, whatever the metadata holds. Figures: bench/LOG.md, Reliability.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import safetensors.numpy

import glassllm
import glassllm.checkpoint as checkpoint
from glassllm.app.config import TrainConfig
from glassllm.app.run_state import RunState, SavedRun
from glassllm.app.train import Trainer
from glassllm.checkpoint import CheckpointError
from glassllm.models import GPT

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40))
RAW = "\u0000raw:"  # a JSON string value starting with this is replaced by the raw text after it

# Values a hostile or damaged file could hold where another was expected.
HOSTILE_VALUES = [
    None, True, False, 0, -1, 1, 2**63, 10**308, 10**400, -(10**30), 1.5, -0.0, 1e308, 5e-324,
    "", "x", "1", "\u00e9\u20ac", [], [1, 2], {}, {"a": 1}, [[[]]], "x" * 10_000, list(range(1000)),
    RAW + "NaN", RAW + "Infinity", RAW + "-Infinity", RAW + "1e999", RAW + "1" + "0" * 5000,
    RAW + "[" * 100_000 + "]" * 100_000, RAW + '{"a":' * 50_000 + "1" + "}" * 50_000,
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-step tiny GPT run: (checkpoint path, trainer)."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "t.txt").write_text(TEXT)
    config = TrainConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, batch_size=2, max_iters=3,
                         eval_interval=3, eval_iters=1, warmup_iters=1, sample_tokens=0,
                         data=str(root / "t.txt"), out_dir=str(root / "o"))  # fmt: skip
    trainer = Trainer(config)
    trainer.fit(progress=False)
    return trainer.checkpoint_path, trainer


def _entries(path):
    with safetensors.safe_open(str(path), framework="np") as handle:
        return (
            {name: handle.get_tensor(name) for name in handle.keys()},  # noqa: SIM118
            dict(handle.metadata()),
        )


def _snapshot(model, optimizer):
    return copy.deepcopy((model.state_dict(), optimizer.state_dict()))


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _dumps(value):
    """JSON text of ``value`` with RAW-marked strings replaced by their raw text."""
    raws = []

    def mark(v):
        if isinstance(v, str) and v.startswith(RAW):
            raws.append(v[len(RAW) :])
            return f"\u0001{len(raws) - 1}\u0001"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(value))
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0001{i}\\u0001"', raw)
    return text


def _paths(value, prefix=()):
    """Every path into a JSON value (dict keys, list indices), the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:8]):
            yield from _paths(item, (*prefix, index))


def _mutated(value, rng):
    """A copy of the JSON value with one random change: a value replaced by a hostile one, a
    key deleted or added, a container's type swapped, or a list shortened or lengthened."""
    value = copy.deepcopy(value)
    paths = list(_paths(value))
    path = paths[rng.integers(len(paths))]
    if not path:
        return HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))]
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    key, kind = path[-1], rng.integers(6)
    if kind <= 2:
        parent[key] = HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))]
    elif kind == 3:
        del parent[key]
    elif kind == 4:
        target = parent[key]
        if isinstance(target, dict):
            target["unexpected"] = 1
        elif isinstance(target, list):
            target.append(copy.deepcopy(target[0]) if target else 1)
        else:
            parent[key] = [target]
    else:
        depth = int(rng.integers(1, 3000))
        parent[key] = RAW + "[" * depth + "]" * depth  # nested lists, written as text
    return value


def _text_mutated(text, rng):
    """The JSON text with a random cut, a random byte flipped or a random character inserted."""
    kind, at = rng.integers(3), int(rng.integers(len(text)))
    if kind == 0:
        return text[:at]
    if kind == 1:
        return text[:at] + chr((ord(text[at]) ^ int(rng.integers(1, 128))) or 1) + text[at + 1 :]
    return text[:at] + '{[",:}]1e'[rng.integers(9)] + text[at:]


class LoaderOracle:
    """Load a file into a fresh-state model and optimizer; check the outcome against the rule."""

    def __init__(self, path, trainer):
        self.original_tensors, self.original_header = _entries(path)
        self.original = checkpoint.read(path)
        self.model = GPT(trainer.model_config, rng=np.random.default_rng(99))
        self.optimizer = self.model.configure_optimizer(0.5, 0.3, (0.5, 0.6))
        self.outcomes = {"loaded": 0, "refused": 0}

    def check(self, path, recomputed):
        before = _snapshot(self.model, self.optimizer)
        try:
            metadata = glassllm.load(path, self.model, self.optimizer)
        except (CheckpointError, FileNotFoundError):
            assert _same(_snapshot(self.model, self.optimizer), before), "changed on error"
            self.outcomes["refused"] += 1
            return
        self.outcomes["loaded"] += 1
        model_state, optimizer_state = _snapshot(self.model, self.optimizer)
        tensors = self.original_tensors
        assert _same(model_state, {k: v for k, v in tensors.items() if not k.startswith("optim.")})
        for name, entry in optimizer_state["state"].items():
            for key, array in entry.items():
                if isinstance(array, np.ndarray):
                    model_name = self.model_names[name]
                    assert _same(array, tensors[f"optim.{key}.{model_name}"])
        if not recomputed:  # an undetected change would have to be no change at all
            assert _same(metadata, self.original.metadata)
            reference = GPT(self.model.config, rng=np.random.default_rng(98))
            reference_opt = reference.configure_optimizer(0.5, 0.3, (0.5, 0.6))
            glassllm.load(self.original, reference, reference_opt)
            assert _same(_snapshot(self.model, self.optimizer)[1], reference_opt.state_dict())

    @property
    def model_names(self):
        names = dict(self.model.named_parameters())
        by_id = {id(p): n for n, p in names.items()}
        return {name: by_id[id(p)] for name, p in self.optimizer.named_parameters()}


def test_fuzz_the_loader(run, tmp_path):
    path, trainer = run
    oracle = LoaderOracle(path, trainer)
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(20261130)
    target = tmp_path / "mutated.safetensors"
    cases = {"bytes": 0, "json-digest-kept": 0, "json-digest-recomputed": 0}

    # 1. bytes: the length field, the header, the data; cut, flipped, inserted, appended
    for _ in range(160):
        mutated = bytearray(data)
        kind = rng.integers(5)
        if kind == 0:
            at = int(rng.integers(8))
            mutated[at] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            at = int(rng.integers(8, header_end))
            mutated[at] = int(rng.integers(256))
        elif kind == 2:
            at = int(rng.integers(header_end, len(data)))
            mutated[at] ^= 1 << int(rng.integers(8))
        elif kind == 3:
            del mutated[int(rng.integers(len(data))) :]
        else:
            at = int(rng.integers(8, header_end))
            mutated[at:at] = bytes(rng.integers(32, 127, int(rng.integers(1, 9))).tolist())
        target.write_bytes(bytes(mutated))
        oracle.check(target, recomputed=False)
        cases["bytes"] += 1

    # 2. the JSON entries (metadata and optimizer): values and structure, with and without a
    # recomputed digest
    for i in range(280):
        tensors, header = dict(oracle.original_tensors), dict(oracle.original_header)
        key = ("glassllm.metadata", "glassllm.optimizer")[i % 2]
        if rng.integers(4) == 0:
            header[key] = _text_mutated(header[key], rng)
        else:
            header[key] = _dumps(_mutated(json.loads(header[key]), rng))
        recomputed = i % 3 != 0
        if recomputed:
            header["glassllm.sha256"] = checkpoint._digest(tensors, header)
        safetensors.numpy.save_file(tensors, str(target), metadata=header)
        oracle.check(target, recomputed)
        cases["json-digest-recomputed" if recomputed else "json-digest-kept"] += 1
        # and the program's reader of the same file: a SavedRun or a CheckpointError
        try:
            SavedRun.read(target)
        except CheckpointError:
            pass

    target.unlink()
    oracle.check(target, recomputed=False)  # a missing file: FileNotFoundError
    print(f"loader fuzz: {cases}, missing file: 1, outcomes: {oracle.outcomes}")
    assert sum(cases.values()) >= 440
    assert oracle.outcomes["refused"] > 300 and oracle.outcomes["loaded"] > 20, oracle.outcomes


def test_fuzz_run_state_from_metadata(run):
    _, trainer = run
    metadata = trainer.metadata()
    rng = np.random.default_rng(7)
    outcomes = {"state": 0, "refused": 0}
    for _ in range(400):
        mutated = metadata
        for _ in range(int(rng.integers(1, 4))):  # one to three changes at once
            mutated = _mutated(mutated, rng)
        mutated = json.loads(json.dumps(mutated, default=str)) if rng.integers(2) else mutated
        try:
            state = RunState.from_metadata(_raw_decoded(mutated), "fuzz.safetensors")
        except CheckpointError as error:
            assert "fuzz.safetensors" in str(error)
            outcomes["refused"] += 1
            continue
        outcomes["state"] += 1
        again = RunState.from_metadata(state.to_metadata(), "again")
        assert again.to_metadata() == state.to_metadata()
    print(f"run-state fuzz: 400 cases, outcomes: {outcomes}")
    assert outcomes["refused"] > 250 and outcomes["state"] > 10, outcomes


def _raw_decoded(value):
    """RAW-marked strings as the value Python's json would decode them to, where it can."""
    if isinstance(value, str) and value.startswith(RAW):
        try:
            return json.loads(value[len(RAW) :])
        except (ValueError, RecursionError):
            return value
    if isinstance(value, dict):
        return {k: _raw_decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_raw_decoded(v) for v in value]
    return value
