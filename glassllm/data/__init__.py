"""Text in, token batches out: tokenizers, corpora and batch sampling.

>>> from glassllm.data import CharTokenizer, get_batch, split_train_val
"""

from glassllm.data.batches import (
    VAL_FRACTION,
    check_long_enough,
    get_batch,
    sequential_batches,
    split_train_val,
)
from glassllm.data.bpe import (
    DEFAULT_BPE_VOCAB_SIZE,
    MIN_BPE_VOCAB_SIZE,
    BPETokenizer,
    MissingDependencyError,
    train_bpe,
)
from glassllm.data.corpus import (
    CORPUS_NAMES,
    MAX_CORPUS_BYTES,
    SHAKESPEARE_SHA256,
    SHAKESPEARE_URL,
    DataError,
    builtin_text,
    cache_dir,
    load_text,
    max_corpus_bytes,
    read_text_file,
    shakespeare_text,
)
from glassllm.data.dataset import TokenSplits, tokenize_corpus
from glassllm.data.tokenizers import (
    TOKENIZER_KINDS,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    UnknownCharacterError,
    bits_per_character,
    build_tokenizer,
    characters_per_token,
    tokenizer_from_dict,
)

__all__ = [
    "DEFAULT_BPE_VOCAB_SIZE",
    "MIN_BPE_VOCAB_SIZE",
    "BPETokenizer",
    "MissingDependencyError",
    "train_bpe",
    "CORPUS_NAMES",
    "MAX_CORPUS_BYTES",
    "SHAKESPEARE_SHA256",
    "SHAKESPEARE_URL",
    "TOKENIZER_KINDS",
    "VAL_FRACTION",
    "ByteTokenizer",
    "CharTokenizer",
    "DataError",
    "TokenSplits",
    "Tokenizer",
    "UnknownCharacterError",
    "bits_per_character",
    "build_tokenizer",
    "builtin_text",
    "cache_dir",
    "characters_per_token",
    "check_long_enough",
    "get_batch",
    "load_text",
    "max_corpus_bytes",
    "read_text_file",
    "sequential_batches",
    "shakespeare_text",
    "split_train_val",
    "tokenize_corpus",
    "tokenizer_from_dict",
]
