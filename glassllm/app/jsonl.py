"""The one way a run's JSON-lines files (``log.jsonl``, ``stats.jsonl``) are read.

Training, ``train --resume``, the plot and the viewer all read them through `read_json_lines`
(`glassllm.app.run_log.read_log` and `glassllm.app.stats.read_stats` add each file's record
check). The rule for a bad line is one: **skipped and counted**. A line is bad when it is longer
than `MAX_LINE_BYTES`, is not UTF-8, is not strict JSON (`glassllm._text.parse_json`: no NaN or
Infinity, no key twice, nested at most 64 deep), or is not a record of its file. Skipping rather
than refusing, because the files are appended by a live run and cut by a kill: the line a
crash half wrote is expected, and ``--resume`` must drop it, not stop on it; refusing the file
would also blind the viewer for the rest of a run over one line. Counting, because a skipped
line is still news: the viewer's ``/api/log`` answers the count and the first reasons
(``skipped``), and the terminal (resume, plot) gets one warning line with the line numbers.

The file itself is read as every file is (`glassllm._files`): a regular file only, never waiting
on a FIFO, each line read with a bound (a longer one is skipped without being held in memory),
at most `MAX_FILE_BYTES` in all. A file that cannot be read raises `glassllm._files.FileProblem`.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> with open(path, "wb") as f:
...     _ = f.write(b'{"iter": 0}\\n{"iter": 1, \\n[[[[\\n\\xff\\n{"iter": 2}\\n')
>>> lines = read_json_lines(path, lambda v: None if isinstance(v, dict) else "not an object")
>>> [line.value["iter"] for line in lines.records], lines.skipped, lines.reasons[1]
([0, 2], 3, 'line 3: not JSON (Expecting value: line 1 column 5 (char 4))')
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from glassllm._files import open_regular
from glassllm._text import parse_json, shown
from glassllm.app.config import MAX_STEPS

# The longest line read (a stats.jsonl line with histograms of a GPT-2-sized model: ~100 KB).
MAX_LINE_BYTES = 4 << 20
# The most read of one file; the rest is counted as one skipped part.
MAX_FILE_BYTES = 1 << 30
# Reasons kept for the answer and the warning (the count counts all).
REASONS_KEPT = 3


@dataclasses.dataclass(frozen=True)
class Line:
    """A good line: its ``number`` (from 1), its ``text`` as written (no newline), its ``value``."""

    number: int
    text: str
    value: Any


@dataclasses.dataclass
class JsonLines:
    """The good lines of a file in order, and the bad ones: how many, and the first reasons."""

    records: list[Line] = dataclasses.field(default_factory=list)
    skipped: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)

    def skip(self, number: int, reason: str) -> None:
        self.skipped += 1
        if len(self.reasons) < REASONS_KEPT:
            self.reasons.append(f"line {number}: {reason}")

    def warning(self, name: str) -> str | None:
        """One line for the terminal about the skipped lines, None when none was."""
        if not self.skipped:
            return None
        more = "; ..." if self.skipped > len(self.reasons) else ""
        plural = "s" if self.skipped != 1 else ""
        return (
            f"{name}: {self.skipped} unreadable line{plural} skipped "
            f"({'; '.join(self.reasons)}{more})"
        )


def print_warning(message: str) -> None:
    """``message`` as one ``glassllm: warning:`` line on stderr (a skipped line is said once)."""
    print(f"glassllm: warning: {message}", file=sys.stderr, flush=True)


def read_json_lines(
    path: str | os.PathLike[str],
    check: Callable[[Any], str | None],
    live: bool = False,
    label: str | None = None,
) -> JsonLines:
    """The lines of ``path`` whose JSON value ``check`` accepts (returns None; else the reason it
    is not a record). A missing file has no lines. ``live``: a run may be writing the last line
    right now, so a last line without its newline that is not (yet) a record is left out
    without being counted. ``label``: the file in messages (default: the path)."""
    label = label or repr(os.fspath(path))
    result = JsonLines()
    if not os.path.lexists(path):
        return result
    with open_regular(path, label) as handle:
        number, total = 0, 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            number += 1
            total += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                total += _skip_rest_of_line(handle)
                result.skip(number, f"longer than {MAX_LINE_BYTES:,} bytes")
            elif raw.strip():
                ended = raw.endswith(b"\n")
                reason, line = _record(raw, number, check)
                if line is not None:
                    result.records.append(line)
                elif not (live and not ended):
                    result.skip(number, reason if ended else f"{reason}, and cut short")
            if total > MAX_FILE_BYTES:
                if handle.read(1):
                    result.skip(number + 1, f"the file goes on past {MAX_FILE_BYTES:,} bytes")
                break
    return result


def _skip_rest_of_line(handle: Any) -> int:
    """Read past the end of an overlong line, a bounded piece at a time; the bytes read."""
    skipped = 0
    while True:
        piece = handle.readline(1 << 20)
        skipped += len(piece)
        if not piece or piece.endswith(b"\n") or skipped > MAX_FILE_BYTES:
            return skipped


def integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_or_null(value: Any) -> bool:
    return value is None or number(value)


def record_problem(
    value: Any, fields: Mapping[str, tuple[Callable[[Any], bool], str]]
) -> str | None:
    """Why ``value`` is not a record of a run's JSON-lines file, or None: a JSON object whose
    ``iter`` is a step count, and whose each key of ``fields`` present passes its test
    (``{key: (test, "what it must be")}``). Keys not in ``fields`` are let through (a later
    version's); a key of ``fields`` may be absent (an older version's, or a test's)."""
    if not isinstance(value, dict):
        return "not a JSON object"
    iteration = value.get("iter")
    if not integer(iteration) or not 0 <= iteration <= MAX_STEPS:
        return f"its iter {shown(iteration, 40)} is not a step count"
    for key, (test, what) in fields.items():
        if key in value and not test(value[key]):
            return f"its {key} {shown(value[key], 40)} is not {what}"
    return None


def _record(raw: bytes, number: int, check: Callable[[Any], str | None]) -> tuple[str, Line | None]:
    text = raw.rstrip(b"\r\n")
    try:
        value = parse_json(text)
    except ValueError as err:
        return f"not JSON ({shown(str(err), 80)[1:-1]})", None
    problem = check(value)
    if problem is not None:
        return problem, None
    return "", Line(number, text.decode("utf-8"), value)
