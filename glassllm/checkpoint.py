"""Checkpoints as safetensors files: model, optimizer state and metadata in one file, no pickle.

Layout of a file written by `save`:

* **tensors**: the model's ``state_dict()`` under its own names (``blocks.0.attn.qkv.weight``, no
  prefix), so any safetensors tool opens it; then each array of optimizer state as
  ``optim.<state key>.<model parameter name>`` (``optim.exp_avg.blocks.0.attn.qkv.weight``). The
  optimizer's parameters are matched to the model's by identity, so an optimizer built from
  plain ``model.parameters()`` still maps onto model names, and a tied parameter appears once.
* **string metadata** (safetensors allows only ``str -> str``), each value JSON:
  ``glassllm.format`` (the layout version), ``glassllm.metadata`` (the caller's dict),
  ``glassllm.optimizer`` (class name, hyper-parameters per group with parameters as model names,
  scalar state such as step counts), and ``glassllm.sha256``, a digest of every tensor and
  metadata entry, so a flipped byte in the data is caught, not trained on.

Writing is atomic: a temporary file in the same directory, flushed and fsynced, then
``os.replace``, then the directory fsynced. A crash or a kill mid-save leaves the previous file
intact (at worst a stray ``.<name>.*.tmp`` next to it).

Reading (`read`) takes the file in once and checks that it parses and that its digest matches
before any metadata is decoded; every JSON entry must be what `save` could have written (an
object for the metadata, no NaN, infinity or float overflow, nesting Python can hold).
Loading (`load`, from a path or from what `read` returned) checks everything before it changes
anything, in two phases: `Module.check_state_dict` and `Optimizer.check_state_dict` list what
does not fit (keys, shapes, dtypes, hyper-parameters, state), and only when both lists are
empty do `Module.load_state_dict` and `Optimizer.load_state_dict` copy. Any problem raises one
`CheckpointError` listing all of them (``FileNotFoundError`` for a missing file) and the model
and optimizer stay exactly as they were. Values are copied into the existing arrays, so tied
weights stay tied.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassllm._text import shown
from glassllm.atomic_file import write_bytes_atomically
from glassllm.nn.module import Module
from glassllm.optim.optimizer import Optimizer
from glassllm.safetensors_file import SafetensorsError, read_header, read_tensors, serialize

__all__ = ["Checkpoint", "CheckpointError", "save", "read", "load", "read_metadata"]

FORMAT = "glassllm-checkpoint-1"
OPTIM_PREFIX = "optim."
_FORMAT_KEY = "glassllm.format"
_METADATA_KEY = "glassllm.metadata"
_OPTIMIZER_KEY = "glassllm.optimizer"
_DIGEST_KEY = "glassllm.sha256"

PathLike = str | os.PathLike


class CheckpointError(ValueError):
    """A checkpoint cannot be written or loaded: the message lists every problem found."""


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A checkpoint file read into memory by `read`, its digest already verified.

    ``tensors`` holds every tensor in the file under its stored name (the model's state dict and
    the ``optim.``-prefixed optimizer state); ``metadata`` is the dict `save` was given (``{}``
    when none). ``optimizer`` is the file's optimizer entry as saved (class name, parameter
    groups, scalar state), or None for a file saved without an optimizer; `load` reads it.
    ``verified`` is True when the file carried a digest and it matched; False only for a file
    without one (a plain safetensors file, or one whose digest entry was removed or damaged):
    a caller that requires integrity, as the ``glassllm`` program does, refuses such a file.
    """

    path: str
    tensors: dict[str, np.ndarray]
    metadata: dict[str, Any]
    optimizer: Any = None
    verified: bool = False


