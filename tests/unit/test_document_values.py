"""A graph document holds JSON values only (docs/security.md, "YAML graph documents"). The review
found an integer of over 4,300 digits escaping as a raw ValueError (Python's int_max_str_digits),
and `!!binary`, `!!set` and timestamps decoding to bytes, sets and datetimes that the journal's JSON
cannot hold. Each is refused with a GraphError naming it, through the planner's own entry."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from pal.core.document_text import MAX_INT_DIGITS
from pal.errors import GraphError
from pal.plan.documents import load_graph_text
from pal.plan.programs import parse_plan


def graph_yaml(value: str) -> str:
    """A valid graph whose tool node passes `value`, written as YAML, as an argument."""
    return ("nodes:\n  - {id: t, type: trigger}\n  - id: a\n    type: tool\n"
            f"    data:\n      tool: echo\n      args:\n        x: {value}\n"
            "edges:\n  - {source: t, target: a}\n")


def refusal(text: str) -> str:
    with pytest.raises(GraphError) as info:
        parse_plan(text, known_tools=frozenset({"echo"}), max_bytes=1_000_000)
    [problem] = info.value.problems
    return problem


@pytest.mark.parametrize(("value", "fragment"), [
    pytest.param("1" * (MAX_INT_DIGITS + 1), "an integer of more than 4300 digits", id="long-decimal"),
    pytest.param("-" + "9" * 100_000, "an integer of more than 4300 digits", id="very-long-negative"),
    pytest.param("1_" * 4400 + "1", "an integer of more than 4300 digits", id="underscored"),
    pytest.param("0x" + "f" * 3600, "an integer of more than 4300 digits", id="hex-past-4300-decimal-digits"),
    pytest.param("!!int " + "7" * 5000, "an integer of more than 4300 digits", id="tagged-int"),
    pytest.param("!!binary aGVsbG8=", "!!binary value (bytes)", id="binary"),
    pytest.param("!!set {a, b}", "!!set", id="set"),
    pytest.param("!!omap [{a: 1}]", "!!omap", id="omap"),
    pytest.param("!!pairs [{a: 1}]", "!!pairs", id="pairs"),
    pytest.param("2024-01-01", "a date or time", id="date"),
    pytest.param("2001-12-14t21:59:43.10-05:00", "a date or time", id="datetime"),
    pytest.param("2001-12-14 21:59:43.10", "a date or time", id="spaced-datetime"),
    pytest.param("!!timestamp 2024-01-01", "a date or time", id="tagged-timestamp"),
    pytest.param("{2024-01-01: due}", "a date or time", id="timestamp-as-a-key"),
    pytest.param(".inf", "'.inf', which is not a JSON number", id="infinity"),
    pytest.param("-.Inf", "which is not a JSON number", id="negative-infinity"),
    pytest.param(".nan", "'.nan', which is not a JSON number", id="nan"),
])
def test_a_yaml_value_json_cannot_hold_is_refused(value: str, fragment: str) -> None:
    problem = refusal(graph_yaml(value))
    assert fragment in problem and "(line 8)" in problem, problem
    assert problem.endswith("a graph document holds only JSON values")


@pytest.mark.parametrize(("text", "fragment"), [
    pytest.param('{"x": ' + "1" * (MAX_INT_DIGITS + 1) + "}", "an integer of more than 4300 digits", id="long"),
    pytest.param('{"x": -' + "1" * 50_000 + "}", "an integer of more than 4300 digits", id="long-negative"),
    pytest.param('{"x": NaN}', "NaN, which is not a JSON number", id="nan"),
    pytest.param('{"x": -Infinity}', "-Infinity, which is not a JSON number", id="infinity"),
    pytest.param('{"x": 1e999}', "1e999, which is not a finite number", id="overflowing-exponent"),
])
def test_a_json_document_is_held_to_the_same_values(text: str, fragment: str) -> None:
    assert fragment in refusal(text)


@pytest.fixture
def fewer_int_digits() -> Iterator[int]:
    """A host process that lowered Python's limit (PAL is a library in other people's processes)."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        yield 1000
    finally:
        sys.set_int_max_str_digits(previous)


def test_a_process_with_a_lower_int_limit_gets_a_graph_error_too(fewer_int_digits: int) -> None:
    for text in (graph_yaml("1" * 1001), '{"x": ' + "1" * 1001 + "}", graph_yaml("0x" + "f" * 900)):
        assert "an integer of more than 1000 digits" in refusal(text)


@pytest.mark.parametrize(("value", "decoded"), [
    ("1" * MAX_INT_DIGITS, int("1" * MAX_INT_DIGITS)), ("-0x1f", -31), ("0b101", 5), ("1_000", 1000),
    ("1.5", 1.5), ("-2.5e+3", -2500.0), ('"2024-01-01"', "2024-01-01"), ("!!str 2024-01-01", "2024-01-01"),
    ("'.inf'", ".inf"), ("[1, two, {three: 3.0}]", [1, "two", {"three": 3.0}]), ("null", None), ("true", True),
])
def test_json_values_still_decode(value: str, decoded: object) -> None:
    document = load_graph_text(graph_yaml(value))
    assert document["nodes"][1]["data"]["args"]["x"] == decoded
    assert json.loads(json.dumps(document)) == document  # the journal's JSON holds it as it is
    parse_plan(graph_yaml(value), known_tools=frozenset({"echo"}))
