"""Baselines: the recent tokens and cost of each node of each graph, recomputed from the journal's
completed steps (a beat task) and read by workers through a per-process cache
(docs/anomalies.md, "Baselines")."""

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
SCAN_EVENTS = 50_000  # a recomputation reads at most this many recent completions
SCAN_RUNS = 5_000  # ...the step counts of at most this many recently succeeded runs (a fifth of it
# for node retries: every step of a run is a row there)


class BaselineStore(StoreBase):
    def recompute_baselines(self, *, now: datetime, max_samples: int = MAX_SAMPLES,
                            scan: int = SCAN_EVENTS, scan_runs: int = SCAN_RUNS) -> int:
        """Rewrite every baseline from the most recent completed steps that recorded usage (tokens,
        cost), newest first; each node's retries in the most recently finished runs; and the step
        counts of the most recently succeeded runs of each graph. Returns how many (graph, node,
        metric) baselines it wrote."""
        je = journal_events
        recent = (sa.select(runs.c.graph_hash, je.c.step_id, je.c.payload)
                  .join(runs, runs.c.id == je.c.run_id)
                  .where(je.c.kind == EventKind.STEP_COMPLETED, runs.c.graph_hash.is_not(None))
                  .order_by(je.c.seq.desc()).limit(scan))
        samples: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        with self._tx() as conn:
            for graph_hash, step_id, payload in conn.execute(recent):
                usage = (payload or {}).get("usage")
                if not usage or step_id is None:
                    continue
                node = baseline_node(step_id)  # a loop body node's iterations share one
                tokens = samples[(graph_hash, node, "tokens")]
                if len(tokens) < max_samples:
                    used = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
                    tokens.append(float(used))
                    cost = Decimal(str(usage.get("cost_usd", "0")))
                    samples[(graph_hash, node, "cost_usd")].append(float(cost))
            for graph_hash, step_id, retried in conn.execute(_node_retries(scan_runs // 5)):
                counts = samples[(graph_hash, baseline_node(step_id), "retries")]
                if len(counts) < max_samples:
                    counts.append(float(retried))
            for graph_hash, steps in conn.execute(_step_counts(scan_runs)):
                counts = samples[(graph_hash, RUN_NODE, "steps")]
                if len(counts) < max_samples:
                    counts.append(float(steps))
            conn.execute(step_baselines.delete())
            if samples:
                conn.execute(step_baselines.insert(), [
                    {"graph_hash": g, "node_id": n, "metric": m, "samples": values, "updated_at": now}
                    for (g, n, m), values in samples.items()])
        return len(samples)

    def baselines(self, graph_hash: str) -> dict[tuple[str, str], list[float]]:
        """(node, metric) -> recent samples, newest first, of one graph."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(step_baselines.c.node_id, step_baselines.c.metric,
                                          step_baselines.c.samples)
                                .where(step_baselines.c.graph_hash == graph_hash))
            return {(node, metric): list(values) for node, metric, values in rows}


def _recent_runs(limit: int, *statuses: RunStatus) -> sa.Subquery:
    return (sa.select(runs.c.id).where(runs.c.status.in_(statuses), runs.c.graph_hash.is_not(None))
            .order_by(runs.c.finished_at.desc()).limit(limit).subquery())


def _node_retries(limit: int) -> sa.Select[Any]:
    """(graph hash, step id, times it retried) of every step that ran in the most recently
    finished runs, newest first: a step that never retried counts 0."""
    je = journal_events
    recent = _recent_runs(limit, RunStatus.SUCCEEDED, RunStatus.FAILED)
    retried = sa.func.sum(sa.case((je.c.kind == EventKind.STEP_RETRYING, 1), else_=0))
    return (sa.select(runs.c.graph_hash, je.c.step_id, retried)
            .join(recent, recent.c.id == runs.c.id)
            .join(je, sa.and_(je.c.run_id == runs.c.id,
                              je.c.kind.in_((EventKind.STEP_STARTED, EventKind.STEP_RETRYING))))
            .group_by(runs.c.id, runs.c.graph_hash, je.c.step_id, runs.c.finished_at)
            .order_by(runs.c.finished_at.desc()))


def _step_counts(limit: int) -> sa.Select[Any]:
    """(graph hash, steps completed) of the most recently succeeded runs, newest first."""
    je = journal_events
    recent = _recent_runs(limit, RunStatus.SUCCEEDED)
    return (sa.select(runs.c.graph_hash, sa.func.count(je.c.seq))
            .join(recent, recent.c.id == runs.c.id)
            .join(je, sa.and_(je.c.run_id == runs.c.id, je.c.kind == EventKind.STEP_COMPLETED))
            .group_by(runs.c.id, runs.c.graph_hash, runs.c.finished_at)
            .order_by(runs.c.finished_at.desc()))
