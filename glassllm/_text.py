"""Values from outside (a file, a request, an argument) turned into text, and text into values,
at no more cost than reading them: `shown` and `listed` for error messages, `parse_json` for
JSON that may be hostile, `finite_for_json` for JSON written out (which has no NaN or infinity).

>>> shown(10**400)
'100000000000000000...0000000000000000000'
>>> shown([[[[[[[[1]]]]]]]])
'a deeply nested value'
>>> listed(["a", "b", "c"], limit=2)
'a, b and 1 more'
>>> finite_for_json([1.0, float("nan")]), finite_for_json(float("-inf"), spelled=True)
([1.0, None], '-inf')
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Iterable
from typing import Any

# No file glassllm reads nests deeper than a few levels (a tokenizer.json: 5).
MAX_JSON_DEPTH = 64
_CONTAINERS = (list, tuple, dict, set, frozenset)


class _TooDeep(Exception):
    pass


class _ShortRepr(reprlib.Repr):
    """reprlib's bounded repr (a few items of a list, the ends of a long number or text), which
    gives up on a value nested more than ``maxlevel`` deep rather than printing ``[[...]]``."""

    def repr1(self, x: Any, level: int) -> str:
        if level <= 0 and isinstance(x, _CONTAINERS) and len(x):
            raise _TooDeep
        return super().repr1(x, level)

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 14_000:  # over ~4200 digits: Python refuses to print 4300
            return "a huge integer"
        return super().repr_int(x, level)


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters whatever ``value`` holds: the
    first items of a long list, the ends of a long text or of an integer of hundreds of digits
    ("a huge integer" beyond Python's printing limit), "a deeply nested value" for one nested
    more than 6 deep (a JSON file can hold a list nested 10^5 deep)."""
    short = _ShortRepr()
    short.maxlevel, short.maxlong = 6, 40
    short.maxstring = short.maxother = max(limit, 8)
    try:
        text = short.repr(value)
    except (_TooDeep, RecursionError):
        return "a deeply nested value"
    except ValueError:  # an int subclass too long to print
        return "a huge integer"
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


# ---------------------------------------------------------------------------------- text

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_problem(text: str) -> str | None:
    r"""Why ``text`` is not text UTF-8 can encode, or None. Python keeps the bytes of a command
    line argument that are not UTF-8 as lone surrogates U+DC80..U+DCFF (``surrogateescape``) and
    a JSON string may spell any surrogate as ``\udXXX``; neither is a character.

    >>> utf8_problem("caf\xe9"), utf8_problem("caf\udce9")
    (None, 'it is not valid UTF-8 (byte 0xe9 at character 3)')
    """
    found = _SURROGATE.search(text)
    if found is None:
        return None
    code, at = ord(found.group()), found.start()
    if 0xDC80 <= code <= 0xDCFF:
        return f"it is not valid UTF-8 (byte 0x{code - 0xDC00:02x} at character {at})"
    return f"it holds a lone surrogate U+{code:04X} at character {at}, which is not a character"


# ---------------------------------------------------------------------------------- JSON


def parse_json(data: bytes | str) -> Any:
    """The JSON value of ``data``: UTF-8, no key given twice in an object, nested at most
    MAX_JSON_DEPTH deep, numbers only finite ones (no ``NaN`` or ``Infinity``, which JSON does not
    have, and no ``1e999``, which overflows a float). Anything else raises ValueError whose
    message says what, in words fit for a user (at most about 200 characters).

    >>> parse_json(b'{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> parse_json("[NaN]")
    Traceback (most recent call last):
    ValueError: NaN is not a JSON number
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_not_a_number,
            parse_float=_finite_float,
        )
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, a key twice, a huge int
        raise ValueError(shown(str(err), 200)[1:-1]) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
    return value


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {shown(text, 40)[1:-1]} does not fit a float")
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


def finite_for_json(value: Any, spelled: bool = False) -> Any:
    """``value`` with every NaN and infinity (in lists, tuples and dicts too) replaced by None,
    or with ``spelled`` by its name ``"nan"``, ``"inf"`` or ``"-inf"``: JSON has neither."""
    if isinstance(value, float) and not math.isfinite(value):
        if not spelled:
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: finite_for_json(item, spelled) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_for_json(item, spelled) for item in value]
    return value
