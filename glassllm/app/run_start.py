"""What a training run starts from: its token streams, its tokenizer and its model (`start_run`,
called by `glassllm.app.train.Trainer` before anything is written).

Three starts:

* **from scratch**: a new tokenizer of ``--tokenizer`` fitted to the text, a model of the options'
  shape (``--arch``, ``--n-layer``, ...) with random initial weights drawn from the run's model
  generator;
* **resumed** (``--resume``): the checkpoint's tokenizer and model configuration; the Trainer
  then loads its weights, optimizer state and generators;
* **from a checkpoint** (``--init-from PATH``, nanoGPT's ``init_from``): a glassllm run directory
  or its ``ckpt.safetensors``, a Hugging Face model directory or a GGUF file, opened as
  ``glassllm sample`` opens it (`glassllm.app.sample.open_checkpoint`). The run takes that
  model's configuration, every architectural choice included (grouped-query attention, an
  untied head, biases, rotary settings), with the run's ``--dropout``; its weights in float32;
  and its tokenizer, which tokenizes the corpus and is stored in the run's checkpoint with the
  configuration (and an instruct model's chat template, for ``glassllm chat``), so sampling,
  chatting and resuming never read the original path again. The model keeps
  its context: ``--block-size`` is the length of the training windows and may be anything up to
  it (nanoGPT crops the model's context to ``block_size`` instead; a finetuned model here can
  still be sampled over its whole context). No random number is drawn for the weights, so the
  model generator starts fresh and drives dropout alone.

The corpus is read in one place, `_token_splits` (`glassllm.app.training_data`): a text file is
tokenized by the run's tokenizer (a resumed run's or the ``--init-from`` checkpoint's), and a
prepared directory (``glassllm prepare``) must have been tokenized by it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from glassllm.app.config import CHECKPOINT_NAME, TrainConfig
from glassllm.app.run_state import RunState, SavedRun
from glassllm.app.sample import Opened, open_checkpoint
from glassllm.app.training_data import (
    check_init_tokenizer,
    load_training_data,
    tokenizer_option_for,
)
from glassllm.chat_template import ChatTemplate
from glassllm.data import Tokenizer, TokenSplits, tokenize_corpus
from glassllm.data.shards import is_prepared
from glassllm.models import GPT, GPTConfig


@dataclasses.dataclass
class RunStart:
    """The tokens, model configuration and model a run trains (weights not yet restored when
    resuming)."""

    corpus: TokenSplits
    model_config: GPTConfig
    model: GPT
    chat_template: ChatTemplate | None = None  # an instruct model's, kept for glassllm chat


def start_run(
    config: TrainConfig, saved: SavedRun | None, model_rng: np.random.Generator
) -> RunStart:
    """The start of a run of the (validated) ``config``: resumed from ``saved`` when given, else
    from ``config.init_from`` when set, else from scratch (weights drawn from ``model_rng``).
    Raises ValueError (or OSError) for the user, before anything is written."""
    if saved is not None:
        tokenizer = saved.state.tokenizer
        corpus = _token_splits(config, tokenizer, saved.state)
        if config.init_from is not None:  # the checkpoint holds the model: no draw
            model_config = saved.state.model_config
            model = GPT(model_config, rng=model_rng, init=False)
            return RunStart(corpus, model_config, model, saved.state.chat_template)
        # from scratch, as the run first drew it (its weights are replaced by the checkpoint's)
        model_config = config.model_config(tokenizer.vocab_size)
        return RunStart(corpus, model_config, GPT(model_config, rng=model_rng))
    if config.init_from is not None:
        return _start_from_checkpoint(config, model_rng)
    corpus = load_training_data(config)
    model_config = config.model_config(corpus.tokenizer.vocab_size)
    return RunStart(corpus, model_config, GPT(model_config, rng=model_rng))


def _start_from_checkpoint(config: TrainConfig, model_rng: np.random.Generator) -> RunStart:
    assert config.init_from is not None
    opened = open_init_from(config.init_from)
    loaded = opened.model.config
    if config.block_size > loaded.block_size:
        raise ValueError(
            f"--block-size {config.block_size} is beyond the context of the --init-from model "
            f"({loaded.block_size} tokens): give --block-size {loaded.block_size} or less"
        )
    corpus = _token_splits(config, opened.tokenizer)
    model_config = dataclasses.replace(loaded, dropout=config.dropout)
    model = GPT(model_config, rng=model_rng, init=False)  # dropout masks from the run's generator
    # the loaded arrays themselves (float32: every loader widens), copied into place once
    model.load_state_dict({name: p.data for name, p in opened.model.named_parameters()})
    return RunStart(corpus, model_config, model, opened.chat_template)


def _token_splits(
    config: TrainConfig, tokenizer: Tokenizer, saved_state: RunState | None = None
) -> TokenSplits:
    """The corpus of ``config`` for ``tokenizer`` (a resumed run's or the ``--init-from``
    checkpoint's): a text tokenized by it, split as a run of its kind splits it, or a prepared
    directory, whose ids must be that tokenizer's."""
    if config.init_from is None:
        return load_training_data(config, saved_state)
    if is_prepared(config.data):  # its tokenizer is the manifest's: the checkpoint's, or refused
        kind = tokenizer_option_for(config.data)
        corpus = load_training_data(dataclasses.replace(config, tokenizer=kind), saved_state)
        check_init_tokenizer(corpus, tokenizer, config.init_from)
        return corpus
    kind = tokenizer.kind
    return tokenize_corpus(config.data, kind, config.block_size, tokenizer, config.vocab_size)


def open_init_from(path: str | os.PathLike[str]) -> Opened:
    """The model and tokenizer ``--init-from path`` names: a glassllm run directory (its
    ``ckpt.safetensors``) or checkpoint, a Hugging Face directory or a GGUF file. Raises a
    ValueError starting ``--init-from:`` (or an OSError) for the user. A Hugging Face
    directory's chat template is read too (a GGUF file's and a run's come with them)."""
    where = Path(path)
    if where.is_dir() and not (where / "config.json").is_file():
        if not (where / CHECKPOINT_NAME).is_file():
            raise ValueError(
                f"--init-from: {str(path)!r} is a directory with neither config.json (a Hugging "
                f"Face model) nor {CHECKPOINT_NAME} (a glassllm run)"
            )
        where = where / CHECKPOINT_NAME
    elif not os.path.lexists(where):
        raise ValueError(f"--init-from: {str(path)!r} does not exist")
    try:
        opened = open_checkpoint(where)
        if opened.source.kind == "huggingface" and opened.chat_template is None:
            directory = where if where.is_dir() else where.parent
            opened.chat_template = ChatTemplate.from_directory(directory)
        return opened
    except ValueError as err:
        raise ValueError(f"--init-from: {err}") from None
