"""Open a Hugging Face GPT-2 directory as a glassllm GPT (and its tokenizer).

A directory holds ``config.json``, the weights in ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), and a tokenizer in ``tokenizer.json`` or ``vocab.json`` +
``merges.txt``. Every check runs before a byte of weights is read (but one: a stored
``lm_head.weight`` is compared with ``wte.weight`` after both are read), and every problem found
goes into one `HFFormatError`. The model is built without drawing random initial weights (each
array is read from the file into place): a load costs the file read, not an initialisation too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from glassllm.data.bpe import BPETokenizer
from glassllm.hf.convert import (
    HEAD,
    PREFIX,
    HFFormatError,
    config_from_hf,
    head_problems,
    rename_from_hf,
)
from glassllm.hf.safetensors_file import FLOAT_DTYPES, TensorEntry, read_header, read_into
from glassllm.models.gpt import GPT, GPTConfig

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_JSON = "tokenizer.json"
VOCAB, MERGES = "vocab.json", "merges.txt"


def load_pretrained(
    path: str | os.PathLike[str], dtype: Any = np.float32, require_tokenizer: bool = False
) -> tuple[GPT, BPETokenizer | None]:
    """``(model, tokenizer)`` from a Hugging Face GPT-2 directory, or from its ``model.safetensors``
    with a ``config.json`` beside it.

    The model is in eval mode, its parameters ``dtype`` (float32: F16, BF16 and F64 files are
    converted), dropout 0. The tokenizer comes from ``tokenizer.json`` or ``vocab.json`` +
    ``merges.txt`` (needs the ``tokenizers`` package); None when the directory has neither, or an
    HFFormatError then with ``require_tokenizer``. Raises HFFormatError (a ValueError) listing
    every problem with the files.
    """
    path = Path(path)
    config, entries = _check(path)
    directory = _directory_of(path)
    tokenizer = find_tokenizer(directory)
    if tokenizer is None and require_tokenizer:
        raise HFFormatError(
            str(directory), [f"no {TOKENIZER_JSON} or {VOCAB} + {MERGES} (needed to sample)"]
        )
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise HFFormatError(
            str(directory),
            [
                f"its tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
                f"only {config.vocab_size}"
            ],
        )
    return _build(path, config, entries, dtype), tokenizer


def load_model(path: str | os.PathLike[str], dtype: Any = np.float32) -> GPT:
    """The GPT of a Hugging Face GPT-2 directory or ``model.safetensors``; see `load_pretrained`."""
    path = Path(path)
    config, entries = _check(path)
    return _build(path, config, entries, dtype)


def find_tokenizer(directory: str | os.PathLike[str]) -> BPETokenizer | None:
    """The tokenizer of a Hugging Face directory: ``tokenizer.json``, else ``vocab.json`` +
    ``merges.txt``; None when it has neither."""
    directory = Path(directory)
    if (directory / TOKENIZER_JSON).is_file():
        return BPETokenizer.from_file(directory / TOKENIZER_JSON)
    vocab, merges = (directory / VOCAB).is_file(), (directory / MERGES).is_file()
    if vocab and merges:
        return BPETokenizer.from_vocab_merges(directory / VOCAB, directory / MERGES)
    if vocab or merges:
        raise HFFormatError(
            str(directory), [f"{VOCAB if vocab else MERGES} without {MERGES if vocab else VOCAB}"]
        )
    return None


def is_pretrained_path(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is meant as a Hugging Face model: a directory, or a ``.safetensors`` file
    with a ``config.json`` beside it and no glassllm checkpoint metadata. (A directory without
    ``config.json`` counts: loading it then says what is missing.)"""
    path = Path(path)
    if path.is_dir():
        return True
    if path.suffix != ".safetensors" or not (path.parent / CONFIG).is_file():
        return False
    try:
        metadata = read_header(str(path))[1]
    except (OSError, ValueError):
        return True  # loading it reports what is wrong
    return not any(key.startswith("glassllm.") for key in metadata)


# ---------------------------------------------------------------------------- checks


