"""Recovery: steal an expired lease (never a live one, never a parked run's timer), re-drive a
batch of orphans, resend an unclaimed recovery's messages, and find orphans as of `now`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pytest

from pal.core.records import ClaimOutcome, Recovery, RunRecord
from pal.core.vocabulary import EventKind, LockHolder
from pal.errors import LeaseBusy
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run


class Resumes:
    """A re-drive plan that resumes `steps`, recording which run and completed outputs it was shown."""

    def __init__(self, *steps: str) -> None:
        self.steps = steps
        self.shown: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, run: RunRecord, completed: Mapping[str, Any]) -> Sequence[str]:
        self.shown.append((run.id, dict(completed)))
        return self.steps


def redelivery(journal: Journal) -> datetime | None:
    lease = journal.runs.get_lease("r1")
    assert lease is not None
    return lease.redeliver_at


def recover(journal: Journal, seconds: float, *steps: str, run_id: str = "r1", lease_ttl: float = TTL,
            **options: Any) -> Recovery | None:
    return journal.recovery.recover_run(run_id=run_id, worker_id="sweeper", now=at(seconds), lease_ttl=lease_ttl,
                                        plan=Resumes(*steps), **options)


def test_recover_run_steals_only_an_expired_lease(journal: Journal) -> None:
    new_run(journal)
    kit.claim_and_complete(journal, "a", kit.dispatching("b"))
    assert journal.steps.claim_step(fence(), "b").outcome is ClaimOutcome.RUN
    lease = kit.lock_row(journal)
    assert recover(journal, TTL - 1, "b") is None
    assert recover(journal, TTL, "b") is None  # expires_at < now: at the instant itself it holds
    assert kit.lock_row(journal) == lease and kit.events(journal, kind=EventKind.RUN_RECOVERED) == []

    plan = Resumes("b")
    recovery = journal.recovery.recover_run(run_id="r1", worker_id="sweeper", now=at(TTL + 1), lease_ttl=TTL, plan=plan)
    assert recovery == Recovery(generation=2, resumed_steps=("b",))
    assert plan.shown == [("r1", {"a": {"step": "a"}})]
    assert kit.lock_row(journal) == {"run_id": "r1", "worker_id": "sweeper", "expires_at": at(2 * TTL + 1),
                                     "generation": 2, "redeliver_at": None}
    assert [(e.generation, e.payload) for e in kit.events(journal, kind=EventKind.RUN_RECOVERED)] == [
        (2, {"generation": 2, "resumed_steps": ["b"]})]
    assert recover(journal, TTL + 2, "b") is None  # the sweeper's own lease is live now
    assert recover(journal, TTL + 2, "b", require_expired=False) == Recovery(3, ("b",))


def test_an_operator_may_take_only_an_idle_live_lease(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    with pytest.raises(LeaseBusy, match="step\\(s\\) a running under w1"):
        recover(journal, 1, "a", allow_idle=True)
    journal.steps.retry_step(fence(seconds=1), "a", 1, of=3, error={"code": "x"}, backoff_s=100)
    assert recover(journal, 2, "a", allow_idle=True) == Recovery(2, ("a",))


def test_a_parked_runs_timer_is_never_stolen(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "approve").outcome is ClaimOutcome.RUN
    assert journal.waits.park_step(fence(), "approve", 1, payload={}, wake_at=at(10), frontier=kit.only("approve"))
    timer = kit.lock_row(journal)
    assert recover(journal, 20, "approve") is None
    assert recover(journal, 20, "approve", require_expired=False) is None
    assert journal.recovery.recover_orphans(run_ids=["r1"], worker_id="sweeper", now=at(20), lease_ttl=TTL,
                                            plan=Resumes("approve"), redeliver_after=5) == {}
    assert journal.recovery.orphaned_runs(now=at(20), limit=10) == []
    assert kit.lock_row(journal) == timer and timer is not None and timer["worker_id"] == LockHolder.PARKED
    assert kit.events(journal, kind=EventKind.RUN_RECOVERED) == []


def test_recover_orphans_steals_a_batch(journal: Journal) -> None:
    for run_id in ("r1", "r2"):
        new_run(journal, run_id)
    new_run(journal, "r3", seconds=20)  # live until T0+50
    new_run(journal, "r4")
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="r4")
    live = kit.lock_row(journal, "r3")

    def plan(run: RunRecord, _completed: Mapping[str, Any]) -> Sequence[str]:
        return ["a"] if run.id == "r1" else []

    recovered = journal.recovery.recover_orphans(run_ids=["r4", "r3", "r2", "r1", "missing"], worker_id="sweeper",
                                                 now=at(40), lease_ttl=TTL, plan=plan, redeliver_after=5)
    assert recovered == {"r1": Recovery(2, ("a",)), "r2": Recovery(2, ())}
    for run_id, redeliver_at in (("r1", at(45)), ("r2", None)):  # a run that resumes nothing: no resend
        assert kit.lock_row(journal, run_id) == {"run_id": run_id, "worker_id": "sweeper",
                                                 "expires_at": at(40 + TTL), "generation": 2,
                                                 "redeliver_at": redeliver_at}
        assert len(kit.events(journal, run_id, EventKind.RUN_RECOVERED)) == 1
    assert kit.lock_row(journal, "r3") == live and kit.lock_row(journal, "r4") is None
    assert journal.recovery.recover_orphans(run_ids=["r1", "r2"], worker_id="sweeper", now=at(41), lease_ttl=TTL,
                                            plan=plan, redeliver_after=5) == {}


def test_redeliver_is_due_after_the_min_gap_and_then_doubles(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    assert recover(journal, 31, "a", lease_ttl=600, redeliver_after=5) == Recovery(2, ("a",))
    assert journal.recovery.redeliverable_runs(now=at(36), limit=10) == []
    assert journal.recovery.redeliverable_runs(now=at(37), limit=10) == ["r1"]
    assert journal.recovery.redeliver(run_id="r1", now=at(35), min_gap=5, plan=Resumes("a")) is None
    assert kit.events(journal, kind=EventKind.RUN_REDELIVERED) == []

    assert journal.recovery.redeliver(run_id="r1", now=at(37), min_gap=5, plan=Resumes("a")) == Recovery(2, ("a",))
    assert redelivery(journal) == at(43)  # the gap: max(5, 37 - 31)
    assert journal.recovery.redeliver(run_id="r1", now=at(42), min_gap=5, plan=Resumes("a")) is None
    assert journal.recovery.redeliver(run_id="r1", now=at(44), min_gap=5, plan=Resumes("a")) == Recovery(2, ("a",))
    assert redelivery(journal) == at(57)  # the gap doubles: 44 - 31
    assert [(e.generation, e.payload) for e in kit.events(journal, kind=EventKind.RUN_REDELIVERED)] == [
        (2, {"generation": 2, "steps": ["a"]})] * 2

    assert journal.steps.claim_step(fence(generation=2, seconds=45), "a").outcome is ClaimOutcome.RUN
    assert journal.recovery.redeliverable_runs(now=at(1000), limit=10) == []  # a claim clears it


def test_no_redelivery_is_due_past_the_leases_end(journal: Journal) -> None:
    new_run(journal)
    assert recover(journal, 31, "a", lease_ttl=20, redeliver_after=5) == Recovery(2, ("a",))  # lease: T0+51
    assert journal.recovery.redeliver(run_id="r1", now=at(37), min_gap=5, plan=Resumes("a")) is not None
    assert redelivery(journal) == at(43)
    assert journal.recovery.redeliver(run_id="r1", now=at(44), min_gap=5, plan=Resumes("a")) is not None  # next: T0+57
    assert redelivery(journal) is None
    assert journal.recovery.orphaned_runs(now=at(52), limit=10) == ["r1"]  # the sweep steals it instead


def test_orphaned_runs_follow_now(journal: Journal) -> None:
    new_run(journal)
    new_run(journal, "r2", seconds=10)
    new_run(journal, "r3")
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="r3")  # finished: never an orphan
    assert journal.recovery.orphaned_runs(now=at(TTL), limit=10) == []
    assert journal.recovery.orphaned_runs(now=at(TTL + 1), limit=10) == ["r1"]
    assert journal.recovery.orphaned_runs(now=at(TTL + 11), limit=10) == ["r1", "r2"]
    assert journal.recovery.orphaned_runs(now=at(TTL + 11), limit=1) == ["r1"]
    assert journal.steps.renew_lease(fence(seconds=TTL)) and not journal.steps.renew_lease(fence(generation=2))
    assert journal.recovery.orphaned_runs(now=at(TTL + 11), limit=10) == ["r2"]
    [(run, lease)] = journal.recovery.stuck_runs(now=at(TTL + 11))
    assert run.id == "r2" and lease is not None and lease.expires_at == at(10 + TTL)
