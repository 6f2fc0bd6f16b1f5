"""The one-call claim and completion (migration 0006) against processes whose step logs are stale.

A process predicts a claim's attempt and a completion's hand-off from the step log it keeps; the
prediction is only used when no newer step event exists. Two Clients on one database stand for two
worker processes: each has its own journal caches. Every test runs on both backends (SQLite always
takes the transactional path, so it checks the expected behaviour itself); the Postgres-only ones
check that the one-call paths are really taken and survive a lost connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2.extras
import pytest
import sqlalchemy as sa

import pal.storage.database
import pal.storage.schema
from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import Fence
from pal.engine.recovery import redrive
from pal.errors import LeaseLost
from tests.conftest import Backend
from tests.support.graphs import branching, counted, edge, flaky, linear
from tests.support.inprocess import Process, two_processes
from tests.support.journal_reads import Counted, started
from tests.support.tools import calls


@pytest.fixture
def two(backend: Backend) -> Iterator[tuple[Process, Process]]:
    yield from two_processes(backend)


def test_a_stale_process_does_not_run_a_step_another_completed(two: tuple[Process, Process],
                                                               counter: Path) -> None:
    a, b = two
    run_id = a.client.start_run(linear(counter, 3), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"  # start, on A
    s0 = a.outbox.pop(0)
    assert b.deliver(s0) == "completed"  # B now keeps a log of the run: start and s0
    s1 = b.outbox.pop(0)
    assert a.deliver(s1) == "completed"  # A runs s1; B's log knows nothing of it
    # A duplicate of s1's message reaches B, whose log predicts attempt 1 of a step it thinks
    # never ran: the newer step_completed must stop the start.
    assert b.deliver(s1) == "completed"
    assert calls(counter) == ["s0", "s1"]
    assert started(a.client, run_id, "s1") == [1]
    while a.outbox:
        a.deliver(a.outbox.pop(0))
    assert a.client.get_run(run_id).status == "succeeded"


def test_a_stale_process_claims_the_attempt_after_a_retry(two: tuple[Process, Process],
                                                          tmp_path: Path) -> None:
    a, b = two
    run_id = a.client.start_run(flaky(tmp_path / "f.log", 1, {"maxAttempts": 3}), {})
    assert b.deliver(a.outbox.pop(0)) == "completed"  # start, on B
    f = b.outbox.pop(0)
    assert a.deliver(f) == "retrying"  # attempt 1 fails on A: step_retrying, B does not know
    assert b.deliver(f) == "completed"  # B's log says attempt 1; the journal says attempt 2
    assert started(a.client, run_id, "f") == [1, 2]
    while b.outbox:
        b.deliver(b.outbox.pop(0))
    assert a.client.get_run(run_id).status == "succeeded"


def diamond(path: Path) -> dict[str, Any]:
    """start -> a, b; a -> c; a and b -> j; c and j -> out (j joins a and b)."""
    nodes = [{"id": "start", "type": "trigger"}, counted("a", path), counted("b", path),
             counted("c", path), counted("j", path),
             {"id": "out", "type": "output", "data": {"value": "{{ nodes.j.output.label }}"}}]
    edges = [edge("start", "a"), edge("start", "b"), edge("a", "c"), edge("a", "j"), edge("b", "j"),
             edge("c", "out"), edge("j", "out")]
    return {"nodes": nodes, "edges": edges}


def test_a_stale_completion_still_dispatches_the_join_it_makes_ready(
    two: tuple[Process, Process], counter: Path
) -> None:
    a, b = two
    run_id = a.client.start_run(diamond(counter), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"
    (_, step_a, generation), step_b = a.outbox.pop(0), a.outbox.pop(0)
    assert {step_a, step_b[1]} == {"a", "b"}
    journal_b = b.client.runtime.journal
    claim = journal_b.steps.claim_step(Fence(run_id, generation, "B", utcnow(), 30), "a")
    assert claim.outcome.value == "run" and claim.run is not None
    assert a.deliver((run_id, "b", generation)) == "completed"  # b completes while a runs on B
    program = b.client.runtime.program_of(claim.run)
    # From B's log (start only) a's completion would dispatch c alone; with b done, j is ready too.
    handoff = journal_b.steps.complete_step(Fence(run_id, generation, "B", utcnow(), 30), "a", claim.attempt, {"label": "a"}, plan=lambda done: program.handoff(done, "a"), frontier=program.redrive_steps)
    assert sorted(handoff.dispatch) == ["c", "j"]
    for step in handoff.dispatch:
        assert b.deliver((run_id, step, generation)) == "completed"
    while b.outbox:
        b.deliver(b.outbox.pop(0))
    assert a.client.get_run(run_id).status == "succeeded"
    assert a.client.get_run(run_id).output == "j"


def test_a_completion_fenced_out_mid_step_is_refused(two: tuple[Process, Process], counter: Path) -> None:
    a, _ = two
    run_id = a.client.start_run(linear(counter, 2), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"
    _, step, generation = a.outbox.pop(0)
    journal = a.client.runtime.journal
    claim = journal.steps.claim_step(Fence(run_id, generation, "zombie", utcnow(), 30), step)
    assert claim.outcome.value == "run" and claim.run is not None
    assert redrive(a.client.runtime, run_id, require_expired=False) is not None
    program = a.client.runtime.program_of(claim.run)
    with pytest.raises(LeaseLost):  # the hand-off (s1) would be a plain dispatch: the one-call path
        journal.steps.complete_step(Fence(run_id, generation, "zombie", utcnow(), 30), step, claim.attempt, {"label": "late"}, plan=lambda done: program.handoff(done, step))
    assert [e for e in a.client.events(run_id) if e.kind == "step_completed" and e.step_id == step] == []


# ------------------------------------------------------------------------------ Postgres only


def test_a_warm_step_is_one_call_to_claim_and_one_to_complete(postgres_backend: Backend,
                                                              counter: Path) -> None:
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 3), {})
        a.deliver(a.outbox.pop(0))
        a.deliver(a.outbox.pop(0))  # s0: this process now knows the run
        counted_calls = Counted(a.client)
        assert a.deliver(a.outbox.pop(0)) == "completed"  # s1
        assert counted_calls.calls == ["claim_step", "complete_step"]
        assert counted_calls.transactions == 0
        assert started(a.client, run_id, "s1") == [1]
        assert [e.step_id for e in a.client.events(run_id) if e.kind == "step_completed"] == [
            "start", "s0", "s1"]
        assert a.client.get_run(run_id).status == "running"
    finally:
        a.client.close()


@pytest.fixture
def two_on_postgres(postgres_backend: Backend) -> Iterator[tuple[Process, Process]]:
    yield from two_processes(postgres_backend)


def lock_of(client: Client, run_id: str) -> tuple[Any, ...]:
    with client.runtime.journal.engine.connect() as conn:
        return tuple(conn.execute(sa.text(
            "SELECT worker_id, expires_at, generation, redeliver_at FROM run_locks WHERE run_id = :r"),
            {"r": run_id}).one())


def test_a_process_whose_log_is_behind_claims_in_one_call(two_on_postgres: tuple[Process, Process],
                                                          counter: Path) -> None:
    """Migration 0019: A's log has not seen s1 complete (B ran it). A's claim of s2 names s1 as
    what it needs, and Postgres checks it: no read of the log first, no transaction."""
    a, b = two_on_postgres
    run_id = a.client.start_run(linear(counter, 4), {})
    a.deliver(a.outbox.pop(0))
    assert a.deliver(a.outbox.pop(0)) == "completed"  # s0 on A: A knows the run up to s0
    assert b.deliver(a.outbox.pop(0)) == "completed"  # s1 on B
    counted_calls = Counted(a.client)
    assert a.deliver(b.outbox.pop(0)) == "completed"  # s2 on A, whose log ends at s0
    assert counted_calls.calls == ["claim_step", "complete_step"]
    assert counted_calls.transactions == 0
    assert started(a.client, run_id, "s2") == [1]
    while a.outbox:
        assert a.deliver(a.outbox.pop(0)) == "completed"
    assert a.client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2", "s3"]


def test_a_process_s_first_claim_of_a_run_is_one_call_after_reading_the_run(
        two_on_postgres: tuple[Process, Process], counter: Path) -> None:
    """B never claimed the run: it reads the run's row (plan, input, parent: they never change)
    outside any fence, a read that writes nothing, then claims in one call, which also brings
    B's log of the run up to date. No claim transaction."""
    a, b = two_on_postgres
    run_id = a.client.start_run(linear(counter, 3), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"  # start on A
    assert a.deliver(a.outbox.pop(0)) == "completed"  # s0 on A
    counted_calls = Counted(b.client)
    assert b.deliver(a.outbox.pop(0)) == "completed"  # s1 on B, its first step of the run
    assert counted_calls.calls == ["claim_step", "complete_step"]
    assert counted_calls.transactions == 1  # the run's row, read
    assert started(a.client, run_id, "s1") == [1]
    assert b.deliver(b.outbox.pop(0)) == "completed"  # s2 on B: its log has start, s0 and s1
    while b.outbox:
        assert b.deliver(b.outbox.pop(0)) == "completed"
    assert a.client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]


