"""The writes every store makes inside its transaction: fence on the lease, append an event,
start a step, finish a run, park a run, and settle what a completion leads to.

Every correctness decision is taken inside one transaction, fenced by the run's lease row: a
write first UPDATEs `run_locks ... WHERE generation = :g`, which both proves the caller still
holds the lease and serializes all writers of that run (a row lock on Postgres, the database
write lock on SQLite). Unique partial indexes make step_completed once per step and the terminal
event once per run (docs/architecture.md, "The life of one step").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.core import faults
from pal.core.records import Fence, Frontier, Handoff
from pal.core.step_log import StepLog
from pal.core.vocabulary import (
    IN_FLIGHT_STATUSES,
    TERMINAL_EVENT,
    TERMINAL_STATUSES,
    EventKind,
    LockHolder,
    RunStatus,
)
from pal.storage.base import Caches, Outcome, StoreBase, event_rows, json_safe, lease_lost
from pal.storage.schema import journal_events, run_locks, runs
from pal.storage.sql.queries import query

WAIT_RECHECK_SECONDS = 600.0  # a parked run is looked at again at least this often

_FENCE = (
    run_locks.update()
    .where(run_locks.c.run_id == sa.bindparam("fence_run"),
           run_locks.c.generation == sa.bindparam("fence_generation"))
    .values(expires_at=sa.bindparam("fence_expires"), worker_id=sa.bindparam("fence_worker"),
            redeliver_at=None)
    .returning(run_locks.c.generation)
)
_EVENT_COLUMNS = {"run_id": "ev_run", "step_id": "ev_step", "attempt": "ev_attempt", "kind": "ev_kind",
                  "payload": "ev_payload", "generation": "ev_generation", "created_at": "ev_at"}
_EVENT_VALUES: dict[str, Any] = {column: sa.bindparam(name) for column, name in _EVENT_COLUMNS.items()}
# Postgres: the step protocol's calls inside a transaction (storage/sql/queries.sql), in psycopg2's
# form for exec_driver_sql.
_FENCED_LOG = query("fenced_log").driver_sql
_FENCED_COMPLETION = query("fenced_completion").driver_sql
_START_STEP = query("start_step").driver_sql


def started_payload(fence: Fence, attempt: int) -> dict[str, Any]:
    """What a `step_started` records: the attempt, and the worker that claimed it."""
    return {"attempt": attempt, "worker": fence.worker_id}


class Primitives(StoreBase):
    def __init__(self, engine: Engine, caches: Caches | None = None) -> None:
        super().__init__(engine, caches)
        # The hot path's statements, built once: a step pays for executing them, not for building
        # their expression trees again.
        self._append_stmt = self._insert(journal_events).values(_EVENT_VALUES).returning(journal_events.c.seq)
        self._append_once_stmt = (self._insert(journal_events).values(_EVENT_VALUES)
                                  .on_conflict_do_nothing().returning(journal_events.c.seq))

    def _fence(self, conn: sa.Connection, fence: Fence) -> bool:
        """Extend the lease iff `fence.generation` holds it; locks the row for this transaction."""
        row = conn.execute(_FENCE, {"fence_run": fence.run_id, "fence_generation": fence.generation,
                                    "fence_expires": fence.expires_at,
                                    "fence_worker": fence.worker_id}).first()
        return row is not None

    def _fence_or_lose(self, conn: sa.Connection, fence: Fence) -> None:
        if not self._fence(conn, fence):
            raise lease_lost(fence.run_id, fence.generation)

    def _fence_and_read(self, conn: sa.Connection, fence: Fence) -> StepLog | None:
        """`_fence`, then the run's step log as this transaction sees it; None when fenced out.
        On Postgres one round trip."""
        if self.calls is None:
            return self._step_log(conn, fence.run_id) if self._fence(conn, fence) else None
        known = self._known_log(fence.run_id)
        outcome, events = conn.exec_driver_sql(_FENCED_LOG, (
            fence.run_id, fence.generation, fence.worker_id, fence.expires_at, known.seq)).one()
        if Outcome(outcome) is Outcome.FENCED_OUT:
            return None
        return self._read_on(conn, fence.run_id, known, event_rows(events))

    def _complete_and_read(self, conn: sa.Connection, fence: Fence, step_id: str, attempt: int,
                           payload: Mapping[str, Any]) -> StepLog | None:
        """`_fence`, append `step_completed` (once per step), then the run's step log as this
        transaction sees it; None if the step had completed already, LeaseLost when fenced out.
        On Postgres one round trip."""
        if self.calls is None:
            self._fence_or_lose(conn, fence)
            seq = self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_COMPLETED, payload,
                               fence.generation, fence.now, on_conflict_skip=True)
            return None if seq is None else self._step_log(conn, fence.run_id)
        known = self._known_log(fence.run_id)
        outcome, events = conn.exec_driver_sql(_FENCED_COMPLETION, (
            fence.run_id, fence.generation, fence.worker_id, fence.expires_at, known.seq,
            step_id, attempt, json.dumps(payload), fence.now)).one()
        match Outcome(outcome):
            case Outcome.FENCED_OUT:
                raise lease_lost(fence.run_id, fence.generation)
            case Outcome.ALREADY_COMPLETED:
                return None
        return self._read_on(conn, fence.run_id, known, event_rows(events))

    def _start(self, conn: sa.Connection, fence: Fence, step_id: str, attempt: int) -> int | None:
        """Append `step_started`: its seq, None if this attempt was claimed under this generation."""
        payload = started_payload(fence, attempt)
        if self.calls is None:
            return self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_STARTED, payload,
                                fence.generation, fence.now, on_conflict_skip=True)
        seq: int | None = conn.exec_driver_sql(_START_STEP, (
            fence.run_id, step_id, attempt, json.dumps(payload), fence.generation, fence.now)).scalar()
        return seq

    def _append(self, conn: sa.Connection, run_id: str, step_id: str | None,
                attempt: int | None, kind: str, payload: Mapping[str, Any], generation: int,
                now: datetime, *, on_conflict_skip: bool = False) -> int | None:
        stmt = self._append_once_stmt if on_conflict_skip else self._append_stmt
        seq: int | None = conn.execute(stmt, {
            "ev_run": run_id, "ev_step": step_id, "ev_attempt": attempt, "ev_kind": str(kind),
            "ev_payload": dict(payload), "ev_generation": generation, "ev_at": now}).scalar()
        return seq

    def _settle(self, conn: sa.Connection, run_id: str, decision: Handoff, generation: int, now: datetime,
                frontier: Frontier | None) -> None:
        """What a completion leads to, in its transaction: the run fails or succeeds when the plan
        says it is over, or parks when nothing was dispatched and only waiting steps remain."""
        if decision.finished and decision.error is not None:
            self._finish(conn, run_id, RunStatus.FAILED, generation, now,
                         error=json_safe(dict(decision.error)))
        elif decision.finished:
            self._finish(conn, run_id, RunStatus.SUCCEEDED, generation, now,
                         output=json_safe(decision.output))
        elif not decision.dispatch:
            self._park_if_idle(conn, run_id, generation, now, frontier)

    def _finish(self, conn: sa.Connection, run_id: str, status: RunStatus, generation: int,
                now: datetime, *, output: Any = None, error: Any = None) -> bool:
        """Flip the status and append the terminal event together; only the flipper writes it."""
        flipped = conn.execute(
            runs.update()
            .where(runs.c.id == run_id, runs.c.status.not_in(TERMINAL_STATUSES))
            .values(status=status, output=output, error=error, finished_at=now)
            .returning(runs.c.id)
        ).first()
        if flipped is None:
            return False
        payload = {"output": output} if status == RunStatus.SUCCEEDED else {"error": error}
        self._append(conn, run_id, None, None, TERMINAL_EVENT[status], payload, generation, now)
        # Nothing may act for a failed run: its unfinished children (and theirs) stop with it.
        if status == RunStatus.FAILED or (status == RunStatus.CANCELLED
                                          and (error or {}).get("code") == "parent_failed"):
            for child in conn.execute(sa.select(runs.c.id).where(
                    runs.c.parent_run_id == run_id, runs.c.status.not_in(TERMINAL_STATUSES))).scalars():
                self._finish(conn, child, RunStatus.CANCELLED, 0, now,
                             error={"code": "parent_failed", "by": "pal", "reason": f"run {run_id} failed",
                                    "cancelled_with": run_id})
        conn.execute(run_locks.delete().where(run_locks.c.run_id == run_id))
        self._parent_due(conn, run_id, now)
        faults.point("during_finish", None, run_id)
        return True

    def _waiting(self, conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
        """Undecided parked steps of the run: {step_id, attempt, payload, created_at}. A wait ends
        with the step's completion or failure, or with a decision (an approved budget pause runs
        the step afterwards, which may park again: an approval node past its budget)."""
        je = journal_events
        # The waits first: most runs never park, and a join's every completion asks this (reading
        # every completion's output here made a fan-out's cost its square, bench/handoff.py).
        waits = conn.execute(
            sa.select(je.c.seq, je.c.step_id, je.c.attempt, je.c.payload, je.c.created_at)
            .where(je.c.run_id == run_id, je.c.kind == EventKind.STEP_WAITING).order_by(je.c.seq)).all()
        if not waits:
            return []
        latest = {w.step_id: w for w in waits}  # a step that parked again: its last wait counts
        closed = conn.execute(
            sa.select(je.c.step_id, sa.func.max(je.c.seq))
            .where(je.c.run_id == run_id, je.c.step_id.in_(latest), je.c.kind.in_(
                (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED, EventKind.APPROVAL_DECIDED)))
            .group_by(je.c.step_id)).all()
        last_closed = {step_id: seq for step_id, seq in closed}
        return [{"step_id": w.step_id, "attempt": w.attempt, "payload": w.payload, "created_at": w.created_at}
                for w in sorted(latest.values(), key=lambda w: w.seq)
                if last_closed.get(w.step_id, 0) < w.seq]

    def _park_if_idle(self, conn: sa.Connection, run_id: str, generation: int, now: datetime,
                      frontier: Frontier | None) -> bool:
        """Park the run when steps wait and nothing else is in flight (every step the plan
        finds ready is a waiting one): status `waiting`, and the lock row becomes a wake-up
        timer (worker `waiting`, generation + 1 so every older message is stale), due at the
        earliest expiry, now if a waited-for child has already finished, or at the next re-check."""
        if frontier is None:
            return False
        waiting = self._waiting(conn, run_id)
        if not waiting or not set(frontier(self._completed(conn, run_id))) <= {w["step_id"] for w in waiting}:
            return False
        due = [datetime.fromisoformat(w["payload"]["wake_at"])
               for w in waiting if w["payload"].get("wake_at")]
        if self._finished_children_waited_for(conn, waiting):
            due.append(now)
        wake_at = min([*due, now + timedelta(seconds=WAIT_RECHECK_SECONDS)])
        conn.execute(runs.update().where(runs.c.id == run_id, runs.c.status.in_(IN_FLIGHT_STATUSES))
                     .values(status=RunStatus.WAITING))
        self._upsert_lock(conn, run_id, LockHolder.PARKED, wake_at, generation + 1)
        self._parent_due(conn, run_id, now)  # a parent may act on a paused child (onChildApproval)
        return True

    def _finished_children_waited_for(self, conn: sa.Connection, waiting: list[dict[str, Any]]) -> bool:
        children = [w["payload"]["child_run_id"] for w in waiting if w["payload"].get("child_run_id")]
        return bool(children) and bool(conn.execute(sa.select(sa.func.count()).select_from(runs).where(
            runs.c.id.in_(children), runs.c.status.in_(TERMINAL_STATUSES))).scalar())

    def _parent_due(self, conn: sa.Connection, run_id: str, now: datetime) -> None:
        """Make a parked parent due now: the sweep looks at it even if the wake-up call is lost.

        SKIP LOCKED: a child never waits for its parent's lock row (a parent's transaction may hold
        it and wait for the child's: a cancellation walks down the tree). A parent locked right
        now is being decided, parked (which looks at finished children itself) or cancelled."""
        parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == run_id)).scalar()
        if parent is None:
            return
        row = conn.execute(sa.select(run_locks.c.run_id).where(
            run_locks.c.run_id == parent, run_locks.c.worker_id == LockHolder.PARKED
        ).with_for_update(skip_locked=True)).first()
        if row is not None:
            conn.execute(run_locks.update().where(run_locks.c.run_id == parent).values(expires_at=now))

    def _upsert_lock(self, conn: sa.Connection, run_id: str, worker_id: str, expires_at: datetime,
                     generation: int) -> None:
        conn.execute(
            self._insert(run_locks).values(run_id=run_id, worker_id=worker_id, expires_at=expires_at,
                                           generation=generation)
            .on_conflict_do_update(index_elements=[run_locks.c.run_id],
                                   set_={"worker_id": worker_id, "expires_at": expires_at,
                                         "generation": generation, "redeliver_at": None})
        )
