"""Runs: create one (idempotent on its id), cancel a run tree, and the reads of runs, their
families, events and leases."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from pal.core.admission import Admission
from pal.core.jcs import canonical
from pal.core.records import Event, Lease, RunRecord
from pal.core.start_keys import DEBOUNCE, DEDUPE, StartKey
from pal.core.vocabulary import IN_FLIGHT_STATUSES, EventKind, LockHolder, RunStatus
from pal.errors import QuotaExceeded, Refused, RunIdReused, RunIdTaken, RunNotFound
from pal.storage.admission import HELD_FOR, Admitting
from pal.storage.base import run_record
from pal.storage.schema import journal_events, pruned_runs, run_locks, run_start_keys, runs


class RunStore(Admitting):
    def create_run(
        self, *, run_id: str, tenant_id: str, kind: str, graph: Any, graph_hash: str | None,
        run_input: Any, now: datetime, lease_ttl: float, parent_run_id: str | None = None,
        parent_step_id: str | None = None, max_in_flight: int | None = None,
        limits: dict[str, Any] | None = None, traceparent: str | None = None,
        start_key: StartKey | None = None, admission: Admission | None = None,
        admitted_too: list[str] | None = None,
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, its `run_queued` event and its first lease (generation 1). A
        `traceparent` (who started it, docs/observability.md) is kept in `run_queued`.

        Idempotent on `run_id`: a second call by the same tenant (and, for a child run, the same
        parent step) returns the existing run and `False`; any other caller gets RunIdTaken. With
        a dedupe `start_key` held by a run, that run and `False`; with a debounce one, the run its
        burst queued before is cancelled (`debounced`), and this one's first lease lasts the
        period: the orphan sweep starts it once the period passes with no newer start. A new run
        whose `admission` is limited is inserted held and gets a slot only in its turn (the run's
        `admitted`); other held runs the same pass admits are added to `admitted_too`.
        """
        with self._tx() as conn:
            if start_key is not None:
                held = self._claim_start_key(conn, tenant_id, start_key, run_id, now)
                if held is not None:
                    return self._run(conn, held), False
            if parent_run_id is not None:
                # Under the parent's lock row: a cancellation of the parent either sees this child
                # or makes this insert see a finished parent.
                conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == parent_run_id)
                             .with_for_update())
                parent = self._run(conn, parent_run_id)
                if parent.terminal:
                    raise Refused(f"run {parent_run_id} is {parent.status}; it starts no child runs")
            elif max_in_flight is not None and not self._exists(conn, run_id):
                self._check_quota(conn, tenant_id, max_in_flight)
            inserted = conn.execute(
                self._insert(runs).values(
                    id=run_id, tenant_id=tenant_id, kind=kind, graph=graph,
                    graph_hash=graph_hash, input=run_input, status=RunStatus.QUEUED,
                    tier="microvm" if kind == "microvm" else "shared",
                    parent_run_id=parent_run_id, parent_step_id=parent_step_id,
                    cost_usd=Decimal(0), input_tokens=0, output_tokens=0, created_at=now, limits=limits,
                    priority=admission.priority if admission else None,
                    concurrency_key=admission.key if admission else None,
                    admitted=False if admission and admission.limited else None,
                ).on_conflict_do_nothing().returning(runs.c.id)
            ).first()
            if inserted is None:
                # The id exists. It is this caller's run again only if tenant and parent agree,
                # decided here, after the insert, in its transaction: a check made before it would
                # race a concurrent insert by someone else (docs/security.md). The refusal names
                # nothing of the run that holds the id.
                owner = conn.execute(sa.select(runs.c.tenant_id, runs.c.parent_run_id, runs.c.parent_step_id,
                                               runs.c.graph_hash, runs.c.input)
                                     .where(runs.c.id == run_id)).one()
                if tuple(owner)[:3] != (tenant_id, parent_run_id, parent_step_id):
                    raise RunIdTaken(f"run id {run_id!r} is not available; choose another, or omit it "
                                     "for a generated one")
                # The caller's own run again, but asked for other work: refused, never silently
                # the old run (a child's document and input are the parent step's, so they match).
                if parent_run_id is None and not _same_request(owner, graph_hash, run_input):
                    raise RunIdReused(f"run id {run_id!r} is already a run of another graph or input; "
                                      "use a new id (or omit it) for new work")
            else:
                self._refuse_pruned(conn, run_id)
                queued: dict[str, Any] = {"graph_hash": graph_hash}
                first_lease = timedelta(seconds=lease_ttl)
                if start_key is not None and start_key.purpose == DEBOUNCE:
                    first_lease = timedelta(seconds=start_key.seconds)
                    queued["debounce"] = {"key": start_key.key, "until": (now + first_lease).isoformat()}
                if traceparent is not None:
                    queued["traceparent"] = traceparent
                if parent_run_id is not None:
                    queued |= {"parent_run_id": parent_run_id, "parent_step_id": parent_step_id}
                limited = admission is not None and admission.limited
                if limited:
                    assert admission is not None
                    queued["admission"] = {"priority": admission.priority, "key": admission.key}
                self._append(conn, run_id, None, None, EventKind.RUN_QUEUED, queued, 1, now)
                conn.execute(run_locks.insert().values(
                    run_id=run_id, worker_id=LockHolder.HELD if limited else LockHolder.QUEUED,
                    expires_at=now + (HELD_FOR if limited else first_lease), generation=1))
                if admission is not None and limited:
                    self._lock_tenant(conn, tenant_id)
                    admitted = self._admit_held(conn, tenant_id, admission.tenant_limit, now, lease_ttl)
                    if admitted_too is not None:
                        admitted_too.extend(a for a in admitted if a != run_id)
            record = self._run(conn, run_id)
        return record, inserted is not None

    def _claim_start_key(self, conn: sa.Connection, tenant_id: str, start_key: StartKey, run_id: str,
                         now: datetime) -> str | None:
        """Point the tenant's key at `run_id` unless a dedupe key still holds a run: that run's id
        then. A debounce key still holding another run that has not started cancels that run.
        Concurrent claims of one key queue on its row."""
        expires = now + timedelta(seconds=start_key.seconds)
        claimed = conn.execute(self._insert(run_start_keys).values(
            tenant_id=tenant_id, purpose=start_key.purpose, key=start_key.key, run_id=run_id,
            expires_at=expires).on_conflict_do_nothing().returning(run_start_keys.c.run_id)).first()
        if claimed is not None:
            return None
        keys = run_start_keys.c
        this_key = sa.and_(keys.tenant_id == tenant_id, keys.purpose == start_key.purpose,
                           keys.key == start_key.key)
        held = conn.execute(sa.select(run_start_keys.c.run_id, run_start_keys.c.expires_at).where(this_key)
                            .with_for_update()).one()
        live = held.expires_at > now
        if live and start_key.purpose == DEDUPE:
            return str(held.run_id)
        if held.run_id != run_id:  # the same id again goes through the id's own checks below
            if live:
                self._supersede(conn, held.run_id, run_id, now)
            conn.execute(run_start_keys.update().where(this_key).values(run_id=run_id, expires_at=expires))
        return None

    def _supersede(self, conn: sa.Connection, earlier: str, later: str, now: datetime) -> None:
        """Cancel the earlier run of a debounce burst if it has not started (its first lease, held
        for the period, is still the queued one)."""
        lock = conn.execute(sa.select(run_locks.c.worker_id, run_locks.c.generation)
                            .where(run_locks.c.run_id == earlier).with_for_update()).first()
        if lock is not None and lock.worker_id == LockHolder.QUEUED and lock.generation == 1:
            self._finish(conn, earlier, RunStatus.CANCELLED, lock.generation, now,
                         error={"code": "debounced", "by": "pal", "reason": f"superseded by run {later}",
                                "superseded_by": later})

    @staticmethod
    def _refuse_pruned(conn: sa.Connection, run_id: str) -> None:
        """RunIdTaken for the id of a pruned run, decided after the insert, in its transaction: a
        run started again under that id would run and deliver again under the same idempotency
        keys, whose receipts were pruned with it (docs/retention.md)."""
        pruned = sa.select(pruned_runs.c.run_id).where(pruned_runs.c.run_id == run_id)
        if conn.execute(pruned).first() is not None:
            raise RunIdTaken(f"run id {run_id!r} is not available; choose another, or omit it "
                             "for a generated one")

    @staticmethod
    def _check_quota(conn: sa.Connection, tenant_id: str, max_in_flight: int) -> None:
        """QuotaExceeded when the tenant has PAL_MAX_RUNS_IN_FLIGHT top-level runs in flight."""
        in_flight = conn.execute(sa.select(sa.func.count()).select_from(runs).where(
            runs.c.tenant_id == tenant_id, runs.c.status.in_(IN_FLIGHT_STATUSES),
            runs.c.parent_run_id.is_(None))).scalar_one()
        if in_flight >= max_in_flight:
            raise QuotaExceeded(f"tenant {tenant_id!r} has {in_flight} runs queued or running, the "
                                f"most PAL_MAX_RUNS_IN_FLIGHT allows ({max_in_flight}); try later")

    def cancel_run(self, *, run_id: str, now: datetime, by: str, reason: str | None) -> list[str]:
        """Cancel the run and every descendant that is not finished, in one transaction: each
        gets `run_cancelled` once and loses its lease, so a step still running is fenced out at
        its next journal write (the next step boundary). Returns the ids cancelled."""
        with self._tx() as conn:
            conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == run_id).with_for_update())
            root = self._run(conn, run_id)
            if root.terminal:
                raise Refused(f"run {run_id} is {root.status}; it cannot be cancelled")
            cancelled, frontier = [], [run_id]
            while frontier:
                current = frontier.pop(0)
                # The run's lock row first: a child being created under it waits, then sees the
                # parent cancelled (create_run refuses), or it committed and is found below.
                lock = conn.execute(sa.select(run_locks.c.generation).where(run_locks.c.run_id == current)
                                    .with_for_update()).scalar()
                error = {"code": "cancelled", "by": by, "reason": reason,
                         "cancelled_with": run_id if current != run_id else None}
                if self._finish(conn, current, RunStatus.CANCELLED, lock or 0, now, error=error):
                    cancelled.append(current)
                frontier += list(conn.execute(sa.select(runs.c.id).where(runs.c.parent_run_id == current)
                                              .order_by(runs.c.created_at)).scalars())
            # A held run cancelled waits for no slot: out of the admission passes' scan.
            conn.execute(runs.update().where(runs.c.id.in_(cancelled), runs.c.admitted.is_(False))
                         .values(admitted=None))
        return cancelled

    def run_exists(self, run_id: str) -> bool:
        with self._tx() as conn:
            return self._exists(conn, run_id)

    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunRecord:
        with self._tx() as conn:
            run = self._run(conn, run_id)
        if tenant_id is not None and run.tenant_id != tenant_id:
            raise RunNotFound(f"no run {run_id!r}")
        return run

    def list_runs(
        self, *, tenant_id: str | None = None, status: str | None = None,
        limit: int = 50, offset: int = 0, graph: str | None = None, search: str | None = None,
        since: datetime | None = None, until: datetime | None = None,
    ) -> list[RunRecord]:
        """Runs newest first, in a stable order (created_at desc, then id) so pages never overlap.
        `graph`: the plan snapshot's `name`, exactly; `search`: text in the run id, any case;
        `since` (inclusive) and `until` (exclusive): the creation time."""
        query = sa.select(runs).order_by(runs.c.created_at.desc(), runs.c.id).limit(limit)
        if tenant_id is not None:
            query = query.where(runs.c.tenant_id == tenant_id)
        if status is not None:
            query = query.where(runs.c.status == status)
        if graph is not None:
            # The snapshot's JSON, read in place (JSONB ->> on Postgres, json_extract on SQLite).
            query = query.where(runs.c.graph["name"].as_string() == graph)
        if search:
            query = query.where(sa.func.lower(runs.c.id).contains(search.lower(), autoescape=True))
        if since is not None:
            query = query.where(runs.c.created_at >= since)
        if until is not None:
            query = query.where(runs.c.created_at < until)
        with self._tx() as conn:
            return [run_record(r, r["graph"]) for r in conn.execute(query.offset(offset)).mappings()]

    def children(self, run_id: str) -> list[RunRecord]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(runs).where(runs.c.parent_run_id == run_id)
                                .order_by(runs.c.created_at)).mappings()
            return [run_record(r, r["graph"]) for r in rows]

    def ancestors(self, run_id: str) -> list[str]:
        """The run's parent, its parent's parent, ... up to the top-level run (last)."""
        found: list[str] = []
        with self._tx() as conn:
            parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == run_id)).scalar()
            while parent is not None and parent not in found:
                found.append(parent)
                parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == parent)).scalar()
        return found

    def descendant_count(self, run_id: str) -> int:
        """How many runs descend from `run_id` (children, theirs, ...)."""
        count, level = 0, [run_id]
        with self._tx() as conn:
            while level:
                below = sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))
                level = list(conn.execute(below).scalars())
                count += len(level)
        return count

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        query = (
            sa.select(journal_events)
            .where(journal_events.c.run_id == run_id, journal_events.c.seq > after_seq)
            .order_by(journal_events.c.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self._tx() as conn:
            return [Event(**dict(r)) for r in conn.execute(query).mappings()]

    def get_lease(self, run_id: str) -> Lease | None:
        """The run's lease; None for a finished run, a parked one (its lock row is only a wake-up
        timer, see `wake_time`) and a held one (it waits for an admission slot)."""
        with self._tx() as conn:
            row = conn.execute(
                sa.select(run_locks).where(run_locks.c.run_id == run_id)
            ).mappings().first()
        no_lease = (LockHolder.PARKED, LockHolder.HELD)
        return Lease(**dict(row)) if row and row["worker_id"] not in no_lease else None


def _same_request(existing: Any, graph_hash: str | None, run_input: Any) -> bool:
    """Whether a run's stored graph and input are the ones asked for again: the input compared as
    RFC 8785 text, so JSONB's rewriting of keys and numbers does not count as a difference."""
    try:
        return bool(existing.graph_hash == graph_hash and canonical(existing.input) == canonical(run_input))
    except ValueError:  # not canonicalisable: compare as values
        return bool(existing.graph_hash == graph_hash and existing.input == run_input)
