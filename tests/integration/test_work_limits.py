"""The work one run, or one tenant, may create is bounded: steps per run, child runs under one
top-level run, subagent nesting depth, and a tenant's runs in flight. docs/security.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.errors import QuotaExceeded
from tests.support.graphs import edge, linear, loop, parent_of, single
from tests.support.outbox import Outbox, capture_publishes, drain


def limited(client: Client, **limits: Any) -> Outbox:
    client.runtime.settings = client.runtime.settings.with_(**limits)
    return capture_publishes(client)


def error_of(client: Client, run_id: str) -> dict[str, Any]:
    error: dict[str, Any] = client.get_run(run_id).error
    return error


def test_a_run_stops_at_its_step_limit(client: Client, counter: Path) -> None:
    sent = limited(client, max_steps_per_run=4)
    run_id = client.start_run(linear(counter, 10), {})
    drain(client, sent)
    assert client.get_run(run_id).status == "failed"
    assert error_of(client, run_id)["code"] == "work_limit_exceeded"
    assert "PAL_MAX_STEPS_PER_RUN" in error_of(client, run_id)["message"]
    assert len([e for e in client.runtime.journal.runs.events(run_id) if e.kind == "step_completed"]) == 4
    assert client.runtime.journal.doctor.violations() == []


def test_a_loop_cannot_outrun_the_step_limit(client: Client, counter: Path) -> None:
    sent = limited(client, max_steps_per_run=25)
    run_id = client.start_run(loop(counter), {"items": list(range(100))})
    drain(client, sent)
    assert error_of(client, run_id)["code"] == "work_limit_exceeded"
    assert len(counter.read_text().splitlines()) < 25


def _nested(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    graph = leaf
    for _ in range(depth):
        graph = parent_of(graph)
    return graph


def test_subagents_nest_no_deeper_than_the_limit(client: Client) -> None:
    leaf = single({"id": "v", "type": "output", "data": {"value": 1}})
    sent = limited(client, max_run_depth=2)
    ok = client.start_run(_nested(2, leaf), {})
    drain(client, sent)
    assert client.get_run(ok).status == "succeeded"
    too_deep = client.start_run(_nested(3, leaf), {})
    drain(client, sent)
    assert client.get_run(too_deep).status == "failed"
    grandchild = client.runtime.journal.runs.children(client.runtime.journal.runs.children(too_deep)[0].id)[0]
    assert error_of(client, grandchild.id)["code"] == "work_limit_exceeded"
    assert "PAL_MAX_RUN_DEPTH" in error_of(client, grandchild.id)["message"]
    assert client.runtime.journal.runs.descendant_count(too_deep) == 2  # the third level was never created


def test_one_run_creates_no_more_child_runs_than_the_limit(client: Client) -> None:
    child = single({"id": "v", "type": "output", "data": {"value": "{{ input.n }}"}})
    fan = {"nodes": [{"id": "start", "type": "trigger"},
                     *[{"id": f"sub{i}", "type": "subagent", "data": {"graph": child, "input": {"n": i}}}
                       for i in range(5)]],
           "edges": [edge("start", f"sub{i}") for i in range(5)]}
    sent = limited(client, max_child_runs=3)
    run_id = client.start_run(fan, {})
    drain(client, sent)
    assert client.get_run(run_id).status == "failed"
    assert len(client.runtime.journal.runs.children(run_id)) == 3
    assert error_of(client, run_id)["code"] in ("work_limit_exceeded", "child_run_failed")


def test_a_tenant_cannot_exceed_its_runs_in_flight(client: Client, counter: Path) -> None:
    limited(client, max_runs_in_flight=3)
    started = [client.start_run(linear(counter, 1), {}, tenant_id="acme") for _ in range(3)]
    before = client.runtime.journal.runs.list_runs(tenant_id="acme", limit=100)
    with pytest.raises(QuotaExceeded, match="PAL_MAX_RUNS_IN_FLIGHT"):
        client.start_run(linear(counter, 1), {}, tenant_id="acme")
    assert client.runtime.journal.runs.list_runs(tenant_id="acme", limit=100) == before  # nothing written
    assert client.start_run(linear(counter, 1), {}, tenant_id="globex")  # another tenant is not held up
    assert client.start_run(linear(counter, 1), {}, tenant_id="acme", run_id=started[0]) == started[0]
