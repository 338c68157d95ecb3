"""`ModelSource`: what a model was opened from, as a typed description.

Every way the program opens a model (``glassllm sample``, ``view``, ``chat``, ``export``: see
``glassllm.app.sample.open_checkpoint``) describes it with one of these, so no caller invents a
metadata dict for a model that has none (a Hugging Face directory has no training step).

>>> from glassllm.models import GPTConfig
>>> config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
>>> ModelSource(kind="in memory", path=None, config=config, tokenizer_kind="char").iteration is None
True
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from glassllm.models.gpt import GPTConfig

SourceKind = Literal["glassllm", "huggingface", "gguf", "in memory"]


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model came from: its kind, its path (None in memory), its config and tokenizer
    kind; for a glassllm checkpoint also its training step, best validation loss and the
    checkpoint's whole metadata (None for the other kinds, which have no training record)."""

    kind: SourceKind
    path: Path | None
    config: GPTConfig
    tokenizer_kind: str
    iteration: int | None = None
    best_val_loss: float | None = None
    metadata: dict[str, Any] | None = None
