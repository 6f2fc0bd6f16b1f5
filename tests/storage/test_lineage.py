"""Derived runs (docs/retry-and-fork.md): create_derived_run copies exactly the completed steps it is
told to reuse, marked with where they came from, in one transaction; every refusal writes nothing;
derived_runs reads the lineage back. Each test runs on SQLite and on Postgres."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from pal.core.records import RunRecord, Usage
from pal.core.vocabulary import EventKind, LockHolder, RunStatus, SourceKind
from pal.errors import QuotaExceeded, Refused, RunIdReused, RunIdTaken, RunNotFound
from pal.storage.journal import Journal
from pal.storage.lineage import Derived, DerivedRequest
from tests.storage import kit
from tests.storage.kit import TTL, at, dispatching, fence, new_run

RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


def failed_source(journal: Journal, run_id: str = "r1", tenant: str = "t1") -> None:
    """A run that completed `a` and `b` (b spent tokens), then failed at `c`."""
    new_run(journal, run_id, tenant=tenant)
    kit.claim_and_complete(journal, "a", dispatching("b"), run_id=run_id)
    f = fence(run_id, seconds=1)
    claim = journal.steps.claim_step(f, "b")
    journal.steps.complete_step(f, "b", claim.attempt, {"step": "b"}, plan=dispatching("c"),
                                usage=Usage(10, 5, Decimal("0.01")))
    claim = journal.steps.claim_step(fence(run_id, seconds=2), "c")
    assert journal.steps.fail_step(fence(run_id, seconds=2), "c", claim.attempt, {"message": "kaput"})


def frontier_of(*steps: str) -> Callable[[RunRecord, Mapping[str, Any]], Sequence[str]]:
    return lambda _source, _reused: steps


def derive(journal: Journal, *, run_id: str = "d1", kind: SourceKind = SourceKind.RETRY,
           keep: Callable[[str], bool] = lambda _s: True, allowed: tuple[str, ...] = RETRYABLE,
           tenant: str | None = "t1", run_input: Any = None, from_step: str | None = None,
           frontier: Sequence[str] = ("c",), max_in_flight: int | None = None) -> Derived:
    request = DerivedRequest("r1", run_id, kind, from_step, {"x": 1} if run_input is None else run_input,
                             keep=keep, allowed=allowed, tenant_id=tenant)
    return journal.lineage.create_derived_run(request, frontier=frontier_of(*frontier), now=at(10), lease_ttl=TTL,
                                              max_in_flight=max_in_flight)


def test_a_retry_reuses_every_completed_step_marked_with_its_source(journal: Journal) -> None:
    failed_source(journal)
    source_events = kit.events(journal)
    derived = derive(journal)
    assert derived.created and derived.dispatch == ("c",) and derived.reused == ("a", "b")
    run = derived.run
    assert (run.status, run.source_run_id, run.source_kind, run.source_step_id) == (
        RunStatus.QUEUED, "r1", "retry", None)
    assert (run.tenant_id, run.input, run.input_tokens, run.cost_usd) == ("t1", {"x": 1}, 0, Decimal(0))
    events = kit.events(journal, "d1")
    assert [(e.kind, e.step_id, e.attempt) for e in events] == [
        (EventKind.RUN_QUEUED, None, None), (EventKind.RUN_RETRIED, None, None),
        (EventKind.STEP_COMPLETED, "a", None), (EventKind.STEP_COMPLETED, "b", None)]
    assert events[1].payload == {"source_run_id": "r1", "reused_steps": ["a", "b"]}
    seq_of = {e.step_id: e.seq for e in source_events if e.kind == EventKind.STEP_COMPLETED}
    assert events[3].payload == {"output": {"step": "b"}, "reused_from": {
        "run_id": "r1", "seq": seq_of["b"], "attempt": 1, "origin_run_id": "r1"}}  # no usage: not spent here
    assert kit.lock_row(journal, "d1") == {"run_id": "d1", "worker_id": LockHolder.QUEUED,
                                           "expires_at": at(10 + TTL), "generation": 1, "redeliver_at": None}
    assert kit.events(journal) == source_events and journal.runs.get_run("r1").status == RunStatus.FAILED
    assert journal.lineage.derived_runs("r1") == [{"run_id": "d1", "kind": "retry", "status": "queued"}]
    assert journal.lineage.derived_runs("d1") == []


def test_the_new_run_continues_like_any_run_and_a_retry_of_a_retry_names_the_origin(journal: Journal) -> None:
    failed_source(journal)
    derive(journal)
    kit.claim_and_complete(journal, "c", kit.finishing("done"), run_id="d1", seconds=11)
    assert journal.runs.get_run("d1").status == RunStatus.SUCCEEDED
    assert [s for s, _, _ in kit.started(journal, "d1")] == ["c"]  # a and b never started again
    request = DerivedRequest("d1", "d2", SourceKind.FORK, "c", {"x": 1}, keep=lambda s: s != "c",
                             allowed=(RunStatus.SUCCEEDED,))
    journal.lineage.create_derived_run(request, frontier=frontier_of("c"), now=at(20), lease_ttl=TTL)
    reused = {e.step_id: e.payload["reused_from"] for e in kit.events(journal, "d2", EventKind.STEP_COMPLETED)}
    assert set(reused) == {"a", "b"} and reused["a"]["run_id"] == "d1" and reused["a"]["origin_run_id"] == "r1"


def test_a_fork_copies_only_the_steps_it_keeps(journal: Journal) -> None:
    failed_source(journal)
    derived = derive(journal, kind=SourceKind.FORK, keep=lambda s: s == "a", from_step="b",
                     run_input={"x": 2}, frontier=("b",))
    assert derived.reused == ("a",) and derived.run.input == {"x": 2} and derived.run.source_step_id == "b"
    events = kit.events(journal, "d1")
    assert [(e.kind, e.step_id) for e in events] == [
        (EventKind.RUN_QUEUED, None), (EventKind.RUN_FORKED, None), (EventKind.STEP_COMPLETED, "a")]
    assert events[1].payload == {"source_run_id": "r1", "reused_steps": ["a"], "from_step": "b"}


def nothing_written(journal: Journal, before: int) -> None:
    assert not journal.runs.run_exists("d1") and kit.lock_row(journal, "d1") is None
    assert len(kit.events(journal, "d1")) == 0 and len(kit.events(journal)) == before
    assert journal.lineage.derived_runs("r1") == []


@pytest.mark.parametrize(("change", "error"), [
    ({"tenant": "t2"}, RunNotFound),  # another tenant's run looks like none
    ({"allowed": (RunStatus.SUCCEEDED,)}, Refused),  # the source's status is not one the kind takes
    ({"frontier": ()}, Refused),  # nothing to run: refused after the writes, which roll back
    ({"max_in_flight": 1}, QuotaExceeded),
])
def test_a_refused_derivation_writes_nothing(journal: Journal, change: dict[str, Any],
                                             error: type[Exception]) -> None:
    failed_source(journal)
    new_run(journal, "busy")  # one run in flight for the quota
    before = len(kit.events(journal))
    with pytest.raises(error):
        derive(journal, **change)
    nothing_written(journal, before)


def test_an_in_flight_source_and_a_child_run_are_refused(journal: Journal) -> None:
    new_run(journal)
    with pytest.raises(Refused, match="is queued"):
        derive(journal, allowed=(RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED))
    nothing_written(journal, 1)
    new_run(journal, "p1")
    new_run(journal, "c1", parent=("p1", "sub"))
    request = DerivedRequest("c1", "d1", SourceKind.RETRY, None, None, keep=lambda _s: True, allowed=RETRYABLE)
    with pytest.raises(Refused, match="child run"):
        journal.lineage.create_derived_run(request, frontier=frontier_of("x"), now=at(1), lease_ttl=TTL)
    assert not journal.runs.run_exists("d1")


def test_the_same_request_again_is_idempotent_and_another_under_its_id_is_refused(journal: Journal) -> None:
    failed_source(journal)
    first = derive(journal)
    count = len(kit.events(journal, "d1"))
    again = derive(journal, max_in_flight=1)  # its own run again: no quota refusal, nothing new
    assert not again.created and again.run.id == "d1" and again.dispatch == ()
    assert len(kit.events(journal, "d1")) == count and again.run.created_at == first.run.created_at
    with pytest.raises(RunIdReused):
        derive(journal, run_input={"x": 2})
    with pytest.raises(RunIdReused):
        derive(journal, kind=SourceKind.FORK, from_step="c")
    new_run(journal, "theirs", tenant="t2")
    with pytest.raises(RunIdTaken):
        derive(journal, run_id="theirs")
    assert len(kit.events(journal, "d1")) == count and journal.lineage.derived_runs("r1")[0]["run_id"] == "d1"


def test_the_doctor_flags_a_reused_step_outside_a_derived_runs_opening(journal: Journal) -> None:
    new_run(journal, "plain")
    with journal.engine.begin() as conn:
        journal.lineage._append(conn, "plain", "a", None, EventKind.STEP_COMPLETED,
                                {"output": 1, "reused_from": {"run_id": "r0", "seq": 1}}, 1, at(1))
    found = [(v.kind, v.run_id, v.step_id) for v in journal.doctor.violations()]
    assert found == [("reused_out_of_place", "plain", "a")]
    with journal.engine.begin() as conn:  # leave the journal clean for the fixture's check
        conn.exec_driver_sql("DELETE FROM journal_events WHERE run_id = 'plain' AND step_id = 'a'")


def test_recovery_replays_a_derived_run_from_its_reused_steps(journal: Journal) -> None:
    """A derived run whose first messages were lost: the re-drive's plan sees the reused outputs as
    completed steps and resumes only what is left (docs/recovery.md)."""
    failed_source(journal)
    derive(journal)
    seen: list[dict[str, Any]] = []

    def plan(_run: RunRecord, completed: Mapping[str, Any]) -> tuple[str, ...]:
        seen.append(dict(completed))
        return ("c",)

    recovery = journal.recovery.recover_run(run_id="d1", worker_id="sweep", now=at(10 + TTL + 1), lease_ttl=TTL, plan=plan)
    assert recovery is not None and recovery.resumed_steps == ("c",) and recovery.generation == 2
    assert seen == [{"a": {"step": "a"}, "b": {"step": "b"}}]
    kit.claim_and_complete(journal, "c", kit.finishing("done"), run_id="d1", generation=2, seconds=10 + TTL + 2)
    assert journal.runs.get_run("d1").status == RunStatus.SUCCEEDED
