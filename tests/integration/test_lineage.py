"""Retry and fork through a real Celery worker, on SQLite and on Postgres + Redis
(docs/retry-and-fork.md): reused steps never run again (the tools' ledgers), the rest runs in the
new run, the source is left as it was, and `pal doctor` finds the journal clean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.core.records import Event
from pal.engine.lineage import fork_run, retry_run
from pal.errors import InputError, QuotaExceeded, Refused, RunNotFound
from tests.support.graphs import approval, branching, counted, edge, loop
from tests.support.tools import calls

pytestmark = pytest.mark.usefixtures("worker")


def pipeline(path: Path, flaky_path: Path, failures: int = 1) -> dict[str, Any]:
    """start -> a -> f (fails `failures` times) -> b (value: input.n) -> out (b's value)."""
    f = {"id": "f", "type": "tool", "data": {"tool": "flaky", "args": {
        "path": str(flaky_path), "label": "f", "failures": failures}}}
    nodes = [{"id": "start", "type": "trigger"}, counted("a", path), f, counted("b", path, "{{ input.n }}"),
             {"id": "out", "type": "output", "data": {"value": "{{ nodes.b.output.value }}"}}]
    return {"nodes": nodes, "edges": [edge("start", "a"), edge("a", "f"), edge("f", "b"), edge("b", "out")]}


def started(events: list[Event]) -> list[str]:
    return [e.step_id for e in events if e.kind == "step_started" and e.step_id]


def reused(events: list[Event]) -> list[str]:
    return [e.step_id for e in events if e.kind == "step_completed" and e.step_id and "reused_from" in e.payload]


def test_a_failed_run_retried_reuses_its_completed_steps_and_succeeds(client: Client, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = client.start_run(pipeline(ledger, flaky), {"n": 3})
    assert client.wait(source, timeout=60).status == "failed"
    before = client.events(source)
    retried = client.retry_run(source)
    run = client.wait(retried, timeout=60)
    assert (run.status, run.output, run.source_run_id, run.source_kind) == ("succeeded", 3, source, "retry")
    events = client.events(retried)
    assert reused(events) == ["start", "a"] and started(events) == ["f", "b", "out"]
    assert calls(ledger) == ["a", "b"] and calls(flaky) == ["f", "f"]  # a ran once, in the source
    assert client.events(source) == before and client.get_run(source).status == "failed"
    assert client.derived_runs(source) == [{"run_id": retried, "kind": "retry", "status": "succeeded"}]
    assert client.runtime.journal.doctor.violations() == []


def test_a_fork_reruns_its_step_and_what_follows_on_the_new_input(client: Client, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = client.start_run(pipeline(ledger, flaky, failures=0), {"n": 3})
    assert client.wait(source, timeout=60).output == 3
    forked = client.fork_run(source, "b", {"n": 7})
    run = client.wait(forked, timeout=60)
    assert (run.status, run.output, run.input, run.source_step_id) == ("succeeded", 7, {"n": 7}, "b")
    assert reused(client.events(forked)) == ["start", "a", "f"] and calls(ledger) == ["a", "b", "b"]
    assert calls(flaky) == ["f"]
    same_input = client.fork_run(source, "a")  # the source's input
    assert client.wait(same_input, timeout=60).output == 3 and calls(ledger)[3:] == ["a", "b"]
    assert client.runtime.journal.doctor.violations() == []


def test_a_fork_after_a_loop_reuses_every_iteration(client: Client, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    source = client.start_run(loop(ledger), {"items": [1, 2]})
    assert client.wait(source, timeout=60).status == "succeeded"
    forked = client.fork_run(source, "out")
    assert client.wait(forked, timeout=60).output == client.get_run(source).output
    assert "each[1].work" in reused(client.events(forked)) and started(client.events(forked)) == ["out"]
    assert calls(ledger) == ["item-0", "item-1"]
    again = client.fork_run(source, "each", {"items": [5]})  # the loop node: all its iterations again
    assert client.wait(again, timeout=60).status == "succeeded" and calls(ledger)[2:] == ["item-0"]
    assert client.runtime.journal.doctor.violations() == []


def test_a_decided_approval_is_reused_not_asked_again(client: Client, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    source = client.start_run(approval(ledger), {"amount": 5, "customer": "c"})
    _wait_parked(client, source)
    with pytest.raises(Refused, match="is waiting"):  # in flight: neither retried nor forked
        fork_run(client.runtime, source, "pay")
    with pytest.raises(Refused):
        retry_run(client.runtime, source)
    assert client.derived_runs(source) == []
    client.approve(source, "gate")
    assert client.wait(source, timeout=60).status == "succeeded"
    forked = client.fork_run(source, "pay")
    assert client.wait(forked, timeout=60).status == "succeeded"
    assert "gate" in reused(client.events(forked)) and calls(ledger) == ["pay", "pay"]
    assert not any(e.kind == "step_waiting" for e in client.events(forked))
    assert client.runtime.journal.doctor.violations() == []


def _wait_parked(client: Client, run_id: str) -> None:
    from pal.cli.demo import wait_until

    assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)


def test_refusals_name_the_problem_and_write_nothing(client: Client, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    source = client.start_run(branching(ledger), {"big": True})
    assert client.wait(source, timeout=60).status == "succeeded"
    count = len(client.list_runs(limit=100))
    with pytest.raises(Refused, match="is succeeded"):
        client.retry_run(source)
    with pytest.raises(InputError, match="not a node"):
        client.fork_run(source, "nope")
    with pytest.raises(InputError, match="not a node"):
        client.fork_run(source, "each[0].work")  # a step id, not a node of the graph
    with pytest.raises(Refused, match="would run no step"):  # the untaken branch stays untaken
        client.fork_run(source, "no")
    with pytest.raises(InputError, match="PAL_MAX_INPUT_BYTES"):
        client.fork_run(source, "check", {"big": "x" * (client.settings.max_input_bytes + 1)})
    with pytest.raises(InputError, match="must be JSON"):
        client.fork_run(source, "check", {"big": float("nan")})
    with pytest.raises(InputError, match="invalid"):
        client.fork_run(source, "check", new_run_id="bad id")
    with pytest.raises(RunNotFound):
        fork_run(client.runtime, source, "check", tenant_id="someone-else")
    with pytest.raises(RunNotFound):
        client.retry_run("no-such-run")
    assert len(client.list_runs(limit=100)) == count and client.derived_runs(source) == []
    assert calls(ledger) == ["yes"]


def test_a_derived_run_counts_towards_max_runs_in_flight(client: Client, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = client.start_run(pipeline(ledger, flaky), {"n": 1})
    assert client.wait(source, timeout=60).status == "failed"
    full = Client(client.settings.with_(max_runs_in_flight=0))  # as if the tenant's runs were all in flight
    try:
        with pytest.raises(QuotaExceeded):
            full.retry_run(source)
    finally:
        full.close()
    assert client.derived_runs(source) == []
    mine = client.retry_run(source, new_run_id="retry-1")
    assert client.retry_run(source, new_run_id="retry-1") == mine  # idempotent
    assert client.wait(mine, timeout=60).status == "succeeded"


def buggy(path: Path) -> dict[str, Any]:
    """start -> a -> bad (a graph bug: it calls `explode`) -> b -> out."""
    graph = pipeline(path, path)
    graph["nodes"][2] = {"id": "f", "type": "tool", "data": {"tool": "explode", "args": {"message": "graph bug"}}}
    return graph


def test_a_run_failed_on_a_graph_bug_retries_with_the_fixed_graph(client: Client, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    source = client.start_run(buggy(ledger), {"n": 5})
    assert client.wait(source, timeout=60).status == "failed"
    fixed = buggy(ledger)
    fixed["nodes"][2] = counted("f", ledger, "fixed")
    fixed["nodes"][1]["position"] = {"x": 40, "y": 80}  # moved on a canvas: still the same node
    retried = client.retry_run(source, graph=fixed)
    run = client.wait(retried, timeout=60)
    assert (run.status, run.output, run.source_kind) == ("succeeded", 5, "retry")
    events = client.events(retried)
    assert reused(events) == ["start", "a"] and started(events) == ["f", "b", "out"]
    assert calls(ledger) == ["a", "f", "b"]  # `a` ran once, in the source run
    assert run.graph_hash != client.get_run(source).graph_hash
    # The same request again is the same run; the source's own graph under that id is other work.
    assert client.retry_run(source, graph=fixed, new_run_id="fixed-1") == "fixed-1"
    assert client.retry_run(source, graph=fixed, new_run_id="fixed-1") == "fixed-1"
    assert client.runtime.journal.doctor.violations() == []


def test_a_fixed_graph_that_changes_a_completed_node_is_refused_naming_it(client: Client, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    source = client.start_run(buggy(ledger), {"n": 5})
    assert client.wait(source, timeout=60).status == "failed"
    count = len(client.list_runs(limit=100))
    changed = buggy(ledger)
    changed["nodes"][1]["data"]["args"]["value"] = "other"  # `a` completed: its output would not fit
    with pytest.raises(InputError, match=r"node 'a', whose step 'a' completed .* changed"):
        client.retry_run(source, graph=changed)
    rewired = buggy(ledger)  # a new step before `a`: `a` would have run after something it never saw
    rewired["nodes"].append(counted("z", ledger))
    rewired["edges"][0] = edge("start", "z")
    rewired["edges"].append(edge("z", "a"))
    with pytest.raises(InputError, match=r"node 'a', whose step 'a' completed .* changed"):
        client.retry_run(source, graph=rewired)
    gone = buggy(ledger)
    gone["nodes"].pop(1)
    gone["edges"][:2] = [edge("start", "f")]
    with pytest.raises(InputError, match=r"node 'a', whose step 'a' completed .* is gone"):
        client.retry_run(source, graph=gone)
    with pytest.raises(InputError, match="only a graph run retries with a fixed graph"):
        client.retry_run(source, graph={"kind": "llm", "provider": "scripted", "model": "m", "prompt": "hi"})
    assert len(client.list_runs(limit=100)) == count and client.derived_runs(source) == []
    assert calls(ledger) == ["a"]
