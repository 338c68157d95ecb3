"""Open a Hugging Face directory as a glassllm GPT (and its tokenizer): ``model_type`` gpt2,
llama, qwen2, qwen3, gpt_neox or gpt_neo (`glassllm.hf.families`), in float32 (F16, BF16 and F64
files widened).

A directory holds ``config.json``, the weights in ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``: plain ``.safetensors`` file names in the directory), and a
tokenizer in ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``. Every file is hostile until
checked (`glassllm.hf.untrusted`): the configuration is bounded, then held to the files' own
tensors (the number of blocks, the embeddings' shapes) before anything is sized from it, so a
malformed directory costs no more than reading its headers. Every check runs before a byte of
weights is read (but one: a stored ``lm_head.weight`` is compared with ``wte.weight`` after both
are read), and every problem found goes into one `HFFormatError`. The model is built without
drawing random initial weights (each array is read from the file into place, or through one
small temporary where the layout changes): a load costs the file read, not an initialisation.

`model_from_hf` runs the same checks and conversion on a config dict and tensors already in
memory (a GGUF file's, dequantized): one conversion for every source. `load_pretrained` and
`load_model` take a GGUF file as well (``.gguf``, or a file starting with the GGUF magic:
`glassllm.gguf.is_gguf_path`): `load_gguf` reads it through `glassllm.gguf.read_gguf`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from glassllm._heap import release_free_memory
from glassllm.data.bpe import BPETokenizer, MissingDependencyError
from glassllm.hf.configs import SHAPE_KEYS, config_from_hf, supported
from glassllm.hf.families import COPY, FAMILIES, Family
from glassllm.hf.safetensors_file import FLOAT_DTYPES, TensorEntry, read_header, read_into
from glassllm.hf.tensors import Plan, from_hf, head_problems, plan
from glassllm.hf.untrusted import MAX_TOKENIZER_BYTES, HFFormatError, listed, read_json, shown
from glassllm.models.gpt import GPT, GPTConfig

if TYPE_CHECKING:
    from glassllm.chat_template import ChatTemplate

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_JSON = "tokenizer.json"
VOCAB, MERGES = "vocab.json", "merges.txt"


def load_pretrained(
    path: str | os.PathLike[str], dtype: Any = np.float32, require_tokenizer: bool = False
) -> tuple[GPT, BPETokenizer | None]:
    """``(model, tokenizer)`` from a Hugging Face directory, or from its ``model.safetensors``
    with a ``config.json`` beside it, or from a GGUF file (`load_gguf`; it always holds its
    tokenizer).

    The model is in eval mode, its parameters ``dtype`` (float32: F16, BF16 and F64 files are
    converted), dropout 0. The tokenizer comes from ``tokenizer.json`` or ``vocab.json`` +
    ``merges.txt`` (needs the ``tokenizers`` package); None when the directory has neither, or an
    HFFormatError then with ``require_tokenizer``; a tokenizer may be smaller than the model's
    vocabulary (Pythia pads it), not larger. Raises HFFormatError (a ValueError) listing every
    problem with the files, a configuration value the model cannot compute exactly included.
    """
    path = Path(path)
    if _is_gguf(path):
        model, tokenizer, _ = load_gguf(path, dtype)
        return model, tokenizer
    config, tensor_plan, headers = _check(path)
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
    return _build_from_files(path, config, tensor_plan, headers, dtype), tokenizer


def load_model(
    path: str | os.PathLike[str], dtype: Any = np.float32, *, keep_quantized: bool = False
) -> GPT:
    """The GPT of a Hugging Face directory, ``model.safetensors`` or GGUF file; see
    `load_pretrained` (and `load_gguf` for ``keep_quantized``, GGUF files only)."""
    path = Path(path)
    if _is_gguf(path):
        return load_gguf(path, dtype, keep_quantized=keep_quantized)[0]
    if keep_quantized:
        raise ValueError(f"{str(path)!r}: keep_quantized=True is for GGUF files only")
    config, tensor_plan, headers = _check(path)
    model = _build_from_files(path, config, tensor_plan, headers, dtype)
    release_free_memory()  # the widened copies read from the files
    return model


def load_gguf(
    path: str | os.PathLike[str], dtype: Any = np.float32, *, keep_quantized: bool = False
) -> tuple[GPT, BPETokenizer, ChatTemplate | None]:
    """``(model, tokenizer, chat template or None)`` of a GGUF file: the file read and checked by
    `glassllm.gguf.read_gguf` (its errors: GGUFFormatError, a ValueError naming the file and the
    field; MissingDependencyError without the ``gguf`` extra), the model built by `model_from_hf`,
    in eval mode, its parameters ``dtype``.

    ``keep_quantized=True`` (float32 only; needs the ``fast`` extra): the projections and the
    embedding the file holds as blocks (Q4_0 to Q8_0, Q4_K to Q6_K: `glassllm.gguf.unpack`)
    stay as blocks, each a `glassllm.nn.QuantizedLinear` or `glassllm.nn.QuantizedEmbedding`
    checked bit for bit against the ``gguf`` package's values on whole rows of each tensor
    (`glassllm.gguf.blocks`) in place of its float32 weight, which is never made. Their weights
    are then not parameters (nothing trains them); decoding reads a fifth to a quarter of the
    memory.
    """
    from glassllm.gguf import read_gguf

    if keep_quantized:
        _check_can_keep_quantized(dtype)
    contents = read_gguf(path, deferred=True)  # dequantized one by one as the model is built
    keeper = None
    if keep_quantized:
        from glassllm.gguf.blocks import Keeper, load_kernels

        keeper = Keeper(contents.header, contents.config)  # each layer before it is read
    model = model_from_hf(contents.config, contents.tensors, str(contents.path), dtype, keeper)
    if keep_quantized:
        load_kernels(model)  # so that the first token does not wait for numba's cache
    tokenizer, chat_template = contents.tokenizer, contents.chat_template
    del contents  # the dequantized tensors, copied into the model: their pages go back now
    release_free_memory()
    return model, tokenizer, chat_template


def _check_can_keep_quantized(dtype: Any) -> None:
    from glassllm._install import install_hint
    from glassllm.kernels import compiled

    if np.dtype(dtype) != np.float32:
        raise ValueError(f"keep_quantized=True computes in float32, not {np.dtype(dtype)}")
    if not compiled.enabled():  # without the row kernel every token would dequantize the model
        raise MissingDependencyError(
            f"keep_quantized=True needs the compiled kernels: {install_hint('fast')}"
        )


def _is_gguf(path: Path) -> bool:
    from glassllm.gguf import is_gguf_path

    return is_gguf_path(path)


def find_tokenizer(directory: str | os.PathLike[str]) -> BPETokenizer | None:
    """The tokenizer of a Hugging Face directory: ``tokenizer.json``, else ``vocab.json`` +
    ``merges.txt``; None when it has neither. A malformed file raises HFFormatError; a missing
    ``tokenizers`` package MissingDependencyError."""
    directory = Path(directory)
    if (directory / TOKENIZER_JSON).is_file():
        return _tokenizer(directory, [TOKENIZER_JSON], BPETokenizer.from_file)
    vocab, merges = (directory / VOCAB).is_file(), (directory / MERGES).is_file()
    if vocab and merges:
        return _tokenizer(directory, [VOCAB, MERGES], BPETokenizer.from_vocab_merges)
    if vocab or merges:
        raise HFFormatError(
            str(directory), [f"{VOCAB if vocab else MERGES} without {MERGES if vocab else VOCAB}"]
        )
    return None


def _tokenizer(directory: Path, names: list[str], read: Any) -> BPETokenizer:
    """``read(*files)``, its errors (but a missing package) as HFFormatError."""
    files = [directory / name for name in names]
    too_big = [f.name for f in files if f.stat().st_size > MAX_TOKENIZER_BYTES]
    if too_big:
        limit = f"larger than {MAX_TOKENIZER_BYTES:,} bytes"
        raise HFFormatError(str(directory), [f"{listed(too_big)} {limit}"])
    try:
        return read(*files)
    except MissingDependencyError:
        raise
    except (ValueError, OSError) as err:
        why = shown(str(err), 300)[1:-1]
        raise HFFormatError(str(directory), [f"unreadable tokenizer ({why})"]) from None


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
    except ValueError:
        return True  # loading it reports what is wrong
    return not any(key.startswith("glassllm.") for key in metadata)


# ---------------------------------------------------------------------------- checks


def _directory_of(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _check(path: Path) -> tuple[GPTConfig, Plan, dict[str, TensorEntry]]:
    """The model's config, where each glassllm parameter comes from (`glassllm.hf.tensors.plan`)
    and the file entries of those tensors, every problem with the files in one HFFormatError."""
    if not path.exists():
        raise HFFormatError(str(path), ["no such file or directory"])
    directory = _directory_of(path)
    where = f"{path} is not a Hugging Face model directory" if path.is_dir() else str(path)
    if not (directory / CONFIG).is_file():
        raise HFFormatError(where, [f"no {CONFIG} in {directory} (need {CONFIG} + {WEIGHTS})"])
    hf_config = read_json(directory / CONFIG)
    family = family_of(hf_config, str(directory))
    problems: list[str] = []
    config = None
    try:
        config = config_from_hf(hf_config)
    except HFFormatError as err:
        problems += [f"unsupported {CONFIG} value {p}" for p in err.problems]
    files, file_problems = _weight_files(path)
    problems += file_problems
    headers: dict[str, TensorEntry] = {}
    twice = []
    for file in files:
        try:
            entries = read_header(str(file))[0]
        except HFFormatError as err:
            problems.append(str(err))
            continue
        twice += [name for name in entries if name in headers]
        headers.update(entries)
    if twice:
        problems.append(f"tensors given twice (in two shards): {listed(twice)}")
    tensor_plan = Plan({})
    if config is not None and not problems:
        shapes = {name: entry.shape for name, entry in headers.items()}
        tensor_plan, tensor_problems = plan(shapes, config, family, SHAPE_KEYS[family.model_type])
        problems += tensor_problems
        problems += [
            f"{name} has dtype {headers[name].dtype} (glassllm reads {', '.join(FLOAT_DTYPES)})"
            for name in _used(tensor_plan, headers)
            if headers[name].dtype not in FLOAT_DTYPES
        ]
    if problems:
        raise HFFormatError(f"cannot load {path}", problems)
    assert config is not None
    return config, tensor_plan, headers


def family_of(hf_config: Any, subject: str) -> Family:
    """The family of a config.json's ``model_type``, or an HFFormatError naming it."""
    model_type = hf_config.get("model_type") if isinstance(hf_config, Mapping) else None
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        holds = (
            f"it holds a {shown(model_type)} model" if model_type else f"{CONFIG} has no model_type"
        )
        raise HFFormatError(subject, [f"{holds}; {supported()}"])
    return FAMILIES[model_type]


