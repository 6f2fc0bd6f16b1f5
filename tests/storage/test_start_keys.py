"""Start keys: a dedupe key gives the run it holds for its window, to its own tenant only; a
debounce key cancels the not-yet-started run of its burst and holds its own run's first lease for the
period; concurrent starts with one key make one run (Postgres)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from pal.core.start_keys import DEBOUNCE, DEDUPE, StartKey
from pal.core.vocabulary import EventKind, LockHolder, RunStatus
from pal.errors import RunIdReused
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at


def start(journal: Journal, run_id: str, key: StartKey, *, seconds: float = 0.0, tenant: str = "t1",
          run_input: Any = None) -> tuple[str, bool]:
    record, created = journal.runs.create_run(
        run_id=run_id, tenant_id=tenant, kind="graph", graph={"nodes": []}, graph_hash="h",
        run_input={"x": 1} if run_input is None else run_input, now=at(seconds), lease_ttl=TTL, start_key=key)
    return record.id, created


def run_ids(journal: Journal) -> list[str]:
    return sorted(r.id for r in journal.runs.list_runs(limit=100))


def test_a_dedupe_key_gives_its_run_within_the_window_and_a_new_run_after(journal: Journal) -> None:
    key = StartKey(DEDUPE, "order-7", 60.0)
    assert start(journal, "r1", key) == ("r1", True)
    assert start(journal, "r2", key, seconds=59, run_input={"other": True}) == ("r1", False)
    assert start(journal, "r1", key, seconds=59) == ("r1", False)  # the same request again
    assert start(journal, "r3", key, seconds=61) == ("r3", True)  # the window lapsed
    assert start(journal, "r4", key, seconds=62) == ("r3", False)
    assert run_ids(journal) == ["r1", "r3"]


def test_a_dedupe_key_is_the_tenants_own(journal: Journal) -> None:
    key = StartKey(DEDUPE, "shared-name", 60.0)
    assert start(journal, "r1", key) == ("r1", True)
    assert start(journal, "r2", key, tenant="t2") == ("r2", True)  # another tenant's key: its own run
    assert start(journal, "r3", StartKey(DEBOUNCE, "shared-name", 60.0)) == ("r3", True)  # another purpose


def test_a_debounce_key_cancels_the_unstarted_run_of_its_burst(journal: Journal) -> None:
    key = StartKey(DEBOUNCE, "customer-9", 30.0)
    assert start(journal, "r1", key) == ("r1", True)
    assert kit.lock_row(journal, "r1")["expires_at"] == at(30)  # held back for the period, not TTL
    queued = kit.events(journal, "r1", EventKind.RUN_QUEUED)[0].payload
    assert queued["debounce"] == {"key": "customer-9", "until": at(30).isoformat()}
    assert start(journal, "r2", key, seconds=10) == ("r2", True)
    first = journal.runs.get_run("r1")
    assert first.status == RunStatus.CANCELLED and first.error["code"] == "debounced"
    assert first.error["superseded_by"] == "r2"
    assert kit.lock_row(journal, "r1") is None
    assert kit.lock_row(journal, "r2")["expires_at"] == at(40)
    assert start(journal, "r3", key, seconds=45) == ("r3", True)  # the burst was over: r2 stands
    assert journal.runs.get_run("r2").status == RunStatus.QUEUED


def test_a_debounced_run_that_has_started_is_not_cancelled(journal: Journal) -> None:
    key = StartKey(DEBOUNCE, "k", 30.0)
    start(journal, "r1", key)
    journal.recovery.recover_orphans(run_ids=["r1"], worker_id="sweeper", now=at(31), lease_ttl=TTL,
                                     plan=lambda run, outputs: ("a",), redeliver_after=60)
    assert kit.lock_row(journal, "r1")["worker_id"] == "sweeper"
    # A start at 29 s by its clock (a skewed API host) still finds r1 started: r1 is kept.
    assert start(journal, "r2", key, seconds=29) == ("r2", True)
    assert journal.runs.get_run("r1").status == RunStatus.QUEUED
    assert kit.lock_row(journal, "r1")["worker_id"] != LockHolder.QUEUED


def test_concurrent_starts_with_one_dedupe_key_make_one_run(pg_admin: sa.Engine) -> None:
    with kit.postgres_journal(pg_admin) as journal:  # SQLite serialises writers: no race to run there
        racing_starts(journal)


def racing_starts(journal: Journal) -> None:
    key = StartKey(DEDUPE, "race", 600.0)
    barrier, got = threading.Barrier(8), []

    def one(n: int) -> None:
        barrier.wait(timeout=30)
        got.append(start(journal, f"r{n}", key))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == 8 and len({run_id for run_id, _ in got}) == 1
    assert [created for _, created in got].count(True) == 1
    assert len(run_ids(journal)) == 1


def test_a_run_id_asked_again_under_a_lapsed_key_is_checked_as_any_run_id(journal: Journal) -> None:
    dedupe = StartKey(DEDUPE, "k", 1.0)
    assert start(journal, "r1", dedupe) == ("r1", True)
    with pytest.raises(RunIdReused):  # the key lapsed: the id's own rule holds (other input: refused)
        start(journal, "r1", dedupe, seconds=5, run_input={"other": True})
    assert start(journal, "r1", dedupe, seconds=5) == ("r1", False)
    debounce = StartKey(DEBOUNCE, "d", 30.0)
    assert start(journal, "r2", debounce) == ("r2", True)
    assert start(journal, "r2", debounce, seconds=1) == ("r2", False)  # the same start again
    assert journal.runs.get_run("r2").status == RunStatus.QUEUED  # not superseded by itself