def test_a_process_s_first_claim_deep_in_a_long_run_runs_the_step(two: tuple[Process, Process],
                                                                   counter: Path) -> None:
    """A fresh worker re-driven into step 1,499 of a long run (after a crash, say): its log of
    the run is empty, so whether the step is ready cannot be told from it without climbing 1,499
    pending nodes. That climb stops at the local limit (it used to recurse once per node, past
    Python's limit: a RecursionError on every fresh process's claim, so the run never recovered);
    the claim then reads the log and runs the step."""
    a, b = two
    length = 1500
    run_id = a.client.start_run(linear(counter, length), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"  # start
    assert a.deliver(a.outbox.pop(0)) == "completed"  # s0
    a.outbox.clear()
    journal_events = pal.storage.schema.journal_events
    with a.client.runtime.journal.engine.begin() as conn:  # s1 .. s1498 done as s0 was (quicker)
        s0 = conn.execute(sa.select(journal_events).where(journal_events.c.run_id == run_id,
                                                          journal_events.c.step_id == "s0")
                          .order_by(journal_events.c.seq)).mappings().all()
        conn.execute(journal_events.insert(), [
            {k: v for k, v in event.items() if k != "seq"} | {"step_id": f"s{i}"}
            for i in range(1, length - 1) for event in s0])
    assert b.deliver((run_id, f"s{length - 1}", 1)) == "completed"
    assert calls(counter) == ["s0", f"s{length - 1}"]
    assert started(a.client, run_id, f"s{length - 1}") == [1]
    assert b.deliver(b.outbox.pop(0)) == "completed"  # out
    assert a.client.get_run(run_id).status == "succeeded"


def test_a_claim_of_a_run_that_does_not_exist_writes_nothing(two_on_postgres: tuple[Process, Process]) -> None:
    """A doorbell for a run this process never saw and nobody made: the read finds no run, the
    claim's transaction says so, and nothing is written."""
    a, _ = two_on_postgres
    assert a.deliver(("run_nobody_made", "s0", 1)) == "terminal"
    with a.client.runtime.journal.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM journal_events WHERE run_id = 'run_nobody_made'")
                            ).scalar() == 0


