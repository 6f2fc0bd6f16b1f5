"""The tracing switch and the derived ids (pal.engine.tracing)."""

from __future__ import annotations

import pytest

from pal.engine.tracing import configured, generation_ids, parse_traceparent


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
])
def test_traces_are_on_only_when_the_standard_variables_name_an_endpoint(env: dict[str, str], on: bool) -> None:
    assert configured(env) is on


def test_ids_are_derived_from_run_generation_and_salt() -> None:
    first = generation_ids("r-1", 1)
    assert first == generation_ids("r-1", 1)  # any process derives the same
    assert len({first, generation_ids("r-1", 2), generation_ids("r-2", 1), generation_ids("r-1", 1, "s")}) == 4
    trace_id, span_id = first
    assert 0 < trace_id < 2**128 and 0 < span_id < 2**64


@pytest.mark.parametrize(("text", "kept"), [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
    (" 00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00 ", True),  # normalised
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),  # an all-zero trace id
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),  # an all-zero span id
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),  # another version
    ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", False),  # short
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", False),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n", True), ("x" * 5000, False), (None, False),
    (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"], False),
])
def test_a_traceparent_is_kept_only_when_it_is_w3c_trace_context(text: object, kept: bool) -> None:
    parsed = parse_traceparent(text)
    assert (parsed is not None) is kept
    if parsed is not None:
        assert parsed == parsed.strip().lower() and len(parsed) == 55
