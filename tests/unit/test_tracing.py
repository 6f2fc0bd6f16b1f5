"""The tracing switch and the derived ids (pal.engine.tracing)."""

from __future__ import annotations

import pytest

from pal.engine.tracing import configured, generation_ids


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
