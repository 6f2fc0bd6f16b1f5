"""Admission slots (pal.core.admission): a tenant's runs that heed a limit are inserted held, then an
admission pass, under the tenant's `tenant_admission` row, gives free slots to held runs by priority
and age. A pass runs when a run starts (in its transaction), after a run ends, and at every sweep."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import sqlalchemy as sa

from pal.core.admission import pool_limit
from pal.core.vocabulary import TERMINAL_STATUSES, LockHolder, RunStatus
from pal.storage.primitives import Primitives
from pal.storage.schema import run_locks, runs, tenant_admission

HELD_FOR = timedelta(days=36_500)  # a held run's lock row: never an expired lease, so never an orphan
SCAN_PAST_FULL_KEYS = 100  # held runs a pass reads past its room: pools that fill up during it
_HELD = sa.and_(runs.c.admitted.is_(False), runs.c.status == RunStatus.QUEUED)


class Admitting(Primitives):
    """The admission pass, shared by run creation (pal.storage.runs) and AdmissionStore."""

    def _lock_tenant(self, conn: sa.Connection, tenant_id: str) -> None:
        """Queue on the tenant's admission row (made on first use)."""
        conn.execute(self._insert(tenant_admission).values(tenant_id=tenant_id).on_conflict_do_nothing())
        conn.execute(sa.select(tenant_admission.c.tenant_id).where(tenant_admission.c.tenant_id == tenant_id)
                     .with_for_update())

    def _admit_held(self, conn: sa.Connection, tenant_id: str, tenant_limit: int | None, now: datetime,
                    lease_ttl: float) -> list[str]:
        """Give the tenant's free slots to its held runs, best priority then oldest first, skipping a
        run whose key is full; the runs admitted. Call under `_lock_tenant`. The slots of finished
        runs are freed first."""
        mine = runs.c.tenant_id == tenant_id
        # A cancelled or failed run's step may still run until its next journal write or heartbeat
        # sees the lease gone: its slot frees one lease after its end (the sweep's pass takes it).
        done = sa.or_(runs.c.status == RunStatus.SUCCEEDED, sa.and_(
            runs.c.status.in_(TERMINAL_STATUSES), runs.c.finished_at <= now - timedelta(seconds=lease_ttl)))
        conn.execute(runs.update().where(mine, runs.c.admitted.is_(True), done).values(admitted=None))
        counts = conn.execute(sa.select(runs.c.concurrency_key, sa.func.count())
                              .where(mine, runs.c.admitted.is_(True)).group_by(runs.c.concurrency_key)).all()
        by_key: Counter[str | None] = Counter({key: count for key, count in counts})
        room = tenant_limit - sum(by_key.values()) if tenant_limit is not None else SCAN_PAST_FULL_KEYS
        if room <= 0:
            return []
        full = [key for key, count in by_key.items() if key is not None and count >= pool_limit(key)]
        open_pool = sa.or_(runs.c.concurrency_key.is_(None), runs.c.concurrency_key.not_in(full)) if full \
            else sa.true()
        candidates = conn.execute(
            sa.select(runs.c.id, runs.c.concurrency_key)
            .select_from(runs.join(run_locks, run_locks.c.run_id == runs.c.id))
            .where(mine, _HELD, open_pool, run_locks.c.worker_id == LockHolder.HELD)
            .order_by(runs.c.priority, runs.c.created_at, runs.c.id)  # set on every held run: ix_runs_held
            .limit(room + SCAN_PAST_FULL_KEYS).with_for_update(of=run_locks, skip_locked=True)).all()
        admitted: list[str] = []
        for run_id, key in candidates:  # full pools were left out; one may fill up in this pass
            if len(admitted) >= room:
                break
            if key is not None and by_key[key] >= pool_limit(key):
                continue
            by_key[key] += 1
            admitted.append(run_id)
        if admitted:
            conn.execute(runs.update().where(runs.c.id.in_(admitted)).values(admitted=True))
            conn.execute(run_locks.update().where(run_locks.c.run_id.in_(admitted)).values(
                worker_id=LockHolder.QUEUED, expires_at=now + timedelta(seconds=lease_ttl)))
        return admitted


class AdmissionStore(Admitting):
    def admit(self, *, tenant_id: str, tenant_limit: int | None, now: datetime,
              lease_ttl: float) -> list[str]:
        """One admission pass for the tenant, in its own transaction: the runs admitted."""
        with self._tx() as conn:
            self._lock_tenant(conn, tenant_id)
            return self._admit_held(conn, tenant_id, tenant_limit, now, lease_ttl)

    def tenants_waiting(self, *, limit: int = 1_000) -> list[str]:
        """Tenants with held runs, the one whose oldest held run waits longest first (the sweep's
        pass looks at each)."""
        with self._tx() as conn:
            query = (sa.select(runs.c.tenant_id).where(_HELD).group_by(runs.c.tenant_id)
                     .order_by(sa.func.min(runs.c.created_at)).limit(limit))
            return list(conn.execute(query).scalars())
