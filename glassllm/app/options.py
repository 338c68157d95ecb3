"""Configuration dataclasses as command-line options: one field, one option, one set of rules.

A field made with `option` carries its help text and its rules in ``field.metadata``: a range
(``min``/``max`` inclusive, ``above``/``below`` exclusive), ``choices``, and for text, the
message when it is empty (``if_empty``). The same rules serve three readers:

* `add_options` builds the argparse options (``n_layer`` -> ``--n-layer``, parsed with the
  field's type, range and default shown by ``--help``);
* `field_problems` checks an instance, whatever built it: the command line, Python code, or a
  checkpoint's metadata (so a restored value obeys exactly the rules of a typed one);
* `describe_range` words a range the same way in ``--help`` and in error messages.

Fields of type ``int``, ``float``, ``str``, ``bool`` and ``X | None`` are supported. An ``int``
field takes an int (not a bool); a ``float`` field an int or a float, finite.

>>> import dataclasses
>>> @dataclasses.dataclass
... class Toy:
...     steps: int = option(10, "training steps", min=1)
...     rate: float = option(0.5, "a rate", min=0.0, below=1.0)
>>> field_problems(Toy(steps=0, rate=1.0))
['steps must be at least 1, got 0', 'rate must be in [0, 1), got 1.0']
>>> field_problems(Toy(steps="x"))
["steps must be an integer, got 'x'"]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from glassllm._text import shown

# Metadata keys that state a rule (the rest, "help" and "metavar", only describe).
RULE_KEYS = ("min", "max", "above", "below", "choices", "if_empty", "note")


def option(default: Any, help: str, **rules: Any) -> Any:
    """A dataclass field that is a command-line option: its default, help and rules.

    rules: ``min``, ``max`` (inclusive), ``above``, ``below`` (exclusive), ``choices`` (a tuple),
    ``if_empty`` (the message for an empty text), ``note`` (words added after the range in a
    message, e.g. "(0 turns clipping off)"), ``metavar`` (how ``--help`` names the value).
    """
    unknown = sorted(set(rules) - set(RULE_KEYS) - {"metavar"})
    if unknown:
        raise TypeError(f"option() got unknown rules {unknown}")
    return dataclasses.field(default=default, metadata={"help": help, **rules})


# ---------------------------------------------------------------------------------- types


def field_type(annotation: Any) -> tuple[type, bool]:
    """``(scalar type, whether None is allowed)`` of a field's annotation: ``int | None`` ->
    ``(int, True)``. Raises TypeError for an annotation no option can parse."""
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            annotation = args[0]
    if annotation in (int, float, str, bool):
        return annotation, optional
    raise TypeError(f"no command-line option for a field of type {annotation!r}")


def option_fields(
    config_class: type, scalars_only: bool = False
) -> list[tuple[dataclasses.Field, type, bool]]:
    """Every field of ``config_class`` with its scalar type and optionality. A field of another
    type raises TypeError, or with ``scalars_only`` is left out (its owner checks it)."""
    hints = typing.get_type_hints(config_class)
    fields = []
    for field in dataclasses.fields(config_class):
        try:
            fields.append((field, *field_type(hints[field.name])))
        except TypeError:
            if not scalars_only:
                raise
    return fields


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a text", bool: "true or false"}


def _type_problem(value: Any, kind: type, optional: bool) -> str | None:
    """What is wrong with the type of ``value``, or None."""
    if value is None:
        return None if optional else f"must be {_TYPE_WORDS[kind]}, got None"
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                ok = math.isfinite(value)
            except OverflowError:  # an int beyond float's range
                ok = False
            if not ok:
                return f"must be a finite number, got {shown(value)}"
    else:
        ok = isinstance(value, kind)
    if ok:
        return None
    return f"must be {_TYPE_WORDS[kind]}{' or null' if optional else ''}, got {shown(value)}"


# ---------------------------------------------------------------------------------- ranges


def _number(bound: float) -> str:
    """A bound as written in messages: 1 not 1.0, 1e-06 as Python prints it."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def describe_range(rules: dict[str, Any]) -> str | None:
    """A field's range in words ("at least 1", ">= 0", "> 0", "in [0, 1)"), or None."""
    low, low_open = (rules["above"], True) if "above" in rules else (rules.get("min"), False)
    high, high_open = (rules["below"], True) if "below" in rules else (rules.get("max"), False)
    if low is not None and high is not None:
        return (
            f"in {'(' if low_open else '['}{_number(low)}, {_number(high)}"
            f"{')' if high_open else ']'}"
        )
    if low is not None:
        if low_open:
            return f"> {_number(low)}"
        return ">= 0" if low == 0 else f"at least {_number(low)}"
    if high is not None:
        return f"< {_number(high)}" if high_open else f"at most {_number(high)}"
    if rules.get("choices"):
        return "one of " + ", ".join(rules["choices"])
    return None


