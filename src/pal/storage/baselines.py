"""Baselines: the recent tokens and cost of each node of each tenant's graphs, recomputed from the
journal's completed steps (a beat task) and read by workers through a per-process cache
(docs/anomalies.md, "Baselines"). Each tenant's baselines are made from its own runs only, so one
tenant's usage never moves another's anomaly decisions (migration 0022)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from pal.core.anomalies import RUN_NODE
from pal.core.loop_steps import baseline_node
from pal.core.vocabulary import EventKind, RunStatus
from pal.storage.base import StoreBase
from pal.storage.schema import journal_events, runs, step_baselines

MAX_SAMPLES = 200  # per node and metric: recent enough to follow a model change, enough for a median
SCAN_EVENTS = 50_000  # per tenant, a recomputation reads at most this many recent completions
SCAN_RUNS = 5_000  # ...of at most this many of its recent runs, and the step counts of at most this
# many recently succeeded ones (a fifth of it for node retries: every step of a run is a row there)
Samples = dict[tuple[str, str, str, str], list[float]]  # (tenant, graph hash, node, metric) -> values


class BaselineStore(StoreBase):
    def recompute_baselines(self, *, now: datetime, max_samples: int = MAX_SAMPLES,
                            scan: int = SCAN_EVENTS, scan_runs: int = SCAN_RUNS) -> int:
        """Rewrite every baseline, tenant by tenant, from its most recent completed steps that
        recorded usage (tokens, cost), newest first; each node's retries in its most recently
        finished runs; and the step counts of its most recently succeeded runs of each graph.
        Returns how many (tenant, graph, node, metric) baselines it wrote."""
        samples: Samples = defaultdict(list)
        with self._tx() as conn:
            tenants = conn.execute(sa.select(runs.c.tenant_id).distinct()
                                   .where(runs.c.graph_hash.is_not(None))).scalars().all()
            for tenant in tenants:
                _tenant_samples(conn, tenant, samples, max_samples, scan, scan_runs)
            conn.execute(step_baselines.delete())
            if samples:
                conn.execute(step_baselines.insert(), [
                    {"tenant_id": t, "graph_hash": g, "node_id": n, "metric": m, "samples": values,
                     "updated_at": now}
                    for (t, g, n, m), values in samples.items()])
        return len(samples)

    def baselines(self, tenant_id: str, graph_hash: str) -> dict[tuple[str, str], list[float]]:
        """(node, metric) -> recent samples, newest first, of one tenant's graph."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(step_baselines.c.node_id, step_baselines.c.metric,
                                          step_baselines.c.samples)
                                .where(step_baselines.c.tenant_id == tenant_id,
                                       step_baselines.c.graph_hash == graph_hash))
            return {(node, metric): list(values) for node, metric, values in rows}


def _tenant_samples(conn: sa.Connection, tenant: str, samples: Samples, max_samples: int, scan: int,
                    scan_runs: int) -> None:
    """Add one tenant's samples, read from its own runs only."""

    def add(graph_hash: str, node: str, metric: str, value: float) -> None:
        values = samples[(tenant, graph_hash, node, metric)]
        if len(values) < max_samples:
            values.append(value)

    for graph_hash, step_id, payload in conn.execute(_recent_usage(tenant, scan, scan_runs)):
        usage = (payload or {}).get("usage")
        if not usage or step_id is None:
            continue
        node = baseline_node(step_id)  # a loop body node's iterations share one
        tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        add(graph_hash, node, "tokens", float(tokens))
        add(graph_hash, node, "cost_usd", float(Decimal(str(usage.get("cost_usd", "0")))))
    for graph_hash, step_id, retried in conn.execute(_node_retries(tenant, scan_runs // 5)):
        add(graph_hash, baseline_node(step_id), "retries", float(retried))
    for graph_hash, steps in conn.execute(_step_counts(tenant, scan_runs)):
        add(graph_hash, RUN_NODE, "steps", float(steps))


def _recent_usage(tenant: str, scan: int, scan_runs: int) -> sa.Select[Any]:
    """(graph hash, step id, payload) of the completions of the tenant's most recent runs, newest
    first (ix_runs_tenant_created finds the runs, ix_journal_events_run_seq their events)."""
    je = journal_events
    recent = (sa.select(runs.c.id, runs.c.graph_hash)
              .where(runs.c.tenant_id == tenant, runs.c.graph_hash.is_not(None))
              .order_by(runs.c.created_at.desc()).limit(scan_runs).subquery())
    return (sa.select(recent.c.graph_hash, je.c.step_id, je.c.payload)
            .join(recent, recent.c.id == je.c.run_id)
            .where(je.c.kind == EventKind.STEP_COMPLETED)
            .order_by(je.c.seq.desc()).limit(scan))


def _recent_runs(tenant: str, limit: int, *statuses: RunStatus) -> sa.Subquery:
    return (sa.select(runs.c.id).where(runs.c.tenant_id == tenant, runs.c.status.in_(statuses),
                                       runs.c.graph_hash.is_not(None))
            .order_by(runs.c.finished_at.desc()).limit(limit).subquery())


def _node_retries(tenant: str, limit: int) -> sa.Select[Any]:
    """(graph hash, step id, times it retried) of every step that ran in the tenant's most recently
    finished runs, newest first: a step that never retried counts 0."""
    je = journal_events
    recent = _recent_runs(tenant, limit, RunStatus.SUCCEEDED, RunStatus.FAILED)
    retried = sa.func.sum(sa.case((je.c.kind == EventKind.STEP_RETRYING, 1), else_=0))
    return (sa.select(runs.c.graph_hash, je.c.step_id, retried)
            .join(recent, recent.c.id == runs.c.id)
            .join(je, sa.and_(je.c.run_id == runs.c.id,
                              je.c.kind.in_((EventKind.STEP_STARTED, EventKind.STEP_RETRYING))))
            .group_by(runs.c.id, runs.c.graph_hash, je.c.step_id, runs.c.finished_at)
            .order_by(runs.c.finished_at.desc()))


def _step_counts(tenant: str, limit: int) -> sa.Select[Any]:
    """(graph hash, steps completed) of the tenant's most recently succeeded runs, newest first."""
    je = journal_events
    recent = _recent_runs(tenant, limit, RunStatus.SUCCEEDED)
    return (sa.select(runs.c.graph_hash, sa.func.count(je.c.seq))
            .join(recent, recent.c.id == runs.c.id)
            .join(je, sa.and_(je.c.run_id == runs.c.id, je.c.kind == EventKind.STEP_COMPLETED))
            .group_by(runs.c.id, runs.c.graph_hash, runs.c.finished_at)
            .order_by(runs.c.finished_at.desc()))
