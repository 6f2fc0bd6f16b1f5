"""Admission slots: a limited run is held (no lease to lose, never an orphan) until a pass gives it a
slot, by priority then age; a full concurrency key holds only its own runs; a cancelled held run
waits for nothing; concurrent starts of one tenant never exceed its limit (Postgres)."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from pal.core.admission import Admission, pool_key
from pal.core.vocabulary import LockHolder, RunStatus
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at


def start(journal: Journal, run_id: str, admission: Admission, *, tenant: str = "t1", seconds: float = 0.0,
          graph: dict[str, object] | None = None, admitted_too: list[str] | None = None) -> bool | None:
    record, _ = journal.runs.create_run(
        run_id=run_id, tenant_id=tenant, kind="graph", graph=graph or {"nodes": []}, graph_hash="h",
        run_input={}, now=at(seconds), lease_ttl=TTL, admission=admission, admitted_too=admitted_too)
    return record.admitted


def admit(journal: Journal, limit: int | None, seconds: float = 100.0, tenant: str = "t1") -> list[str]:
    return journal.admission.admit(tenant_id=tenant, tenant_limit=limit, now=at(seconds), lease_ttl=TTL)


def test_a_tenants_runs_past_its_limit_are_held_then_admitted_as_slots_free(journal: Journal) -> None:
    two = Admission(tenant_limit=2)
    assert [start(journal, f"r{n}", two, seconds=n) for n in range(1, 4)] == [True, True, False]
    held = kit.lock_row(journal, "r3")
    assert held is not None and held["worker_id"] == LockHolder.HELD and held["expires_at"] > at(10**9)
    assert journal.runs.get_run("r3").held and not journal.runs.get_run("r1").held
    assert "r3" not in journal.recovery.orphaned_runs(now=at(86_400 * 365), limit=100)  # never an orphan
    assert start(journal, "other", two, tenant="t2") is True  # another tenant: its own slots
    assert admit(journal, 2) == []  # no slot free yet
    assert journal.runs.get_lease("r3") is None  # held: no lease
    journal.runs.cancel_run(run_id="r1", now=at(5), by="test", reason=None)
    # A cancelled run's step may run on until it sees its lease gone: its slot frees one lease later.
    assert admit(journal, 2, seconds=5 + TTL - 1) == []
    assert admit(journal, 2, seconds=5 + TTL) == ["r3"]
    assert kit.lock_row(journal, "r3") == {"run_id": "r3", "worker_id": LockHolder.QUEUED,
                                           "expires_at": at(5 + 2 * TTL), "generation": 1, "redeliver_at": None}
    queued = kit.events(journal, "r3")[0].payload
    assert queued["admission"] == {"priority": 3, "key": None}


def test_held_runs_get_slots_by_priority_then_age(journal: Journal) -> None:
    start(journal, "busy", Admission(tenant_limit=1))
    for n, priority in enumerate((5, 3, 1, 3), start=1):
        assert start(journal, f"p{priority}-{n}", Admission(priority=priority, tenant_limit=1), seconds=n) is False
    order = []
    for finished in ("busy", *["?"] * 3):
        running = finished if finished != "?" else order[-1]
        journal.runs.cancel_run(run_id=running, now=at(20), by="test", reason=None)
        order += admit(journal, 1)
    assert order == ["p1-3", "p3-2", "p3-4", "p5-1"]


def test_a_full_concurrency_key_holds_only_its_own_runs(journal: Journal) -> None:
    graph = {"nodes": [], "concurrency": {"key": "{{ input.c }}", "limit": 1}}
    a, b = Admission(key=pool_key("a", 1), key_limit=1), Admission(key=pool_key("b", 1), key_limit=1)
    assert start(journal, "a1", a, graph=graph) is True
    assert start(journal, "a2", a, graph=graph, seconds=1) is False
    assert start(journal, "b1", b, graph=graph, seconds=2) is True
    assert start(journal, "a-wide", Admission(key=pool_key("a", 2), key_limit=2), seconds=3) is True  # its own pool
    assert start(journal, "free", Admission(), seconds=3) is None  # heeds no limit: not counted
    journal.runs.cancel_run(run_id="b1", now=at(5), by="test", reason=None)
    assert admit(journal, None) == []  # b's slot freed; a is still full
    journal.runs.cancel_run(run_id="a1", now=at(6), by="test", reason=None)
    assert admit(journal, None) == ["a2"]


def test_a_cancelled_held_run_waits_for_nothing_and_a_start_gives_unnoticed_slots(journal: Journal) -> None:
    one = Admission(tenant_limit=1)
    start(journal, "r1", one)
    start(journal, "r2", one, seconds=1)
    start(journal, "r3", one, seconds=2)
    journal.runs.cancel_run(run_id="r2", now=at(3), by="test", reason=None)
    assert journal.runs.get_run("r2").admitted is None and journal.runs.get_run("r2").status == RunStatus.CANCELLED
    journal.runs.cancel_run(run_id="r1", now=at(4), by="test", reason=None)  # its end goes unnoticed
    also: list[str] = []
    assert start(journal, "r4", one, seconds=40, admitted_too=also) is False  # r3 came first
    assert also == ["r3"]


def test_concurrent_starts_never_exceed_the_tenants_limit(pg_admin: sa.Engine) -> None:
    with kit.postgres_journal(pg_admin) as journal:  # SQLite serialises writers: no race there
        barrier, got = threading.Barrier(8), []

        def one(n: int) -> None:
            barrier.wait(timeout=30)
            got.append(start(journal, f"r{n}", Admission(tenant_limit=3)))

        threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(got, key=str) == [False] * 5 + [True] * 3
        with journal.engine.begin() as conn:
            leases = conn.execute(sa.text("SELECT worker_id, count(*) FROM run_locks GROUP BY worker_id")).all()
        assert dict(leases) == {LockHolder.QUEUED: 3, LockHolder.HELD: 5}


def test_a_backlog_on_a_full_key_does_not_hold_back_another_key(journal: Journal) -> None:
    busy = Admission(key=pool_key("busy", 1), key_limit=1)
    start(journal, "k0", busy)
    for n in range(250):  # more than a pass reads: its room and 100 past it
        assert start(journal, f"k{n + 1}", busy, seconds=1 + n / 1000) is False
    assert start(journal, "free-key", Admission(key=pool_key("calm", 1), key_limit=1), seconds=2) is True