def _in_range(value: Any, rules: dict[str, Any]) -> bool:
    if "min" in rules and not value >= rules["min"]:
        return False
    if "above" in rules and not value > rules["above"]:
        return False
    if "max" in rules and not value <= rules["max"]:
        return False
    if "below" in rules and not value < rules["below"]:
        return False
    return not (rules.get("choices") and value not in rules["choices"])


# ---------------------------------------------------------------------------------- checks


def field_problems(config: Any, label: Callable[[str], str] = str) -> list[str]:
    """Every field of the dataclass instance ``config`` that breaks its type or rules, one
    message each ("n_layer must be at least 1, got 0"). ``label`` names a field in messages.

    A field of the wrong type gets a type message and no range check, so a caller may check
    relations between fields only when this returns no type problems (see `type_problems`).
    Fields of other than the scalar types (a nested dataclass) are left to their owner.
    """
    problems = []
    for field, kind, optional in option_fields(type(config), scalars_only=True):
        value = getattr(config, field.name)
        name = label(field.name)
        wrong_type = _type_problem(value, kind, optional)
        if wrong_type is not None:
            problems.append(f"{name} {wrong_type}")
            continue
        rules = field.metadata
        if value is None:
            continue
        if kind is str and not value and "if_empty" in rules:
            problems.append(rules["if_empty"])
        elif kind is not bool and not _in_range(value, rules):
            problems.append(
                f"{name} must be {describe_range(rules)}{rules.get('note', '')}, got {shown(value)}"
            )
    return problems


def type_problems(config: Any) -> list[str]:
    """The fields of ``config`` whose value has the wrong type (names only)."""
    return [
        field.name
        for field, kind, optional in option_fields(type(config), scalars_only=True)
        if _type_problem(getattr(config, field.name), kind, optional) is not None
    ]


# ---------------------------------------------------------------------------------- argparse


def parse_float(text: str) -> float:
    """float() that refuses nan and inf, which no option here can use."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


parse_float.__name__ = "float"  # argparse names the type in its message: "invalid float value"

# How an option's value is shown in --help, by type (a field's metadata may say otherwise).
_METAVARS = {int: "N", float: "X", str: "TEXT"}


def _help(field: dataclasses.Field, default: Any) -> str:
    """The field's help, then its range and default: "transformer blocks (at least 1; default:
    4)". A help that names its own default keeps it."""
    text = field.metadata.get("help", "")
    words = describe_range(field.metadata)
    if field.metadata.get("choices"):  # argparse lists them
        words = None
    if "(default:" in text:
        if words is not None:
            text = text.replace("(default:", f"({words}; default:")
        return text
    return f"{text} ({'' if words is None else words + '; '}default: {default})"


def add_options(parser: argparse.ArgumentParser, config_class: type) -> None:
    """One option per field of ``config_class``, defaulting to "not given" (absent from the
    namespace), so a caller can tell the options the user set (a resumed run keeps the rest)."""
    defaults = config_class()
    for field, kind, _ in option_fields(config_class):
        flag = "--" + field.name.replace("_", "-")
        help_text = _help(field, getattr(defaults, field.name))
        if kind is bool:
            parser.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        choices = field.metadata.get("choices")
        metavar = "{" + ",".join(choices) + "}" if choices else _METAVARS[kind]
        parser.add_argument(
            flag,
            dest=field.name,
            type=parse_float if kind is float else kind,
            default=argparse.SUPPRESS,
            choices=choices,
            metavar=field.metadata.get("metavar", metavar),
            help=help_text,
        )


def given_options(args: argparse.Namespace, config_class: type) -> dict[str, Any]:
    """The fields of ``config_class`` that the command line set, by name."""
    fields = dataclasses.fields(config_class)
    return {f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)}
