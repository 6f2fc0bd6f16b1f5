"""RFC 8785 canonical JSON (pal.core.jcs): the number form of ECMAScript, members sorted by UTF-16
code units, JSON.stringify's escapes, and a refusal for what JSON cannot hold."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pal.core.jcs import canonical, number


@pytest.mark.parametrize(("value", "text"), [
    # The number examples of RFC 8785, appendix B, and the edges of ECMAScript's format.
    (0.0, "0"), (-0.0, "0"), (5e-324, "5e-324"), (-5e-324, "-5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"), (9007199254740992.0, "9007199254740992"),
    (295147905179352830000.0, "295147905179352830000"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
    (333333333.3333333, "333333333.3333333"), (4.5, "4.5"), (0.002, "0.002"), (0.000001, "0.000001"),
    (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (-1.5, "-1.5"), (100.0, "100"), (1.2e-5, "0.000012"),
])
def test_numbers_print_as_ecmascript_prints_doubles(value: float, text: str) -> None:
    assert number(value) == text


def test_integers_and_equal_doubles_are_one_text() -> None:
    assert canonical([1, 1.0, 2**53, 2**60]) == b"[1,1,9007199254740992,1152921504606847000]"


def test_members_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+FFFF in UTF-16.
    value = {"\uffff": 1, "\U0001f600": 2, "b": 3, "a": 4, "\u00e9": 5, "B": 6}
    assert canonical(value).decode() == '{"B":6,"a":4,"b":3,"\u00e9":5,"\U0001f600":2,"\uffff":1}'


def test_strings_escape_only_quote_backslash_and_controls() -> None:
    assert canonical("\"\\\b\t\n\f\r\x01\x1f\x7f\u2028/\u20ac") == \
        '"\\"\\\\\\b\\t\\n\\f\\r\\u0001\\u001f\x7f\u2028/\u20ac"'.encode()


def test_no_whitespace_and_nesting_is_kept() -> None:
    assert canonical({"b": [True, None, {"d": False, "c": "x"}], "a": {}}) == \
        b'{"a":{},"b":[true,null,{"c":"x","d":false}]}'


@pytest.mark.parametrize(("value", "problem"), [
    (math.nan, "not a JSON number"), (math.inf, "not a JSON number"), ({1: "x"}, "key is not a string"),
    ("\ud800", "lone surrogate"), ({"\udc00": 1}, "lone surrogate"), (b"bytes", "not a JSON value"),
    (2**1100, "int too large"),
])
def test_what_json_cannot_hold_is_refused(value: Any, problem: str) -> None:
    with pytest.raises((ValueError, OverflowError), match=problem):
        canonical(value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20)


@given(json_values)
def test_canonical_text_is_json_that_reads_back_to_an_equal_value(value: Any) -> None:
    text = canonical(value)
    assert json.loads(text, parse_int=float) == value  # numbers are doubles (an int <= 2^53 is one too)
    assert canonical(json.loads(text)) == text  # a fixed point: canonicalising twice changes nothing