def test_a_join_whose_other_branch_another_process_completed_is_claimed_in_one_call(
        two_on_postgres: tuple[Process, Process], counter: Path) -> None:
    a, b = two_on_postgres
    run_id = a.client.start_run(diamond(counter), {})
    a.deliver(a.outbox.pop(0))
    messages = {step: (r, step, g) for r, step, g in a.outbox}
    a.outbox.clear()
    assert b.deliver(messages["b"]) == "completed"  # b on B: its hand-off waits for a
    assert a.deliver(messages["a"]) == "completed"  # a on A, whose log has not seen b
    j = next(m for m in a.outbox if m[1] == "j")
    counted_calls = Counted(a.client)
    assert a.deliver(j) == "completed"
    # The claim in one call (its completion may decide in a transaction: out still waits for c).
    assert counted_calls.calls[0] == "claim_step" and "read_step_log" not in counted_calls.calls
    while a.outbox:
        a.deliver(a.outbox.pop(0))
    assert a.client.get_run(run_id).output == "j"


def test_a_message_ahead_of_its_predecessor_is_refused_with_nothing_written(
        postgres_backend: Backend, counter: Path) -> None:
    """A doorbell for s2 while s1 has not run (a forged or replayed message that passed the
    signature, or one a bug sent early): the server finds s1 incomplete, writes nothing and
    leaves the lease alone; the transaction then refuses the step."""
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 3), {})
        a.deliver(a.outbox.pop(0))
        assert a.deliver(a.outbox.pop(0)) == "completed"  # s0: A knows the run
        _, _, generation = a.outbox[0]  # s1's message, never delivered
        lock = lock_of(a.client, run_id)
        counted_calls = Counted(a.client)
        assert a.deliver((run_id, "s2", generation)) == "not_ready"
        assert counted_calls.calls == ["claim_step"]  # then the transaction decided
        assert started(a.client, run_id, "s2") == []
        assert lock_of(a.client, run_id) == lock  # holder, expiry, generation, redelivery untouched
        assert calls(counter) == ["s0"]
    finally:
        a.client.close()


