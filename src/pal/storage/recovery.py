"""Recovery's writes and reads: steal an expired lease (one run, or a sweep's batch), send an
unclaimed recovery's messages again, and find orphans (docs/recovery.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pal.core.records import Lease, Recovery, Replay, RunRecord
from pal.core.step_log import LOG_KINDS
from pal.core.vocabulary import IN_FLIGHT_STATUSES, EventKind, LockHolder
from pal.errors import LeaseBusy
from pal.storage.base import RUN_ROWS, run_record
from pal.storage.primitives import Primitives
from pal.storage.schema import journal_events, run_locks, runs

_LOGS_SINCE = (  # several runs' step logs at once (a sweep batch)
    sa.select(journal_events.c.run_id, journal_events.c.seq, journal_events.c.step_id, journal_events.c.kind,
              journal_events.c.payload)
    .where(journal_events.c.run_id.in_(sa.bindparam("logs_runs", expanding=True)),
           journal_events.c.seq > sa.bindparam("logs_after"), journal_events.c.kind.in_(LOG_KINDS))
    .order_by(journal_events.c.run_id, journal_events.c.seq)
)
_STEP_ENDS = (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED, EventKind.STEP_RETRYING,
              EventKind.STEP_WAITING)


class RecoveryStore(Primitives):
    def recover_run(
        self, *, run_id: str, worker_id: str, now: datetime, lease_ttl: float, plan: Replay,
        require_expired: bool = True, allow_idle: bool = False, redeliver_after: float | None = None,
        held_by: Sequence[str] = (),
    ) -> Recovery | None:
        """Steal the run's lease (generation + 1) and record which steps the re-drive resumes.

        One UPSERT decides the winner: it only updates a lock that has expired, unless
        `require_expired` is False (tests), or `allow_idle` is True and no step is running under
        the live lease (an operator's resume: messages of the old generation are fenced out at
        their claim, so taking an idle lease can never let two workers run one step). None means
        nothing to do: the run is terminal or not in flight, or another holder's lease is live.
        Raises LeaseBusy when `allow_idle` finds a step running under a live lease.
        With `redeliver_after`, the resumed steps' messages are due to be sent again that many
        seconds from now unless a worker claims one first (see `redeliver`). `held_by`: a live
        lease of one of these holders is taken too (a stopping worker hands its leases back).
        """
        expires = now + timedelta(seconds=lease_ttl)
        with self._tx() as conn:
            run = self._run(conn, run_id)
            if run.status not in IN_FLIGHT_STATUSES:
                return None
            take_live = not require_expired
            if allow_idle:
                self._refuse_if_busy(conn, run_id, now)
                take_live = True  # an idle live lease may go: its old messages are fenced out
            # Due for a resend unless a worker claims a step first (cleared below if none resumes).
            redeliver_at = now + timedelta(seconds=redeliver_after) if redeliver_after is not None else None
            stolen = self._steal(conn, [run_id], worker_id, now, expires, redeliver_at, take_live, held_by)
            self._drop_lock_rows_of_finished(conn, stolen, worker_id)
            generation = stolen.get(run_id)
            if generation is None:
                return None
            steps = tuple(plan(run, self._completed(conn, run_id)))
            recovery = Recovery(generation=generation, resumed_steps=steps)
            self._record_recoveries(conn, {run_id: recovery}, now, redelivery=redeliver_at is not None)
        return recovery

    def leases_held_by(self, holders: Sequence[str]) -> list[str]:
        """The runs whose live lease one of `holders` (worker ids) holds, in run id order."""
        if not holders:
            return []
        with self._tx() as conn:
            return list(conn.execute(
                sa.select(run_locks.c.run_id).where(run_locks.c.worker_id.in_(list(holders)))
                .order_by(run_locks.c.run_id)).scalars())

    def _refuse_if_busy(self, conn: sa.Connection, run_id: str, now: datetime) -> None:
        """LeaseBusy when a step runs under the run's live lease (an operator may not take it)."""
        lease = conn.execute(
            sa.select(run_locks).where(run_locks.c.run_id == run_id).with_for_update()
        ).mappings().first()
        if lease is not None and lease["expires_at"] >= now:
            running = self._running_steps(conn, run_id, lease["generation"])
            if running:
                raise LeaseBusy(
                    f"run {run_id}: step(s) {', '.join(running)} running under "
                    f"{lease['worker_id']} (generation {lease['generation']}), lease live for "
                    f"{(lease['expires_at'] - now).total_seconds():.1f}s more")

    def recover_orphans(self, *, run_ids: Sequence[str], worker_id: str, now: datetime, lease_ttl: float,
                        plan: Replay, redeliver_after: float) -> dict[str, Recovery]:
        """The sweep's re-drive of a batch of orphans, in one transaction: for each run what
        `recover_run` does with `require_expired` (steal an expired lease, never a parked run's
        timer; journal `run_recovered`; redelivery due `redeliver_after` seconds from now), with
        one statement of each kind for the whole batch instead of one transaction per run.

        The leases are taken in run id order, as every sweeper does. Any error (a plan that cannot
        be made, a deadlock with a cancellation walking a run tree) rolls back the whole batch and
        is raised; the caller then recovers the runs one by one."""
        expires = now + timedelta(seconds=lease_ttl)
        redeliver_at = now + timedelta(seconds=redeliver_after)
        with self._tx() as conn:
            rows = {row["id"]: row for row in conn.execute(
                RUN_ROWS.where(runs.c.id.in_(sorted(set(run_ids))), runs.c.status.in_(IN_FLIGHT_STATUSES))
            ).mappings()}
            if not rows:
                return {}
            stolen = self._steal(conn, sorted(rows), worker_id, now, expires, redeliver_at, take_live=False)
            self._drop_lock_rows_of_finished(conn, stolen, worker_id)
            if not stolen:
                return {}
            known = {run_id: self._known_log(run_id) for run_id in stolen}
            new_events: dict[str, list[Any]] = {run_id: [] for run_id in stolen}
            for event in conn.execute(_LOGS_SINCE, {"logs_runs": list(stolen),
                                                    "logs_after": min(k.seq for k in known.values())}):
                if event.seq > known[event.run_id].seq:
                    new_events[event.run_id].append(event)
            recoveries: dict[str, Recovery] = {}
            for run_id, generation in stolen.items():
                row = rows[run_id]
                run = run_record(row, self._graph(conn, run_id, row["kind"], row["graph_hash"]))
                log = self._read_on(conn, run_id, known[run_id], new_events[run_id])
                recoveries[run_id] = Recovery(generation, tuple(plan(run, log.outputs)))
            self._record_recoveries(conn, recoveries, now, redelivery=True)
        return recoveries

    def _steal(self, conn: sa.Connection, run_ids: Sequence[str], worker_id: str, now: datetime,
               expires: datetime, redeliver_at: datetime | None, take_live: bool,
               held_by: Sequence[str] = ()) -> dict[str, int]:
        """Take the runs' leases, in the order given: one UPSERT (generation + 1, or a new lock row
        at generation 1 for a run that had none). Only an expired lease is taken unless
        `take_live` (or it is `held_by` one of these), and never a parked run's wake-up timer (the
        run may have parked since it was read) nor a held run's lock row (it waits for an admission
        slot). The generation of each run taken."""
        takeable = sa.or_(run_locks.c.expires_at < now, run_locks.c.worker_id.in_(held_by)) if held_by \
            else run_locks.c.expires_at < now
        stmt = self._insert(run_locks).values([
            {"run_id": run_id, "worker_id": worker_id, "expires_at": expires, "generation": 1,
             "redeliver_at": redeliver_at} for run_id in run_ids])
        stmt = stmt.on_conflict_do_update(
            index_elements=[run_locks.c.run_id],
            set_={"worker_id": worker_id, "expires_at": expires, "redeliver_at": redeliver_at,
                  "generation": run_locks.c.generation + 1},
            where=sa.and_(run_locks.c.worker_id.not_in((LockHolder.PARKED, LockHolder.HELD)),
                          sa.true() if take_live else takeable),
        ).returning(run_locks.c.run_id, run_locks.c.generation)
        return {run_id: generation for run_id, generation in conn.execute(stmt).all()}

    def _record_recoveries(self, conn: sa.Connection, recoveries: Mapping[str, Recovery], now: datetime,
                           *, redelivery: bool) -> None:
        """Journal each `run_recovered`; a recovery that resumes nothing needs no redelivery."""
        conn.execute(journal_events.insert(), [
            {"run_id": run_id, "step_id": None, "attempt": None, "kind": str(EventKind.RUN_RECOVERED),
             "payload": {"generation": r.generation, "resumed_steps": list(r.resumed_steps)},
             "generation": r.generation, "created_at": now} for run_id, r in recoveries.items()])
        idle = [run_id for run_id, r in recoveries.items() if not r.resumed_steps]
        if redelivery and idle:
            conn.execute(run_locks.update().where(run_locks.c.run_id.in_(idle)).values(redeliver_at=None))

    def _drop_lock_rows_of_finished(self, conn: sa.Connection, stolen: dict[str, int],
                                    worker_id: str) -> None:
        """A lock row the steal inserted (generation 1) rather than stole belongs to a run that had
        none: if that run finished (and dropped its lease) after it was read, the row goes again
        and the run is no longer among the stolen."""
        inserted = [run_id for run_id, generation in stolen.items() if generation == 1]
        if not inserted:
            return
        finished = list(conn.execute(sa.select(runs.c.id).where(
            runs.c.id.in_(inserted), runs.c.status.not_in(IN_FLIGHT_STATUSES))).scalars())
        if finished:
            conn.execute(run_locks.delete().where(run_locks.c.run_id.in_(finished),
                                                  run_locks.c.generation == 1,
                                                  run_locks.c.worker_id == worker_id))
            for run_id in finished:
                del stolen[run_id]

    def redeliverable_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Recovered runs whose re-driven steps no worker has claimed by their redelivery time."""
        with self._tx() as conn:
            return list(conn.execute(
                sa.select(run_locks.c.run_id).where(run_locks.c.redeliver_at < now)
                .order_by(run_locks.c.redeliver_at).limit(limit)).scalars())

    def redeliver(self, *, run_id: str, now: datetime, min_gap: float, plan: Replay) -> Recovery | None:
        """Send a recovery's messages again: no worker claimed a step since the steal, so they may
        be lost (a Redis flush, a worker killed before its claim, a claim refused while Postgres
        restarted), and the 10-minute recovery lease would otherwise idle the run that long.

        The generation stays: a message still queued remains valid and the copies are harmless
        (one claim per attempt and generation wins), so a slow queue never livelocks the run the
        way repeated steals would. Each resend doubles the wait (at least `min_gap`), and none is
        due past the lease's end, where the sweep steals it as usual. Journals `run_redelivered
        {generation, steps}`; None when nothing is due (claimed meanwhile, finished, parked)."""
        with self._tx() as conn:
            lock = conn.execute(sa.select(run_locks).where(
                run_locks.c.run_id == run_id, run_locks.c.redeliver_at < now
            ).with_for_update()).mappings().first()
            if lock is None:
                return None
            run = self._run(conn, run_id)
            stolen_at = conn.execute(sa.select(sa.func.max(journal_events.c.created_at)).where(
                journal_events.c.run_id == run_id, journal_events.c.kind == EventKind.RUN_RECOVERED,
                journal_events.c.generation == lock["generation"])).scalar() or now
            in_flight = run.status in IN_FLIGHT_STATUSES
            steps = tuple(plan(run, self._completed(conn, run_id))) if in_flight else ()
            due = now + timedelta(seconds=max(min_gap, (now - stolen_at).total_seconds()))
            conn.execute(run_locks.update().where(run_locks.c.run_id == run_id).values(
                redeliver_at=due if steps and due < lock["expires_at"] else None))
            if not steps:
                return None
            self._append(conn, run_id, None, None, EventKind.RUN_REDELIVERED,
                         {"generation": lock["generation"], "steps": list(steps)}, lock["generation"], now)
        return Recovery(generation=lock["generation"], resumed_steps=steps)

    def _running_steps(self, conn: sa.Connection, run_id: str, generation: int) -> list[str]:
        """Steps started under `generation` whose attempt has no completion, failure or retry."""
        rows = conn.execute(
            sa.select(journal_events.c.step_id, journal_events.c.attempt, journal_events.c.kind,
                      journal_events.c.generation)
            .where(journal_events.c.run_id == run_id,
                   journal_events.c.kind.in_((EventKind.STEP_STARTED, *_STEP_ENDS)))
        ).all()
        closed = {(r.step_id, r.attempt) for r in rows if r.kind != EventKind.STEP_STARTED}
        return sorted({r.step_id for r in rows
                       if r.kind == EventKind.STEP_STARTED and r.generation == generation
                       and (r.step_id, r.attempt) not in closed})

    @staticmethod
    def orphan_query(*, now: datetime, limit: int, tier: str = "shared") -> sa.Select[Any]:
        """In-flight runs whose lease is missing or expired (the partial index ix_runs_in_flight
        keeps finished runs out of the scan)."""
        return (
            sa.select(runs.c.id)
            .select_from(runs.outerjoin(run_locks, run_locks.c.run_id == runs.c.id))
            .where(runs.c.status.in_(IN_FLIGHT_STATUSES), runs.c.tier == tier,
                   sa.or_(run_locks.c.run_id.is_(None), run_locks.c.expires_at < now))
            .order_by(runs.c.id)
            .limit(limit)
        )

    def orphaned_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Orphans of the shared tier, which the graph re-drive takes."""
        with self._tx() as conn:
            return list(conn.execute(self.orphan_query(now=now, limit=limit)).scalars())

    def orphaned_microvm_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Orphans of the isolated tier, which resumeMicroVMRun takes (pal.storage.vms)."""
        with self._tx() as conn:
            return list(conn.execute(self.orphan_query(now=now, limit=limit, tier="microvm")).scalars())

    def stuck_runs(self, *, now: datetime, limit: int = 100) -> list[tuple[RunRecord, Lease | None]]:
        """In-flight runs with a missing or expired lease, with that lease."""
        ids = self.orphaned_runs(now=now, limit=limit)
        with self._tx() as conn:
            found = []
            for run_id in ids:
                lease = conn.execute(
                    sa.select(run_locks).where(run_locks.c.run_id == run_id)
                ).mappings().first()
                found.append((self._run(conn, run_id), Lease(**dict(lease)) if lease else None))
        return found
