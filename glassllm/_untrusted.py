"""Reading files that may be hostile (the Hugging Face loaders', the chat template's): the one
error, the bounds a file's values must keep, and JSON that cannot cost more than reading it
(`glassllm._text.parse_json`, here as HFFormatError). `glassllm.hf.untrusted` re-exports it all.

Every byte of a Hugging Face directory is treated as hostile until checked: a malformed file
raises `HFFormatError` (a ValueError) with every problem found on one line, never another
exception, and nothing is sized from a file before it is checked against these bounds and
against the file's own tensors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from glassllm._files import FileProblem, read_regular
from glassllm._text import MAX_JSON_DEPTH, listed, shown
from glassllm._text import parse_json as _parse_json
from glassllm.data.bpe import MAX_TOKENIZER_BYTES

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_TOKENIZER_BYTES",
    "HFFormatError",
    "listed",
    "parse_json",
    "read_json",
    "shown",
]

# config.json (GPT-2's: under 1 KB), model.safetensors.index.json (a line a tensor: tens of KB).
MAX_JSON_BYTES = 4 * 2**20
# tokenizer.json, vocab.json, merges.txt: MAX_TOKENIZER_BYTES (glassllm.data.bpe, which reads them).


class HFFormatError(ValueError):
    """A file or directory that is not a Hugging Face GPT-2 glassllm can load, or a model that
    cannot be written as one. ``problems`` lists every problem found; the message joins them on one
    line."""

    def __init__(self, subject: str, problems: Iterable[str]) -> None:
        self.subject = subject
        self.problems = [" ".join(str(p).split()) for p in problems]
        super().__init__(f"{subject}: {'; '.join(self.problems)}")


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of the file ``path``: UTF-8, at most ``max_bytes``, no key given twice in an
    object, nested at most MAX_JSON_DEPTH deep; anything else raises HFFormatError."""
    path = Path(path)
    try:  # a FIFO would block, a device never end: regular files only (glassllm._files)
        data = read_regular(path, max_bytes, str(path))
    except FileProblem as err:
        if "limit" in err.problem:
            raise HFFormatError(
                str(path), [f"larger than {max_bytes:,} bytes: not a {path.name}"]
            ) from None
        raise HFFormatError(str(path), [err.problem.removeprefix("is ")]) from None
    return parse_json(data, str(path))


def parse_json(data: bytes, subject: str) -> Any:
    """`read_json`'s checks on the bytes ``data`` (named ``subject`` in errors)."""
    try:
        return _parse_json(data)
    except ValueError as err:
        raise HFFormatError(subject, [f"unreadable ({err})"]) from None