def test_a_step_after_a_choice_reads_the_log_before_its_claim(two_on_postgres: tuple[Process, Process],
                                                              counter: Path) -> None:
    """What makes `yes` ready is `check`'s output, not only its completion: the plan names no
    steps to check, and a process whose log is behind reads it first, as before migration 0019."""
    a, b = two_on_postgres
    run_id = a.client.start_run(branching(counter), {"big": True})
    a.deliver(a.outbox.pop(0))  # start on A
    assert b.deliver(a.outbox.pop(0)) == "completed"  # check on B
    counted_calls = Counted(a.client)
    assert a.deliver(b.outbox.pop(0)) == "completed"  # yes on A, whose log ends at start
    assert counted_calls.calls == ["read_step_log", "claim_step", "complete_step"]
    while a.outbox:
        a.deliver(a.outbox.pop(0))
    assert a.client.get_run(run_id).output == "big"


def prepared_statements(connection: Any) -> dict[str, int]:
    """The statements prepared in a DBAPI connection's session, with how often each was used."""
    with connection.cursor() as cursor:
        executed(connection, cursor, "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements")
        return dict(cursor.fetchall())


def executed(connection: Any, cursor: Any, statement: str) -> None:
    """Execute on the journal's own connection, which is asynchronous (pal.storage.one_call)."""
    cursor.execute(statement)
    psycopg2.extras.wait_select(connection)


def test_the_step_calls_are_prepared_once_per_connection(postgres_backend: Backend, counter: Path) -> None:
    """Each call is PREPAREd on the connection's first use and then only EXECUTEd: Postgres
    counts one plan use per call and keeps one prepared statement per query."""
    a = Process(postgres_backend)
    try:
        a.client.start_run(linear(counter, 6), {})
        a.deliver(a.outbox.pop(0))
        a.deliver(a.outbox.pop(0))  # s0: this process now knows the run
        counted_calls = Counted(a.client)
        for _ in range(4):  # s1..s4: warm steps, each one claim call and one completion call
            assert a.deliver(a.outbox.pop(0)) == "completed"
        autocommit = a.client.runtime.journal.calls
        assert autocommit is not None
        uses = prepared_statements(autocommit._connection())
        made = {f"pal_{name}": counted_calls.calls.count(name) for name in set(counted_calls.calls)}
        assert made == {"pal_claim_step": 4, "pal_complete_step": 4}
        assert uses["pal_claim_step"] >= 4 and uses["pal_complete_step"] >= 4
        assert set(uses) == set(made)  # one prepared statement per query, not one per call
    finally:
        a.client.close()


@pytest.mark.parametrize("elsewhere", ["statements gone", "names taken"])
def test_a_session_without_our_prepared_calls_runs_them_unprepared(postgres_backend: Backend,
                                                                   counter: Path, elsewhere: str) -> None:
    """Behind a pooler in transaction mode a statement can reach a server session that never saw
    our PREPARE, or one where another client prepared the same name. Simulated behind the
    journal's back on its own connection: the steps still run, one call each, and the connection
    calls the functions unprepared from then on."""
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 5), {})
        autocommit = a.client.runtime.journal.calls
        assert autocommit is not None
        connection = autocommit._connection()

        def prepared() -> list[str]:
            return sorted(prepared_statements(connection))

        others = ["pal_claim_step", "pal_complete_step"]
        if elsewhere == "names taken":  # before this connection's first call
            with connection.cursor() as cursor:
                for name in others:
                    executed(connection, cursor, f"PREPARE {name} AS SELECT 1")
        for _ in range(3):  # start, s0, s1: s1 is a warm step
            assert a.deliver(a.outbox.pop(0)) == "completed"
        if elsewhere == "statements gone":
            assert prepared() == others  # ours, so far
            with connection.cursor() as cursor:
                executed(connection, cursor, "DEALLOCATE ALL")
            others = []
        counted_calls = Counted(a.client)
        while a.outbox:
            assert a.deliver(a.outbox.pop(0)) == "completed"
        assert counted_calls.calls[:2] == ["claim_step", "complete_step"]  # still one call each
        assert autocommit._connection() is connection
        assert prepared() == others  # nothing prepared since
        assert a.client.get_run(run_id).status == "succeeded"
        assert calls(counter) == ["s0", "s1", "s2", "s3", "s4"]
    finally:
        a.client.close()


