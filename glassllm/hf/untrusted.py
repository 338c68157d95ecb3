"""Reading files that may be hostile: the one error, the bounds a file's values must keep, and
JSON that cannot cost more than reading it.

Every byte of a Hugging Face directory is treated as hostile until checked: a malformed file
raises `HFFormatError` (a ValueError) with every problem found on one line, never another
exception, and nothing is sized from a file before it is checked against these bounds and
against the file's own tensors.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# No GPT-2 file nests deeper than a few levels (tokenizer.json: 5).
MAX_JSON_DEPTH = 64
# config.json (GPT-2's: under 1 KB), model.safetensors.index.json (a line a tensor: tens of KB).
MAX_JSON_BYTES = 4 * 2**20
# tokenizer.json, vocab.json, merges.txt: the largest in use are tens of MB.
MAX_TOKENIZER_BYTES = 256 * 2**20


class HFFormatError(ValueError):
    """A file or directory that is not a Hugging Face GPT-2 glassllm can load, or a model that
    cannot be written as one. ``problems`` lists every problem found; the message joins them on one
    line."""

    def __init__(self, subject: str, problems: Iterable[str]) -> None:
        self.subject = subject
        self.problems = [" ".join(str(p).split()) for p in problems]
        super().__init__(f"{subject}: {'; '.join(self.problems)}")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters; safe for any value a JSON file
    can hold (deep nesting, an integer too long to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return "a huge integer"
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        return "a deeply nested value"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listed(names: Iterable[Any], limit: int = 10) -> str:
    """``names`` joined with commas (each cut to 80 characters), the first ``limit`` of them and
    how many more."""
    names = list(names)
    cut = [n if isinstance(n, str) and len(n) <= 80 else _cut(n) for n in names[:limit]]
    head = ", ".join(cut)
    return head if len(names) <= limit else f"{head} and {len(names) - limit:,} more"


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else shown(value, 80)
    return text if len(text) <= 80 else text[:77] + "..."


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of the file ``path``: UTF-8, at most ``max_bytes``, no key given twice in an
    object, nested at most MAX_JSON_DEPTH deep; anything else raises HFFormatError."""
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            raise HFFormatError(str(path), ["not a regular file"])
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise HFFormatError(str(path), [f"unreadable ({err.strerror or err})"]) from None
    if len(data) > max_bytes:
        raise HFFormatError(str(path), [f"larger than {max_bytes:,} bytes: not a {path.name}"])
    return parse_json(data, str(path))


def parse_json(data: bytes, subject: str) -> Any:
    """`read_json`'s checks on the bytes ``data`` (named ``subject`` in errors)."""
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise HFFormatError(
            subject, [f"unreadable (nested deeper than {MAX_JSON_DEPTH})"]
        ) from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, a key twice, a huge int
        raise HFFormatError(subject, [f"unreadable ({shown(str(err), 200)[1:-1]})"]) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise HFFormatError(subject, [f"unreadable (nested deeper than {MAX_JSON_DEPTH})"])
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"key {shown(twice)} given twice in one object")
    return value


def _depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest
