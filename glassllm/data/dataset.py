"""A corpus as a run uses it: text -> tokenizer -> training and validation token streams."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from glassllm.data.batches import VAL_FRACTION, check_long_enough, split_train_val
from glassllm.data.corpus import DataError, load_text
from glassllm.data.tokenizers import Tokenizer, build_tokenizer, characters_per_token


@dataclasses.dataclass
class TokenSplits:
    """The token streams of a run: 90% for training, 10% for validation."""

    tokenizer: Tokenizer
    train: np.ndarray  # or, from a prepared directory, `glassllm.data.shards.TokenShards`
    val: np.ndarray
    sha256: str  # of the text (of a prepared corpus: its manifest), for resumes and ranks
    # Characters of text in each split, when known without decoding it (a prepared corpus)
    characters: dict[str, int] | None = None
    prepared: bool = False  # read from a `glassllm prepare` directory

    def characters_per_token(self) -> dict[str, float]:
        """Characters of text per token in each split, to report losses also in bits per
        character, which compare across tokenizers (1 for char)."""
        if self.characters is not None:
            return {s: self.characters[s] / len(ids) for s, ids in self.splits().items()}
        return {s: characters_per_token(self.tokenizer, ids) for s, ids in self.splits().items()}

    def splits(self) -> dict[str, np.ndarray]:
        return {"train": self.train, "val": self.val}


def load_prepared(directory: str, block_size: int) -> TokenSplits:
    """The splits of a `glassllm prepare` directory, memory-mapped (`glassllm.data.shards`);
    each must hold a window of ``block_size + 1`` tokens. DataError for anything wrong."""
    from glassllm.data.shards import PreparedCorpus

    corpus = PreparedCorpus(directory)
    for split, name in (("train", "training"), ("val", "validation")):
        try:
            check_long_enough(corpus.splits[split], block_size, name)
        except ValueError as err:
            raise DataError(
                f"prepared corpus {directory!r}: {err}; use a smaller --block-size"
            ) from None
    return TokenSplits(
        corpus.tokenizer,
        corpus.splits["train"],
        corpus.splits["val"],
        corpus.sha256,
        corpus.characters,
        prepared=True,
    )


def tokenize_corpus(
    data: str,
    tokenizer_kind: str,
    block_size: int,
    tokenizer: Tokenizer | None = None,
    vocab_size: int | None = None,
) -> TokenSplits:
    """Load the corpus ``data`` (see `load_text`), tokenize it with ``tokenizer`` (else a new
    tokenizer of ``tokenizer_kind``, ``vocab_size`` for a BPE) and split it 90/10. Each split must
    hold at least one window of ``block_size + 1`` tokens. Every way this can fail raises one
    ValueError.

    "char" and "byte" split the token stream 90/10 (a char vocabulary is that of the whole text,
    as nanoGPT's). "bpe" splits the text 90/10 by characters first and learns its merges on the
    training part only, so the validation loss is measured on text the tokenizer never saw.
    """
    text = load_text(data)
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    try:
        if tokenizer_kind == "bpe":
            cut = int(len(text) * (1.0 - VAL_FRACTION))
            if tokenizer is None:
                tokenizer = build_tokenizer("bpe", text[:cut], vocab_size)
            train, val = tokenizer.encode_array(text[:cut]), tokenizer.encode_array(text[cut:])
            ids_count = len(train) + len(val)
        else:
            if tokenizer is None:
                tokenizer = build_tokenizer(tokenizer_kind, text, vocab_size)
            ids = tokenizer.encode_array(text)
            train, val = split_train_val(ids)
            ids_count = len(ids)
    except ValueError as err:
        if tokenizer is None:  # building it failed (a missing package, a bad vocabulary size)
            raise
        raise ValueError(f"data {data!r} does not fit the tokenizer: {err}") from None
    try:
        check_long_enough(train, block_size, "training")
        check_long_enough(val, block_size, "validation")
    except ValueError as err:
        raise ValueError(
            f"data {data!r} is too short for block_size={block_size}: {ids_count} "
            f"tokens, and {err}; use a text of at least {10 * (block_size + 2)} tokens "
            "or a smaller --block-size"
        ) from None
    return TokenSplits(tokenizer, train, val, sha256)
