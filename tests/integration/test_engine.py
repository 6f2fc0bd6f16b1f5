"""Graphs run node by node through a real Celery worker, on SQLite and on Postgres + Redis."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pal.client import Client
from pal.core.records import Event
from tests.support.graphs import branching, failing, fan_out_in, linear
from tests.support.tools import calls

pytestmark = pytest.mark.usefixtures("worker")


def completed_steps(events: list[Event]) -> Counter[str]:
    return Counter(e.step_id for e in events if e.kind == "step_completed" and e.step_id)


def terminal_events(events: list[Event]) -> list[str]:
    return [e.kind for e in events if e.kind in ("run_succeeded", "run_failed", "run_cancelled")]


def test_linear_graph_completes_each_step_once(client: Client, counter: Path) -> None:
    run_id = client.start_run(linear(counter, 5), {"n": 1})
    run = client.wait(run_id, timeout=60)
    events = client.events(run_id)
    assert run.status == "succeeded"
    assert run.output == 4
    assert completed_steps(events) == Counter(["start", "s0", "s1", "s2", "s3", "s4", "out"])
    assert terminal_events(events) == ["run_succeeded"]
    assert calls(counter) == ["s0", "s1", "s2", "s3", "s4"]
    assert [e.seq for e in events] == sorted(e.seq for e in events)


@pytest.mark.parametrize(("big", "taken", "skipped"), [(True, "yes", "no"), (False, "no", "yes")])
def test_condition_takes_one_branch_and_skips_the_other(
    client: Client, counter: Path, big: bool, taken: str, skipped: str
) -> None:
    run_id = client.start_run(branching(counter), {"big": big})
    run = client.wait(run_id, timeout=60)
    events = client.events(run_id)
    assert run.status == "succeeded"
    assert run.output == ("big" if big else "small")
    assert calls(counter) == [taken]
    assert skipped not in {e.step_id for e in events}
    assert completed_steps(events) == Counter(["start", "check", taken, f"out_{taken}"])
    assert terminal_events(events) == ["run_succeeded"]


def test_fan_out_fan_in_join_waits_for_every_branch(client: Client, counter: Path) -> None:
    run_id = client.start_run(fan_out_in(counter, 4), {})
    run = client.wait(run_id, timeout=60)
    events = client.events(run_id)
    assert run.status == "succeeded"
    assert run.output == 0 + 1 + 2 + 3
    assert sorted(calls(counter)) == ["b0", "b1", "b2", "b3", "join"]
    assert calls(counter)[-1] == "join"
    join_started = next(e.seq for e in events if e.kind == "step_started" and e.step_id == "join")
    branch_done = [e.seq for e in events if e.kind == "step_completed" and e.step_id.startswith("b")]
    assert max(branch_done) < join_started
    assert all(n == 1 for n in completed_steps(events).values())
    assert terminal_events(events) == ["run_succeeded"]


def test_failing_tool_fails_the_run_with_its_error(client: Client) -> None:
    run_id = client.start_run(failing(), {})
    run = client.wait(run_id, timeout=60)
    events = client.events(run_id)
    assert run.status == "failed"
    assert run.error["step_id"] == "bad"
    assert run.error["message"] == "kaput"
    failed = [e for e in events if e.kind == "step_failed"]
    assert [e.step_id for e in failed] == ["bad"]
    error = failed[0].payload["error"]
    assert {k: v for k, v in error.items() if k != "traceback"} == {
        "type": "RuntimeError", "message": "kaput", "code": "step_failed", "class": "tool"}
    # The traceback names the tool's own frame and ends with the exception line; the run's error has it too.
    assert "in explode" in error["traceback"] and error["traceback"].rstrip().endswith("RuntimeError: kaput")
    assert run.error["traceback"] == error["traceback"]
    assert terminal_events(events) == ["run_failed"]
    assert "out" not in {e.step_id for e in events}
    assert client.runtime.journal.runs.get_lease(run_id) is None


def test_non_json_output_fails_the_step_clearly(client: Client) -> None:
    graph = {"nodes": [{"id": "t", "type": "trigger"},
                       {"id": "odd", "type": "tool", "data": {"tool": "not_json"}}],
             "edges": [{"source": "t", "target": "odd"}]}
    run = client.wait(client.start_run(graph, {}), timeout=60)
    assert run.status == "failed"
    assert "not JSON" in run.error["message"]


def test_concurrent_runs_all_finish(client: Client, tmp_path: Path) -> None:
    run_ids = [client.start_run(fan_out_in(tmp_path / f"c{i}.log", 3), {}) for i in range(6)]
    runs = [client.wait(r, timeout=90) for r in run_ids]
    assert [r.status for r in runs] == ["succeeded"] * 6
    for i in range(6):
        assert sorted(calls(tmp_path / f"c{i}.log")) == ["b0", "b1", "b2", "join"]
