"""The configuration of a training run: every option of ``glassllm train``, as one dataclass.

Each field is a command-line option (``n_layer`` -> ``--n-layer``) parsed with the field's type;
its ``help`` metadata is the option's help. A checkpoint stores the whole configuration, so
``--resume`` continues with it, changed only by the options given again (see `resume_config`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from glassllm.app.run_state import read_checkpoint_metadata
from glassllm.data import TOKENIZER_KINDS

# The files a run writes in out_dir, and what each is (for messages).
CHECKPOINT_NAME = "ckpt.safetensors"
LOG_NAME = "log.jsonl"
PLOT_NAME = "loss.png"
OUT_FILES = {CHECKPOINT_NAME: "checkpoint", LOG_NAME: "log", PLOT_NAME: "loss plot"}


def _option(default: Any, help: str, **extra: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **extra})


@dataclasses.dataclass
class TrainConfig:
    """Every knob of a training run; ``glassllm train --n-layer 6`` sets ``n_layer``.

    The defaults are nanoGPT's "I only have a macbook" shakespeare_char configuration (4 layers,
    4 heads, 128 wide, context 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4, beta2 0.99): a
    0.8M-parameter character-level GPT, here trained on the built-in corpus (the Python docs).
    Measured on a 2-core CPU (`glassllm train`, no options): 1 min 46 s wall when the machine is
    otherwise idle (about 50 ms per step), 4 to 5 minutes when it is busy with other work; final
    val loss 1.42 (train 1.38), peak memory 145 MB.
    """

    # model
    n_layer: int = _option(4, "transformer blocks")
    n_head: int = _option(4, "attention heads per block (must divide n_embd)")
    n_embd: int = _option(128, "width of the residual stream")
    block_size: int = _option(64, "context length in tokens")
    dropout: float = _option(0.0, "dropout probability (0 for small models)")
    bias: bool = _option(False, "biases in Linear and LayerNorm layers")
    # data
    data: str = _option(
        "builtin", "'builtin' (Python docs), 'shakespeare' or a text file path", metavar="DATA"
    )
    tokenizer: str = _option(
        "char", "'char' (one token per character) or 'byte' (UTF-8 bytes)", choices=TOKENIZER_KINDS
    )
    batch_size: int = _option(12, "blocks per step")
    # optimisation
    max_iters: int = _option(2000, "training steps")
    lr: float = _option(1e-3, "peak learning rate")
    min_lr: float = _option(1e-4, "learning-rate floor at the end of the cosine decay")
    warmup_iters: int = _option(100, "steps of linear learning-rate warmup")
    lr_decay_iters: int | None = _option(
        None, "step where the cosine decay reaches min_lr (default: max_iters)"
    )
    weight_decay: float = _option(0.1, "AdamW weight decay on matrices")
    beta1: float = _option(0.9, "AdamW beta1")
    beta2: float = _option(0.99, "AdamW beta2")
    grad_clip: float = _option(1.0, "clip the gradient norm to this (0: no clipping)")
    # evaluation, checkpoints, reproducibility
    eval_interval: int = _option(250, "steps between evaluations and checkpoints")
    eval_iters: int = _option(20, "batches per split in each evaluation")
    seed: int = _option(1337, "seed of every random generator of the run")
    out_dir: str = _option("out", "directory for the checkpoint, log and loss plot", metavar="DIR")
    sample_tokens: int = _option(300, "tokens sampled at the end of training (0: none)")

    def validate(self) -> None:
        """Raise one ValueError naming every field that cannot work."""
        problems: list[str] = []
        for name in (
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "batch_size",
            "eval_interval",
            "eval_iters",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "sample_tokens", "seed"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_head >= 1 and self.n_embd % self.n_head != 0:
            problems.append(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            problems.append(
                f"lr_decay_iters ({self.lr_decay_iters}) must be >= warmup_iters "
                f"({self.warmup_iters})"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"lr must be a positive number, got {self.lr}")
        if not (self.min_lr >= 0 and math.isfinite(self.min_lr)):
            problems.append(f"min_lr must be >= 0, got {self.min_lr}")
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.grad_clip >= 0:
            problems.append(f"grad_clip must be >= 0 (0 turns clipping off), got {self.grad_clip}")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.tokenizer not in TOKENIZER_KINDS:
            problems.append(
                f"tokenizer must be one of {', '.join(TOKENIZER_KINDS)}, got {self.tokenizer!r}"
            )
        if not self.data:
            problems.append("data must name a corpus or a file")
        if not self.out_dir:
            problems.append("out_dir must name a directory ('.' for the current one)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def decay_iters(self) -> int:
        """The step where the cosine decay ends: ``lr_decay_iters``, else ``max_iters`` (or
        ``warmup_iters`` when that is longer: a short run then spends all its steps warming up)."""
        if self.lr_decay_iters is None:
            return max(self.max_iters, self.warmup_iters)
        return self.lr_decay_iters

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**values)


def check_out_dir(out_dir: str | os.PathLike[str]) -> None:
    """Raise ValueError unless a run can write its files in ``out_dir``, creating it if needed.

    Checks without creating anything: ``out_dir`` is a writable directory, or the nearest
    existing folder above it is one; none of the run's files there is a directory; an existing
    log or plot (rewritten in place, where the checkpoint is replaced by a rename) is writable.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        if os.path.lexists(out_dir):
            raise ValueError(f"out_dir {str(out_dir)!r} is not a directory")
        ancestor = out_dir.parent
        while not os.path.lexists(ancestor):
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ValueError(
                f"cannot create out_dir {str(out_dir)!r}: {str(ancestor)!r} is not a directory"
            )
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ValueError(
                f"cannot create out_dir {str(out_dir)!r}: {str(ancestor)!r} is not writable"
            )
        return
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir {str(out_dir)!r} is not writable")
    for name, what in OUT_FILES.items():
        path = out_dir / name
        if path.is_dir():
            raise ValueError(
                f"{str(path)!r} is a directory, where the run writes its {what}: remove it or "
                "choose another --out-dir"
            )
        if name != CHECKPOINT_NAME and path.exists() and not os.access(path, os.W_OK):
            raise ValueError(f"the {what} {str(path)!r} is not writable")


