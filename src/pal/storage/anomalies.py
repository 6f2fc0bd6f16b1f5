"""Anomalies in the journal: each `anomaly_detected` at most once per (run, kind, step), which the
primary key of `run_anomalies` decides; and the list of anomalies across a tenant's runs
(docs/anomalies.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.core.anomalies import Anomaly
from pal.core.lru import Lru
from pal.core.records import Fence
from pal.core.vocabulary import EventKind
from pal.storage.base import Caches
from pal.storage.primitives import Primitives
from pal.storage.schema import run_anomalies, runs

_KNOWN_ANOMALIES = 4096  # (run, kind, step) this process has seen journaled: no write to try again


class AnomalyStore(Primitives):
    def __init__(self, engine: Engine, caches: Caches | None = None) -> None:
        super().__init__(engine, caches)
        self._journaled: Lru[tuple[str, str, str], bool] = Lru(_KNOWN_ANOMALIES)

    def record_anomalies(self, fence: Fence, anomalies: Sequence[Anomaly]) -> list[Anomaly]:
        """Journal the anomalies not journaled before for their (run, kind, step): an
        `anomaly_detected` event and a `run_anomalies` row each, in one fenced transaction. Returns
        the ones written; none when fenced out (the lease's holder reports them instead)."""
        fresh = [a for a in anomalies if self._journaled.get(_key(fence.run_id, a)) is None]
        if not fresh:
            return []
        written: list[Anomaly] = []
        with self._tx() as conn:
            if not self._fence(conn, fence):
                return []
            for anomaly in fresh:
                payload = anomaly.as_payload()
                inserted = conn.execute(self._insert(run_anomalies).values(
                    run_id=fence.run_id, kind=str(anomaly.kind), step_id=anomaly.step_id or "",
                    payload=payload, created_at=fence.now,
                ).on_conflict_do_nothing().returning(run_anomalies.c.run_id)).first()
                if inserted is not None:
                    self._append(conn, fence.run_id, anomaly.step_id, None, EventKind.ANOMALY_DETECTED,
                                 payload, fence.generation, fence.now)
                    written.append(anomaly)
        for anomaly in fresh:  # journaled now or before: either way, never try again
            self._journaled.put(_key(fence.run_id, anomaly), True)
        return written

    def anomalies(self, *, tenant_id: str | None = None, run_id: str | None = None,
                  since: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Anomalies newest first: of one run, or across a tenant's runs."""
        query = (sa.select(run_anomalies.c.run_id, run_anomalies.c.payload, run_anomalies.c.created_at)
                 .join(runs, runs.c.id == run_anomalies.c.run_id)
                 .order_by(run_anomalies.c.created_at.desc(), run_anomalies.c.run_id).limit(limit))
        if tenant_id is not None:
            query = query.where(runs.c.tenant_id == tenant_id)
        if run_id is not None:
            query = query.where(run_anomalies.c.run_id == run_id)
        if since is not None:
            query = query.where(run_anomalies.c.created_at >= since)
        with self._tx() as conn:
            return [{"run_id": r.run_id, **r.payload, "created_at": r.created_at.isoformat()}
                    for r in conn.execute(query)]


def _key(run_id: str, anomaly: Anomaly) -> tuple[str, str, str]:
    return run_id, str(anomaly.kind), anomaly.step_id or ""
