"""Derived runs (docs/retry-and-fork.md): create a run that retries or forks a finished one, in one
transaction, and read a run's lineage in the other direction (the runs derived from it).

A derived run is a new run, never the old one reopened: the source's journal is append-only and
may already be covered by a signed receipt (docs/receipts.md). Its own journal is self-contained:
`run_queued`, then `run_retried`/`run_forked` naming the source and the steps it reuses, then one
`step_completed {output, reused_from}` per reused step in the source's order, all written before
any step of the new run starts. Readers (the interpreter, recovery, `pal doctor`, receipts) see
completed steps like any others; nothing of the source is changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from pal.core.records import RunRecord
from pal.core.vocabulary import DERIVED_EVENT, EventKind, LockHolder, RunStatus, SourceKind
from pal.errors import Refused, RunIdReused, RunIdTaken, RunNotFound
from pal.storage.base import json_safe
from pal.storage.runs import RunStore, _same_request
from pal.storage.schema import journal_events, run_locks, runs

ReuseFrontier = Callable[[RunRecord, Mapping[str, Any]], Sequence[str]]
"""frontier(source, reused): the steps a run with these completed steps dispatches first."""


@dataclass(frozen=True)
class DerivedRequest:
    """What a retry or a fork asks for; `keep(step_id)` says whether a completed step is reused."""

    source_run_id: str
    run_id: str
    kind: SourceKind
    from_step: str | None
    run_input: Any
    keep: Callable[[str], bool]
    allowed: tuple[str, ...]  # the source statuses this kind accepts
    tenant_id: str | None = None  # None: any tenant's run (the CLI, an operator)
    # A retry's fixed graph (checked by pal.engine.lineage) and its hash; None: the source's.
    graph: dict[str, Any] | None = None
    graph_hash: str | None = None


@dataclass(frozen=True)
class Derived:
    run: RunRecord
    created: bool  # False: the same request with the same run id again (idempotent)
    dispatch: tuple[str, ...]  # the steps to publish, generation 1 (empty when not created)
    reused: tuple[str, ...]


class LineageStore(RunStore):
    def create_derived_run(self, request: DerivedRequest, *, frontier: ReuseFrontier, now: datetime,
                           lease_ttl: float, max_in_flight: int | None = None) -> Derived:
        """Create the derived run, its journal up to the reused steps and its first lease, in one
        transaction: RunNotFound (another tenant's source too), Refused (the source's status, a
        run id in use, nothing left to run), QuotaExceeded; nothing is written on any of them."""
        with self._tx() as conn:
            # A share lock on the source (Postgres): a prune deleting it either commits first (this
            # then finds no run) or passes it over, so the source is read whole (docs/retention.md).
            conn.execute(sa.select(runs.c.id).where(runs.c.id == request.source_run_id)
                         .with_for_update(read=True, key_share=True))
            source = self._run(conn, request.source_run_id)
            if request.tenant_id is not None and source.tenant_id != request.tenant_id:
                raise RunNotFound(f"no run {request.source_run_id!r}")
            if self._exists(conn, request.run_id):
                return Derived(self._same_derived(conn, request, source), False, (), ())
            if source.parent_run_id is not None:
                raise Refused(f"run {source.id} is a subagent's child run; retry or fork its parent run "
                              f"{source.parent_run_id}")
            if source.status not in request.allowed:
                raise Refused(f"run {source.id} is {source.status}; a {request.kind} needs a run that is "
                              f"{' or '.join(request.allowed)}")
            if max_in_flight is not None:
                self._check_quota(conn, source.tenant_id, max_in_flight)
            reused = self._reusable(conn, source.id, request.keep)
            inserted = conn.execute(self._insert(runs).values(
                id=request.run_id, tenant_id=source.tenant_id, kind=source.kind,
                graph=source.graph if request.graph is None else request.graph,
                graph_hash=request.graph_hash or source.graph_hash, input=json_safe(request.run_input),
                status=RunStatus.QUEUED, tier="shared", cost_usd=Decimal(0), input_tokens=0, output_tokens=0,
                created_at=now,
                limits=dict(source.limits) if source.limits is not None else None,
                source_run_id=source.id, source_kind=request.kind, source_step_id=request.from_step,
            ).on_conflict_do_nothing().returning(runs.c.id)).first()
            if inserted is None:  # a concurrent request took the id first
                return Derived(self._same_derived(conn, request, source), False, (), ())
            self._refuse_pruned(conn, request.run_id)
            self._write_journal(conn, request, source, reused, now)
            # Decided after the writes, from the outputs as written: a refusal here rolls them back.
            dispatch = tuple(frontier(source, self._completed(conn, request.run_id)))
            if not dispatch:
                raise Refused(f"a {request.kind} of run {source.id}"
                              f"{' from ' + request.from_step if request.from_step else ''} would run no "
                              "step: every step it would reach is reused or skipped")
            conn.execute(run_locks.insert().values(
                run_id=request.run_id, worker_id=LockHolder.QUEUED,
                expires_at=now + timedelta(seconds=lease_ttl), generation=1))
            record = self._run(conn, request.run_id)
        return Derived(record, True, dispatch, tuple(reused))

    def derived_runs(self, run_id: str) -> list[dict[str, Any]]:
        """The runs retried or forked from `run_id`, oldest first: {run_id, kind, status}."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(runs.c.id, runs.c.source_kind, runs.c.status)
                                .where(runs.c.source_run_id == run_id)
                                .order_by(runs.c.created_at, runs.c.id)).all()
        return [{"run_id": r.id, "kind": r.source_kind, "status": r.status} for r in rows]

    def _reusable(self, conn: sa.Connection, source_id: str, keep: Callable[[str], bool]) -> dict[str, Any]:
        """The source's completions that `keep` reuses, by step, in the source's journal order."""
        je = journal_events
        rows = conn.execute(sa.select(je.c.seq, je.c.step_id, je.c.attempt, je.c.payload)
                            .where(je.c.run_id == source_id, je.c.kind == EventKind.STEP_COMPLETED)
                            .order_by(je.c.seq)).all()
        return {r.step_id: r for r in rows if keep(r.step_id)}

    def _write_journal(self, conn: sa.Connection, request: DerivedRequest, source: RunRecord,
                       reused: Mapping[str, Any], now: datetime) -> None:
        run_id = request.run_id
        queued = {"graph_hash": source.graph_hash}
        self._append(conn, run_id, None, None, EventKind.RUN_QUEUED, queued, 1, now)
        lineage: dict[str, Any] = {"source_run_id": source.id, "reused_steps": list(reused)}
        if request.from_step is not None:
            lineage["from_step"] = request.from_step
        self._append(conn, run_id, None, None, DERIVED_EVENT[request.kind], lineage, 1, now)
        for step_id, row in reused.items():
            earlier = (row.payload or {}).get("reused_from") or {}
            origin = earlier.get("origin_run_id") or earlier.get("run_id") or source.id
            # attempt None: the step ran in no attempt of this run; `usage` stays with the run
            # that spent it, so this run's totals count only what it spends (`pal doctor`).
            payload = {"output": (row.payload or {}).get("output"),
                       "reused_from": {"run_id": source.id, "seq": row.seq, "attempt": row.attempt,
                                       "origin_run_id": origin}}
            self._append(conn, run_id, step_id, None, EventKind.STEP_COMPLETED, payload, 1, now)

    def _same_derived(self, conn: sa.Connection, request: DerivedRequest, source: RunRecord) -> RunRecord:
        """The existing run under the requested id, if it is this very request again; RunIdTaken
        (someone else's id, named by nothing of the run) or RunIdReused otherwise."""
        existing = self._run(conn, request.run_id)
        if existing.tenant_id != source.tenant_id or existing.parent_run_id is not None:
            raise RunIdTaken(f"run id {request.run_id!r} is not available; choose another, or omit it "
                             "for a generated one")
        same = (existing.source_run_id, existing.source_kind, existing.source_step_id) == (
            source.id, request.kind, request.from_step)
        if not (same and _same_request(existing, request.graph_hash or source.graph_hash, request.run_input)):
            raise RunIdReused(f"run id {request.run_id!r} is already another run; use a new id (or omit "
                              "it) for new work")
        return existing