def _used(tensor_plan: Plan, present: Mapping[str, Any]) -> list[str]:
    """The file tensors the plan reads (those present: a missing one is a problem already)."""
    names = [name for _, sources in tensor_plan.sources.values() for name in sources]
    names += [tensor_plan.head] if tensor_plan.head else []
    return [name for name in names if name in present]


def _weight_files(path: Path) -> tuple[list[Path], list[str]]:
    """The safetensors files holding the weights, or the problem why there are none."""
    if path.is_file():
        return [path], []
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS], []
    if (path / WEIGHTS_INDEX).is_file():
        try:
            index = read_json(path / WEIGHTS_INDEX)
        except HFFormatError as err:
            return [], [str(err)]
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            return [], [f"{WEIGHTS_INDEX} has no weight_map object naming the shards"]
        bad = [s for s in weight_map.values() if not _plain_shard_name(s)]
        shards = set(weight_map.values()) if not bad else set()
        if bad:
            return [], [
                f"{WEIGHTS_INDEX} names shards that are not plain .safetensors file names (in "
                f"{path} itself): "
                f"{listed(sorted(set(map(shown, bad))))}"
            ]
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            return [], [f"missing shards listed in {WEIGHTS_INDEX}: {listed(missing)}"]
        return [path / s for s in sorted(shards)], []
    pickled = [name for name in PICKLED if (path / name).is_file()]
    if pickled:
        return [], [
            f"it has {pickled[0]} but no {WEIGHTS}; glassllm reads safetensors only (no pickle)"
        ]
    return [], [f"no {WEIGHTS} in {path}"]


