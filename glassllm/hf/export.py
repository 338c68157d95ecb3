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

Writing a BPE tokenizer needs the ``tokenizers`` package (the ``hf`` extra: ``pip install -e
'.[hf]'`` in the checkout), which runs it; a char or byte tokenizer is written without it
(`tokenizer_spec`), and so is the model. The directory appears whole or not at all: everything is
written into a temporary directory beside it, flushed, and moved into place by
`glassllm.atomic_directory.replace_directory`, so that after a kill at any moment the old
directory or the new one is at the path; the next export puts back or removes what a killed one
left (`glassllm.atomic_directory.recover`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from glassllm._foreign import foreign_call
from glassllm._text import parse_json, utf8_problem
from glassllm.atomic_directory import make_temporary, recover, replace_directory
from glassllm.atomic_file import fsync_path
from glassllm.data.bpe import END_OF_TEXT, BPETokenizer, byte_level_alphabet, import_tokenizers
from glassllm.data.tokenizers import ByteTokenizer, CharTokenizer
from glassllm.hf.convert import HFFormatError, config_to_hf, state_dict_to_hf
from glassllm.hf.load import CONFIG, TOKENIZER_JSON, WEIGHTS
from glassllm.models.gpt import GPT
from glassllm.safetensors_file import write_file

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
    recover(out)  # what an export killed midway left: the old directory back, temporaries gone
    check_target(out, overwrite, source)
    config = model.config
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise HFFormatError(
            "cannot export",
            [f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only "
             f"{config.vocab_size}"],
        )  # fmt: skip
    tensors = state_dict_to_hf(model.state_dict(), config)
    if tokenizer is not None and not isinstance(tokenizer, BPETokenizer):
        tokenizer_spec(tokenizer)  # an unknown kind is refused before anything is written
    eos = None
    if isinstance(tokenizer, BPETokenizer):
        eos = tokenizer.token_id(END_OF_TEXT)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = make_temporary(out)
    try:
        _write_json(temporary / CONFIG, config_to_hf(config, bos_token_id=eos, eos_token_id=eos))
        # through glassllm's boundary: a full disk is an OSError, not the library's own error
        write_file(temporary / WEIGHTS, tensors, metadata={"format": "pt"})
        # safetensors creates its file 0o600; give it the mode open() gave config.json (umask).
        os.chmod(temporary / WEIGHTS, (temporary / CONFIG).stat().st_mode & 0o777)
        if tokenizer is not None:
            _write_tokenizer(tokenizer, eos, config.block_size, temporary)
        for file in temporary.iterdir():
            fsync_path(file)
        fsync_path(temporary)
        replace_directory(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def hf_tokenizer_of(tokenizer: CharTokenizer | ByteTokenizer | BPETokenizer) -> Any:
    """A ``tokenizers.Tokenizer`` giving the same ids and text as a glassllm tokenizer (needs the
    ``tokenizers`` package; `save_pretrained` writes a char or byte tokenizer without it)."""
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.tokenizer
    return import_tokenizers().Tokenizer.from_str(json.dumps(tokenizer_spec(tokenizer)))


def tokenizer_spec(tokenizer: CharTokenizer | ByteTokenizer) -> dict[str, Any]:
    """The ``tokenizer.json`` of a char or byte tokenizer, as the ``tokenizers`` library writes
    it, built without that library: a BPE model with no merges (tests/hf/ hold it to the
    library's own output). A char vocabulary is one token per character, glued back by a
    ``Fuse`` decoder; the byte tokenizer is GPT-2's byte-level alphabet, byte ``b`` at id ``b``."""
    if isinstance(tokenizer, CharTokenizer):
        problem = utf8_problem("".join(tokenizer.chars))  # a checkpoint's JSON can hold one
        if problem is not None:
            raise HFFormatError("cannot export", [f"the character vocabulary: {problem}"])
        vocab, pre_tokenizer, decoder = dict(tokenizer.stoi), None, {"type": "Fuse"}
    elif isinstance(tokenizer, ByteTokenizer):
        vocab = dict(byte_level_alphabet())
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
        pre_tokenizer = {**byte_level, "use_regex": False}
        decoder = {**byte_level, "add_prefix_space": True, "use_regex": True}  # the defaults
    else:
        raise HFFormatError(
            "cannot export", [f"no Hugging Face form for {type(tokenizer).__name__}"]
        )
    vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))  # in id order, as written
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def _write_tokenizer(
    tokenizer: CharTokenizer | ByteTokenizer | BPETokenizer,
    eos: int | None,
    block_size: int,
    directory: Path,
) -> None:
    if isinstance(tokenizer, BPETokenizer):  # the library's own files, for any model it runs
        hf = tokenizer.tokenizer
        # Through the library boundary: whatever it raises (a full disk included) is an OSError.
        with foreign_call(
            lambda why: OSError(f"cannot write the tokenizer in {directory} ({why})")
        ):
            text = hf.to_str(pretty=True)  # what hf.save writes, written here as every file is
        (directory / TOKENIZER_JSON).write_text(text, encoding="utf-8")
        if (parse_json(text).get("model") or {}).get("type") == "BPE":
            with foreign_call(lambda why: OSError(f"cannot write {directory} vocab.json ({why})")):
                hf.model.save(str(directory))  # vocab.json + merges.txt, for GPT-2-era readers
    else:  # a BPE without merges, written as the library writes it
        spec = tokenizer_spec(tokenizer)
        text = json.dumps(spec, indent=2, ensure_ascii=False)
        (directory / TOKENIZER_JSON).write_text(text, encoding="utf-8")
        vocab = json.dumps(spec["model"]["vocab"], ensure_ascii=False, separators=(",", ":"))
        (directory / "vocab.json").write_text(vocab, encoding="utf-8")
        (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
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


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
