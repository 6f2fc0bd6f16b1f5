"""Claims (phase 1 of the step protocol): which outcome a claim gets, and what it writes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from pal.core.records import ClaimOutcome, RunRecord
from pal.core.vocabulary import RunStatus
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run


def test_a_claim_under_the_leases_generation_starts_the_step(journal: Journal) -> None:
    new_run(journal)
    claim = journal.steps.claim_step(fence(seconds=1), "a")
    assert claim.outcome is ClaimOutcome.RUN
    assert claim.attempt == 1 and claim.completed == {}
    assert claim.run is not None and claim.run.id == "r1" and claim.run.input == {"x": 1}
    assert kit.started(journal) == [("a", 1, 1)]
    assert kit.events(journal, kind="step_started")[0].payload == {"attempt": 1, "worker": "w1"}
    run = journal.runs.get_run("r1")
    assert run.status == RunStatus.RUNNING and run.started_at == at(1)
    lease = journal.runs.get_lease("r1")
    assert lease is not None
    assert (lease.worker_id, lease.generation, lease.expires_at) == ("w1", 1, at(1 + TTL))


@pytest.mark.parametrize("process", ["same", "other"])
def test_a_second_claim_of_the_same_attempt_is_a_duplicate(journal: Journal, process: str) -> None:
    """From the process that claimed (Postgres: the one-call path) or from a process that never
    read the run (the transaction path)."""
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    again = journal if process == "same" else Journal(journal.engine)
    duplicate = again.steps.claim_step(fence(worker="w2", seconds=2), "a")
    assert duplicate.outcome is ClaimOutcome.DUPLICATE and duplicate.attempt == 0
    assert kit.started(journal) == [("a", 1, 1)]


@pytest.mark.parametrize("generation", [0, 2])
def test_a_claim_under_another_generation_is_stale_and_writes_nothing(journal: Journal,
                                                                       generation: int) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN  # this process knows the run
    before, lease = kit.events(journal), kit.lock_row(journal)
    claim = journal.steps.claim_step(fence(generation=generation, worker="w2", seconds=5), "b")
    assert claim.outcome is ClaimOutcome.STALE
    assert kit.events(journal) == before
    assert kit.lock_row(journal) == lease


def test_a_claim_of_the_old_generation_after_a_recovery_is_stale(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    recovery = journal.recovery.recover_run(run_id="r1", worker_id="sweeper", now=at(TTL + 1), lease_ttl=TTL,
                                            plan=lambda _run, _done: ["a"])
    assert recovery is not None and recovery.generation == 2
    assert journal.steps.claim_step(fence(seconds=TTL + 2), "a").outcome is ClaimOutcome.STALE
    claim = journal.steps.claim_step(fence(generation=2, seconds=TTL + 2), "a")
    assert claim.outcome is ClaimOutcome.RUN and claim.attempt == 1  # the same attempt, re-driven
    assert kit.started(journal) == [("a", 1, 1), ("a", 1, 2)]


@pytest.mark.parametrize("end", ["succeeded", "cancelled", "unknown"])
def test_a_claim_on_a_finished_run_is_terminal(journal: Journal, end: str) -> None:
    run_id = "r1" if end != "unknown" else "nobody"
    new_run(journal)
    if end == "succeeded":
        kit.claim_and_complete(journal, "a", kit.finishing({"done": True}))
    elif end == "cancelled":
        journal.runs.cancel_run(run_id="r1", now=at(1), by="op", reason=None)
    before = kit.events(journal)
    claim = journal.steps.claim_step(fence(run_id, seconds=2), "b")
    assert claim.outcome is ClaimOutcome.TERMINAL
    assert kit.events(journal) == before
    assert kit.lock_row(journal, run_id) is None


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_step_that_is_not_ready_is_refused_with_nothing_written(
    journal: Journal, warm: bool
) -> None:
    """cold: the process never read the run; warm: it has claimed a step of it (on Postgres
    the claim then starts as a one-call claim)."""
    new_run(journal)
    if warm:
        assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    seen: list[tuple[str, dict[str, Any]]] = []

    def ready(run: RunRecord, completed: Mapping[str, Any]) -> bool:
        seen.append((run.id, dict(completed)))
        return False

    before, lease = kit.events(journal), kit.lock_row(journal)
    claim = journal.steps.claim_step(fence(worker="w2", seconds=5), "b", ready=ready)
    assert claim.outcome is ClaimOutcome.NOT_READY
    assert seen and all(s == ("r1", {}) for s in seen)
    assert kit.events(journal) == before
    assert journal.runs.get_run("r1").status == (RunStatus.RUNNING if warm else RunStatus.QUEUED)
    assert kit.lock_row(journal) == lease


def test_a_ready_step_is_claimed_once_its_predecessor_completed(journal: Journal) -> None:
    new_run(journal)
    kit.claim_and_complete(journal, "a", kit.dispatching("b"))
    claim = journal.steps.claim_step(fence(seconds=1), "b", ready=lambda _run, done: "a" in done)
    assert claim.outcome is ClaimOutcome.RUN and claim.completed == {"a": {"step": "a"}}


def test_a_step_between_retry_attempts_backs_off_until_its_wake_time(journal: Journal) -> None:
    new_run(journal)
    first = journal.steps.claim_step(fence(), "a")
    assert first.outcome is ClaimOutcome.RUN and first.attempt == 1
    assert journal.steps.retry_step(fence(seconds=1), "a", 1, of=3, error={"code": "boom"}, backoff_s=10)
    wake_at = at(11)
    assert kit.events(journal, kind="step_retrying")[0].payload == {
        "attempt": 1, "of": 3, "error": {"code": "boom"}, "wake_at": wake_at.isoformat()}

    early = journal.steps.claim_step(fence(seconds=5), "a")
    assert early.outcome is ClaimOutcome.BACKOFF
    assert early.attempt == 2 and early.wait_s == 6.0
    assert kit.started(journal) == [("a", 1, 1)]
    lease = journal.runs.get_lease("r1")  # held past the wake-up time, so the sweep leaves the run alone
    assert lease is not None and lease.expires_at == wake_at + timedelta(seconds=TTL)

    assert journal.steps.claim_step(fence(seconds=10.5), "a").outcome is ClaimOutcome.BACKOFF
    due = journal.steps.claim_step(fence(seconds=11), "a")
    assert due.outcome is ClaimOutcome.RUN and due.attempt == 2
    assert kit.started(journal) == [("a", 1, 1), ("a", 2, 1)]


def test_a_refused_claim_keeps_a_recoverys_redelivery_due(journal: Journal) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    recovery = journal.recovery.recover_run(run_id="r1", worker_id="sweeper", now=at(TTL + 1), lease_ttl=600,
                                            plan=lambda _run, _done: ["a"], redeliver_after=5)
    assert recovery is not None
    claim = journal.steps.claim_step(fence(generation=2, seconds=TTL + 2), "b", ready=lambda _run, _done: False)
    assert claim.outcome is ClaimOutcome.NOT_READY
    assert journal.recovery.redeliverable_runs(now=at(TTL + 7), limit=10) == ["r1"]