def test_a_terminated_autocommit_connection_is_replaced_and_the_step_runs(
    postgres_backend: Backend, pg_admin: sa.Engine, counter: Path
) -> None:
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 3), {})
        a.deliver(a.outbox.pop(0))
        a.deliver(a.outbox.pop(0))
        autocommit = a.client.runtime.journal.calls
        assert autocommit is not None
        pid = autocommit._connection().get_backend_pid()
        with pg_admin.connect() as conn:  # as a Postgres restart would, to this one connection
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        while a.outbox:
            assert a.deliver(a.outbox.pop(0)) == "completed"
        assert autocommit._connection().get_backend_pid() != pid
        assert a.client.get_run(run_id).status == "succeeded"
        assert calls(counter) == ["s0", "s1", "s2"]
    finally:
        a.client.close()


def test_disposing_the_engine_closes_the_autocommit_connections(postgres_backend: Backend,
                                                               counter: Path) -> None:
    a = Process(postgres_backend)
    try:
        a.client.start_run(linear(counter, 1), {})
        a.deliver(a.outbox.pop(0))
        a.deliver(a.outbox.pop(0))
        autocommit = a.client.runtime.journal.calls
        assert autocommit is not None
        connection = autocommit._connection()
        assert not connection.closed
        a.client.runtime.journal.engine.dispose()
        assert connection.closed
    finally:
        a.client.close()


def test_the_lease_fence_renews_the_lock_row_in_place(postgres_backend: Backend, pg_admin: sa.Engine,
                                                      counter: Path) -> None:
    """Migration 0007: with no index on `expires_at`, every claim's and completion's lease renewal
    is a heap-only (HOT) update: no new index entries, no index bloat."""
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 5), {})
        with a.client.runtime.journal.engine.connect() as conn:
            schema = conn.execute(sa.text("SELECT current_schema()")).scalar()
        while a.outbox:
            assert a.deliver(a.outbox.pop(0)) == "completed"
        assert a.client.get_run(run_id).status == "succeeded"
    finally:
        a.client.close()  # its backends exit, which flushes their table statistics
    query = sa.text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                    "WHERE schemaname = :schema AND relname = 'run_locks'")
    deadline = time.monotonic() + 10
    with pg_admin.connect() as conn:
        while True:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            updates, hot = conn.execute(query, {"schema": schema}).one()
            if updates >= 12 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert updates >= 12  # a fence per claim and per completion of 6 of the 7 steps at least
    assert hot == updates


def test_the_first_one_call_after_an_idle_pooled_connection_runs(
    postgres_backend: Backend, counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process opens its autocommit connection from the pool at its first one-call claim; a
    pooled connection that sat idle is pinged on checkout first, and the ping must not leave it
    inside a transaction (psycopg2 cannot switch to autocommit there)."""
    monkeypatch.setattr(pal.storage.database, "PING_AFTER_IDLE_SECONDS", 0.0)  # every checkout pings
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(linear(counter, 3), {})
        assert a.deliver(a.outbox.pop(0)) == "completed"  # start: a transaction, no autocommit yet
        counted_calls = Counted(a.client)
        while a.outbox:
            assert a.deliver(a.outbox.pop(0)) == "completed"
        assert "claim_step" in counted_calls.calls
        assert a.client.get_run(run_id).status == "succeeded"
        assert calls(counter) == ["s0", "s1", "s2"]
    finally:
        a.client.close()
