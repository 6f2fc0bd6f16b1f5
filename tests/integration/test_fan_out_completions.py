"""Completions that hand off nothing: a fan-out's branches before the last, beside parked steps.

Such a completion writes nothing but its `step_completed` unless the run must park (a step of it
waits and nothing else is in flight). So on Postgres it is one call of `pal_complete`
when the process's step log shows no parked step that a decision has not ended, and a
transaction asks the journal for waiting steps only when the run's whole log shows one (docs/architecture.md, "The life of one step"). Two
Clients on one database stand for two worker processes, as in test_one_call_steps.py; the tests
that count calls are Postgres only, the others run on both backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pal.core.clock import utcnow
from pal.core.records import Fence
from tests.conftest import Backend
from tests.support.graphs import counted, edge, fan_out_in
from tests.support.inprocess import Process, two_processes
from tests.support.journal_reads import Counted
from tests.support.tools import calls


@pytest.fixture
def two(backend: Backend) -> Iterator[tuple[Process, Process]]:
    yield from two_processes(backend)


def approval_beside_a_tool(counter: Path) -> dict[str, Any]:
    """start -> gate (approval) -[approved]-> after, and start -> tool, in parallel."""
    return {"nodes": [{"id": "start", "type": "trigger"},
                      {"id": "gate", "type": "approval", "data": {"prompt": "go?"}},
                      counted("after", counter), counted("tool", counter)],
            "edges": [edge("start", "gate"), edge("gate", "after", "approved"), edge("start", "tool")]}


def test_a_completion_beside_a_parked_step_parks_the_run(two: tuple[Process, Process], counter: Path) -> None:
    """The tool completes after the gate parked, in the process that parked it: nothing is
    dispatched and only the gate waits, so the completion parks the run."""
    a, _ = two
    run_id = a.client.start_run(approval_beside_a_tool(counter), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"
    assert a.deliver(a.take("gate")) == "waiting"
    assert a.client.get_run(run_id).status == "running"  # the tool is still in flight
    assert a.deliver(a.take("tool")) == "completed"
    assert a.client.get_run(run_id).status == "waiting"
    a.client.approve(run_id, "gate")
    while a.outbox:
        assert a.deliver(a.outbox.pop(0)) == "completed"
    assert a.client.get_run(run_id).status == "succeeded"
    assert sorted(calls(counter)) == ["after", "tool"]


def test_a_completion_whose_log_missed_the_park_still_parks_the_run(two: tuple[Process, Process],
                                                                    counter: Path) -> None:
    """B claimed the tool before A parked the gate, so B's log has no parked step: B's one-call
    completion must find the newer `step_waiting` and decide again in a transaction, which parks
    the run (on SQLite the transaction is the only path)."""
    a, b = two
    run_id = a.client.start_run(approval_beside_a_tool(counter), {})
    assert a.deliver(a.outbox.pop(0)) == "completed"
    _, _, generation = a.take("tool")
    journal_b = b.client.runtime.journal
    claim = journal_b.steps.claim_step(Fence(run_id, generation, "B", utcnow(), 30), "tool")
    assert claim.outcome.value == "run" and claim.run is not None
    assert a.deliver(a.take("gate")) == "waiting"  # parks the gate while the tool runs on B
    program = b.client.runtime.program_of(claim.run)
    counted_calls = Counted(b.client) if b.client.runtime.journal.calls is not None else None
    handoff = journal_b.steps.complete_step(
        Fence(run_id, generation, "B", utcnow(), 30), "tool", claim.attempt, {"value": "tool"},
        plan=lambda done: program.handoff(done, "tool"), frontier=program.redrive_steps)
    if counted_calls is not None:  # Postgres: the one call was tried, then the transaction decided
        assert (counted_calls.calls, counted_calls.transactions) == (["complete_step"], 1)
    assert handoff.dispatch == () and not handoff.finished
    assert a.client.get_run(run_id).status == "waiting"


def test_a_branch_completion_that_hands_off_nothing_is_one_call(postgres_backend: Backend,
                                                                 counter: Path) -> None:
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(fan_out_in(counter, 3), {})
        assert a.deliver(a.outbox.pop(0)) == "completed"
        counted_calls = Counted(a.client)
        assert a.deliver(a.take("b0")) == "completed"
        assert counted_calls.calls == ["claim_step", "complete_step"]
        assert counted_calls.transactions == 0 and not any(m[1] == "join" for m in a.outbox)
        while a.outbox:
            assert a.deliver(a.outbox.pop(0)) == "completed"
        assert a.client.get_run(run_id).status == "succeeded"
        assert sorted(calls(counter)) == ["b0", "b1", "b2", "join"]
    finally:
        a.client.close()


COMPLETE = ("SELECT outcome, seq FROM pal_complete(:run, :generation, 'probe', now() + interval '30 s', "
            ":after, 'b1', 1, '{\"output\": {\"value\": 1}}'::jsonb, now(), NULL::text, NULL::integer, "
            "NULL::jsonb)")


def test_a_stale_one_call_completion_writes_nothing_and_commits_without_a_flush(
        postgres_backend: Backend, counter: Path) -> None:
    """Called with a log older than the run's newest step event, the function appends nothing
    and leaves only the lease's renewal to commit, with synchronous_commit off for it; called
    with the latest log, it appends the completion and commits durably."""
    a = Process(postgres_backend)
    try:
        run_id = a.client.start_run(fan_out_in(counter, 2), {})
        assert a.deliver(a.outbox.pop(0)) == "completed"
        _, _, generation = a.take("b1")
        engine = a.client.runtime.journal.engine
        with engine.connect() as conn:
            latest = conn.execute(sa.text("SELECT max(seq) FROM journal_events WHERE run_id = :r "
                                          "AND kind = 'step_completed'"), {"r": run_id}).scalar_one()
            conn.rollback()
        params = {"run": run_id, "generation": generation}
        with engine.connect() as conn:
            with conn.begin() as tx:
                assert conn.execute(sa.text(COMPLETE), params | {"after": latest - 1}).all() == [("log_moved", None)]
                assert conn.execute(sa.text("SELECT current_setting('synchronous_commit')")).scalar() == "off"
                # What it wrote, seen in its own transaction: the lease's renewal, no event.
                assert conn.execute(sa.text("SELECT count(*) FROM journal_events WHERE run_id = :r "
                                            "AND step_id = 'b1'"), {"r": run_id}).scalar() == 0
                assert conn.execute(sa.text("SELECT worker_id FROM run_locks WHERE run_id = :r"),
                                    {"r": run_id}).scalar() == "probe"
                tx.rollback()
            with conn.begin() as tx:
                [(outcome, seq)] = conn.execute(sa.text(COMPLETE), params | {"after": latest}).all()
                assert outcome == "completed" and seq > latest
                assert conn.execute(sa.text("SELECT current_setting('synchronous_commit')")).scalar() == "on"
                tx.rollback()
        assert [e for e in a.client.events(run_id) if e.step_id == "b1" and e.kind == "step_completed"] == []
    finally:
        a.client.close()
