"""Tokenizers: text <-> integer ids.

Three tokenizers:

- :class:`CharTokenizer`: one id per distinct character of the training text, in sorted order
  (nanoGPT's shakespeare_char). Small vocabulary, so a tiny model learns fast; it can only encode
  characters it saw.
- :class:`ByteTokenizer`: one id per UTF-8 byte (256 symbols). Encodes any text; a character
  outside ASCII costs several tokens, and a sample cut inside a character decodes to U+FFFD.
- :class:`BPETokenizer`: byte-level byte-pair encoding (GPT-2's scheme) run by the Hugging Face
  ``tokenizers`` library, the optional ``hf`` extra (``pip install -e '.[hf]'`` in the checkout),
  imported only when a BPE tokenizer is built. Trained on a text with :func:`train_bpe`, or read
  from a Hugging Face ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``.

The vocabulary travels inside the checkpoint: ``to_dict()`` gives a JSON-serialisable dict and
:func:`tokenizer_from_dict` rebuilds the tokenizer from it, so sampling needs only the checkpoint
(a BPE tokenizer stores its whole ``tokenizer.json`` text there).

>>> tok = CharTokenizer.from_text("hello world")
>>> tok.vocab_size
8
>>> tok.encode("hello")
[3, 2, 4, 4, 5]
>>> tok.decode(tok.encode("hello"))
'hello'
>>> tokenizer_from_dict(tok.to_dict()).encode("low")
[4, 5, 7]
>>> ByteTokenizer().encode("é")
[195, 169]
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from glassllm._text import utf8_problem
from glassllm.data.bpe import DEFAULT_BPE_VOCAB_SIZE, BPETokenizer, train_bpe


class Tokenizer(Protocol):
    """What the training loop and sampler need from a tokenizer."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_repr(self, token_id: int) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class UnknownCharacterError(ValueError):
    """A character that is not in a :class:`CharTokenizer`'s vocabulary."""


_ENCODE_CHUNK = 1 << 20  # characters per step of CharTokenizer.encode_array


