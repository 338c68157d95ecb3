"""Write a glassllm GPT (and its tokenizer) as a Hugging Face directory: ``GPT2LMHeadModel`` for
learned positions, ``LlamaForCausalLM`` for rotary ones (`glassllm.hf.targets`; any other
configuration is refused by name).

transformers' ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
``AutoTokenizer.from_pretrained(out_dir)`` load the result and compute the same logits and ids:

* ``config.json``: in transformers' spelling, with the model's shape and choices
  (`glassllm.hf.targets.config_to_hf`);
* ``model.safetensors``: float32 in torch's layout under transformers' names (GPT-2's
  ``transformer.``-prefixed), no buffers, no tied head; a bias the class has and the model
  lacks is written as zeros;
* with a tokenizer, ``tokenizer.json`` + ``tokenizer_config.json`` (``PreTrainedTokenizerFast``),
  and ``vocab.json`` + ``merges.txt`` for a BPE model. The char and byte tokenizers become
  ``tokenizers`` BPE models without merges: a char vocabulary one token per character, glued back
  by a ``Fuse`` decoder; the byte tokenizer GPT-2's byte-level alphabet with byte ``b`` at id ``b``.

Writing a tokenizer needs the ``tokenizers`` package (``pip install 'glassllm[hf]'``); the model
alone does not. The directory appears whole or not at all: everything is written into a temporary
directory beside it, flushed, and renamed into place.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import safetensors.numpy

from glassllm.atomic_file import fsync_path
from glassllm.data.bpe import END_OF_TEXT, BPETokenizer, byte_level_alphabet, import_tokenizers
from glassllm.data.tokenizers import ByteTokenizer, CharTokenizer
from glassllm.hf.convert import HFFormatError, config_to_hf, state_dict_to_hf
from glassllm.hf.load import CONFIG, TOKENIZER_JSON, WEIGHTS
from glassllm.models.gpt import GPT

TOKENIZER_CONFIG = "tokenizer_config.json"


def save_pretrained(
    model: GPT,
    tokenizer: CharTokenizer | ByteTokenizer | BPETokenizer | None,
    out_dir: str | os.PathLike[str],
    overwrite: bool = False,
    source: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``model`` (and ``tokenizer``, unless None) as a Hugging Face directory; returns
    its path. An existing non-empty ``out_dir`` is refused unless ``overwrite``, then replaced as a
    whole, and only when `check_target` allows it (``source``: the file or directory the model was
    read from, never replaced). Raises HFFormatError (a ValueError) for a model or tokenizer that
    cannot be written, or a directory that may not be replaced."""
    if not isinstance(model, GPT):
        raise TypeError(f"save_pretrained writes a glassllm GPT, got {type(model).__name__}")
    out = Path(out_dir)
    check_target(out, overwrite, source)
    config = model.config
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise HFFormatError(
            "cannot export",
            [f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only "
             f"{config.vocab_size}"],
        )  # fmt: skip
    tensors = state_dict_to_hf(model.state_dict(), config)
    hf_tokenizer = None if tokenizer is None else hf_tokenizer_of(tokenizer)
    eos = None
    if isinstance(tokenizer, BPETokenizer):
        eos = tokenizer.token_id(END_OF_TEXT)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    os.mkdir(temporary)
    try:
        _write_json(temporary / CONFIG, config_to_hf(config, bos_token_id=eos, eos_token_id=eos))
        safetensors.numpy.save_file(tensors, str(temporary / WEIGHTS), metadata={"format": "pt"})
        # safetensors creates its file 0o600; give it the mode open() gave config.json (umask).
        os.chmod(temporary / WEIGHTS, (temporary / CONFIG).stat().st_mode & 0o777)
        if hf_tokenizer is not None:
            _write_tokenizer(hf_tokenizer, eos, config.block_size, temporary)
        for file in temporary.iterdir():
            fsync_path(file)
        fsync_path(temporary)
        _move_into_place(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def hf_tokenizer_of(tokenizer: CharTokenizer | ByteTokenizer | BPETokenizer) -> Any:
    """A ``tokenizers.Tokenizer`` giving the same ids and text as a glassllm tokenizer."""
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.tokenizer
    tokenizers = import_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        hf = tokenizers.Tokenizer(models.BPE(vocab=dict(tokenizer.stoi), merges=[]))
        hf.decoder = decoders.Fuse()
        return hf
    if isinstance(tokenizer, ByteTokenizer):
        vocab = {ch: byte for ch, byte in byte_level_alphabet().items()}
        hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
        return hf
    raise HFFormatError("cannot export", [f"no Hugging Face form for {type(tokenizer).__name__}"])


def _write_tokenizer(hf: Any, eos: int | None, block_size: int, directory: Path) -> None:
    hf.save(str(directory / TOKENIZER_JSON))
    spec = json.loads(hf.to_str())
    if (spec.get("model") or {}).get("type") == "BPE":
        hf.model.save(str(directory))  # vocab.json + merges.txt, for GPT-2-era readers
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": block_size,
        # transformers would otherwise "clean up" spaces before punctuation when decoding.
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    if eos is not None:
        config.update(bos_token=END_OF_TEXT, eos_token=END_OF_TEXT)
    _write_json(directory / TOKENIZER_CONFIG, config)


def check_target(
    out_dir: str | os.PathLike[str],
    overwrite: bool = False,
    source: str | os.PathLike[str] | None = None,
) -> None:
    """Raise HFFormatError unless `save_pretrained` may write ``out_dir``: absent or empty, or,
    with ``overwrite``, a directory it may replace as a whole: one holding a model (a
    ``config.json``), and holding neither ``source`` nor the working directory."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise HFFormatError(str(out), ["exists and is not a directory"])
    if not (out.is_dir() and any(out.iterdir())):
        return
    if not overwrite:
        raise HFFormatError(str(out), ["exists and is not empty (overwrite to replace it)"])
    problems = []
    if not (out / CONFIG).is_file():
        problems.append(
            f"overwrite replaces only a model directory, and this one has no {CONFIG}: remove "
            "it yourself or choose another directory"
        )
    target = out.resolve()
    for inside, what in ((source, "the model's source"), (Path.cwd(), "the working directory")):
        if inside is not None and Path(inside).resolve().is_relative_to(target):
            problems.append(f"it holds {what} ({inside}), which overwrite would delete")
    if problems:
        raise HFFormatError(str(out), problems)


def _move_into_place(temporary: Path, out: Path) -> None:
    """Rename the finished directory to ``out``; an existing ``out`` is moved aside first and
    removed after, so ``out`` is at every moment either absent, the old one or the new one."""
    if not out.exists():
        os.rename(temporary, out)
    elif not any(out.iterdir()):
        out.rmdir()
        os.rename(temporary, out)
    else:
        old = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
        os.rename(out, old)
        os.rename(temporary, out)
        shutil.rmtree(old, ignore_errors=True)
    fsync_path(out.parent)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
