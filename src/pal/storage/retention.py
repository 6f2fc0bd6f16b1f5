"""Retention (docs/retention.md): delete finished run families in batches, one transaction each, and
keep what must outlive them: the pruned id (never started again) and, when asked, its receipt.

A family is a top-level run and its child runs (`parent_run_id`, any depth); it goes whole or not
at all, and only when every member is finished, re-checked under row locks in the deleting
transaction. Families are visited oldest finish first, by a keyset cursor (finish time, id), so a
family passed over (a member still in flight, or its row locked by a concurrent retry or fork) is
not visited again by the same prune and every batch costs the same however much is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pal.core.records import Event, RunRecord
from pal.core.vocabulary import TERMINAL_STATUSES
from pal.storage.runs import RunStore
from pal.storage.schema import (
    UtcDateTime,
    journal_events,
    pruned_runs,
    run_anomalies,
    run_locks,
    run_signals,
    run_start_keys,
    runs,
    runtime_vms,
    side_effect_receipts,
)

Sign = Callable[[RunRecord, list[Event]], bytes]
"""sign(run, events): the receipt bundle to keep for a run about to be deleted."""

Cursor = tuple[datetime, str]  # (finished_at, id) of the last top-level run visited
_CHUNK = 400  # ids per IN list: far below SQLite's bound on a statement's variables
# Every table keyed by run besides `runs` (each also cascades from it: deleted explicitly to count
# the events and to keep the order of deletes obvious).
_BY_RUN = (journal_events, side_effect_receipts, run_anomalies, runtime_vms, run_signals, run_start_keys,
           run_locks)


@dataclass(frozen=True)
class PruneQuery:
    finished_before: datetime
    tenant_id: str | None = None
    batch: int = 500  # families per transaction


@dataclass(frozen=True)
class PruneBatch:
    families: int  # families deleted (or, in a dry run, that would be)
    runs: int
    events: int
    receipts: int  # receipt bundles kept
    skipped: int  # families passed over: a member in flight
    cursor: Cursor | None  # None: nothing was left to visit


class RetentionStore(RunStore):
    def prune_batch(self, query: PruneQuery, *, after: Cursor | None, now: datetime, dry_run: bool = False,
                    sign: Sign | None = None) -> PruneBatch:
        """Delete (dry run: count) up to `query.batch` finished families after `after`, in one
        transaction, each run's id kept in `pruned_runs` (with its receipt, given `sign`)."""
        with self._tx() as conn:
            tops = conn.execute(self._candidates(query, after, locking=not dry_run)).all()
            if not tops:
                return PruneBatch(0, 0, 0, 0, 0, None)
            families, skipped = self._families(conn, [t.id for t in tops], locking=not dry_run)
            members = [run_id for family in families for run_id in family]
            cursor = (tops[-1].finished_at, tops[-1].id)
            if dry_run:
                events = sum(conn.execute(sa.select(sa.func.count()).select_from(journal_events).where(
                    journal_events.c.run_id.in_(ids))).scalar_one() for ids in _chunks(members))
                return PruneBatch(len(families), len(members), events, 0, skipped, cursor)
            kept = self._keep(conn, members, now, sign)
            events = self._delete(conn, members)
        return PruneBatch(len(families), len(members), events, kept, skipped, cursor)

    def pruned_receipt(self, run_id: str, tenant_id: str | None = None) -> bytes | None:
        """The receipt bundle kept for a pruned run (of `tenant_id`, when given); None otherwise."""
        with self._tx() as conn:
            row = conn.execute(sa.select(pruned_runs.c.tenant_id, pruned_runs.c.receipt)
                               .where(pruned_runs.c.run_id == run_id)).first()
        if row is None or row.receipt is None or (tenant_id is not None and row.tenant_id != tenant_id):
            return None
        return str(row.receipt).encode("utf-8")

    @staticmethod
    def _candidates(query: PruneQuery, after: Cursor | None, *, locking: bool) -> sa.Select[Any]:
        """The next finished top-level runs, oldest finish first (ix_runs_finished). Postgres locks
        them, skipping rows a concurrent transaction holds (a retry or fork reading its source):
        the status test is evaluated again on the locked row, so only a run finished now goes."""
        r = runs.c
        found = (sa.select(r.id, r.finished_at)
                 .where(r.parent_run_id.is_(None), r.finished_at.is_not(None),
                        r.finished_at < query.finished_before, r.status.in_(TERMINAL_STATUSES))
                 .order_by(r.finished_at, r.id).limit(query.batch))
        if query.tenant_id is not None:
            found = found.where(r.tenant_id == query.tenant_id)
        if after is not None:
            last = sa.tuple_(sa.literal(after[0], UtcDateTime()), sa.literal(after[1], runs.c.id.type))
            found = found.where(sa.tuple_(r.finished_at, r.id) > last)
        return found.with_for_update(skip_locked=True) if locking else found

    @staticmethod
    def _families(conn: sa.Connection, tops: Sequence[str], *, locking: bool) -> tuple[list[list[str]], int]:
        """Each top-level run with its descendants, level by level; a family with a member not
        finished is passed over (counted). The members are locked (Postgres) before their status
        is read, so a status read here is final."""
        root_of = {run_id: run_id for run_id in tops}
        family: dict[str, list[str]] = {run_id: [run_id] for run_id in tops}
        live: set[str] = set()
        level = list(tops)
        while level:
            below: list[str] = []
            for ids in _chunks(level):
                select = sa.select(runs.c.id, runs.c.parent_run_id, runs.c.status).where(
                    runs.c.parent_run_id.in_(ids))
                for child in conn.execute(select.with_for_update() if locking else select):
                    root = root_of[child.id] = root_of[child.parent_run_id]
                    family[root].append(child.id)
                    below.append(child.id)
                    if child.status not in TERMINAL_STATUSES:
                        live.add(root)
            level = below
        kept = [members for root, members in family.items() if root not in live]
        return kept, len(live)

    def _keep(self, conn: sa.Connection, members: list[str], now: datetime, sign: Sign | None) -> int:
        """Insert each member's `pruned_runs` row; its receipt too when `sign` is given."""
        rows, kept = [], 0
        for ids in _chunks(members):
            for run in conn.execute(sa.select(runs.c.id, runs.c.tenant_id, runs.c.status, runs.c.finished_at)
                                    .where(runs.c.id.in_(ids))):
                receipt = None
                if sign is not None:
                    receipt = sign(self._run(conn, run.id), self._events_on(conn, run.id)).decode("utf-8")
                    kept += 1
                rows.append({"run_id": run.id, "tenant_id": run.tenant_id, "status": run.status,
                             "finished_at": run.finished_at, "pruned_at": now, "receipt": receipt})
        if rows:
            conn.execute(pruned_runs.insert(), rows)
        return kept

    @staticmethod
    def _events_on(conn: sa.Connection, run_id: str) -> list[Event]:
        rows = conn.execute(sa.select(journal_events).where(journal_events.c.run_id == run_id)
                            .order_by(journal_events.c.seq)).mappings()
        return [Event(**dict(r)) for r in rows]

    @staticmethod
    def _delete(conn: sa.Connection, members: list[str]) -> int:
        """Delete the members' rows of every table, then the runs; the number of events deleted."""
        events = 0
        for ids in _chunks(members):
            for table in _BY_RUN:
                deleted = conn.execute(table.delete().where(table.c.run_id.in_(ids)))
                events += deleted.rowcount if table is journal_events else 0
            conn.execute(runs.delete().where(runs.c.id.in_(ids)))
        return events


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start:start + _CHUNK])
