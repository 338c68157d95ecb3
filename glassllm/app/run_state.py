"""Checkpoints of a trained GPT: read the metadata, rebuild model and tokenizer from the file alone.

A training checkpoint is a `glassllm.save` file whose metadata says
``format = "glassllm.gpt"`` and carries the model's shape (``model_config``), the tokenizer's
vocabulary (``tokenizer``), the training configuration and the state of every random generator
(see `glassllm.app.train.Trainer.metadata`). Any other file is "another model".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import glassllm
from glassllm.checkpoint import read_metadata
from glassllm.data import Tokenizer, tokenizer_from_dict
from glassllm.models import GPT, GPTConfig

# metadata["format"] of a checkpoint written by glassllm.app.train; anything else is another model.
CHECKPOINT_FORMAT = "glassllm.gpt"


def read_checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a checkpoint written by :class:`Trainer`, read without building a model.

    Raises ValueError for a missing or unreadable file, and for a checkpoint of another model.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is a directory, not a checkpoint file")
    if not path.exists():
        raise ValueError(f"checkpoint {str(path)!r} not found")
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} is not a regular file")
    metadata = read_metadata(path)  # CheckpointError (a ValueError) for an unreadable file
    if not isinstance(metadata, dict) or metadata.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{str(path)!r} is not a glassllm GPT checkpoint (its metadata has no "
            f"format={CHECKPOINT_FORMAT!r}): it holds another model"
        )
    return metadata


def model_from_metadata(
    metadata: dict[str, Any], rng: np.random.Generator | None = None
) -> tuple[GPT, Tokenizer]:
    """An (untrained) GPT of the checkpoint's shape and the checkpoint's tokenizer."""
    try:
        tokenizer = tokenizer_from_dict(metadata["tokenizer"])
        model_config = GPTConfig.from_dict(metadata["model_config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"checkpoint metadata is incomplete or invalid: {err}") from None
    if model_config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"checkpoint metadata disagrees with itself: the model has a vocabulary of "
            f"{model_config.vocab_size} but its tokenizer {tokenizer.vocab_size}"
        )
    return GPT(model_config, rng=rng), tokenizer


def load_trained_model(path: str | Path) -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """Rebuild model and tokenizer from a checkpoint file alone: ``(model, tokenizer, metadata)``.

    The model is in eval mode (ready to sample).
    """
    metadata = read_checkpoint_metadata(path)
    model, tokenizer = model_from_metadata(metadata, rng=np.random.default_rng(0))
    glassllm.load(path, model)
    model.eval()
    return model, tokenizer, metadata
