"""Runs: create_run is idempotent for its owner and refused to anyone else or over the quota;
cancel_run ends a run tree once per run; the reads of a run family."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from pal.core.vocabulary import EventKind, LockHolder, RunStatus
from pal.errors import QuotaExceeded, Refused, RunIdReused, RunIdTaken, RunNotFound
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run


def create_again(journal: Journal, run_id: str = "r1", *, tenant: str = "t1", seconds: float = 5.0,
                 parent: tuple[str, str] | None = None, max_in_flight: int | None = None,
                 run_input: Any = None, graph_hash: str | None = None) -> bool:
    """create_run once more (at T0 + `seconds`), by default for new_run's graph and input; whether
    it inserted a run."""
    _, created = journal.runs.create_run(
        run_id=run_id, tenant_id=tenant, kind="graph", graph={"nodes": ["other"]}, graph_hash=graph_hash,
        run_input={"x": 1} if run_input is None else run_input, now=at(seconds), lease_ttl=TTL,
        parent_run_id=parent[0] if parent else None,
        parent_step_id=parent[1] if parent else None, max_in_flight=max_in_flight)
    return created


def test_a_new_run_is_queued_with_its_first_lease(journal: Journal) -> None:
    run = new_run(journal)
    assert (run.status, run.tenant_id, run.input, run.created_at) == (RunStatus.QUEUED, "t1", {"x": 1}, at(0))
    assert (run.cost_usd, run.input_tokens, run.started_at, run.finished_at) == (Decimal(0), 0, None, None)
    assert [(e.kind, e.generation, e.payload) for e in kit.events(journal)] == [
        (EventKind.RUN_QUEUED, 1, {"graph_hash": None})]
    assert kit.lock_row(journal) == {"run_id": "r1", "worker_id": LockHolder.QUEUED, "expires_at": at(TTL),
                                     "generation": 1, "redeliver_at": None}


def test_create_run_is_idempotent_for_the_same_tenant(journal: Journal) -> None:
    new_run(journal)
    lease = kit.lock_row(journal)
    assert not create_again(journal)
    run = journal.runs.get_run("r1")
    assert (run.input, run.graph, run.created_at) == ({"x": 1}, {"nodes": []}, at(0))  # the first call's
    assert len(kit.events(journal)) == 1 and kit.lock_row(journal) == lease
    assert not create_again(journal, run_input={"x": 1.0})  # the same JSON, spelled otherwise


@pytest.mark.parametrize("change", [{"run_input": {"x": 2}}, {"run_input": {"x": 1, "y": None}},
                                    {"graph_hash": "ab" * 32}])
def test_a_run_id_reused_for_another_graph_or_input_is_refused(journal: Journal, change: dict[str, Any]) -> None:
    new_run(journal)
    with pytest.raises(RunIdReused, match="already a run of another graph or input"):
        create_again(journal, **change)
    run = journal.runs.get_run("r1")
    assert (run.input, run.graph_hash) == ({"x": 1}, None) and len(kit.events(journal)) == 1  # nothing written


def test_a_run_id_of_another_owner_is_taken(journal: Journal) -> None:
    new_run(journal)
    new_run(journal, "c1", parent=("r1", "sub"))
    with pytest.raises(RunIdTaken):
        create_again(journal, tenant="t2")
    with pytest.raises(RunIdTaken):  # the same id from another parent step
        create_again(journal, "c1", parent=("r1", "other"))
    assert not create_again(journal, "c1", parent=("r1", "sub"))
    assert journal.runs.get_run("r1").tenant_id == "t1" and len(kit.events(journal)) == 1
    with pytest.raises(RunNotFound):
        journal.runs.get_run("r1", tenant_id="t2")


def test_a_tenant_over_max_in_flight_is_refused(journal: Journal) -> None:
    new_run(journal, "r1", max_in_flight=2)
    new_run(journal, "r2", max_in_flight=2)
    with pytest.raises(QuotaExceeded):
        new_run(journal, "r3", max_in_flight=2)
    assert not journal.runs.run_exists("r3")
    assert not create_again(journal, "r2", max_in_flight=2)  # its own run again: no new run, no refusal
    new_run(journal, "r3", tenant="t2", max_in_flight=2)  # another tenant's quota
    new_run(journal, "c1", parent=("r1", "sub"), max_in_flight=2)  # child runs are the parent's
    journal.runs.cancel_run(run_id="r2", now=at(1), by="op", reason=None)
    new_run(journal, "r4", max_in_flight=2)


def family(journal: Journal) -> None:
    """r1 -> (c1 -> g1), (c2, which has succeeded)."""
    new_run(journal)
    new_run(journal, "c1", seconds=1, parent=("r1", "a"))
    new_run(journal, "c2", seconds=2, parent=("r1", "b"))
    new_run(journal, "g1", seconds=3, parent=("c1", "x"))
    kit.claim_and_complete(journal, "only", kit.finishing("c2 done"), run_id="c2", seconds=4)


def test_cancel_run_cancels_a_run_tree_once_each(journal: Journal) -> None:
    family(journal)
    assert journal.runs.cancel_run(run_id="r1", now=at(10), by="op", reason="enough") == ["r1", "c1", "g1"]
    for run_id in ("r1", "c1", "g1"):
        run = journal.runs.get_run(run_id)
        cancelled_with = None if run_id == "r1" else "r1"
        assert (run.status, run.finished_at) == (RunStatus.CANCELLED, at(10))
        assert [e.payload for e in kit.events(journal, run_id, EventKind.RUN_CANCELLED)] == [
            {"error": {"code": "cancelled", "by": "op", "reason": "enough", "cancelled_with": cancelled_with}}]
        assert kit.lock_row(journal, run_id) is None
    assert journal.runs.get_run("c2").status == RunStatus.SUCCEEDED
    assert kit.events(journal, "c2", EventKind.RUN_CANCELLED) == []
    for run_id in ("r1", "c1", "c2"):
        with pytest.raises(Refused):
            journal.runs.cancel_run(run_id=run_id, now=at(11), by="op", reason=None)
    with pytest.raises(Refused):  # a cancelled parent starts no child runs
        new_run(journal, "c3", seconds=12, parent=("r1", "c"))
    assert len(kit.events(journal, "r1", EventKind.RUN_CANCELLED)) == 1


def test_a_failed_run_cancels_its_unfinished_children(journal: Journal) -> None:
    family(journal)
    assert journal.steps.claim_step(fence(seconds=5), "a").outcome.value == "run"
    assert journal.steps.fail_step(fence(seconds=6), "a", 1, {"code": "boom"})
    assert journal.runs.get_run("r1").status == RunStatus.FAILED
    assert {r: journal.runs.get_run(r).status for r in ("c1", "c2", "g1")} == {
        "c1": RunStatus.CANCELLED, "c2": RunStatus.SUCCEEDED, "g1": RunStatus.CANCELLED}
    assert kit.events(journal, "g1", EventKind.RUN_CANCELLED)[0].payload["error"]["code"] == "parent_failed"
    assert not journal.steps.fail_step(fence(seconds=7), "a", 1, {"code": "again"})
    assert len(kit.events(journal, "r1", EventKind.RUN_FAILED)) == 1


def test_the_reads_of_a_run_family(journal: Journal) -> None:
    family(journal)
    assert [r.id for r in journal.runs.children("r1")] == ["c1", "c2"]
    assert journal.runs.ancestors("g1") == ["c1", "r1"] and journal.runs.ancestors("r1") == []
    assert journal.runs.descendant_count("r1") == 3 and journal.runs.descendant_count("g1") == 0
    assert [r.id for r in journal.runs.list_runs(tenant_id="t1", status=RunStatus.QUEUED)] == ["g1", "c1", "r1"]
    assert [r.id for r in journal.runs.list_runs(limit=2, offset=1)] == ["c2", "c1"]
    assert journal.runs.list_runs(tenant_id="t2") == []
    assert journal.runs.run_exists("g1") and not journal.runs.run_exists("g2")
    with pytest.raises(RunNotFound):
        journal.runs.get_run("g2")
