"""The `sleep` node: what a graph may ask for, and what a hostile or malformed time gets (a clear
refusal at parse time, or a failed step when a template renders it; never a timer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pal.core.vocabulary import EventKind
from pal.errors import GraphError
from pal.nodes.base import Park, StepContext
from pal.nodes.sleep import Sleep, SleepInvalid
from pal.plan.graph import parse_graph

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def graph_with(data: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": [{"id": "t", "type": "trigger"}, {"id": "s", "type": "sleep", "data": data}],
            "edges": [{"source": "t", "target": "s"}]}


def problems_of(data: dict[str, Any]) -> str:
    with pytest.raises(GraphError) as info:
        parse_graph(graph_with(data))
    return str(info.value)


def run(data: dict[str, Any], run_input: Any = None) -> Any:
    return Sleep().execute(data, StepContext("r1", "s", 1, run_input, started_at=NOW))


@pytest.mark.parametrize("data, says", [
    ({}, "exactly one of duration"),
    ({"duration": "1h", "until": "2027-01-01T00:00:00Z"}, "exactly one of duration"),
    ({"duration": "soon"}, "is not a duration"),
    ({"duration": "-5m"}, "must be positive"),
    ({"duration": "0s"}, "must be positive"),
    ({"duration": "401d"}, "is not a duration"),  # Go durations stop at hours
    ({"duration": "9700h"}, "more than 400 days"),
    ({"duration": "1" * 80 + "h"}, "longer than 64 characters"),
    ({"duration": 30}, "must be string"),
    ({"until": "2027-01-31 09:00"}, "has no offset"),
    ({"until": "next tuesday"}, "is not an ISO 8601 time"),
    ({"until": ["2027-01-01T00:00:00Z"]}, "must be string"),
    ({"duration": "1h", "wake": "now"}, "unknown data field 'wake'"),
])
def test_a_bad_sleep_is_refused_when_the_graph_is_parsed(data: dict[str, Any], says: str) -> None:
    assert says in problems_of(data)


def test_a_duration_sets_a_timer_journaled_with_the_wait() -> None:
    park = run({"duration": "72h"})
    assert isinstance(park, Park)
    due = NOW + timedelta(hours=72)
    assert park.wake_at == due
    assert park.payload == {"kind": "timer", "due_at": due.isoformat(), "set_at": NOW.isoformat()}
    assert park.event == (EventKind.TIMER_SET, {"due_at": due.isoformat()})


def test_until_a_time_with_its_offset() -> None:
    park = run({"until": "2026-12-08T09:00:00+01:00"})
    assert isinstance(park, Park)
    assert park.wake_at == datetime(2026, 12, 8, 8, 0, tzinfo=UTC)


def test_a_time_already_past_completes_at_once() -> None:
    assert run({"until": "2026-12-07T11:00:00Z"}) == {"due_at": "2026-12-07T11:00:00+00:00",
                                                      "fired_at": NOW.isoformat()}


@pytest.mark.parametrize("rendered, says", [
    ("later", "is not a duration"),
    ("-1h", "must be positive"),
    ("99999h", "more than 400 days"),
])
def test_a_template_that_renders_a_bad_duration_fails_the_step(rendered: str, says: str) -> None:
    with pytest.raises(SleepInvalid) as info:
        run({"duration": "{{ input.wait }}"}, {"wait": rendered})
    assert says in str(info.value) and info.value.code == "sleep_invalid"


def test_a_template_that_renders_a_far_until_fails_the_step() -> None:
    with pytest.raises(SleepInvalid, match="more than 400 days away"):
        run({"until": "{{ input.when }}"}, {"when": "2099-01-01T00:00:00Z"})


def test_a_template_that_renders_no_string_fails_the_step() -> None:
    with pytest.raises(SleepInvalid, match="non-string"):
        run({"duration": "{{ input.wait }}"}, {"wait": {"h": 1}})
