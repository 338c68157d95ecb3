"""What ``glassllm train --data`` trains on: a text tokenized at start, or a prepared directory.

``--data FILE`` (or ``builtin``, ``shakespeare``) is read and tokenized as it always was
(`glassllm.data.tokenize_corpus`). ``--data DIR``, a ``glassllm prepare`` output, is memory-mapped
(`glassllm.data.shards`) and brings its own tokenizer: ``--tokenizer`` left out takes the
manifest's kind (`tokenizer_option_for`), one given must be that kind, and ``--vocab-size`` is
refused (the vocabulary is the manifest's). The checkpoint records the manifest's sha256 as its
``data_sha256``; ``--resume`` on a prepared corpus whose manifest changed is refused (a file that
changed only warns, as before: the text of ``--data FILE`` is the user's to edit).
"""

from __future__ import annotations

import os
from typing import Any

from glassllm.app.config import TrainConfig
from glassllm.data import CORPUS_NAMES, DataError, Tokenizer, TokenSplits, tokenize_corpus
from glassllm.data.dataset import load_prepared
from glassllm.data.shards import PreparedCorpus, is_prepared


def tokenizer_option_for(data: str) -> str | None:
    """The ``--tokenizer`` a prepared ``data`` directory implies (None for a text file)."""
    if not is_prepared(data):
        return None
    return str(PreparedCorpus(data).manifest["tokenizer"]["type"])


def load_training_data(config: TrainConfig, saved: Any = None) -> TokenSplits:
    """The corpus of a run configured by ``config``; ``saved``: the `RunState` resumed from."""
    saved_tokenizer = None if saved is None else saved.tokenizer
    if not is_prepared(config.data):
        if os.path.isdir(config.data) and config.data not in CORPUS_NAMES:
            raise DataError(
                f"--data {config.data!r} is a directory without a manifest.json: make one with "
                f"glassllm prepare --data {config.data} --out-dir PREPARED, then --data PREPARED"
            )
        return tokenize_corpus(
            config.data, config.tokenizer, config.block_size, saved_tokenizer, config.vocab_size
        )
    corpus = load_prepared(config.data, config.block_size)
    kind = corpus.tokenizer.to_dict()["type"]
    if config.tokenizer != kind:
        raise ValueError(
            f"--data {config.data!r} was prepared with a {kind!r} tokenizer, not "
            f"--tokenizer {config.tokenizer!r}: leave --tokenizer out (the manifest's is used)"
        )
    if config.vocab_size is not None:
        raise ValueError(
            f"--vocab-size is the prepared corpus's ({corpus.tokenizer.vocab_size}) with --data "
            f"{config.data!r}: leave it out"
        )
    if saved is not None and saved.data_sha256 != corpus.sha256:
        raise ValueError(
            f"--resume: the prepared corpus {config.data!r} (manifest sha256 "
            f"{corpus.sha256[:12]}) is not the one this checkpoint trained on "
            f"({str(saved.data_sha256)[:12]}): resume on that corpus, or start a new run"
        )
    return corpus


def check_init_tokenizer(corpus: TokenSplits, init_tokenizer: Tokenizer, init_from: str) -> None:
    """ValueError unless a prepared ``corpus`` was tokenized by the tokenizer of the checkpoint
    a run is initialised from (``--init-from``): the ids on disk mean that tokenizer's tokens.
    A text corpus needs no check (it is tokenized with ``init_tokenizer`` at start)."""
    if corpus.prepared and corpus.tokenizer.to_dict() != init_tokenizer.to_dict():
        raise ValueError(
            f"--data was prepared with another tokenizer than {init_from!r}'s: prepare it again "
            f"with --tokenizer {init_from}"
        )
