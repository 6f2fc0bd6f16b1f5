"""Approvals, subagents, loops and cancellation through a real Celery worker, on SQLite and on
Postgres + Redis. Restarts and SIGKILLs are in tests/e2e/test_control_flow_crashes.py."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import Event, Fence
from pal.engine.recovery import sweep
from pal.engine.runs import child_run_id
from pal.engine.services import NodeServices
from pal.engine.steps import execute_step
from pal.errors import Refused
from pal.nodes.approval import approval_hash
from tests.support.graphs import approval, loop, parent_of, single
from tests.support.tools import calls

TERMINAL = ("run_succeeded", "run_failed", "run_cancelled")


def waiting_on(client: Client, run_id: str, step_id: str, timeout: float = 60) -> None:
    assert wait_until(lambda: any(p.step_id == step_id for p in client.pending_approvals(run_id)), timeout), \
        f"{step_id} never waited; run is {client.get_run(run_id).status}"


def terminal(events: list[Event]) -> list[str]:
    return [e.kind for e in events if e.kind in TERMINAL]


def test_approval_parks_the_run_without_a_lease_then_follows_the_approved_branch(
        client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(approval(counter), {"amount": 30, "customer": "acme"})
    waiting_on(client, run_id, "gate")
    run = client.get_run(run_id)
    assert run.status == "waiting"
    assert client.runtime.journal.runs.get_lease(run_id) is None  # no lease, no worker held
    [waiting] = [e for e in client.events(run_id) if e.kind == "step_waiting"]
    assert waiting.payload["prompt"] == "Refund 30 to acme?"
    assert waiting.payload["approval_hash"] == approval_hash("Refund 30 to acme?", {"amount": 30})
    assert "requested_at" in waiting.payload and "expires_at" not in waiting.payload
    client.approve(run_id, "gate", comment="looks right", by="ada")
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded" and run.output == "paid"
    [decided] = [e for e in client.events(run_id) if e.kind == "approval_decided"]
    assert decided.payload | {} == {"decision": "approved", "by": "ada", "comment": "looks right",
                                    "approval_hash": waiting.payload["approval_hash"]}
    assert calls(counter) == ["pay"]
    assert terminal(client.events(run_id)) == ["run_succeeded"]


def test_rejection_takes_the_rejected_branch_or_fails_the_run(client: Client, worker: None,
                                                              counter: Path) -> None:
    with_branch = client.start_run(approval(counter, rejected=True), {"amount": 1, "customer": "a"})
    without = client.start_run(approval(counter), {"amount": 2, "customer": "b"})
    for run_id in (with_branch, without):
        waiting_on(client, run_id, "gate")
        client.reject(run_id, "gate", comment="no")
    assert client.wait(with_branch, timeout=60).status == "succeeded"
    failed = client.wait(without, timeout=60)
    assert failed.status == "failed" and failed.error["code"] == "approval_rejected"
    assert calls(counter) == ["on_rejected"]


def test_refused_decisions_change_nothing(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(approval(counter), {"amount": 5, "customer": "c"})
    waiting_on(client, run_id, "gate")
    before = client.events(run_id)
    with pytest.raises(Refused, match="has no step 'nope'"):
        client.approve(run_id, "nope")
    with pytest.raises(Refused, match="is not waiting"):
        client.approve(run_id, "start")
    with pytest.raises(Refused, match="asks to approve something else"):
        client.approve(run_id, "gate", expected_hash="0" * 64)
    with pytest.raises(Refused, match="decision must be one of"):
        client.decide(run_id, "gate", "maybe")
    assert client.events(run_id) == before
    client.approve(run_id, "gate", expected_hash=approval_hash("Refund 5 to c?", {"amount": 5}))
    with pytest.raises(Refused):
        client.reject(run_id, "gate")  # a second decision on the same step: "was already decided"
    client.wait(run_id, timeout=60)
    with pytest.raises(Refused, match="is succeeded; nothing waits there"):
        client.approve(run_id, "gate")  # a run that is not waiting
    assert [e.kind for e in client.events(run_id)].count("approval_decided") == 1


@pytest.mark.parametrize("with_timeout_branch", [True, False])
def test_an_expired_approval_takes_its_timeout_branch_or_fails_on_the_sweep(
        client: Client, worker: None, counter: Path, with_timeout_branch: bool) -> None:
    run_id = client.start_run(approval(counter, expires="1s", timeout=with_timeout_branch),
                              {"amount": 9, "customer": "d"})
    waiting_on(client, run_id, "gate")
    waiting = next(e for e in client.events(run_id) if e.kind == "step_waiting")
    assert "expires_at" in waiting.payload
    assert client.runtime.journal.waits.wake_time(run_id) is not None
    assert sweep(client.runtime).woken.get(run_id, 0) == 0 or client.get_run(run_id).status != "waiting"
    sweep(client.runtime, now=utcnow() + timedelta(seconds=2))
    run = client.wait(run_id, timeout=60)
    decided = next(e for e in client.events(run_id) if e.kind == "approval_decided")
    assert decided.payload["decision"] == "timeout" and decided.payload["by"] == "pal:expiry"
    if with_timeout_branch:
        assert run.status == "succeeded" and calls(counter) == ["on_timeout"]
    else:
        assert run.status == "failed" and run.error["code"] == "approval_expired" and calls(counter) == []


def test_subagent_runs_a_child_and_returns_its_output(client: Client, worker: None, counter: Path) -> None:
    child = single({"id": "c", "type": "tool", "data": {"tool": "count", "args": {
        "path": str(counter), "label": "child", "value": "{{ input.n * 2 }}"}}})
    run_id = client.start_run(parent_of(child, child_input={"n": "{{ input.n }}"}), {"n": 21})
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output == {"label": "child", "value": 42}
    [kid] = client.runtime.journal.runs.children(run_id)
    assert kid.id == child_run_id(run_id, "sub", 1) and kid.parent_step_id == "sub"
    assert kid.status == "succeeded" and kid.tenant_id == run.tenant_id
    assert calls(counter) == ["child"]


def test_a_re_driven_subagent_step_finds_its_child(client: Client, counter: Path) -> None:
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    child = single({"id": "c", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter),
                                                                                 "label": "child"}}})
    run_id = client.start_run(parent_of(child), {})
    execute_step(client.runtime, *sent.pop(0))  # the parent's trigger
    sub = sent.pop(0)
    journal = client.runtime.journal
    # The worker running `sub` died after creating the child and before parking: run it again.
    claim = journal.steps.claim_step(Fence(run_id, 1, "doomed", utcnow(), 30), "sub")
    from pal.nodes.base import StepContext

    ctx = StepContext(run_id=run_id, step_id="sub", attempt=claim.attempt, input={}, services=NodeServices(client.runtime))
    first = NodeServices(client.runtime).start_child(ctx, child, {})
    assert execute_step(client.runtime, *sub).outcome == "duplicate"  # same attempt, same generation
    from pal.engine.recovery import redrive

    recovery = redrive(client.runtime, run_id, require_expired=False)
    assert recovery is not None and recovery.resumed_steps == ("sub",)
    execute_step(client.runtime, run_id, "sub", recovery.generation)
    assert [c.id for c in journal.runs.children(run_id)] == [first]  # never a second child
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["child"]


def test_nested_approval_two_levels_deep(client: Client, worker: None, counter: Path) -> None:
    grandchild = approval(counter)
    run_id = client.start_run(parent_of(parent_of(grandchild, child_input={"amount": 3, "customer": "e"})), {})
    assert wait_until(lambda: bool(client.pending_approvals(run_id)), 60)
    [pending] = client.pending_approvals(run_id)
    assert pending.depth == 2 and pending.step_id == "gate" and pending.prompt == "Refund 3 to e?"
    assert client.get_run(run_id).status == "waiting"
    client.approve(pending.run_id, "gate", by="ada")
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded" and run.output == "paid"
    assert calls(counter) == ["pay"]


def test_on_child_approval_fail_is_err_child_run_paused(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(parent_of(approval(counter), child_input={"amount": 1, "customer": "f"},
                                        on_child_approval="fail"), {})
    run = client.wait(run_id, timeout=60)
    assert run.status == "failed" and run.error["code"] == "child_run_paused"
    assert calls(counter) == []


def test_a_failed_child_fails_the_parent_step(client: Client, worker: None) -> None:
    child = single({"id": "bad", "type": "tool", "data": {"tool": "explode", "args": {"message": "kaput"}}})
    run = client.wait(client.start_run(parent_of(child), {}), timeout=60)
    assert run.status == "failed" and run.error["code"] == "child_run_failed"
    assert run.error["child_error"]["message"] == "kaput"


def test_loop_runs_each_item_once_and_collects_the_outputs(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(loop(counter), {"items": ["a", "b", "c"]})
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output == [{"index": 0, "got": "a"}, {"index": 1, "got": "b"}, {"index": 2, "got": "c"}]
    done = [e.step_id for e in client.events(run_id) if e.kind == "step_completed"]
    assert done == ["start", "each[items]", "each[0].work", "each[0].check", "each[1].work", "each[1].check",
                    "each[2].work", "each[2].check", "each", "out"]
    assert calls(counter) == ["item-0", "item-1", "item-2"]


@pytest.mark.parametrize(("items", "limit", "status", "expected"), [
    ([], None, "succeeded", []),
    (None, 2, "succeeded", [{"index": 0, "got": 0}, {"index": 1, "got": 1}]),
    ([1, 2, 3], 2, "failed", "loop_too_long"),
])
def test_loop_limits(client: Client, worker: None, counter: Path, items: object, limit: int | None,
                     status: str, expected: object) -> None:
    graph = loop(counter, items=items if items is not None else None, max_iterations=limit)
    if items is not None:
        graph["nodes"][1]["data"]["items"] = items
    run = client.wait(client.start_run(graph, {}), timeout=60)
    assert run.status == status
    assert (run.output if status == "succeeded" else run.error["code"]) == expected


def test_cancel_stops_a_run_and_every_descendant_once(client: Client, worker: None, counter: Path) -> None:
    """The parent has a running child (napping), a waiting approval, and a queued step."""
    napping = single({"id": "zz", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 2}}})
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "sub", "type": "subagent", "data": {"graph": napping}},
                       {"id": "gate", "type": "approval", "data": {"prompt": "go?"}},
                       {"id": "deep", "type": "subagent", "data": {"graph": approval(counter),
                                                                   "input": {"amount": 1, "customer": "g"}}}],
             "edges": [{"source": "start", "target": "sub"}, {"source": "start", "target": "gate"},
                       {"source": "start", "target": "deep"}]}
    run_id = client.start_run(graph, {})
    assert wait_until(lambda: len(client.pending_approvals(run_id)) == 2, 60)
    cancelled = client.cancel(run_id, reason="changed my mind", by="ada")
    assert cancelled[0] == run_id and len(cancelled) == 3  # the run and both children
    time.sleep(2.5)  # let the napping child's step try to complete: it is fenced out
    for rid in cancelled:
        assert client.get_run(rid).status == "cancelled"
        assert terminal(client.events(rid)) == ["run_cancelled"]
        assert client.runtime.journal.runs.get_lease(rid) is None
    assert client.get_run(run_id).error == {"code": "cancelled", "by": "ada", "reason": "changed my mind",
                                            "cancelled_with": None}
    with pytest.raises(Refused, match="is cancelled; it cannot be cancelled"):
        client.cancel(run_id)
    with pytest.raises(Refused):
        client.approve(run_id, "gate")
    assert Counter(e.kind for e in client.events(run_id))["run_cancelled"] == 1


def test_cancel_with_a_running_child_a_waiting_approval_and_a_queued_step(client: Client, counter: Path) -> None:
    """Message by message, so that each descendant is caught in the state the test names."""
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    journal = client.runtime.journal
    child = single({"id": "work", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter),
                                                                                    "label": "child"}}})
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "sub", "type": "subagent", "data": {"graph": child}},
                       {"id": "gate", "type": "approval", "data": {"prompt": "go?"}},
                       {"id": "later", "type": "tool", "data": {"tool": "count", "args": {
                           "path": str(counter), "label": "later"}}}],
             "edges": [{"source": "start", "target": "sub"}, {"source": "start", "target": "gate"},
                       {"source": "start", "target": "later"}]}
    run_id = client.start_run(graph, {})
    execute_step(client.runtime, *sent.pop(0))  # trigger: sub, gate and later are dispatched
    by_step = {m[1]: m for m in sent}
    sent.clear()
    assert execute_step(client.runtime, *by_step["gate"]).outcome == "waiting"
    assert execute_step(client.runtime, *by_step["sub"]).outcome == "waiting"
    [kid] = journal.runs.children(run_id)
    execute_step(client.runtime, *sent.pop(0))  # the child's trigger
    child_work = sent.pop(0)
    running = journal.steps.claim_step(Fence(kid.id, child_work[2], "busy", utcnow(), 30), "work")
    assert running.outcome.value == "run"  # the child's step is running; `later` is still queued
    cancelled = client.cancel(run_id, reason="stop", by="ada")
    assert sorted(cancelled) == sorted([run_id, kid.id])
    # The queued step and the child's running step hit the cancellation at their next boundary.
    assert execute_step(client.runtime, *by_step["later"]).outcome == "terminal"
    assert execute_step(client.runtime, *child_work).outcome == "terminal"
    from pal.errors import LeaseLost

    with pytest.raises(LeaseLost):
        journal.steps.complete_step(Fence(kid.id, child_work[2], "busy", utcnow(), 30), "work", 1, 1, plan=lambda done: client.runtime.program_of(kid).handoff(done, "work"))
    with pytest.raises(Refused):
        client.approve(run_id, "gate")
    for rid in (run_id, kid.id):
        assert client.get_run(rid).status == "cancelled"
        assert terminal(client.events(rid)) == ["run_cancelled"]
    assert calls(counter) == []


def capture(client: Client) -> list[tuple[str, str, int]]:
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    return sent


def test_a_decision_after_a_cancellation_is_refused_and_changes_nothing(client: Client, counter: Path) -> None:
    sent = capture(client)
    run_id = client.start_run(approval(counter), {"amount": 1, "customer": "h"})
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "waiting"
    client.cancel(run_id)
    with pytest.raises(Refused, match="is cancelled"):
        client.approve(run_id, "gate")
    assert client.get_run(run_id).status == "cancelled"
    assert terminal(client.events(run_id)) == ["run_cancelled"] and sent == []


def test_two_decisions_on_parallel_approvals_keep_each_others_messages_valid(client: Client, counter: Path) -> None:
    sent = capture(client)
    gate = {"prompt": "go?"}
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "ga", "type": "approval", "data": gate}, {"id": "gb", "type": "approval", "data": gate},
                       {"id": "a", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter), "label": "a"}}},
                       {"id": "b", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter), "label": "b"}}}],
             "edges": [{"source": "start", "target": "ga"}, {"source": "start", "target": "gb"},
                       {"source": "ga", "target": "a", "sourceHandle": "approved"},
                       {"source": "gb", "target": "b", "sourceHandle": "approved"}]}
    run_id = client.start_run(graph, {})
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "waiting"
    client.approve(run_id, "ga")
    client.approve(run_id, "gb")
    assert [m[1] for m in sent] == ["a", "b"] and sent[0][2] == sent[1][2]  # one generation for both
    assert [execute_step(client.runtime, *m).outcome for m in sent] == ["completed", "completed"]
    assert client.get_run(run_id).status == "succeeded" and sorted(calls(counter)) == ["a", "b"]


def test_a_child_is_never_started_under_a_cancelled_parent(client: Client, counter: Path) -> None:
    from pal.nodes.base import StepContext

    capture(client)
    child = single({"id": "c", "type": "tool", "data": {"tool": "noop"}})
    run_id = client.start_run(parent_of(child), {})
    client.cancel(run_id)
    ctx = StepContext(run_id=run_id, step_id="sub", attempt=1, input={}, services=NodeServices(client.runtime))
    with pytest.raises(Refused, match="starts no child runs"):
        NodeServices(client.runtime).start_child(ctx, child, {})
    assert client.runtime.journal.runs.children(run_id) == []


def test_a_failed_parent_cancels_its_paused_child(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(parent_of(approval(counter), child_input={"amount": 1, "customer": "i"},
                                        on_child_approval="fail"), {})
    assert client.wait(run_id, timeout=60).error["code"] == "child_run_paused"
    [kid] = client.runtime.journal.runs.children(run_id)
    assert kid.status == "cancelled" and kid.error["code"] == "parent_failed"
    with pytest.raises(Refused):
        client.approve(kid.id, "gate")  # nothing can act for the failed parent any more
    assert calls(counter) == []


def test_an_approval_inside_a_loop_body_follows_its_body_edges(client: Client, counter: Path) -> None:
    sent = capture(client)
    body = {"nodes": [{"id": "ask", "type": "approval", "data": {"prompt": "item {{ loop.item }}?"}},
                      {"id": "yes", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter), "label": "yes"}}},
                      {"id": "no", "type": "tool", "data": {"tool": "count", "args": {"path": str(counter), "label": "no"}}}],
            "edges": [{"source": "ask", "target": "yes", "sourceHandle": "approved"},
                      {"source": "ask", "target": "no", "sourceHandle": "rejected"}]}
    run_id = client.start_run(single({"id": "each", "type": "loop", "data": {"items": [1], "body": body}}), {})
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    client.reject(run_id, "each[0].ask")
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["no"]
