"""The orphan sweep, manual resume and lease fencing, with time passed in as an input."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import Fence, Recovery
from pal.engine.recovery import RECOVERY_LEASE_SECONDS, ResumeRefused, redrive, resume, sweep
from pal.engine.steps import execute_step
from pal.storage.schema import run_locks, runs
from tests.conftest import Backend
from tests.support.graphs import linear, single
from tests.support.tools import calls

Message = tuple[str, str, int]


@pytest.fixture
def outbox(client: Client) -> list[Message]:
    sent: list[Message] = []
    client.runtime.publish = lambda *m, countdown=0.0: sent.append(m)
    return sent


def test_sweep_re_drives_an_orphan_once(client: Client, outbox: list[Message], counter: Path) -> None:
    run_id = client.start_run(linear(counter, 3), {})
    execute_step(client.runtime, *outbox.pop(0))  # the trigger
    execute_step(client.runtime, *outbox.pop(0))  # s0
    outbox.clear()  # the message for s1 is lost
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None
    assert sweep(client.runtime, now=lease.expires_at - timedelta(seconds=1)).found == 0
    after_expiry = lease.expires_at + timedelta(seconds=1)
    report = sweep(client.runtime, now=after_expiry)
    assert report.found == 1
    assert report.recovered[run_id] == Recovery(generation=2, resumed_steps=("s1",))
    assert outbox == [(run_id, "s1", 2)]
    new_lease = client.runtime.journal.runs.get_lease(run_id)
    assert new_lease is not None and new_lease.generation == 2
    assert new_lease.expires_at == after_expiry + timedelta(seconds=RECOVERY_LEASE_SECONDS)
    # An overlapping pass at the same moment finds the fresh lease and does nothing.
    assert sweep(client.runtime, now=after_expiry).recovered == {}
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]
    recovered = [e.payload for e in client.events(run_id) if e.kind == "run_recovered"]
    assert recovered == [{"generation": 2, "resumed_steps": ["s1"]}]


def test_racing_sweepers_produce_exactly_one_redrive(backend: Backend, counter: Path) -> None:
    """Eight threads, each with its own runtime and connections, steal the same expired lease."""
    clients = [Client(backend.settings) for _ in range(8)]
    sent: list[Message] = []
    for c in clients:
        c.runtime.publish = lambda *m, countdown=0.0: sent.append(m)
    run_ids = [clients[0].start_run(linear(counter, 1), {}) for _ in range(3)]
    sent.clear()
    later = utcnow() + timedelta(hours=1)
    barrier = threading.Barrier(len(clients))
    results: list[dict[str, Recovery]] = []

    def race(c: Client) -> None:
        barrier.wait()
        results.append(sweep(c.runtime, now=later).recovered)

    threads = [threading.Thread(target=race, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [run_id for result in results for run_id in result]
    assert sorted(winners) == sorted(run_ids)
    assert sorted(sent) == sorted((r, "start", 2) for r in run_ids)
    for run_id in run_ids:
        kinds = [e.kind for e in clients[0].events(run_id)]
        assert kinds.count("run_recovered") == 1
    for c in clients:
        c.close()


def test_resume_refuses_a_busy_live_lease_and_a_finished_run(client: Client, outbox: list[Message],
                                                             counter: Path) -> None:
    run_id = client.start_run(linear(counter, 1), {})
    # A worker is running the trigger under the live lease.
    client.runtime.journal.steps.claim_step(Fence(run_id, 1, "w1", utcnow(), 30), "start")
    with pytest.raises(ResumeRefused, match="its lease is live"):
        resume(client.runtime, run_id)
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None
    recovery = resume(client.runtime, run_id, now=lease.expires_at + timedelta(seconds=1))
    assert recovery.resumed_steps == ("start",)
    outbox.clear()
    outbox.append((run_id, "start", recovery.generation))
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    before = client.events(run_id)
    with pytest.raises(ResumeRefused, match="is succeeded; there is nothing to resume"):
        resume(client.runtime, run_id)
    assert client.events(run_id) == before


def test_zombie_worker_is_fenced_out(client: Client, outbox: list[Message], counter: Path) -> None:
    """A worker whose lease was stolen mid-step cannot complete it, even when it wakes up later."""
    run_id = client.start_run(linear(counter, 1), {})
    execute_step(client.runtime, *outbox.pop(0))
    _, step, old_generation = outbox.pop(0)
    journal = client.runtime.journal
    claim = journal.steps.claim_step(Fence(run_id, old_generation, "zombie", utcnow(), 30), step)
    assert claim.outcome.value == "run"
    stolen = redrive(client.runtime, run_id, require_expired=False)
    assert stolen is not None
    from pal.core.records import Handoff
    from pal.errors import LeaseLost

    with pytest.raises(LeaseLost):
        journal.steps.complete_step(Fence(run_id, old_generation, "zombie", utcnow(), 30), step, 1, "late", plan=lambda done: Handoff((), False))
    assert not journal.steps.fail_step(Fence(run_id, old_generation, "zombie", utcnow(), 30), step, 1, {"type": "X", "message": "late"})
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    completed = [e for e in client.events(run_id) if e.kind == "step_completed" and e.step_id == step]
    assert [(e.generation, e.payload["output"]["label"]) for e in completed] == [(2, "s0")]
    assert client.get_run(run_id).status == "succeeded"


def test_orphan_query_uses_the_in_flight_index(postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings)
    engine = client.runtime.journal.engine
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO runs (id, tenant_id, kind, status, tier, cost_usd, input_tokens, output_tokens,"
            " created_at) SELECT 'done-' || g, 't', 'graph', 'succeeded', 'shared', 0, 0, 0, now()"
            " FROM generate_series(1, 20000) g"))
        conn.execute(sa.text(
            "INSERT INTO runs (id, tenant_id, kind, status, tier, cost_usd, input_tokens, output_tokens,"
            " created_at) SELECT 'live-' || g, 't', 'graph', 'running', 'shared', 0, 0, 0, now()"
            " FROM generate_series(1, 5) g"))
        conn.execute(sa.text("ANALYZE runs"))
        conn.execute(sa.text("ANALYZE run_locks"))
    query = client.runtime.journal.recovery.orphan_query(now=utcnow(), limit=20)
    compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        plan = "\n".join(conn.execute(sa.text(f"EXPLAIN {compiled}")).scalars())
    assert "ix_runs_in_flight" in plan, plan
    assert len(client.runtime.journal.recovery.orphaned_runs(now=utcnow(), limit=20)) == 5
    client.close()


def test_unclaimed_recovery_is_sent_again_with_doubling_waits(client: Client, outbox: list[Message],
                                                                counter: Path) -> None:
    """A recovery's messages that no worker claims (lost in a Redis flush) are sent again, same
    generation, after lease + interval and then at doubling waits, never past the recovery lease;
    the first claim under the recovery stops the resends."""
    run_id = client.start_run(linear(counter, 2), {})
    execute_step(client.runtime, *outbox.pop(0))  # the trigger
    outbox.clear()  # the message for s0 is lost
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None
    stolen_at = lease.expires_at + timedelta(seconds=1)
    assert sweep(client.runtime, now=stolen_at).recovered[run_id].generation == 2
    assert outbox == [(run_id, "s0", 2)]
    outbox.clear()  # lost again: no worker will ever claim it
    settings = client.runtime.settings
    gap = timedelta(seconds=settings.lease_ttl + settings.recovery_interval)
    assert sweep(client.runtime, now=stolen_at + gap - timedelta(seconds=1)).redelivered == {}
    first = sweep(client.runtime, now=stolen_at + gap + timedelta(seconds=1))
    assert first.redelivered == {run_id: Recovery(generation=2, resumed_steps=("s0",))}
    assert first.recovered == {} and outbox == [(run_id, "s0", 2)]
    outbox.clear()
    # The next resend waits as long as the run has already idled since the steal (doubling).
    idle = gap + timedelta(seconds=1)
    assert sweep(client.runtime, now=stolen_at + 2 * idle - timedelta(seconds=1)).redelivered == {}
    assert run_id in sweep(client.runtime, now=stolen_at + 2 * idle + timedelta(seconds=1)).redelivered
    kinds = [e.kind for e in client.events(run_id)]
    assert kinds.count("run_redelivered") == 2 and kinds.count("run_recovered") == 1
    # A worker claims the resent message: no more resends, and the run finishes on generation 2.
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    assert sweep(client.runtime, now=stolen_at + timedelta(seconds=RECOVERY_LEASE_SECONDS - 1)).redelivered == {}
    assert calls(counter) == ["s0", "s1"]


def test_a_claimed_recovery_is_not_sent_again(client: Client, outbox: list[Message], counter: Path) -> None:
    run_id = client.start_run(linear(counter, 2), {})
    outbox.clear()  # the trigger's message is lost
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None
    stolen_at = lease.expires_at + timedelta(seconds=1)
    sweep(client.runtime, now=stolen_at)
    claim = client.runtime.journal.steps.claim_step(Fence(run_id, 2, "w1", stolen_at, RECOVERY_LEASE_SECONDS), "start")
    assert claim.outcome.value == "run"
    later = stolen_at + timedelta(seconds=RECOVERY_LEASE_SECONDS - 1)
    assert sweep(client.runtime, now=later).redelivered == {}


def test_a_step_that_outlives_its_lease_keeps_it_renewed(backend: Backend) -> None:
    """A 4.5 s step under a 1.5 s lease: the process's lease keeper renews it every 0.5 s, so a
    sweep at any moment meanwhile finds nothing to steal, and the step completes on generation 1."""
    client = Client(dataclasses.replace(backend.settings, lease_ttl=1.5))
    sent: list[Message] = []
    client.runtime.publish = lambda *m, countdown=0.0: sent.append(m)
    run_id = client.start_run(single({"id": "slow", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 4.5}}}), {})
    execute_step(client.runtime, *sent.pop(0))  # the trigger
    step = threading.Thread(target=execute_step, args=(client.runtime, *sent.pop(0)))
    step.start()
    expiries = set()
    while step.is_alive():
        lease = client.runtime.journal.runs.get_lease(run_id)
        assert lease is not None
        expiries.add(lease.expires_at)
        assert sweep(client.runtime).found == 0
        step.join(timeout=0.25)
    assert len(expiries) >= 4  # the claim's expiry and at least three renewals
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    events = client.events(run_id)
    assert client.get_run(run_id).status == "succeeded"
    assert "run_recovered" not in [e.kind for e in events]
    assert {e.generation for e in events if e.step_id == "slow"} == {1}
    client.close()


def test_a_run_that_finished_after_the_sweep_read_it_gets_no_lease_back(
        client: Client, outbox: list[Message], counter: Path) -> None:
    """The race on purpose: the sweep read the run while it was running, then its last step finished
    (dropping the lease) before the steal. The steal must not give a finished run a lock row."""
    run_id = client.start_run(linear(counter, 1), {})
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    journal = client.runtime.journal
    finished = journal.runs.get_run(run_id)
    assert finished.status == "succeeded"
    stale = dataclasses.replace(finished, status="running")  # what the sweep saw a moment earlier
    journal.recovery._run = lambda _conn, _run_id: stale  # type: ignore[method-assign,assignment]
    assert redrive(client.runtime, run_id, require_expired=False) is None
    del journal.recovery._run
    with journal.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(run_locks)
                            .where(run_locks.c.run_id == run_id)).scalar() == 0
    assert "run_recovered" not in [e.kind for e in client.events(run_id)]
    assert journal.doctor.violations() == []


def test_a_pass_publishes_every_re_driven_message_through_the_real_broker(backend: Backend,
                                                                         counter: Path) -> None:
    """The pass's messages go out in one batch at its end (a Redis pipeline; the filesystem
    transport publishes at once): each reaches a real worker, which finishes the run."""
    from tests.support.workers import in_process_worker

    client = Client(backend.settings)
    try:
        run_ids = [client.start_run(linear(counter, 1), {"n": n}) for n in range(3)]
        lease = client.runtime.journal.runs.get_lease(run_ids[-1])
        assert lease is not None
        report = sweep(client.runtime, now=lease.expires_at + timedelta(seconds=1))
        assert sorted(report.recovered) == sorted(run_ids)
        with in_process_worker(client):
            finished = [client.wait(run_id, timeout=60) for run_id in run_ids]
        assert [run.status for run in finished] == ["succeeded"] * 3
        for run_id in run_ids:
            started = [e.generation for e in client.events(run_id) if e.kind == "step_started"]
            assert started and set(started) == {2}  # the generation-1 triggers were dropped as stale
        assert sorted(calls(counter)) == ["s0"] * 3
    finally:
        client.close()


def _orphans(client: Client, outbox: list[Message], counter: Path, count: int) -> list[str]:
    """`count` runs whose trigger message was lost: in flight, with a lease that will expire."""
    run_ids = [client.start_run(linear(counter, 1), {"n": n}) for n in range(count)]
    outbox.clear()
    return run_ids


def _transactions_of_a_pass(client: Client, now: Any) -> tuple[int, Any]:
    began: list[int] = []

    def count(*_: Any) -> None:
        began.append(1)

    sa.event.listen(client.runtime.journal.engine, "begin", count)
    try:
        report = sweep(client.runtime, now=now)
    finally:
        sa.event.remove(client.runtime.journal.engine, "begin", count)
    return len(began), report


def test_a_pass_re_drives_all_its_orphans_in_one_transaction(client: Client, outbox: list[Message],
                                                            counter: Path) -> None:
    one = _orphans(client, outbox, counter, 1)
    later = utcnow() + timedelta(seconds=client.runtime.settings.lease_ttl + 1)
    with_one, report = _transactions_of_a_pass(client, later)
    assert list(report.recovered) == one
    sent = list(outbox)
    five = _orphans(client, outbox, counter, 5)
    with_five, report = _transactions_of_a_pass(client, later + timedelta(seconds=1))
    assert sorted(report.recovered) == sorted(five)
    assert with_five == with_one  # not one transaction per orphan
    outbox[:0] = sent
    assert sorted(run_id for run_id, _, _ in outbox) == sorted(one + five)
    for run_id in five:
        recovered = [e.payload for e in client.events(run_id) if e.kind == "run_recovered"]
        assert recovered == [{"generation": 2, "resumed_steps": ["start"]}]
    while outbox:
        execute_step(client.runtime, *outbox.pop(0))
    assert {client.get_run(r).status for r in one + five} == {"succeeded"}
    assert client.runtime.journal.doctor.violations() == []


def test_an_orphan_whose_plan_cannot_be_made_does_not_hold_up_the_others(
        client: Client, outbox: list[Message], counter: Path) -> None:
    run_ids = _orphans(client, outbox, counter, 3)
    poisoned = run_ids[1]
    with client.runtime.journal.engine.begin() as conn:  # a plan this version can no longer parse
        conn.execute(sa.update(runs).where(runs.c.id == poisoned)
                     .values(graph={"nodes": "not a list"}, graph_hash="0" * 64))
    later = utcnow() + timedelta(seconds=client.runtime.settings.lease_ttl + 1)
    report = sweep(client.runtime, now=later)
    assert sorted(report.recovered) == sorted(r for r in run_ids if r != poisoned)
    lease = client.runtime.journal.runs.get_lease(poisoned)
    assert lease is not None and lease.generation == 1  # untouched: the next pass tries again
    assert "run_recovered" not in [e.kind for e in client.events(poisoned)]


def test_a_batch_gives_no_lease_back_to_a_run_that_finished_after_it_was_read(
        client: Client, outbox: list[Message], counter: Path) -> None:
    """The race on purpose: the batch read the runs as in flight, then one of them finished and
    dropped its lock row before the steal. The steal must not give that run a lock row back."""
    run_ids = _orphans(client, outbox, counter, 2)
    finishing = run_ids[0]
    journal = client.runtime.journal
    with journal.engine.begin() as conn:
        conn.execute(sa.delete(run_locks).where(run_locks.c.run_id == finishing))

    finished: list[str] = []

    def finish_first(_conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if not finished and statement.lstrip().upper().startswith("INSERT INTO RUN_LOCKS"):
            finished.append(finishing)  # on the batch's own connection, just before its steal
            cursor.execute(f"UPDATE runs SET status = 'succeeded' WHERE id = '{finishing}'")

    sa.event.listen(journal.engine, "before_cursor_execute", finish_first)
    later = utcnow() + timedelta(seconds=client.runtime.settings.lease_ttl + 1)
    try:
        recoveries = journal.recovery.recover_orphans(run_ids=run_ids, worker_id="recovery:test", now=later,
                                                      lease_ttl=RECOVERY_LEASE_SECONDS,
                                                      plan=lambda run, done: ("start",), redeliver_after=60)
    finally:
        sa.event.remove(journal.engine, "before_cursor_execute", finish_first)
    assert finished == [finishing]
    assert list(recoveries) == [run_ids[1]]
    assert journal.runs.get_lease(finishing) is None
    assert "run_recovered" not in [e.kind for e in client.events(finishing)]
