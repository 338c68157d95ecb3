"""Byte-level BPE (GPT-2's tokenizer scheme) on the Hugging Face ``tokenizers`` library.

The library is the optional ``hf`` extra (``pip install -e '.[hf]'`` in the checkout), imported
when a BPE tokenizer is built or read, never when glassllm is imported. Byte-level BPE splits
text into words with GPT-2's pattern, maps every UTF-8 byte to one of 256 base symbols, then
applies learned merges in order; any text encodes, and ``decode(encode(text)) == text``.

Three ways to get one:

- :func:`train_bpe` learns merges on a text, deterministically (the same text and size give the
  same tokenizer, byte for byte). ``<|endoftext|>`` is id 0, the 256 byte symbols follow.
- :meth:`BPETokenizer.from_file` reads a Hugging Face ``tokenizer.json`` (any model the library
  runs, not only BPE); :meth:`BPETokenizer.from_vocab_merges` reads GPT-2's older ``vocab.json`` +
  ``merges.txt`` pair.
- :meth:`BPETokenizer.from_json` rebuilds it from :meth:`BPETokenizer.to_json`, the whole
  ``tokenizer.json`` as one string; ``to_dict`` stores that string, so a checkpoint carries it.

A tokenizer file is untrusted input, and a valid one can still make the library fail on a given
text (a pre-tokenizer regex that backtracks past the regex engine's limit panics at encode time).
Every call into the library goes through one boundary (`glassllm._foreign.foreign_call`): any
failure, a Rust panic included, is a `TokenizerError` (a ValueError) with one line saying what
failed, and text that is not UTF-8 (a lone surrogate) is refused before it reaches the library.
Files are read as every file glassllm reads (`glassllm._files`): regular files only, at most
`MAX_TOKENIZER_BYTES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from glassllm._files import FileProblem, read_regular
from glassllm._foreign import foreign_call
from glassllm._install import install_hint
from glassllm._text import parse_json, utf8_problem

END_OF_TEXT = "<|endoftext|>"
# 256 byte symbols + <|endoftext|>: the smallest byte-level vocabulary (no merge at all).
MIN_BPE_VOCAB_SIZE = 257
DEFAULT_BPE_VOCAB_SIZE = 512
INSTALL_HINT = install_hint("hf")
# tokenizer.json, vocab.json, merges.txt: the largest in use are tens of MB.
MAX_TOKENIZER_BYTES = 256 * 2**20


class MissingDependencyError(ImportError, ValueError):
    """An optional package is not installed. Also a ValueError: the input asked for something this
    installation cannot do, which the command line reports in one line with exit status 2."""


# SentencePiece's byte-fallback tokens: one byte each, written <0xNN>.
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerError(ValueError):
    """The tokenizers library failed on a tokenizer file or on a text: one line saying what."""


def _library(doing: str) -> Any:
    """The boundary around one call into the library: its failures as TokenizerError."""
    return foreign_call(lambda why: TokenizerError(f"the tokenizer failed to {doing} ({why})"))


def _checked_text(text: Any, what: str = "the text") -> str:
    if not isinstance(text, str):
        raise TokenizerError(f"{what} must be a str, got {type(text).__name__}")
    problem = utf8_problem(text)
    if problem is not None:
        raise TokenizerError(f"{what} cannot be encoded: {problem}")
    return text


def import_tokenizers() -> Any:
    """The ``tokenizers`` module, or a MissingDependencyError naming the extra to install."""
    try:
        import tokenizers
    except ImportError:
        raise MissingDependencyError(
            f"BPE tokenizers need the tokenizers package, in {INSTALL_HINT}"
        ) from None
    return tokenizers


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map from the 256 printable stand-in characters back to the bytes they encode.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, ...) are
    moved to U+0100 and up in byte order, which is why a space shows as 'Ġ' in GPT-2's vocabulary.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {ch: b for b, ch in chars.items()}


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` behind glassllm's Tokenizer protocol.

    ``vocab_size`` is one more than the largest id (special tokens included). ``encode`` adds no
    special token of its own; ``<|endoftext|>`` written in the text is that special token, as in
    GPT-2. ``decode`` keeps special tokens, so a round trip gives the text back; ids the tokenizer
    does not know decode to nothing.
    """

    kind = "bpe"

    def __init__(self, tokenizer: Any) -> None:
        tokenizers = import_tokenizers()
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(f"BPETokenizer wraps a tokenizers.Tokenizer, got {type(tokenizer)}")
        self.tokenizer = tokenizer
        with _library("list its vocabulary"):
            vocab = tokenizer.get_vocab(with_added_tokens=True)
            added = tokenizer.get_added_tokens_decoder()  # {id: AddedToken}
        if not vocab:
            raise TokenizerError("the tokenizer has an empty vocabulary")
        self.vocab_size: int = max(vocab.values()) + 1
        # why: read from the tokenizer's objects, not from its to_str() description parsed back
        # (SmolLM2's: 0.3 s of a 2 s load for these two facts)
        # A byte-level tokenizer's token strings are GPT-2 stand-in characters, one per byte.
        self.byte_level = any(
            isinstance(part, (tokenizers.decoders.ByteLevel, tokenizers.pre_tokenizers.ByteLevel))
            for part in (tokenizer.decoder, tokenizer.pre_tokenizer)
        )
        self.special_tokens: dict[int, str] = {
            int(index): str(token.content)
            for index, token in sorted(added.items())
            if token.special
        }

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_json(cls, text: str) -> BPETokenizer:
        """From the text of a ``tokenizer.json`` (what :meth:`to_json` returns)."""
        if not isinstance(text, str):
            raise ValueError(f"a tokenizer.json text must be a str, got {type(text).__name__}")
        tokenizers = import_tokenizers()
        with foreign_call(lambda why: TokenizerError(f"not a valid tokenizer.json: {why}")):
            tokenizer = tokenizers.Tokenizer.from_str(text)
        return cls(tokenizer)

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        """From a Hugging Face ``tokenizer.json`` file (a regular file of at most
        `MAX_TOKENIZER_BYTES`)."""
        text = _read_tokenizer_file(path)
        import_tokenizers()
        try:
            return cls.from_json(text)
        except ValueError as err:
            raise ValueError(f"{str(path)!r}: {err}") from None

    @classmethod
    def from_vocab_merges(cls, vocab: str | Path, merges: str | Path) -> BPETokenizer:
        """From GPT-2's ``vocab.json`` + ``merges.txt``: byte-level BPE, as GPT-2's tokenizer runs
        them; ``<|endoftext|>``, when in the vocabulary, is a special token."""
        tokenizers = import_tokenizers()
        from tokenizers import decoders, models, pre_tokenizers, processors

        # Read here, not by the library (BPE.from_file), so that the files are read as every
        # file is: regular files only, bounded. merges.txt as the library reads it: a line per
        # merge, two tokens split at one space, "#version" lines skipped.
        vocab_text, merges_text = _read_tokenizer_file(vocab), _read_tokenizer_file(merges)
        name = f"{str(vocab)!r} + {str(merges)!r}"
        try:
            table = parse_json(vocab_text)
        except ValueError as err:
            raise TokenizerError(f"cannot read {name}: {err}") from None
        if not isinstance(table, dict) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**32
            for i in table.values()
        ):
            raise TokenizerError(f"cannot read {name}: vocab.json must map tokens to ids")
        pairs = []
        lines = merges_text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"cannot read {name}: merges.txt line {number} is not a pair")
            pairs.append((parts[0], parts[1]))
        with foreign_call(lambda why: TokenizerError(f"cannot read {name}: {why}")):
            tokenizer = tokenizers.Tokenizer(models.BPE(vocab=table, merges=pairs))
            _byte_level(tokenizer, pre_tokenizers, decoders, processors)
            if tokenizer.token_to_id(END_OF_TEXT) is not None:
                tokenizer.add_special_tokens([END_OF_TEXT])
        return cls(tokenizer)

    # ------------------------------------------------------------------ the Tokenizer protocol

    def encode(self, text: str) -> list[int]:
        text = _checked_text(text)
        with _library("encode the text"):
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_array(self, text: str) -> np.ndarray:
        return np.array(self.encode(text), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        with _library("decode token ids"):
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_repr(self, token_id: int) -> str:
        """A printable form of one token: its text quoted (``' the'``), its bytes when they are not
        whole UTF-8 characters (``'\\xe2\\x80'``), a special token as written."""
        token_id = int(token_id)
        with _library("look up a token id"):
            token = self.tokenizer.id_to_token(token_id)
        if token is None:
            return f"<id {token_id} not in the tokenizer>"
        if token_id in self.special_tokens:
            return token
        raw = self._raw_bytes(token)
        if raw is None:
            return repr(token)
        try:
            return repr(raw.decode("utf-8"))
        except UnicodeDecodeError:
            return repr(raw)[1:]

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes one token stands for, or None where the token is not bytes (a special token,
        a token of a tokenizer that is not byte-level, an id it does not know). A byte-level
        token's GPT-2 stand-in characters map back to bytes; a byte-fallback token ``<0xC3>``
        (SentencePiece's) is that byte."""
        token_id = int(token_id)
        if token_id in self.special_tokens:
            return None
        with _library("look up a token id"):
            token = self.tokenizer.id_to_token(token_id)
        return None if token is None else self._raw_bytes(token)

    def _raw_bytes(self, token: str) -> bytes | None:
        fallback = _BYTE_FALLBACK.fullmatch(token)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        alphabet = byte_level_alphabet()
        if not (self.byte_level and all(ch in alphabet for ch in token)):
            return None
        return bytes(alphabet[ch] for ch in token)

    def to_json(self) -> str:
        """The whole tokenizer as ``tokenizer.json`` text."""
        with _library("describe itself"):
            return self.tokenizer.to_str()

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "tokenizer_json": self.to_json()}

    def token_id(self, token: str) -> int | None:
        """The id of a token string (e.g. ``<|endoftext|>``), None when absent."""
        token = _checked_text(token, "the token")
        with _library("look up a token"):
            return self.tokenizer.token_to_id(token)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _read_tokenizer_file(path: str | Path) -> str:
    """The text of a tokenizer file: a regular UTF-8 file of at most MAX_TOKENIZER_BYTES."""
    label = f"tokenizer file {str(path)!r}"
    try:
        data = read_regular(path, MAX_TOKENIZER_BYTES, label)
        return data.decode("utf-8")
    except FileProblem as err:
        raise TokenizerError(str(err)) from None
    except UnicodeDecodeError as err:
        raise TokenizerError(f"cannot read {label}: not UTF-8 (at byte {err.start})") from None


def _byte_level(tokenizer: Any, pre_tokenizers: Any, decoders: Any, processors: Any) -> None:
    """GPT-2's pipeline around a BPE model: its word pattern and byte map, no prefix space."""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)


def train_bpe(
    text: str, vocab_size: int = DEFAULT_BPE_VOCAB_SIZE, min_frequency: int = 2
) -> BPETokenizer:
    """Learn a byte-level BPE of at most ``vocab_size`` tokens on ``text`` (deterministic).

    Ids: 0 is ``<|endoftext|>``, 1 to 256 the byte symbols, then one token per merge in the order
    learned. Merges stop early when no pair occurs ``min_frequency`` times, so a short text can
    give a smaller vocabulary than asked for: read ``vocab_size`` on the result.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ValueError(f"vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size < MIN_BPE_VOCAB_SIZE:
        raise ValueError(
            f"a byte-level BPE needs vocab_size >= {MIN_BPE_VOCAB_SIZE} (256 bytes + "
            f"{END_OF_TEXT}), got {vocab_size}"
        )
    if not isinstance(text, str) or not text:
        raise ValueError("cannot train a BPE tokenizer on empty text")
    _checked_text(text, "the training text")
    tokenizers = import_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    _byte_level(tokenizer, pre_tokenizers, decoders, processors)
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=int(min_frequency),
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with _library("learn merges on the text"):
        tokenizer.train_from_iterator([text], trainer=trainer)
    return BPETokenizer(tokenizer)
