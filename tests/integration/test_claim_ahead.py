"""A completion that also claims the one successor its own worker takes back (migration 0020).

A solo worker publishes a step's only successor and takes that message straight back; its
completion then starts the successor's attempt in the same transaction, and its next claim of that
step, at that generation, needs no statement. These tests stand a Client for such a worker: its
`RunsNext` records the messages it took back (a real solo worker's chain is in
tests/e2e/test_inline_steps.py). Postgres only: SQLite has no one-call completion, and claims as
before.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import pal.storage.steps
from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import ClaimAhead, Fence
from pal.engine.recovery import redrive
from pal.engine.steps import execute_step
from pal.errors import LeaseLost
from tests.conftest import Backend
from tests.support.graphs import counted, edge, flaky, linear
from tests.support.journal_reads import Counted, started, step_transactions
from tests.support.tools import calls

Message = tuple[str, str, int]  # a doorbell: run, step, generation


class TakingWorker:
    """A Client standing for a solo worker whose every hand-off may take its message back."""

    def __init__(self, backend: Backend, *, takes: bool = True) -> None:
        self.client = Client(backend.settings)
        self.outbox: list[Message] = []  # published to the queue, for anyone
        self.taken: list[Message] = []  # published and taken back, for this worker to run next
        self.takes = takes
        self.takes_back = True  # False: the publish fell back to the queue (no message taken back)
        self.aheads: dict[Message, ClaimAhead] = {}  # a taken message's claim, as an OwnMessage carries it
        self.client.runtime.publish = lambda run_id, step_id, generation, countdown=0.0: (
            self.outbox.append((run_id, step_id, generation)))

    def may_claim(self) -> bool:
        return self.takes

    def ring(self, run_id: str, step_id: str, generation: int, prepared: object = None) -> None:
        self.outbox.append((run_id, step_id, generation))

    def ring_own(self, run_id: str, step_id: str, generation: int, prepared: object = None,
                 ahead: ClaimAhead | None = None) -> bool:
        message = (run_id, step_id, generation)
        (self.taken if self.takes_back else self.outbox).append(message)
        if self.takes_back and ahead is not None:
            self.aheads[message] = ahead
        return self.takes_back

    def deliver(self, message: Message) -> str:
        """Run a message as its worker would: a taken one with the claim it carries."""
        return execute_step(self.client.runtime, *message, ahead=self.aheads.pop(message, None),
                            runs_next=self).outcome

    def deliver_from_queue(self, message: Message) -> str:
        """Run a message as any worker that took it from the queue would: with no claim ahead."""
        return execute_step(self.client.runtime, *message).outcome


@pytest.fixture
def worker(postgres_backend: Backend) -> Iterator[TakingWorker]:
    w = TakingWorker(postgres_backend)
    yield w
    w.client.close()


def test_a_completion_starts_the_successor_its_worker_takes_back(worker: TakingWorker,
                                                                 counter: Path) -> None:
    run_id = worker.client.start_run(linear(counter, 3), {})
    assert worker.deliver(worker.outbox.pop(0)) == "completed"  # start: claims s0 as it completes
    assert worker.outbox == [] and worker.taken == [(run_id, "s0", 1)]
    counted_calls = Counted(worker.client)
    assert worker.deliver(worker.taken.pop(0)) == "completed"  # s0: no claim statement at all
    assert counted_calls.calls == ["complete_step"]
    assert counted_calls.transactions == 0
    while worker.taken:
        worker.deliver(worker.taken.pop(0))
    assert worker.client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]
    events = step_transactions(worker.client, run_id)
    # Each successor's step_started is in its predecessor's completion's transaction, right after it.
    for (xmin, kind, step), (next_xmin, next_kind, next_step) in itertools.pairwise(events):
        if kind == "step_completed" and step != "out":
            assert next_kind == "step_started" and next_xmin == xmin, (step, next_step)
    assert [step for _, kind, step in events if kind == "step_started"] == ["start", "s0", "s1", "s2", "out"]


def test_a_claimed_step_is_not_run_by_another_worker_nor_twice(postgres_backend: Backend,
                                                               worker: TakingWorker, counter: Path) -> None:
    """A genuine duplicate of the taken message, delivered to another worker before the claiming
    worker runs it, finds the step started: nothing runs, nothing is written."""
    other = TakingWorker(postgres_backend, takes=False)
    try:
        run_id = worker.client.start_run(linear(counter, 2), {})
        worker.deliver(worker.outbox.pop(0))
        s0 = worker.taken.pop(0)
        before = step_transactions(worker.client, run_id)
        assert other.deliver(s0) == "duplicate"
        assert step_transactions(worker.client, run_id) == before and calls(counter) == []
        assert worker.deliver(s0) == "completed"
        assert worker.deliver(s0) == "completed"  # a second copy: the step is done, nothing runs
        assert calls(counter) == ["s0"] and started(worker.client, run_id, "s0") == [1]
    finally:
        other.client.close()


def test_a_claim_ahead_lost_with_its_message_is_recovered(worker: TakingWorker, counter: Path) -> None:
    """The claim ahead travels only with the message taken back: if that message is lost (never
    run), the claim is lost with it, the step stays started, as if the worker had died after its
    completion, and the re-drive after its lease runs it once, with the same attempt."""
    first = worker.client.start_run(linear(counter, 2), {})
    second = worker.client.start_run(linear(counter, 2), {})
    worker.deliver(worker.outbox.pop(0))  # first's start: claims first's s0
    lost = worker.taken.pop(0)
    worker.aheads.pop(lost)  # the in-memory message, and its claim, are gone
    worker.takes = False
    assert worker.deliver(worker.outbox.pop(0)) == "completed"  # second's start, claimed in the journal
    assert worker.deliver(lost) == "duplicate"  # another copy of the step's message: the journal decides
    assert calls(counter) == []
    worker.takes = True
    recovery = redrive(worker.client.runtime, first, require_expired=False)  # as after its lease
    assert recovery is not None and recovery.resumed_steps == ("s0",)
    while worker.outbox or worker.taken:
        worker.deliver((worker.taken or worker.outbox).pop(0))
    assert worker.client.get_run(first).status == "succeeded"
    assert started(worker.client, first, "s0") == [1, 1]  # generation 1's start, resumed by 2
    assert sorted(calls(counter)) == ["s0", "s0", "s1", "s1"]  # once per run
    assert worker.client.get_run(second).status == "succeeded"


def test_a_claim_ahead_never_runs_under_another_generation(worker: TakingWorker, counter: Path) -> None:
    """A message of the claimed step at a newer generation (a re-drive) is not answered from the
    claim ahead: it claims in the journal under its own fence."""
    run_id = worker.client.start_run(linear(counter, 2), {})
    worker.deliver(worker.outbox.pop(0))
    _, step, generation = worker.taken.pop(0)
    assert redrive(worker.client.runtime, run_id, require_expired=False) is not None
    newer = worker.outbox.pop(0)
    assert newer == (run_id, step, generation + 1)
    counted_calls = Counted(worker.client)
    assert worker.deliver(newer) == "completed"
    assert counted_calls.calls[0] != "complete_step"  # it claimed first, in the journal
    assert started(worker.client, run_id, step) == [1, 1]


def fan_out(path: Path) -> dict[str, Any]:
    nodes = [{"id": "start", "type": "trigger"}, counted("a", path), counted("b", path),
             {"id": "out", "type": "output", "data": {"value": "{{ nodes.a.output.value }}"}}]
    return {"nodes": nodes, "edges": [edge("start", "a"), edge("start", "b"), edge("a", "out"),
                                      edge("b", "out")]}


def test_nothing_is_claimed_ahead_of_a_fan_out_a_retry_or_a_worker_that_does_not_take(
        postgres_backend: Backend, worker: TakingWorker, counter: Path, tmp_path: Path) -> None:
    run_id = worker.client.start_run(fan_out(counter), {})
    worker.deliver(worker.outbox.pop(0))
    assert sorted(step for _, step, _ in worker.outbox) == ["a", "b"] and worker.taken == []
    assert started(worker.client, run_id, "a") == started(worker.client, run_id, "b") == []

    worker.outbox.clear()
    retried = worker.client.start_run(flaky(tmp_path / "f.log", 1, {"maxAttempts": 2, "backoffMs": 0}), {})
    worker.deliver(worker.outbox.pop(0))
    assert worker.deliver(worker.taken.pop(0)) == "retrying"  # f's first attempt
    assert worker.taken == [] and worker.outbox == [(retried, "f", 1)]  # the retry is not claimed
    assert started(worker.client, retried, "f") == [1]

    idle = TakingWorker(postgres_backend, takes=False)
    try:
        plain = idle.client.start_run(linear(counter, 1), {})
        idle.deliver(idle.outbox.pop(0))
        assert idle.taken == [] and [m[1] for m in idle.outbox] == ["s0"]
        assert started(idle.client, plain, "s0") == []
    finally:
        idle.client.close()


def test_a_fenced_out_completion_claims_nothing(worker: TakingWorker, counter: Path) -> None:
    run_id = worker.client.start_run(linear(counter, 2), {})
    worker.deliver(worker.outbox.pop(0))
    worker.deliver(worker.taken.pop(0))  # s0; s1 claimed ahead
    journal = worker.client.runtime.journal
    ahead = worker.aheads[(run_id, "s1", 1)]
    claim = journal.steps.claim_step(Fence(run_id, 1, "w", utcnow(), 30), "s1", ahead=ahead)  # the claim ahead
    assert claim.run is not None
    program = worker.client.runtime.program_of(claim.run)
    with journal.engine.begin() as conn:  # another generation takes the lease
        conn.execute(sa.text("UPDATE run_locks SET generation = 7 WHERE run_id = :r"), {"r": run_id})
    before = step_transactions(worker.client, run_id)
    with pytest.raises(LeaseLost):
        journal.steps.complete_step(Fence(run_id, 1, "w", utcnow(), 30), "s1", claim.attempt, {"value": 1},
                                    plan=lambda done: program.handoff(done, "s1"), claim_next=True)
    assert step_transactions(worker.client, run_id) == before


def test_a_worker_busy_with_a_hundred_runs_still_claims_each_in_one_call(worker: TakingWorker,
                                                                        counter: Path) -> None:
    """Each run's step log stays in the process (OUTPUT_CACHE_RUNS): the claim of the first of a
    hundred runs this worker has stepped is one call, not a transaction that reads its whole log."""
    worker.takes = False
    runs = [worker.client.start_run(linear(counter, 2), {}) for _ in range(100)]
    starts = list(worker.outbox)
    worker.outbox.clear()
    for message in starts:
        assert worker.deliver(message) == "completed"
    counted_calls = Counted(worker.client)
    assert worker.outbox[0][0] == runs[0]
    assert worker.deliver(worker.outbox[0]) == "completed"
    assert counted_calls.calls == ["claim_step", "complete_step"]
    assert counted_calls.transactions == 0


def test_a_claim_ahead_is_not_answered_late_in_another_thread_or_after_a_fallen_back_publish(
        worker: TakingWorker, counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim ahead answers only the claim of the message taken back with it, soon after the
    completion's fence; otherwise the journal decides (the step is started: a duplicate, recovered
    by the sweep after its lease)."""
    late = worker.client.start_run(linear(counter, 1), {})
    monkeypatch.setattr(pal.storage.steps, "CLAIMED_AHEAD_S", 0.0)
    worker.deliver(worker.outbox.pop(0))
    assert worker.deliver(worker.taken.pop(0)) == "duplicate"  # too late
    monkeypatch.undo()

    elsewhere = worker.client.start_run(linear(counter, 1), {})
    worker.deliver(worker.outbox.pop(0))
    message = worker.taken.pop(0)
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.deliver_from_queue(message)))
    thread.start()
    thread.join(30)
    assert outcome == ["duplicate"]  # the same step's message without its claim: the journal decides
    assert worker.deliver(message) == "completed"  # with the claim taken back with it
    assert worker.deliver(worker.taken.pop(0)) == "completed"  # its output step, claimed ahead too

    fallen = worker.client.start_run(linear(counter, 1), {})
    worker.takes_back = False
    worker.deliver(worker.outbox.pop(0))
    assert worker.taken == [] and worker.outbox == [(fallen, "s0", 1)]
    assert worker.deliver(worker.outbox.pop(0)) == "duplicate"  # the claim ahead was dropped
    assert calls(counter) == ["s0"]  # only `elsewhere` ran its step
    for run_id in (late, fallen):  # both were left started: the sweep's re-drive runs them once
        assert started(worker.client, run_id, "s0") == [1]
        assert redrive(worker.client.runtime, run_id, require_expired=False) is not None
    worker.takes_back = True
    while worker.outbox or worker.taken:
        worker.deliver((worker.taken or worker.outbox).pop(0))
    assert sorted(calls(counter)) == ["s0", "s0", "s0"]
    assert {worker.client.get_run(r).status for r in (late, elsewhere, fallen)} == {"succeeded"}


def test_a_successor_already_started_is_not_claimed_ahead(worker: TakingWorker, counter: Path) -> None:
    """The completion's insert of the successor's step_started conflicts (it exists at this
    generation): the completion commits, nothing is claimed ahead, the message goes to the queue."""
    run_id = worker.client.start_run(linear(counter, 1), {})
    with worker.client.runtime.journal.engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at) "
            "VALUES (:r, 's0', 1, 'step_started', '{\"attempt\": 1}', 1, now())"), {"r": run_id})
    assert worker.deliver(worker.outbox.pop(0)) == "completed"
    assert worker.taken == [] and worker.outbox == [(run_id, "s0", 1)]
    assert [e.step_id for e in worker.client.events(run_id) if e.kind == "step_completed"] == ["start"]
    assert worker.deliver(worker.outbox.pop(0)) == "duplicate"
