"""glassllm._text: strict JSON (finite numbers only) and text that UTF-8 can encode."""

import pytest

from glassllm._text import MAX_JSON_DEPTH, parse_json, utf8_problem


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("[NaN]", "NaN is not a JSON number"),
        ('{"a": Infinity}', "Infinity is not a JSON number"),
        ("[-Infinity]", "-Infinity is not a JSON number"),
        ("[1e999]", "1e999 does not fit a float"),
        ("[" + "9" * 5000 + "]", "integer"),
        ("[" * 100_000 + "]" * 100_000, f"nested deeper than {MAX_JSON_DEPTH}"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper"),
        (b'"\xff"', "utf-8"),
        ('{"a": 1, "a": 2}', "given twice"),
    ],
)
def test_parse_json_refuses_what_json_does_not_have_in_one_short_line(data, fragment):
    with pytest.raises(ValueError) as info:
        parse_json(data)
    message = str(info.value)
    assert fragment in message and "\n" not in message and len(message) <= 220, message


def test_parse_json_keeps_ordinary_values():
    assert parse_json(b'{"a": [1, 2.5e-3, -0.0, null, true, "\\u00e9"]}') == {
        "a": [1, 2.5e-3, -0.0, None, True, "é"]
    }
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)


def test_utf8_problem_names_the_byte_or_the_surrogate():
    assert utf8_problem("plain é and 日本") is None
    assert utf8_problem("ab\udcff") == "it is not valid UTF-8 (byte 0xff at character 2)"
    assert "lone surrogate U+D800 at character 0" in utf8_problem("\ud800x")