def _plain_shard_name(name: object) -> bool:
    """A file name of the directory itself: no folder, no ``..``, ending in ``.safetensors``.
    (A symbolic link there is followed, as for ``model.safetensors``: Hugging Face's cache
    stores every file as one.)"""
    return (
        isinstance(name, str)
        and name.endswith(".safetensors")
        and len(name) > len(".safetensors")
        and name == os.path.basename(name)
        and not any(c in name for c in "/\\\0")
        and Path(name).name == name
    )


# ---------------------------------------------------------------------------- building


def _build_from_files(
    path: Path, config: GPTConfig, tensor_plan: Plan, headers: dict[str, TensorEntry], dtype: Any
) -> GPT:
    def read(name: str, out: np.ndarray) -> None:
        read_into(headers[name], out)

    return _build(str(path), config, tensor_plan, read, lambda name: headers[name].shape, dtype)


def _build(
    subject: str,
    config: GPTConfig,
    tensor_plan: Plan,
    read: Callable[[str, np.ndarray], None],
    shape_of: Callable[[str], tuple[int, ...]],
    dtype: Any,
    kept: Callable[[GPT, str], bool] | None = None,
) -> GPT:
    """A GPT of ``config`` whose every parameter is made from file tensors by ``tensor_plan``
    (``read(name, out)`` fills ``out``, of the tensor's shape, with its values), in eval mode.
    ``kept(model, name)`` is asked before each parameter is read: True when it has put that
    parameter's layer in another form itself (a GGUF load keeps a projection as its blocks), and
    then the parameter is not read (its array, never written, holds no memory)."""
    model = GPT(config, dtype=dtype, init=False)  # no draws: every array is read from the file
    params = dict(model.named_parameters())
    if set(params) != set(tensor_plan.sources):  # matched to parameter_shapes, GPT's own table
        unmapped = sorted(set(params) ^ set(tensor_plan.sources))
        raise RuntimeError(f"GPT's parameters {unmapped} are not mapped")
    table = params["wte.weight"]  # the head check's, at the end
    read_anyway = {"wte.weight"} if tensor_plan.head is not None else set()  # that check's
    for ours, (how, names) in tensor_plan.sources.items():
        target = params.pop(ours).data  # held by the model alone once filled
        if kept is not None and ours not in read_anyway and kept(model, ours):
            continue
        if how == COPY:
            read(names[0], target)  # straight into place
        else:
            arrays = []
            for name in names:
                arrays.append(np.empty(shape_of(name), dtype=target.dtype))
                read(name, arrays[-1])
            target[...] = from_hf(how, arrays, config)
            del arrays
        del target
    if tensor_plan.head is not None:  # a stored copy of the tied head must be exactly wte.weight
        values = np.empty(table.shape, dtype=table.dtype)
        read(tensor_plan.head, values)
        embedding = tensor_plan.sources["wte.weight"][1][0]
        problems = head_problems(values, table.data, tensor_plan.head, embedding)
        if problems:
            raise HFFormatError(subject, problems)
    return model.eval()