class CharTokenizer:
    """Character-level tokenizer: id ``i`` is the ``i``-th character of the sorted vocabulary."""

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        chars = list(chars)
        if not chars:
            raise ValueError("a CharTokenizer needs at least one character")
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"vocabulary entries must be single characters, got {ch!r}")
        if len(set(chars)) != len(chars):
            raise ValueError("vocabulary characters must be distinct")
        self.chars: list[str] = chars
        self.stoi: dict[str, int] = {ch: i for i, ch in enumerate(chars)}
        self.vocab_size: int = len(chars)
        # For encode_array: the vocabulary's code points sorted, and the id of each.
        codes = np.array([ord(ch) for ch in chars], dtype=np.uint32)
        self._ids_by_code = np.argsort(codes, kind="stable").astype(np.int64)
        self._sorted_codes = codes[self._ids_by_code]

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Vocabulary = sorted set of the characters of ``text`` (as nanoGPT's prepare.py)."""
        if not text:
            raise ValueError("cannot build a character vocabulary from empty text")
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``; a character outside the vocabulary is an error."""
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError:
            position, ch = next((i, c) for i, c in enumerate(text) if c not in self.stoi)
            raise UnknownCharacterError(
                f"character {ch!r} (U+{ord(ch):04X}) at position {position} is not in the "
                f"vocabulary of {self.vocab_size} characters this tokenizer was built from"
            ) from None

    def encode_array(self, text: str) -> np.ndarray:
        """:meth:`encode` as a 1-D int64 array (what the batch sampler indexes).

        Vectorised, a chunk of characters at a time: the code points are looked up in the
        sorted vocabulary, so the only array as long as the text is the result (8 bytes a
        character), not a Python list beside it.
        """
        ids = np.empty(len(text), dtype=np.int64)
        last = len(self._sorted_codes) - 1
        for start in range(0, len(text), _ENCODE_CHUNK):
            piece = text[start : start + _ENCODE_CHUNK]
            # surrogatepass: a lone surrogate is a character like any other (it may be in the
            # vocabulary), not an encoding error.
            codes = np.frombuffer(piece.encode("utf-32-le", "surrogatepass"), dtype="<u4")
            where = np.minimum(np.searchsorted(self._sorted_codes, codes), last)
            if not np.array_equal(self._sorted_codes[where], codes):
                self.encode(text)  # raises UnknownCharacterError naming the first unknown one
            ids[start : start + len(piece)] = self._ids_by_code[where]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        chars = self.chars
        return "".join(chars[int(i)] for i in ids)

    def token_repr(self, token_id: int) -> str:
        """A printable form of one token: its character, quoted and escaped (``'\\n'``)."""
        return repr(self.chars[int(token_id)])

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "chars": "".join(self.chars)}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _utf8(text: str) -> bytes:
    """The UTF-8 bytes of ``text``; a lone surrogate (a byte of a command line argument that was
    not UTF-8) is a ValueError saying where, not the codec's message."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the text cannot be encoded: {utf8_problem(text)}") from None


class ByteTokenizer:
    """Byte-level tokenizer: the UTF-8 bytes of the text, 256 symbols, any text at all."""

    kind = "byte"
    vocab_size: int = 256

    def encode(self, text: str) -> list[int]:
        return list(_utf8(text))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(_utf8(text), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        # A sample may stop (or go wrong) inside a multi-byte character: show U+FFFD, not a crash.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_repr(self, token_id: int) -> str:
        """Printable ASCII bytes as their character (``'a'``), others as escapes (``'\\xe2'``)."""
        return repr(bytes([int(token_id)]))[1:]

    def token_bytes(self, token_id: int) -> bytes:
        """The one byte a token is."""
        return bytes([int(token_id)])

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind}

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


def bits_per_character(loss: float, characters_per_token: float) -> float:
    """A cross-entropy in nats per token as bits per character of text:
    ``loss / ln 2 / characters_per_token`` (see `characters_per_token`)."""
    return float(loss) / math.log(2.0) / float(characters_per_token)


def characters_per_token(tokenizer: Tokenizer, ids: Iterable[int] | np.ndarray) -> float:
    """How many characters of text the tokens ``ids`` stand for, per token.

    A loss in nats per token divided by ``ln(2) * characters_per_token`` is in bits per character,
    which compares models whatever their tokenizers (1 for a char tokenizer, about 2 for a BPE of
    512 tokens on English).
    """
    ids = np.asarray(ids)
    if ids.size == 0:
        raise ValueError("characters_per_token needs at least one token")
    return len(tokenizer.decode(ids.tolist())) / ids.size


# The kinds build_tokenizer builds (and `glassllm train --tokenizer` offers).
TOKENIZER_KINDS = ("char", "byte", "bpe")
_BUILDABLE = TOKENIZER_KINDS


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer named ``kind`` ("char", "byte" or "bpe"), fitted to ``text`` where that
    applies. ``vocab_size`` is the BPE's size (default 512, at least 257) and is for "bpe" only."""
    if kind not in _BUILDABLE:
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(_BUILDABLE)}")
    if kind == "bpe":
        return train_bpe(text, DEFAULT_BPE_VOCAB_SIZE if vocab_size is None else vocab_size)
    if vocab_size is not None:
        raise ValueError(f"a vocabulary size is for the 'bpe' tokenizer only, not {kind!r}")
    if kind == "char":
        return CharTokenizer.from_text(text)
    return ByteTokenizer()


def tokenizer_from_dict(spec: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`to_dict` output (e.g. a checkpoint's metadata)."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"a tokenizer description must be a dict with a 'type', got {spec!r}")
    kind = spec["type"]
    if kind == "char":
        chars = spec.get("chars")
        if not isinstance(chars, str):
            raise ValueError("a 'char' tokenizer description needs its 'chars' string")
        return CharTokenizer(chars)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        text = spec.get("tokenizer_json")
        if not isinstance(text, str):
            raise ValueError("a 'bpe' tokenizer description needs its 'tokenizer_json' string")
        return BPETokenizer.from_json(text)
    raise ValueError(f"unknown tokenizer type {kind!r}; known: {', '.join(_BUILDABLE)}")


def _hex_bytes(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: bytes that are not UTF-8 shown as ``<0xNN>`` each."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(f"<0x{b:02X}>" for b in bad), error.end


codecs.register_error("glassllm.hex_bytes", _hex_bytes)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token's text for display. A byte-level token that holds part of a UTF-8 character
    (byte-level BPE splits characters; a byte tokenizer always does) shows its bytes as
    ``<0xC3>``, never U+FFFD, which would make different tokens look alike; a whole character
    and any other token show as ``decode`` gives them.

    >>> token_text(ByteTokenizer(), 0xC3), token_text(ByteTokenizer(), ord("a"))
    ('<0xC3>', 'a')
    """
    raw = getattr(tokenizer, "token_bytes", lambda _: None)(token_id)
    if raw is None:
        return tokenizer.decode([token_id])
    return raw.decode("utf-8", errors="glassllm.hex_bytes")
