"""check_run_input and RUN_ID: what a run may be started with."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pal.engine.runs import RUN_ID, check_run_input, new_run_id
from pal.errors import InputError


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({1, 2}, id="set"),
        pytest.param(float("nan"), id="nan"),
        pytest.param({"x": float("inf")}, id="nested-infinity"),
        pytest.param({"when": object()}, id="object"),
        pytest.param([b"bytes"], id="bytes"),
        pytest.param({("a", "b"): 1}, id="tuple-key"),
    ],
)
def test_non_json_input_is_rejected(value: Any) -> None:
    with pytest.raises(InputError, match="run input must be JSON"):
        check_run_input(value, 1_000)


def test_oversized_input_is_rejected_with_its_size() -> None:
    value = {"text": "x" * 100}
    size = len(json.dumps(value).encode())
    with pytest.raises(InputError) as info:
        check_run_input(value, size - 1)
    assert f"run input is {size} bytes, over the limit of {size - 1} (PAL_MAX_INPUT_BYTES)" in str(info.value)


def test_input_exactly_at_the_limit_is_accepted() -> None:
    value = {"text": "x" * 100}
    assert check_run_input(value, len(json.dumps(value).encode())) == value


def test_size_counts_utf8_bytes_not_characters() -> None:
    value = "\u00e9" * 10  # json.dumps escapes it: "\u00e9" is six bytes each
    size = len(json.dumps(value).encode())
    assert size == 62
    with pytest.raises(InputError):
        check_run_input(value, size - 1)
    assert check_run_input(value, size) == value


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        pytest.param(None, None, id="none"),
        pytest.param({"a": [1, 2.5, True, None, "s"]}, {"a": [1, 2.5, True, None, "s"]}, id="object"),
        pytest.param((1, 2), [1, 2], id="tuple-becomes-list"),
        pytest.param({1: "x"}, {"1": "x"}, id="int-key-becomes-string"),
    ],
)
def test_input_is_returned_as_it_will_be_stored(value: Any, stored: Any) -> None:
    assert check_run_input(value, 1_000) == stored


@pytest.mark.parametrize(
    "run_id",
    ["a", "run_1", "Run-2024.01.01:00", "0abc", "x" * 128, "order:42:retry.1"],
)
def test_run_id_accepts(run_id: str) -> None:
    assert RUN_ID.match(run_id)


@pytest.mark.parametrize(
    "run_id",
    ["", "_run", "-run", ".run", ":run", "run id", "run/1", "run#1", "x" * 129, "r\u00e9sum\u00e9", "run*"],
)
def test_run_id_rejects(run_id: str) -> None:
    assert RUN_ID.match(run_id) is None


def test_generated_run_ids_are_valid_and_distinct() -> None:
    first, second = new_run_id(), new_run_id()
    assert RUN_ID.match(first) and RUN_ID.match(second)
    assert first != second


def test_run_id_rejects_a_trailing_newline() -> None:
    assert RUN_ID.match("run1\n") is None
