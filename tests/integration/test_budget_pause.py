"""A budget in `pause` (both backends): the step past the budget parks before its node runs, waits
like an approval (`step_waiting {kind: "budget"}`), runs once when approved (a new attempt, no
second completion) and fails the run `budget_exceeded` when rejected. Forged, stale and racing
decisions are refused with nothing written. docs/anomalies.md, "Budgets"."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.engine.steps import execute_step
from pal.errors import Refused
from tests.support.graphs import linear
from tests.support.outbox import Outbox, capture_publishes, drain

PAUSED = {"maxSteps": 2, "onBreach": "pause"}


@pytest.fixture
def outbox(client: Client) -> Outbox:
    return capture_publishes(client)


def events_of(client: Client, run_id: str, kind: str) -> list[Any]:
    return [e for e in client.events(run_id) if e.kind == kind]


def lines(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def paused_run(client: Client, outbox: Outbox, counter: Path) -> str:
    """start, s0 run; s1 is past maxSteps 2 and waits."""
    run_id = client.start_run(linear(counter, 3) | {"limits": PAUSED}, {})
    drain(client, outbox)
    return run_id


def test_the_step_past_the_budget_waits_before_its_node_runs(client: Client, outbox: Outbox,
                                                              counter: Path) -> None:
    run_id = paused_run(client, outbox, counter)
    run = client.get_run(run_id)
    assert run.status == "waiting" and lines(counter) == 1  # s1's node never ran
    [waiting] = events_of(client, run_id, "step_waiting")
    assert waiting.step_id == "s1" and waiting.payload["kind"] == "budget"
    assert waiting.payload["show"]["limit_name"] == "maxSteps"
    assert (waiting.payload["show"]["limit"], waiting.payload["show"]["observed"]) == ("2", "2")
    [pending] = client.pending_approvals(run_id)
    assert (pending.step_id, pending.kind) == ("s1", "budget")
    assert pending.approval_hash == waiting.payload["approval_hash"]
    assert client.runtime.journal.doctor.violations() == []


def test_approved_the_step_runs_once_and_the_next_one_waits_again(client: Client, outbox: Outbox,
                                                                   counter: Path) -> None:
    run_id = paused_run(client, outbox, counter)
    client.approve(run_id, "s1", comment="worth it")
    drain(client, outbox)
    assert lines(counter) == 2  # s1 ran, once
    starts = [(e.step_id, e.attempt) for e in events_of(client, run_id, "step_started")]
    assert starts.count(("s1", 1)) == 1 and starts.count(("s1", 2)) == 1  # the paused attempt, then its run
    [decided] = events_of(client, run_id, "approval_decided")
    assert decided.payload["kind"] == "budget" and decided.payload["comment"] == "worth it"
    assert [p.step_id for p in client.pending_approvals(run_id)] == ["s2"]  # still over: asks again
    client.approve(run_id, "s2")
    drain(client, outbox)
    assert [p.step_id for p in client.pending_approvals(run_id)] == ["out"]  # every step past it asks
    client.approve(run_id, "out")
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "succeeded" and lines(counter) == 3
    completed = [e.step_id for e in events_of(client, run_id, "step_completed")]
    assert sorted(completed) == sorted(set(completed))  # each step completed exactly once
    assert client.runtime.journal.doctor.violations() == []


def test_rejected_the_run_fails_budget_exceeded(client: Client, outbox: Outbox, counter: Path) -> None:
    run_id = paused_run(client, outbox, counter)
    client.reject(run_id, "s1", comment="too dear")
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "budget_exceeded"
    assert run.error["decision"] == "rejected" and run.error["comment"] == "too dear"
    assert run.error["limit_name"] == "maxSteps" and lines(counter) == 1
    assert events_of(client, run_id, "step_started")[-1].step_id == "s1"  # nothing claimed after
    assert client.runtime.journal.doctor.violations() == []


def test_forged_and_stale_decisions_are_refused_with_nothing_written(client: Client, outbox: Outbox,
                                                                      counter: Path) -> None:
    run_id = paused_run(client, outbox, counter)
    before = len(client.events(run_id))
    with pytest.raises(Refused, match="asks to approve something else"):
        client.approve(run_id, "s1", expected_hash="0" * 64)
    with pytest.raises(Refused, match=r"not waiting|that ever ran"):
        client.approve(run_id, "s2")
    with pytest.raises(Refused, match="decision must be"):
        client.decide(run_id, "s1", "maybe")
    # A doorbell for the paused step (a duplicate or forged message) starts nothing.
    assert execute_step(client.runtime, run_id, "s1", 1).outcome in ("stale", "waiting")
    assert len(client.events(run_id)) == before and lines(counter) == 1
    client.approve(run_id, "s1")
    with pytest.raises(Refused, match=r"already decided|not waiting"):
        client.reject(run_id, "s1")
    drain(client, outbox)
    assert lines(counter) == 2


def test_two_racing_decisions_one_wins(client: Client, outbox: Outbox, counter: Path) -> None:
    run_id = paused_run(client, outbox, counter)
    results: list[str] = []
    barrier = threading.Barrier(2)

    def decide(decision: str) -> None:
        barrier.wait()
        try:
            client.decide(run_id, "s1", decision)
            results.append(decision)
        except Refused:
            results.append("refused")

    threads = [threading.Thread(target=decide, args=(d,)) for d in ("approved", "rejected")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results).count("refused") == 1, results
    assert len(events_of(client, run_id, "approval_decided")) == 1
    drain(client, outbox)
    winner = next(r for r in results if r != "refused")
    assert lines(counter) == (2 if winner == "approved" else 1)
    assert client.runtime.journal.doctor.violations() == []
