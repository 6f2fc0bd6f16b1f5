"""The `wait_event` node: what a graph may wait for, and what a malformed name, match or expiry gets
(a refusal when the graph is parsed, or a failed step when a template renders one)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pal.errors import GraphError
from pal.nodes.base import Park, StepContext
from pal.nodes.wait_event import EventNameInvalid, WaitEvent
from pal.plan.graph import parse_graph

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def graph_with(data: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": [{"id": "t", "type": "trigger"}, {"id": "w", "type": "wait_event", "data": data}],
            "edges": [{"source": "t", "target": "w"}]}


@pytest.mark.parametrize("data, says", [
    ({}, "'name' is required"),
    ({"name": ""}, "must be 1 to 64"),
    ({"name": "has space"}, "must be 1 to 64"),
    ({"name": "x" * 65}, "must be 1 to 64"),
    ({"name": "../up"}, "must be 1 to 64"),
    ({"name": "paid", "match": ["order"]}, "'match' must be object"),
    ({"name": "paid", "expiresIn": "soon"}, "is not a duration"),
    ({"name": "paid", "expiresIn": "-1h"}, "must be positive"),
])
def test_a_bad_wait_is_refused_when_the_graph_is_parsed(data: dict[str, Any], says: str) -> None:
    with pytest.raises(GraphError) as info:
        parse_graph(graph_with(data))
    assert says in str(info.value)


def test_a_wait_parks_with_its_name_match_and_expiry() -> None:
    park = WaitEvent().execute({"name": "paid", "match": {"order": "{{ input.order }}"}, "expiresIn": "72h"},
                               StepContext("r1", "w", 1, {"order": "o-7"}, started_at=NOW))
    assert isinstance(park, Park)
    assert park.wake_at == NOW + timedelta(hours=72)
    assert park.payload["kind"] == "event" and park.payload["name"] == "paid"
    assert park.payload["match"] == {"order": "o-7"}


@pytest.mark.parametrize("rendered", ["two words", "", "x" * 65, 7])
def test_a_name_template_that_renders_a_bad_name_fails_the_step(rendered: Any) -> None:
    with pytest.raises(EventNameInvalid) as info:
        WaitEvent().execute({"name": "{{ input.name }}"}, StepContext("r1", "w", 1, {"name": rendered},
                                                                      started_at=NOW))
    assert info.value.code == "event_name_invalid"


@pytest.mark.parametrize("cancel_on", [
    "", [], ["ok", "has space"], [1], {"name": "x"}, ["x" * 65], [f"s{i}" for i in range(17)], "../x",
])
def test_a_bad_cancel_on_is_refused_when_the_graph_is_parsed(cancel_on: Any) -> None:
    with pytest.raises(GraphError) as info:
        parse_graph(graph_with({"name": "paid"}) | {"cancelOn": cancel_on})
    assert "cancelOn must be a signal name or a list of 1 to 16" in str(info.value)


def test_cancel_on_is_kept_in_the_snapshot_and_hashed_and_refused_in_a_loop_body() -> None:
    plain = parse_graph(graph_with({"name": "paid"}))
    one = parse_graph(graph_with({"name": "paid"}) | {"cancelOn": "abort"})
    listed = parse_graph(graph_with({"name": "paid"}) | {"cancelOn": ["abort", "abort"]})
    assert "cancelOn" not in plain.document() and one.document()["cancelOn"] == ["abort"]
    assert one.hash == listed.hash != plain.hash
    body = {"nodes": [{"id": "w", "type": "wait_event", "data": {"name": "x"}}], "edges": [], "cancelOn": "x"}
    loop = {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "l", "type": "loop", "data": {"items": "{{ input.xs }}", "body": body}}],
            "edges": [{"source": "t", "target": "l"}]}
    with pytest.raises(GraphError) as info:
        parse_graph(loop)
    assert "cancelOn belongs on the graph, not a loop body" in str(info.value)