def _directory_of(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _check(path: Path) -> tuple[GPTConfig, dict[str, TensorEntry]]:
    """The model's config and, for each glassllm parameter, where its values are in the files."""
    if not path.exists():
        raise HFFormatError(str(path), ["no such file or directory"])
    directory = _directory_of(path)
    where = f"{path} is not a Hugging Face model directory" if path.is_dir() else str(path)
    if not (directory / CONFIG).is_file():
        raise HFFormatError(where, [f"no {CONFIG} in {directory} (need {CONFIG} + {WEIGHTS})"])
    problems: list[str] = []
    config = None
    try:
        hf_config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HFFormatError(str(directory / CONFIG), [f"unreadable ({err})"]) from None
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if model_type != "gpt2":
        holds = (
            f"it holds a {model_type!r} model" if model_type else f"{CONFIG} has no model_type"
        )
        raise HFFormatError(str(directory), [f"{holds}; glassllm loads model_type 'gpt2' only"])
    try:
        config = config_from_hf(hf_config)
    except HFFormatError as err:
        problems += [f"unsupported {CONFIG} value {p}" for p in err.problems]
    files, file_problems = _weight_files(path)
    problems += file_problems
    headers: dict[str, TensorEntry] = {}
    for file in files:
        try:
            headers.update(read_header(str(file))[0])
        except (OSError, ValueError) as err:
            problems.append(str(err))
    if config is not None and not file_problems:
        sources, tensor_problems = rename_from_hf(
            {name: entry.shape for name, entry in headers.items()}, config
        )
        problems += tensor_problems
        problems += [
            f"{hf} has dtype {headers[hf].dtype} (glassllm reads {', '.join(FLOAT_DTYPES)})"
            for hf in sources.values()
            if headers[hf].dtype not in FLOAT_DTYPES
        ]
    if problems:
        raise HFFormatError(f"cannot load {path}", problems)
    assert config is not None
    return config, {ours: headers[hf] for ours, hf in sources.items()}


def _weight_files(path: Path) -> tuple[list[Path], list[str]]:
    """The safetensors files holding the weights, or the problem why there are none."""
    if path.is_file():
        return [path], []
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS], []
    if (path / WEIGHTS_INDEX).is_file():
        try:
            index = json.loads((path / WEIGHTS_INDEX).read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return [], [f"unreadable {WEIGHTS_INDEX} ({err!r})"]
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            return [], [f"missing shards listed in {WEIGHTS_INDEX}: {', '.join(missing)}"]
        return [path / s for s in shards], []
    pickled = [name for name in PICKLED if (path / name).is_file()]
    if pickled:
        return [], [
            f"it has {pickled[0]} but no {WEIGHTS}; glassllm reads safetensors only (no pickle)"
        ]
    return [], [f"no {WEIGHTS} in {path}"]


def _head_entry(path: Path) -> TensorEntry | None:
    """The ``lm_head.weight`` entry when the file stores the (tied) head as well."""
    for file in _weight_files(path)[0]:
        entries = read_header(str(file))[0]
        for name in (HEAD, PREFIX + HEAD):
            if name in entries:
                return entries[name]
    return None


# ---------------------------------------------------------------------------- building


def _build(path: Path, config: GPTConfig, entries: dict[str, TensorEntry], dtype: Any) -> GPT:
    """A GPT of ``config`` whose every parameter is read from ``entries``, in eval mode."""
    model = GPT(config, dtype=dtype, init=False)  # no draws: every array is read from the file
    params = dict(model.named_parameters())
    if set(params) != set(entries):  # the table in glassllm.hf.convert is GPT's own layout
        raise RuntimeError(f"GPT's parameters {sorted(set(params) ^ set(entries))} are not mapped")
    for name, entry in entries.items():
        read_into(entry, params[name].data)
    head = _head_entry(path)
    if head is not None:  # a stored copy of the tied head must be exactly wte.weight
        values = np.empty(head.shape, dtype=params["wte.weight"].dtype)
        read_into(head, values)
        problems = head_problems(values, params["wte.weight"].data)
        if problems:
            raise HFFormatError(str(path), problems)
    return model.eval()