def _array_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__array__")


def model_from_hf(
    hf_config: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    source: str,
    dtype: Any = np.float32,
    kept: Callable[[GPT, str], bool] | None = None,
) -> GPT:
    """The GPT of a transformers-style ``config.json`` dict and its tensors under transformers'
    names in torch's layout (as ``model.state_dict()`` holds them): the checks and conversion of
    a directory load (`load_model`), on values already in memory (a GGUF file's, say). Float
    arrays only (float16, float32, float64); ``source`` names the model in errors. Raises
    HFFormatError listing every problem. ``kept(model, name)``: as `_build`'s."""
    family = family_of(hf_config, source)
    try:
        config = config_from_hf(hf_config)
    except HFFormatError as err:
        raise HFFormatError(
            f"cannot load {source}", [f"unsupported {CONFIG} value {p}" for p in err.problems]
        ) from None
    # A value with a shape and a dtype (an array, a GGUF DeferredTensor) is read only when its
    # parameter is filled, so a reader that makes values on demand holds one at a time.
    arrays = {
        name: value if _array_like(value) else np.asarray(value) for name, value in tensors.items()
    }
    shapes = {name: array.shape for name, array in arrays.items()}
    tensor_plan, problems = plan(shapes, config, family, SHAPE_KEYS[family.model_type])
    problems += [
        f"{name} has dtype {arrays[name].dtype} (glassllm reads float16, float32, float64)"
        for name in _used(tensor_plan, arrays)
        if arrays[name].dtype not in (np.float16, np.float32, np.float64)
    ]
    if problems:
        raise HFFormatError(f"cannot load {source}", problems)

    def read(name: str, out: np.ndarray) -> None:
        np.copyto(out, np.asarray(arrays[name]), casting="unsafe")

    return _build(source, config, tensor_plan, read, lambda name: shapes[name], dtype, kept)
