"""Write a trained model in another format: ``glassllm export``.

``glassllm export --checkpoint out/ckpt.safetensors --format hf --out-dir DIR`` writes a Hugging
Face directory (``config.json``, ``model.safetensors``, tokenizer files: GPT-2 for learned
positions, Llama for rotary ones) that transformers' ``AutoModelForCausalLM`` and
``AutoTokenizer`` load and that computes the same logits (see `glassllm.hf.save_pretrained`).
The source may also be a Hugging Face directory (copied in glassllm's layout). The directory
appears whole or not at all; an existing non-empty one is refused unless ``--overwrite``, which
replaces only a directory that `glassllm.hf.check_target` allows (one holding a
``config.json``, and neither the source nor the working directory).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TextIO

from glassllm.app.config import CHECKPOINT_NAME, DEFAULT_OUT_DIR
from glassllm.app.options import field_problems, option

EXPORT_FORMATS = ("hf",)


@dataclasses.dataclass
class ExportConfig:
    """What ``glassllm export`` is asked for; ``--out-dir DIR`` sets ``out_dir``."""

    checkpoint: str = option(
        str(Path(DEFAULT_OUT_DIR) / CHECKPOINT_NAME),
        "the glassllm checkpoint (or Hugging Face directory) to export",
        metavar="PATH",
        if_empty="--checkpoint must name a checkpoint file",
    )
    format: str = option(
        "hf", "'hf': a Hugging Face directory (GPT-2 or Llama)", choices=EXPORT_FORMATS
    )
    out_dir: str | None = option(
        None,
        "the directory to write (default: none, required)",
        metavar="DIR",
        if_empty="--out-dir is empty",
    )
    overwrite: bool = option(
        False, "replace OUT_DIR when it exists and is not empty (a model directory only)"
    )

    def validate(self) -> None:
        """Raise one ValueError naming every option that cannot work."""
        problems = field_problems(self, label=lambda name: "--" + name.replace("_", "-"))
        if self.out_dir is None:
            problems.append("export needs --out-dir DIR, the directory to write")
        if problems:
            raise ValueError("; ".join(problems))


def export(config: ExportConfig, out: TextIO | None = None) -> Path:
    """Export as ``glassllm export`` does; returns the directory written. Every failure is a
    ValueError (or OSError) with a message for the user, raised before anything is written."""
    from glassllm.app.sample import open_checkpoint
    from glassllm.atomic_directory import recover
    from glassllm.hf import HFFormatError, check_target, save_pretrained

    config.validate()
    assert config.out_dir is not None
    out_dir = Path(config.out_dir)
    for note in recover(out_dir):  # an export killed midway: its old directory back, and so on
        print(f"glassllm: {note}", file=sys.stderr, flush=True)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not config.overwrite:
        raise ValueError(
            f"--out-dir {str(out_dir)!r} exists and is not empty; pass --overwrite to replace it"
        )
    try:  # before the model is read: the library's rule for what may be replaced
        check_target(out_dir, config.overwrite, source=config.checkpoint)
    except HFFormatError as err:
        raise ValueError(f"--out-dir {err}") from None
    opened = open_checkpoint(config.checkpoint)
    model, tokenizer = opened.model, opened.tokenizer
    try:
        path = save_pretrained(
            model, tokenizer, out_dir, overwrite=config.overwrite, source=config.checkpoint
        )
    except HFFormatError as err:
        raise ValueError(f"cannot export {config.checkpoint!r}: {err}") from None
    if out is not None:
        out.write(
            f"exported {config.checkpoint} to {path} ({model.num_parameters():,} parameters, "
            f"vocabulary {model.config.vocab_size}); load it with transformers' "
            f"AutoModelForCausalLM.from_pretrained({str(path)!r})\n"
        )
        out.flush()
    return path