# Fields that shape the model, its tokens or its randomness: a resumed run must keep them.
FIXED_ON_RESUME = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "dropout",
    "bias",
    "data",
    "tokenizer",
    "seed",
)


def resume_config(given: dict[str, Any]) -> TrainConfig:
    """The configuration of a resumed run: the checkpoint's, updated with the options ``given``.

    The checkpoint is ``given["out_dir"]/ckpt.safetensors`` (default ``out``). Options in
    :data:`FIXED_ON_RESUME` may be given only with the checkpoint's value.
    """
    out_dir = given.get("out_dir", TrainConfig().out_dir)
    path = Path(out_dir) / CHECKPOINT_NAME
    if path.is_dir():
        raise ValueError(f"--resume: {str(path)!r} is a directory, not a checkpoint file")
    if not path.is_file():
        raise ValueError(
            f"--resume: no checkpoint at {str(path)!r} (train without --resume first, or point "
            f"--out-dir at the run to continue)"
        )
    metadata = read_checkpoint_metadata(path)
    if "train_config" not in metadata:  # e.g. written by examples/train_tiny_gpt.py
        raise ValueError(
            f"--resume: checkpoint {str(path)!r} has no training configuration (it was not "
            "written by glassllm train); sample from it with glassllm sample, or train anew"
        )
    try:
        saved = TrainConfig.from_dict(metadata["train_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"checkpoint {str(path)!r} has no usable training configuration: {err}"
        ) from None
    conflicts = [
        f"{name}={given[name]!r} (checkpoint: {getattr(saved, name)!r})"
        for name in FIXED_ON_RESUME
        if name in given and given[name] != getattr(saved, name)
    ]
    if conflicts:
        raise ValueError(
            f"cannot change {', '.join(conflicts)} when resuming: the model, data, tokenizer and "
            "seed come from the checkpoint"
        )
    changes = {name: value for name, value in given.items() if name != "out_dir"}
    return dataclasses.replace(saved, **changes, out_dir=str(out_dir))
