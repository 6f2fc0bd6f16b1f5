"""Signals sent to a run: kept in `run_signals` until a waiting `wait_event` step takes one, in the
transaction that completes that step (pal.storage.waits), so each signal wakes at most one wait and
each wait takes at most one signal."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pal.core.vocabulary import TERMINAL_STATUSES
from pal.errors import Refused, RunNotFound
from pal.storage.base import json_safe
from pal.storage.primitives import Primitives
from pal.storage.schema import run_signals, runs

MATCH_SCAN = 200  # pending signals of one name looked at for a `match`: the oldest first


class SignalStore(Primitives):
    def send(self, *, run_id: str, tenant_id: str, name: str, payload: Any, sent_by: str, now: datetime,
             max_pending: int) -> str:
        """Keep a signal for the run; its id. RunNotFound for a run of another tenant (as for one
        that does not exist); Refused for a finished run or one holding `max_pending` untaken
        signals already. Nothing is written when refused."""
        with self._tx() as conn:
            run = conn.execute(sa.select(runs.c.tenant_id, runs.c.status).where(runs.c.id == run_id)
                               .with_for_update()).first()
            if run is None or run.tenant_id != tenant_id:
                raise RunNotFound(f"no run {run_id!r}")  # another tenant's run is not there either
            if run.status in TERMINAL_STATUSES:
                raise Refused(f"run {run_id} is {run.status}; it takes no more signals")
            pending = conn.execute(sa.select(sa.func.count()).select_from(run_signals).where(
                run_signals.c.run_id == run_id, run_signals.c.taken_at.is_(None))).scalar() or 0
            if pending >= max_pending:
                raise Refused(f"run {run_id} holds {pending} signals no step has taken; send fewer")
            signal_id = uuid.uuid4().hex
            conn.execute(run_signals.insert().values(
                id=signal_id, run_id=run_id, name=name, payload=json_safe(payload), sent_by=sent_by,
                sent_at=now))
        return signal_id

    def pending(self, run_id: str) -> list[dict[str, Any]]:
        """The run's signals no step has taken, oldest first."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(run_signals.c.id, run_signals.c.name, run_signals.c.sent_at)
                                .where(run_signals.c.run_id == run_id, run_signals.c.taken_at.is_(None))
                                .order_by(run_signals.c.sent_at, run_signals.c.id)).mappings()
            return [dict(row) for row in rows]


def take_signal(conn: sa.Connection, *, run_id: str, name: str, match: Mapping[str, Any], step_id: str,
                attempt: int, now: datetime) -> dict[str, Any] | None:
    """Take the oldest untaken signal of `name` whose payload holds every key of `match` with its
    value, for this step attempt; None when there is none. Call under the run's lock row."""
    rows = conn.execute(sa.select(run_signals).where(
        run_signals.c.run_id == run_id, run_signals.c.name == name, run_signals.c.taken_at.is_(None))
        .order_by(run_signals.c.sent_at, run_signals.c.id).limit(MATCH_SCAN)).mappings()
    for row in rows:
        payload = row["payload"]
        if match and not (isinstance(payload, dict) and all(payload.get(k) == v for k, v in match.items())):
            continue
        taken = conn.execute(run_signals.update().where(
            run_signals.c.id == row["id"], run_signals.c.taken_at.is_(None)).values(
            taken_step=step_id, taken_attempt=attempt, taken_at=now))
        if taken.rowcount == 1:
            return {"id": row["id"], "name": row["name"], "payload": payload,
                    "sent_by": row["sent_by"], "sent_at": row["sent_at"].isoformat()}
    return None
