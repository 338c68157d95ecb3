"""The documents of a corpus given as many files: what ``glassllm prepare --data PATH...`` reads.

A path is a file, a directory (searched recursively, in sorted order, for ``.txt``, ``.md``,
``.jsonl`` and ``.json`` files; other files are not looked at) or ``-``, standard input. A
``.txt`` or ``.md`` file, and standard input, is one document; a ``.jsonl`` or ``.json`` file is
one JSON object per line, its document the string under the text field (``--text-field``,
default ``text``), blank lines skipped (the format of OpenWebText and most Hugging Face dumps).

Every file is untrusted (`glassllm._files`): a regular file only, at most `max_corpus_bytes`
each, UTF-8 without NUL bytes. A file that breaks a rule is a :class:`BadSource` naming the file
(and the line, for JSON lines) in one line; ``--skip-bad-files`` counts those instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

from glassllm.data.corpus import DataError, max_corpus_bytes, read_text_file

TEXT_SUFFIXES = (".txt", ".md")
JSON_LINES_SUFFIXES = (".jsonl", ".json")
STDIN = "-"


class BadSource(DataError):
    """One source file that cannot be read as documents (the message names it and why)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A file of the corpus (``path`` as found; ``-`` for standard input)."""

    path: str

    @property
    def json_lines(self) -> bool:
        return self.path.lower().endswith(JSON_LINES_SUFFIXES)


def find_sources(paths: list[str]) -> list[Source]:
    """The files named by ``paths`` in order, each directory's files sorted (so the same tree
    gives the same corpus on any machine); DataError for a path that does not exist, or when no
    file at all is found."""
    found: list[Source] = []
    for given in paths:
        if given == STDIN:
            found.append(Source(STDIN))
        elif os.path.isdir(given):
            for root, dirs, files in os.walk(given):
                dirs.sort()
                found.extend(
                    Source(os.path.join(root, name))
                    for name in sorted(files)
                    if name.lower().endswith(TEXT_SUFFIXES + JSON_LINES_SUFFIXES)
                )
        elif os.path.lexists(given):
            found.append(Source(given))
        else:
            raise DataError(f"data path {given!r} not found")
    if not found:
        raise DataError(
            f"no corpus files under {', '.join(map(repr, paths))} (looked for "
            f"{', '.join(TEXT_SUFFIXES + JSON_LINES_SUFFIXES)} files)"
        )
    return found


@dataclasses.dataclass
class SourceDocuments:
    """What one file holds: its documents, and its size and digest for the manifest."""

    documents: list[str]
    size: int
    sha256: str


def read_documents(source: Source, text_field: str = "text") -> SourceDocuments:
    """The documents of ``source``; :class:`BadSource` (one line) when it breaks a rule."""
    try:
        if source.path == STDIN:
            raw = sys.stdin.buffer.read(max_corpus_bytes() + 1)
            if len(raw) > max_corpus_bytes():
                raise DataError(f"standard input is over the limit of {max_corpus_bytes():,} bytes")
            text = _decoded(raw, "standard input")
        else:
            text = read_text_file(source.path)
            raw = None
    except DataError as err:
        raise BadSource(str(err)) from None
    data = raw if raw is not None else text.encode("utf-8")
    documents = _json_documents(source.path, text, text_field) if source.json_lines else [text]
    return SourceDocuments(documents, len(data), hashlib.sha256(data).hexdigest())


def _decoded(raw: bytes, name: str) -> str:
    if not raw:
        raise DataError(f"{name} is empty")
    if b"\0" in raw:
        raise DataError(f"{name} is binary, not text (a NUL byte at offset {raw.find(0)})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{name} is not UTF-8 text (offset {err.start})") from None


def _json_documents(path: str, text: str, field: str) -> list[str]:
    documents = []
    # why: split at "\n" only: str.splitlines also splits at U+2028 and U+2029, which a JSON
    # string may hold as they are (json.dumps(..., ensure_ascii=False) writes them so)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise BadSource(f"{path!r} line {number} is not JSON ({err})") from None
        value = record.get(field) if isinstance(record, dict) else None
        if not isinstance(value, str):
            raise BadSource(
                f"{path!r} line {number} has no string field {field!r} (choose it with "
                "--text-field)"
            )
        if value:
            documents.append(value)
    return documents


def display_name(source: Source) -> str:
    """How the manifest names a source: its path as given (``-`` for standard input)."""
    return source.path if source.path == STDIN else str(Path(source.path))