def save(
    path: PathLike,
    model: Module,
    optimizer: Optimizer | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write ``model`` (and ``optimizer``'s state, and ``metadata``) to ``path`` atomically.

    ``metadata`` must be a dict that survives a JSON round trip unchanged (str keys; lists, not
    tuples; no NaN): `load` returns it equal. Everything is checked before a byte is written.

    >>> import os, tempfile
    >>> import numpy as np
    >>> import glassllm, glassllm.nn as nn
    >>> model = nn.Linear(2, 3, rng=np.random.default_rng(0))
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
    >>> glassllm.save(path, model, metadata={"iter": 10})
    >>> fresh = nn.Linear(2, 3, rng=np.random.default_rng(1))
    >>> glassllm.load(path, fresh)
    {'iter': 10}
    >>> bool(np.array_equal(fresh.weight.data, model.weight.data))
    True
    """
    user_metadata = _checked_metadata(metadata)
    model_state = model.state_dict()
    tensors: dict[str, np.ndarray] = {}
    for name, array in model_state.items():
        if name.startswith(OPTIM_PREFIX):
            raise CheckpointError(
                f"model key {name!r} starts with {OPTIM_PREFIX!r}, which checkpoints reserve for "
                "optimizer state; rename that submodule"
            )
        # safetensors 0.8.0 writes a non-C-contiguous array (a transposed view, or the
        # Fortran-ordered copy np.array(view, copy=True) makes of one) with its values scrambled
        # (huggingface/safetensors#825), so every array goes in C order.
        tensors[name] = _c_order(array)

    header = {_FORMAT_KEY: FORMAT, _METADATA_KEY: json.dumps(user_metadata, allow_nan=False)}
    if optimizer is not None:
        optimizer_tensors, optimizer_header = _optimizer_entries(model, optimizer)
        tensors.update(optimizer_tensors)
        header[_OPTIMIZER_KEY] = json.dumps(optimizer_header, allow_nan=False)
    header[_DIGEST_KEY] = _digest(tensors, header)
    _atomic_write(os.fspath(path), tensors, header)


def read(path: PathLike) -> Checkpoint:
    """Read ``path`` once and verify it: a `Checkpoint` whose contents match the file's digest.

    The digest is checked before the metadata is decoded, so nothing taken from a damaged file
    reaches the caller; build the model from ``read(path).metadata`` and hand the same
    `Checkpoint` to `load` without reading the file again. A plain safetensors file of a state
    dict (no glassllm entries, so no digest) reads with ``metadata == {}``. Raises
    ``FileNotFoundError`` for a missing file and `CheckpointError` for anything else wrong.

    >>> import os, tempfile
    >>> import numpy as np
    >>> import glassllm, glassllm.nn as nn
    >>> model = nn.Linear(2, 3, rng=np.random.default_rng(0))
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
    >>> glassllm.save(path, model, metadata={"in_features": 2})
    >>> checkpoint = read(path)
    >>> checkpoint.metadata, sorted(checkpoint.tensors)
    ({'in_features': 2}, ['bias', 'weight'])
    >>> load(checkpoint, nn.Linear(checkpoint.metadata["in_features"], 3))
    {'in_features': 2}
    """
    path = _existing_file(path)
    tensors, header = _read(path)
    verified = _DIGEST_KEY in header
    intact = not verified or header[_DIGEST_KEY] == _digest(tensors, header)
    fmt = header.get(_FORMAT_KEY)
    if fmt is not None and fmt != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has layout {shown(fmt)}; this glassllm reads {FORMAT!r}"
            + ("" if intact else " (or the file is corrupted: its digest does not match)")
        )
    if not intact:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its contents do not match the digest stored in it"
        )
    metadata = _metadata_dict(header, path)
    optimizer = _json_entry(header, _OPTIMIZER_KEY, path, default=None)
    return Checkpoint(
        path=path, tensors=tensors, metadata=metadata, optimizer=optimizer, verified=verified
    )


def load(
    source: PathLike | Checkpoint, model: Module, optimizer: Optimizer | None = None
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` (and ``optimizer``) in place; return the saved metadata.

    ``source`` is a path (read with `read`) or a `Checkpoint` that `read` returned (not read
    again). A checkpoint saved without metadata gives ``{}``; a plain safetensors file of a state
    dict (no glassllm metadata, no optimizer) loads into the model too. Optimizer tensors in the
    file are ignored when no ``optimizer`` is given (sampling needs only the model). Raises
    ``FileNotFoundError`` for a missing file and `CheckpointError` for anything else wrong, with
    model and optimizer unchanged. The optimizer's hyper-parameters (each group's lr, betas,
    weight decay, ...) come from the file, as with ``torch.optim.Optimizer.load_state_dict``.
    """
    checkpoint = source if isinstance(source, Checkpoint) else read(source)
    tensors = checkpoint.tensors
    model_state = {k: v for k, v in tensors.items() if not k.startswith(OPTIM_PREFIX)}
    problems = model.check_state_dict(model_state)
    optimizer_state = None
    if optimizer is not None:
        optimizer_state, optimizer_problems = _optimizer_state_dict(
            model, optimizer, tensors, checkpoint.optimizer
        )
        problems += optimizer_problems
    if problems:
        raise CheckpointError(
            f"cannot load checkpoint {checkpoint.path} ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}; the model and optimizer were not changed):\n  "
            + "\n  ".join(problems)
        )
    # Both checks passed, so neither load can fail: they check again (shapes and names only,
    # nothing is copied for it), then copy in place.
    model.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    return checkpoint.metadata


def read_metadata(path: PathLike) -> dict[str, Any]:
    """The metadata dict `save` stored in ``path``, read from the header alone.

    No tensor is read, so the digest is not checked here: nothing in the result is verified.
    To build a model from the metadata, use `read` (verified) and `load` its result. Raises
    ``FileNotFoundError`` for a missing file, `CheckpointError` for an unreadable one.
    """
    path = _existing_file(path)
    try:
        header = read_header(path)[1]
    except SafetensorsError as error:
        raise _unreadable(path, error) from None
    return _metadata_dict(header, path)


# ---------------------------------------------------------------------- metadata and names


def _checked_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        round_trip = json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"metadata must be JSON-serialisable: {error}") from error
    if round_trip != metadata:
        raise CheckpointError(
            "metadata must come back from JSON unchanged (str keys, lists rather than tuples); "
            f"{metadata!r} would load as {round_trip!r}"
        )
    return round_trip


def _json_entry(header: Mapping[str, str], key: str, path: str, default: Any) -> Any:
    """``header[key]`` decoded as JSON that `save` could have written (no NaN or infinity, no
    number that overflows a float, nesting Python can hold), else `CheckpointError`."""
    if key not in header:
        return default
    try:
        return json.loads(header[key], parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise CheckpointError(
            f"checkpoint {path}: metadata entry {key!r} is nested too deeply"
        ) from None
    except ValueError as error:
        raise CheckpointError(
            f"checkpoint {path}: metadata entry {key!r} is not valid JSON ({error})"
        ) from error


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not np.isfinite(value):
        short = text if len(text) <= 40 else f"{text[:18]}...{text[-18:]}"
        raise ValueError(f"{short} does not fit a float")
    return value


def _metadata_dict(header: Mapping[str, str], path: str) -> dict[str, Any]:
    metadata = _json_entry(header, _METADATA_KEY, path, default={})
    if not isinstance(metadata, dict):
        raise CheckpointError(
            f"checkpoint {path}: its metadata is a JSON {type(metadata).__name__}, not an object"
        )
    return metadata


def _model_names(model: Module) -> dict[int, str]:
    """``{id(parameter): its model name}``; a tied parameter once, under its first name."""
    return {id(param): name for name, param in model.named_parameters()}


def _optimizer_entries(model: Module, optimizer: Optimizer) -> tuple[dict[str, np.ndarray], dict]:
    """Optimizer state as ``optim.<key>.<model name>`` tensors plus a JSON-able header."""
    to_model = _optimizer_to_model_names(model, optimizer)
    state_dict = optimizer.state_dict()
    tensors: dict[str, np.ndarray] = {}
    scalar_state: dict[str, dict[str, Any]] = {}
    for name, entry in state_dict["state"].items():
        model_name = to_model[name]
        for key, value in entry.items():
            if isinstance(value, np.ndarray):
                tensors[f"{OPTIM_PREFIX}{key}.{model_name}"] = _c_order(value)
            else:
                scalar_state.setdefault(model_name, {})[key] = value
    groups = [
        {**group, "params": [to_model[name] for name in group["params"]]}
        for group in state_dict["param_groups"]
    ]
    header = {
        "class": type(optimizer).__name__,
        "param_groups": groups,
        "scalar_state": scalar_state,
    }
    return tensors, header


def _optimizer_to_model_names(model: Module, optimizer: Optimizer) -> dict[str, str]:
    model_names = _model_names(model)
    mapping, strangers = {}, []
    for name, param in optimizer.named_parameters():
        if id(param) in model_names:
            mapping[name] = model_names[id(param)]
        else:
            strangers.append(f"{name!r} {param.shape}")
    if strangers:
        raise CheckpointError(
            "the optimizer updates parameter(s) that are not the model's: " + ", ".join(strangers)
        )
    return mapping


def _optimizer_state_dict(
    model: Module, optimizer: Optimizer, tensors: Mapping[str, np.ndarray], header: Any
) -> tuple[dict[str, Any], list[str]]:
    """The optimizer `state_dict` (in the optimizer's own names) rebuilt from the file's entries,
    and every problem found, the optimizer's own `Optimizer.check_state_dict` included."""
    problems = _optimizer_header_problems(header, type(optimizer).__name__)
    if problems:
        return {}, problems
    try:
        to_model = _optimizer_to_model_names(model, optimizer)
    except CheckpointError as error:
        return {}, [str(error)]
    to_optimizer = {model_name: name for name, model_name in to_model.items()}
    state, problems = _optimizer_state(optimizer, tensors, header["scalar_state"], to_optimizer)
    groups, group_problems = _optimizer_groups(header["param_groups"], to_optimizer)
    problems += group_problems
    if problems:
        return {}, problems
    state_dict = {"state": state, "param_groups": groups}
    return state_dict, [f"optimizer: {p}" for p in optimizer.check_state_dict(state_dict)]


def _optimizer_header_problems(header: Any, kind: str) -> list[str]:
    """Whether the file's optimizer entry has the layout `save` writes, for a ``kind``."""
    if header is None:
        return ["the checkpoint holds no optimizer state (saved without an optimizer)"]
    if (
        not isinstance(header, dict)
        or not {"class", "param_groups", "scalar_state"} <= set(header)
        or not isinstance(header["class"], str)
        or not isinstance(header["param_groups"], list)
        or not isinstance(header["scalar_state"], dict)
    ):
        return ["the checkpoint's optimizer entry is malformed"]
    if header["class"] != kind:
        return [f"the checkpoint holds {header['class']} state, not {kind} state"]
    return []


def _optimizer_state(
    optimizer: Optimizer,
    tensors: Mapping[str, np.ndarray],
    scalar_state: dict[str, Any],
    to_optimizer: dict[str, str],
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per-parameter state under the optimizer's names: the ``optim.<key>.<model name>`` tensors
    and the scalars; tensors or scalars of no parameter of the optimizer are problems."""
    state, used = {}, set()
    for model_name, name in to_optimizer.items():
        entry = {}
        for key in optimizer.array_state_keys:
            tensor_name = f"{OPTIM_PREFIX}{key}.{model_name}"
            if tensor_name in tensors:
                entry[key] = tensors[tensor_name]
                used.add(tensor_name)
        scalars = scalar_state.get(model_name, {})
        if isinstance(scalars, dict):
            entry.update(scalars)
        if entry:
            state[name] = entry
    problems = []
    unexpected = sorted(k for k in tensors if k.startswith(OPTIM_PREFIX) and k not in used)
    if unexpected:
        problems.append(
            "optimizer tensors for no parameter of this optimizer: " + ", ".join(unexpected)
        )
    stray_scalars = sorted(set(scalar_state) - set(to_optimizer))
    if stray_scalars:
        problems.append(f"optimizer step counts for unknown parameters: {stray_scalars}")
    return state, problems


def _optimizer_groups(
    saved_groups: list[Any], to_optimizer: dict[str, str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The saved parameter groups with model names turned into the optimizer's names."""
    groups, problems = [], []
    for index, group in enumerate(saved_groups):
        names = group.get("params") if isinstance(group, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            problems.append(f"optimizer group {index} is malformed")
            continue
        unknown = [n for n in names if n not in to_optimizer]
        if unknown:
            problems.append(
                f"optimizer group {index} names parameters this optimizer lacks: {unknown}"
            )
        groups.append({**group, "params": [to_optimizer.get(n, n) for n in names]})
    return groups, problems


# ---------------------------------------------------------------------- bytes on disk


def _c_order(array: np.ndarray) -> np.ndarray:
    """``array`` in C order, copied only if it is not already. Not ``np.ascontiguousarray``:
    that returns at least 1-D, so a 0-d parameter would come back with shape (1,)."""
    return np.asarray(array, order="C")


def _digest(tensors: Mapping[str, np.ndarray], header: Mapping[str, str]) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) and metadata entry but itself."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = _c_order(tensors[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.reshape(-1).view(np.uint8))  # 1-D first: 0-d and empty arrays too
    for key in sorted(header):
        if key != _DIGEST_KEY:
            digest.update(f"{key}\0{header[key]}\0".encode())
    return digest.hexdigest()


def _read(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        return read_tensors(path)
    except SafetensorsError as error:  # an OSError (unreadable, not malformed) passes through
        raise _unreadable(path, error) from None


def _existing_file(path: PathLike) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} is not a file")
    return path


def _unreadable(path: str, error: SafetensorsError) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a readable safetensors checkpoint (truncated, corrupted or another "
        f"format): {error.problem}"
    )


def _atomic_write(path: str, tensors: dict[str, np.ndarray], header: dict[str, str]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save checkpoint: directory {directory} does not exist")
    if os.path.isdir(path):
        raise CheckpointError(f"cannot save checkpoint: {path} is a directory")
    # Serialised in memory (behind the library boundary: its errors are ValueErrors) and written
    # through our own descriptor: the file gets ordinary permissions (safetensors' save_file
    # leaves 0o600), the bytes we fsync are exactly the ones we wrote, and a full disk is an
    # OSError naming the file, the previous checkpoint intact.
    write_bytes_atomically(path, serialize(tensors, header))
