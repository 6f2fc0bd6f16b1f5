"""Parked steps: park_step parks an idle run behind a wake-up timer, resume_waiting decides a
parked step once, and the timers follow the explicit `now`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from pal.core.records import ClaimOutcome, Handoff
from pal.core.vocabulary import EventKind, LockHolder, RunStatus
from pal.errors import LeaseLost, Refused
from pal.storage.journal import Journal
from pal.storage.primitives import WAIT_RECHECK_SECONDS
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run

APPROVAL = {"kind": "approval", "prompt": "ship it?"}


def park_approval(journal: Journal, *, wake_in: float | None = 100.0, frontier: tuple[str, ...] = ("approve",),
                  payload: Mapping[str, Any] = APPROVAL) -> bool:
    """r1: `start` completes and hands off to `approve`, which parks at T0+2 (wake-up `wake_in`
    seconds after T0)."""
    new_run(journal)
    kit.claim_and_complete(journal, "start", kit.dispatching("approve"))
    assert journal.steps.claim_step(fence(seconds=1), "approve").outcome is ClaimOutcome.RUN
    return journal.waits.park_step(fence(seconds=2), "approve", 1, payload=payload,
                                   wake_at=at(wake_in) if wake_in is not None else None, frontier=kit.only(*frontier))


def resume(journal: Journal, seconds: float = 10.0, **decision: Any) -> tuple[Handoff, int]:
    return journal.waits.resume_waiting(run_id="r1", step_id="approve", now=at(seconds), lease_ttl=TTL,
                                        plan=kit.dispatching("after"), **decision)


def test_a_run_whose_frontier_only_waits_is_parked(journal: Journal) -> None:
    assert park_approval(journal)
    assert journal.runs.get_run("r1").status == RunStatus.WAITING
    timer = kit.lock_row(journal)
    assert timer is not None
    assert (timer["worker_id"], timer["generation"], timer["expires_at"]) == (LockHolder.PARKED, 2, at(100))
    assert journal.runs.get_lease("r1") is None and journal.waits.wake_time("r1") == at(100)
    body = {**APPROVAL, "wake_at": at(100).isoformat()}
    assert [(e.step_id, e.attempt, e.generation, e.payload) for e in kit.events(journal, kind=EventKind.STEP_WAITING)] == [
        ("approve", 1, 1, body)]
    assert journal.waits.waiting_steps("r1") == [
        {"step_id": "approve", "attempt": 1, "payload": body, "created_at": at(2)}]
    # Every message of the generation that parked it is stale now.
    assert journal.steps.claim_step(fence(seconds=3), "approve").outcome is ClaimOutcome.STALE


def test_a_parked_run_without_a_wake_up_time_is_looked_at_again_later(journal: Journal) -> None:
    assert park_approval(journal, wake_in=None)
    assert journal.waits.wake_time("r1") == at(2 + WAIT_RECHECK_SECONDS)


def test_a_run_with_another_step_in_flight_is_not_parked(journal: Journal) -> None:
    assert not park_approval(journal, frontier=("approve", "b"))
    assert journal.runs.get_run("r1").status == RunStatus.RUNNING
    lease = journal.runs.get_lease("r1")
    assert lease is not None and (lease.worker_id, lease.generation) == ("w1", 1)
    assert journal.waits.wake_time("r1") is None
    assert [w["step_id"] for w in journal.waits.waiting_steps("r1")] == ["approve"]


def test_a_fenced_out_park_raises_lease_lost_and_writes_nothing(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "approve").outcome is ClaimOutcome.RUN
    before = kit.events(journal)
    with pytest.raises(LeaseLost):
        journal.waits.park_step(fence(generation=2), "approve", 1, payload=APPROVAL, wake_at=None,
                                frontier=kit.only("approve"))
    assert kit.events(journal) == before and journal.waits.waiting_steps("r1") == []


def test_a_parked_step_is_resumed_once(journal: Journal) -> None:
    assert park_approval(journal)
    handoff, generation = resume(journal, output={"approved": True},
                                 event=(EventKind.APPROVAL_DECIDED, {"decision": "approve"}))
    assert (handoff, generation) == (Handoff(("after",), False), 3)
    lease = journal.runs.get_lease("r1")
    assert lease is not None
    assert (lease.worker_id, lease.generation, lease.expires_at) == (LockHolder.QUEUED, 3, at(10 + TTL))
    assert journal.runs.get_run("r1").status == RunStatus.RUNNING
    tail = [(e.kind, e.step_id, e.attempt, e.generation, e.payload) for e in kit.events(journal)][-2:]
    assert tail == [(EventKind.APPROVAL_DECIDED, "approve", 1, 3, {"decision": "approve"}),
                    (EventKind.STEP_COMPLETED, "approve", 1, 3, {"output": {"approved": True}})]
    assert journal.waits.waiting_steps("r1") == []

    before = kit.events(journal)
    with pytest.raises(Refused, match="already decided"):
        resume(journal, seconds=11, output={"approved": False},
               event=(EventKind.APPROVAL_DECIDED, {"decision": "reject"}))
    assert kit.events(journal) == before
    assert journal.steps.claim_step(fence(generation=3, seconds=12), "after").outcome is ClaimOutcome.RUN


def test_a_refused_check_or_an_unknown_step_resumes_nothing(journal: Journal) -> None:
    assert park_approval(journal)
    before = kit.events(journal)

    def check(payload: Mapping[str, Any]) -> None:
        assert payload["prompt"] == "ship it?"
        raise Refused("not this approver")

    with pytest.raises(Refused, match="not this approver"):
        resume(journal, output=True, check=check)
    with pytest.raises(Refused, match="no step 'nope'"):
        journal.waits.resume_waiting(run_id="r1", step_id="nope", now=at(10), lease_ttl=TTL, plan=kit.finishing())
    assert kit.events(journal) == before
    assert journal.runs.get_run("r1").status == RunStatus.WAITING and journal.waits.wake_time("r1") == at(100)


def test_a_parked_step_resumed_with_an_error_fails_the_run(journal: Journal) -> None:
    assert park_approval(journal)
    handoff, generation = resume(journal, error={"code": "rejected"})
    assert (handoff.finished, generation) == (True, 3)
    run = journal.runs.get_run("r1")
    assert (run.status, run.error) == (RunStatus.FAILED, {"code": "rejected", "step_id": "approve"})
    assert [e.kind for e in kit.events(journal)][-2:] == [EventKind.STEP_FAILED, EventKind.RUN_FAILED]
    assert kit.lock_row(journal) is None
    with pytest.raises(Refused):
        resume(journal, seconds=11, output=True)


def test_due_waiting_runs_and_rearm_wait_follow_now(journal: Journal) -> None:
    assert park_approval(journal)
    assert journal.waits.due_waiting_runs(now=at(100), limit=10) == []
    assert journal.waits.due_waiting_runs(now=at(101), limit=10) == ["r1"]
    journal.waits.rearm_wait(run_id="r1", wake_at=at(200), now=at(101))
    assert journal.waits.wake_time("r1") == at(200)
    assert journal.waits.due_waiting_runs(now=at(150), limit=10) == []
    assert journal.waits.due_waiting_runs(now=at(201), limit=10) == ["r1"]
    assert journal.waits.due_waiting_runs(now=at(201), limit=0) == []


def test_rearm_wait_leaves_a_live_lease_alone(journal: Journal) -> None:
    new_run(journal)
    lease = kit.lock_row(journal)
    journal.waits.rearm_wait(run_id="r1", wake_at=at(500), now=at(1))
    assert kit.lock_row(journal) == lease
    assert journal.waits.due_waiting_runs(now=at(1000), limit=10) == []  # in flight, not parked


def test_a_parent_waiting_for_a_finished_child_is_due_now(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "sub").outcome is ClaimOutcome.RUN
    new_run(journal, "c1", seconds=1, parent=("r1", "sub"))
    assert journal.waits.park_step(fence(seconds=2), "sub", 1, payload={"kind": "subagent", "child_run_id": "c1"},
                                   wake_at=None, frontier=kit.only("sub"))
    assert journal.waits.wake_time("r1") == at(2 + WAIT_RECHECK_SECONDS)
    kit.claim_and_complete(journal, "x", kit.finishing("child done"), run_id="c1", seconds=20)
    assert journal.waits.wake_time("r1") == at(20)  # the child's end made its parent due
    journal.waits.rearm_wait(run_id="r1", wake_at=at(500), now=at(30))
    assert journal.waits.wake_time("r1") == at(30)  # a finished child: due now, never at the later time
    assert journal.waits.due_waiting_runs(now=at(30) + timedelta(microseconds=1), limit=10) == ["r1"]
