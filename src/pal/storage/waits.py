"""Parked steps: park one (an approval, a subagent, a timer, a wait for a signal), resume one (a
decision, a child's end, an expiry, a timer, a signal), and the wake-up timers the sweep follows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pal.core.records import Fence, Frontier, Handoff, Plan
from pal.core.vocabulary import EventKind, LockHolder, RunStatus
from pal.errors import Refused
from pal.storage.base import json_safe, missing, run_record
from pal.storage.primitives import Primitives
from pal.storage.schema import journal_events, run_locks, runs
from pal.storage.signals import take_signal


class WaitStore(Primitives):
    def park_step(self, fence: Fence, step_id: str, attempt: int, *, payload: Mapping[str, Any],
                  wake_at: datetime | None, frontier: Frontier,
                  event: tuple[str, Mapping[str, Any]] | None = None) -> bool:
        """Journal `step_waiting {payload}` (after `event`, when given); when no other step is in
        flight, park the run (status `waiting`, no lease held). Raises LeaseLost when fenced out."""
        body = json_safe(dict(payload)) | ({"wake_at": wake_at.isoformat()} if wake_at else {})
        with self._tx() as conn:
            self._fence_or_lose(conn, fence)
            if event is not None:
                self._append(conn, fence.run_id, step_id, attempt, event[0], json_safe(dict(event[1])),
                             fence.generation, fence.now)
            self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_WAITING, body, fence.generation,
                         fence.now)
            return self._park_if_idle(conn, fence.run_id, fence.generation, fence.now, frontier)

    def resume_waiting(
        self, *, run_id: str, step_id: str, now: datetime, lease_ttl: float,
        plan: Plan, output: Any = None,
        error: Mapping[str, Any] | None = None,
        event: tuple[str, Mapping[str, Any]] | None = None,
        check: Callable[[Mapping[str, Any]], None] | None = None,
        frontier: Frontier | None = None,
        rerun: bool = False,
        signal: tuple[str, Mapping[str, Any]] | None = None,
    ) -> tuple[Handoff, int]:
        """Complete (or fail) a parked step: a decision, a child's end, an expiry; or, with
        `rerun`, end its wait so that it runs (an approved budget pause: `event` is the decision
        and the step itself is what the caller publishes).

        One transaction under the run's lock row: the step must be waiting and undecided (else
        Refused); `check(waiting_payload)` may refuse too; `event` (e.g. approval_decided) and
        `step_completed` are appended together; a parked run takes a fresh lease (generation + 1)
        for the successors, which the caller publishes with the returned generation. `signal`
        (name, match): the step takes the oldest such signal sent to the run (Refused when there is
        none), completes with `{"branch": "received", "signal": ...}` and journals
        `signal_received` with it."""
        with self._tx() as conn:
            # Lock first (the lock row, then the run), then read: a cancellation or another
            # decision that committed meanwhile is seen, never overwritten.
            lock = conn.execute(
                sa.select(run_locks).where(run_locks.c.run_id == run_id).with_for_update()
            ).mappings().first()
            row = (conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update())
                   .mappings().first() or missing(run_id))
            run = run_record(row, row["graph"])
            if run.terminal:
                raise Refused(f"run {run_id} is {run.status}; nothing waits there any more")
            if lock is None:
                raise Refused(f"run {run_id} holds no lock row; it is finishing")
            waiting = {w["step_id"]: w for w in self._waiting(conn, run_id)}
            if step_id not in waiting:
                raise Refused(self._why_not_waiting(conn, run_id, step_id))
            if check is not None:
                check(waiting[step_id]["payload"])
            attempt = waiting[step_id]["attempt"]
            if signal is not None:
                taken = take_signal(conn, run_id=run_id, name=signal[0], match=signal[1], step_id=step_id,
                                    attempt=attempt, now=now)
                if taken is None:
                    raise Refused(f"no signal {signal[0]!r} for step {step_id!r} of run {run_id} yet")
                output = {"branch": "received", "signal": taken}
                event = (EventKind.SIGNAL_RECEIVED, {"signal_id": taken["id"], "name": taken["name"]})
            if lock["worker_id"] == LockHolder.PARKED:
                generation = lock["generation"] + 1
                expires = now + timedelta(seconds=lease_ttl)
                self._upsert_lock(conn, run_id, LockHolder.QUEUED, expires, generation)
                conn.execute(runs.update().where(runs.c.id == run_id, runs.c.status == RunStatus.WAITING)
                             .values(status=RunStatus.RUNNING))
            else:
                generation = lock["generation"]
            if event is not None:
                self._append(conn, run_id, step_id, attempt, event[0], json_safe(dict(event[1])),
                             generation, now)
            if rerun:
                return Handoff(dispatch=(step_id,), finished=False), generation
            if error is not None:
                self._append(conn, run_id, step_id, attempt, EventKind.STEP_FAILED, {"error": dict(error)},
                             generation, now)
                self._finish(conn, run_id, RunStatus.FAILED, generation, now,
                             error={**error, "step_id": step_id})
                return Handoff(dispatch=(), finished=True), generation
            self._append(conn, run_id, step_id, attempt, EventKind.STEP_COMPLETED,
                         {"output": json_safe(output)}, generation, now)
            decision = plan(self._completed(conn, run_id))
            self._settle(conn, run_id, decision, generation, now, frontier)
            return decision, generation

    def waiting_steps(self, run_id: str) -> list[dict[str, Any]]:
        """Undecided parked steps of the run: {step_id, attempt, payload, created_at}."""
        with self._tx() as conn:
            return self._waiting(conn, run_id)

    def due_waiting_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Parked runs whose wake-up time has come (an approval expiry, a finished child)."""
        with self._tx() as conn:
            return list(conn.execute(
                sa.select(runs.c.id).join(run_locks, run_locks.c.run_id == runs.c.id)
                .where(runs.c.status == RunStatus.WAITING, run_locks.c.expires_at < now)
                .order_by(run_locks.c.expires_at).limit(limit)
            ).scalars())

    def rearm_wait(self, *, run_id: str, wake_at: datetime, now: datetime) -> None:
        """Set when the sweep looks at a parked run again: `wake_at`, or now when a child it waits
        for has finished meanwhile (its own wake-up may have been lost)."""
        with self._tx() as conn:
            conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == run_id).with_for_update())
            if self._finished_children_waited_for(conn, self._waiting(conn, run_id)):
                wake_at = now
            conn.execute(run_locks.update().where(run_locks.c.run_id == run_id,
                                                  run_locks.c.worker_id == LockHolder.PARKED)
                         .values(expires_at=wake_at))

    def wake_time(self, run_id: str) -> datetime | None:
        """When the sweep next looks at a parked run; None when the run is not parked."""
        with self._tx() as conn:
            return conn.execute(sa.select(run_locks.c.expires_at).where(
                run_locks.c.run_id == run_id, run_locks.c.worker_id == LockHolder.PARKED)).scalar()

    def _why_not_waiting(self, conn: sa.Connection, run_id: str, step_id: str) -> str:
        kinds = set(conn.execute(
            sa.select(journal_events.c.kind).where(journal_events.c.run_id == run_id,
                                                   journal_events.c.step_id == step_id)).scalars())
        if not kinds:
            return f"run {run_id} has no step {step_id!r} that ever ran"
        if EventKind.APPROVAL_DECIDED in kinds:
            return f"step {step_id!r} of run {run_id} was already decided"
        if EventKind.STEP_COMPLETED in kinds:
            return f"step {step_id!r} of run {run_id} is not waiting: it already completed"
        return f"step {step_id!r} of run {run_id} is not waiting"
