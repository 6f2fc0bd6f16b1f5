"""Retention (pal.storage.retention, docs/retention.md): a prune deletes finished run families older
than the cutoff with every row of theirs and nothing else; batches, dry runs, pruned ids and kept
receipts. Each test runs on SQLite and on Postgres, and the journal is clean by `pal doctor` after."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
import sqlalchemy as sa

from pal.config import load_settings
from pal.core.anomalies import Anomaly, AnomalyKind
from pal.core.records import Usage
from pal.core.run_receipt import verify
from pal.core.vocabulary import RunStatus, SourceKind
from pal.engine.retention import PruneTotals, prune_runs
from pal.engine.run_receipts import issue_receipt, trusted_keys
from pal.errors import InputError, ReceiptsOff, RunIdTaken, RunNotFound
from pal.storage.journal import Journal
from pal.storage.lineage import DerivedRequest
from pal.storage.retention import PruneBatch, PruneQuery
from pal.storage.schema import (
    journal_events,
    pruned_runs,
    run_anomalies,
    run_locks,
    runs,
    side_effect_receipts,
)
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run
from tests.storage.test_run_receipts import SETTINGS

CUTOFF = at(100)


def succeeded(journal: Journal, run_id: str, seconds: float, *, tenant: str = "t1",
              parent: tuple[str, str] | None = None, effects: bool = False) -> None:
    """A run that completes step `a` and succeeds at `seconds`; with `effects`, its step claimed a
    delivery receipt and journaled an anomaly first."""
    new_run(journal, run_id, tenant=tenant, seconds=seconds - 1, parent=parent)
    f = fence(run_id, seconds=seconds)
    claim = journal.steps.claim_step(f, "a")
    if effects:
        journal.receipts.claim_receipt(f, key=f"key-{run_id}", step_id="a", attempt=claim.attempt,
                                       effect_kind="webhook", target="https://example.test/hook")
        journal.anomalies.record_anomalies(f, [Anomaly(AnomalyKind.EXCESSIVE_STEPS, 9, 5, "static", "a", "many")])
    journal.steps.complete_step(f, "a", claim.attempt, {"run": run_id}, plan=kit.finishing({"done": run_id}))


def failed(journal: Journal, run_id: str, seconds: float) -> None:
    new_run(journal, run_id, seconds=seconds - 1)
    claim = journal.steps.claim_step(fence(run_id, seconds=seconds), "a")
    assert journal.steps.fail_step(fence(run_id, seconds=seconds), "a", claim.attempt, {"message": "kaput"})


def prune(journal: Journal, cutoff: datetime = CUTOFF, *, batch: int = 500, tenant: str | None = None,
          dry_run: bool = False) -> list[PruneBatch]:
    """Every batch of one prune, as `pal runs prune` walks them."""
    done, cursor, query = [], None, PruneQuery(cutoff, tenant, batch)
    while True:
        found = journal.retention.prune_batch(query, after=cursor, now=at(1000), dry_run=dry_run)
        if found.cursor is None:
            return done
        done.append(found)
        cursor = found.cursor


def rows(journal: Journal, table: sa.Table, run_id: str) -> int:
    column = table.c.id if table is runs else table.c.run_id
    with journal.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(column == run_id)).scalar_one())


def every_row(journal: Journal, run_id: str) -> list[int]:
    return [rows(journal, t, run_id) for t in (runs, journal_events, side_effect_receipts, run_anomalies, run_locks)]


def test_a_prune_deletes_old_finished_runs_with_every_row_of_theirs_and_nothing_else(journal: Journal) -> None:
    succeeded(journal, "old-ok", 10, effects=True)
    failed(journal, "old-failed", 20)
    new_run(journal, "old-cancelled", seconds=29)
    journal.runs.cancel_run(run_id="old-cancelled", now=at(30), by="test", reason=None)
    succeeded(journal, "young", 200)  # finished after the cutoff
    new_run(journal, "queued")  # in flight since long before the cutoff
    new_run(journal, "running")
    journal.steps.claim_step(fence("running"), "a")
    before = {run_id: every_row(journal, run_id) for run_id in ("young", "queued", "running")}
    assert every_row(journal, "old-ok")[:4] == [1, 5, 1, 1]

    batches = prune(journal)

    assert [(b.families, b.runs, b.events, b.skipped) for b in batches] == [(3, 3, 5 + 4 + 2, 0)]
    for gone in ("old-ok", "old-failed", "old-cancelled"):
        assert every_row(journal, gone) == [0, 0, 0, 0, 0]
        with pytest.raises(RunNotFound):
            journal.runs.get_run(gone)
    assert {run_id: every_row(journal, run_id) for run_id in before} == before
    with journal.engine.connect() as conn:
        kept = conn.execute(sa.select(pruned_runs).order_by(pruned_runs.c.run_id)).mappings().all()
    assert [(r["run_id"], r["tenant_id"], r["status"], r["finished_at"], r["receipt"]) for r in kept] == [
        ("old-cancelled", "t1", "cancelled", at(30), None), ("old-failed", "t1", "failed", at(20), None),
        ("old-ok", "t1", "succeeded", at(10), None)]
    assert prune(journal) == []  # nothing left: a second prune finds nothing


def test_a_far_future_cutoff_deletes_every_finished_run_and_only_those(journal: Journal) -> None:
    succeeded(journal, "done", 10)
    new_run(journal, "live")
    batches = prune(journal, datetime(9999, 12, 31, tzinfo=UTC))
    assert sum(b.runs for b in batches) == 1
    assert rows(journal, runs, "done") == 0 and every_row(journal, "live") == [1, 1, 0, 0, 1]


def test_a_family_goes_whole_and_never_while_a_member_is_in_flight(journal: Journal) -> None:
    new_run(journal, "p1", seconds=1)
    succeeded(journal, "p1.c", 5, parent=("p1", "sub"))
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="p1", seconds=8)
    new_run(journal, "p2", seconds=1)
    new_run(journal, "p2.c", seconds=2, parent=("p2", "sub"))  # still queued when p2 ends
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="p2", seconds=9)
    assert journal.runs.get_run("p2").terminal and not journal.runs.get_run("p2.c").terminal
    new_run(journal, "p3", seconds=1)  # in flight; its child finished long ago
    succeeded(journal, "p3.c", 5, parent=("p3", "sub"))

    batches = prune(journal)

    assert [(b.families, b.runs, b.skipped) for b in batches] == [(1, 2, 1)]
    assert rows(journal, runs, "p1") == rows(journal, runs, "p1.c") == 0
    assert [rows(journal, runs, r) for r in ("p2", "p2.c", "p3", "p3.c")] == [1, 1, 1, 1]
    assert len(kit.events(journal, "p2")) == 4 and len(kit.events(journal, "p3.c")) == 4
    journal.runs.cancel_run(run_id="p2.c", now=at(20), by="test", reason=None)  # once all of it ended...
    assert [(b.families, b.runs) for b in prune(journal)] == [(1, 2)]  # ...the family goes


def test_grandchildren_go_with_their_family(journal: Journal) -> None:
    new_run(journal, "g", seconds=1)
    new_run(journal, "g.c", seconds=2, parent=("g", "sub"))
    succeeded(journal, "g.c.c", 5, parent=("g.c", "sub"))
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="g.c", seconds=6)
    kit.claim_and_complete(journal, "a", kit.finishing(), run_id="g", seconds=7)
    assert [(b.families, b.runs) for b in prune(journal)] == [(1, 3)]
    assert [rows(journal, runs, r) for r in ("g", "g.c", "g.c.c")] == [0, 0, 0]


def test_tenant_limits_a_prune_to_that_tenants_runs(journal: Journal) -> None:
    succeeded(journal, "mine", 10, tenant="t1")
    succeeded(journal, "theirs", 10, tenant="t2")
    assert sum(b.runs for b in prune(journal, tenant="t1")) == 1
    assert rows(journal, runs, "mine") == 0 and len(kit.events(journal, "theirs")) == 4


def test_a_derived_run_keeps_its_journal_when_its_source_is_pruned(journal: Journal) -> None:
    failed(journal, "r1", 10)
    with journal.engine.begin() as conn:  # r1 completed a step before it failed: a retry reuses it
        conn.execute(journal_events.update().where(journal_events.c.run_id == "r1",
                                                   journal_events.c.kind == "step_failed")
                     .values(step_id="b"))
    request = DerivedRequest("r1", "d1", SourceKind.RETRY, None, {"x": 1}, keep=lambda _s: True,
                             allowed=(RunStatus.FAILED,), tenant_id="t1")
    derived = journal.lineage.create_derived_run(request, frontier=lambda _s, _r: ("b",), now=at(200), lease_ttl=TTL)
    assert derived.created
    derived_events = kit.events(journal, "d1")

    assert sum(b.runs for b in prune(journal)) == 1  # the source; the derived run is in flight

    assert kit.events(journal, "d1") == derived_events
    assert journal.runs.get_run("d1").source_run_id == "r1"
    with pytest.raises(RunNotFound):  # a retry of the pruned source: no run
        journal.lineage.create_derived_run(DerivedRequest("r1", "d2", SourceKind.RETRY, None, {"x": 1},
                                                  keep=lambda _s: True, allowed=(RunStatus.FAILED,)),
                                   frontier=lambda _s, _r: ("b",), now=at(300), lease_ttl=TTL)
    kit.claim_and_complete(journal, "b", kit.finishing(), run_id="d1", seconds=300)
    assert sum(b.runs for b in prune(journal, at(400))) == 1  # and the derived run, in its turn


def test_batches_walk_every_family_once_and_a_dry_run_writes_nothing(journal: Journal) -> None:
    for n in range(5):
        succeeded(journal, f"r{n}", 10 + n)
    dry = prune(journal, batch=2, dry_run=True)
    assert [(b.families, b.runs, b.events) for b in dry] == [(2, 2, 8), (2, 2, 8), (1, 1, 4)]
    assert all(rows(journal, runs, f"r{n}") == 1 for n in range(5))
    with journal.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(pruned_runs)).scalar_one() == 0
    done = prune(journal, batch=2)
    assert [(b.families, b.runs, b.events) for b in done] == [(b.families, b.runs, b.events) for b in dry]
    assert all(rows(journal, runs, f"r{n}") == 0 for n in range(5))


def test_a_pruned_run_id_is_never_started_again(journal: Journal) -> None:
    succeeded(journal, "r1", 10)
    failed(journal, "src", 20)
    prune(journal, at(15))
    for tenant in ("t1", "t2"):
        with pytest.raises(RunIdTaken, match="run id 'r1' is not available"):
            new_run(journal, "r1", tenant=tenant)
    request = DerivedRequest("src", "r1", SourceKind.RETRY, None, {"x": 1}, keep=lambda _s: True,
                             allowed=(RunStatus.FAILED,), tenant_id="t1")
    with pytest.raises(RunIdTaken):
        journal.lineage.create_derived_run(request, frontier=lambda _s, _r: ("a",), now=at(30), lease_ttl=TTL)
    assert rows(journal, runs, "r1") == 0 and len(kit.events(journal, "src")) == 4


def test_kept_receipts_are_served_for_pruned_runs_and_still_verify(journal: Journal) -> None:
    succeeded(journal, "r1", 10)
    succeeded(journal, "p", 11)
    before = issue_receipt(journal, SETTINGS, "r1")
    reports: list[PruneTotals] = []

    totals = prune_runs(journal, SETTINGS, PruneQuery(at(10.5)), keep_receipts=True, on_batch=reports.append)

    assert (totals.runs, totals.receipts, totals.batches, reports) == (1, 1, 1, [totals])
    assert rows(journal, runs, "r1") == 0
    assert issue_receipt(journal, SETTINGS, "r1") == before
    assert issue_receipt(journal, load_settings({}), "r1", tenant_id="t1") == before  # no key needed
    verified = verify(issue_receipt(journal, SETTINGS, "r1"), trusted_keys(SETTINGS))
    assert (verified.run_id, verified.status, verified.count) == ("r1", "succeeded", 4)
    with pytest.raises(RunNotFound):  # another tenant: no run, as for any unknown id
        issue_receipt(journal, SETTINGS, "r1", tenant_id="t2")
    prune_runs(journal, SETTINGS, PruneQuery(CUTOFF))  # without --keep-receipts: none kept
    with pytest.raises(RunNotFound):
        issue_receipt(journal, SETTINGS, "p")


def test_keep_receipts_without_a_key_and_a_bad_batch_are_refused_before_anything_is_deleted(
        journal: Journal) -> None:
    succeeded(journal, "r1", 10)
    with pytest.raises(ReceiptsOff):
        prune_runs(journal, load_settings({}), PruneQuery(CUTOFF), keep_receipts=True)
    for batch in (0, -1, 10_001, 2**63):
        with pytest.raises(InputError, match="--batch must be between 1 and 10000"):
            prune_runs(journal, SETTINGS, PruneQuery(CUTOFF, batch=batch))
    assert every_row(journal, "r1")[:2] == [1, 4]


def test_totals_stay_true_after_a_prune(journal: Journal) -> None:
    """The doctor's totals and lineage checks (run by the fixture) hold for what remains."""
    new_run(journal, "spent")
    f = fence("spent", seconds=1)
    claim = journal.steps.claim_step(f, "a")
    journal.steps.complete_step(f, "a", claim.attempt, {}, plan=kit.finishing(), usage=Usage(3, 4, Decimal("0.5")))
    succeeded(journal, "young", 200)
    prune(journal)
    assert rows(journal, runs, "spent") == 0 and rows(journal, runs, "young") == 1
