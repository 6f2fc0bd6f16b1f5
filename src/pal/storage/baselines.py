"""Baselines: the recent tokens and cost of each node of each graph, recomputed from the journal's
completed steps (a beat task) and read by workers through a per-process cache
(docs/anomalies.md, "Baselines")."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa

from pal.core.vocabulary import EventKind
from pal.storage.base import StoreBase
from pal.storage.schema import journal_events, runs, step_baselines

MAX_SAMPLES = 200  # per node and metric: recent enough to follow a model change, enough for a median
SCAN_EVENTS = 50_000  # a recomputation reads at most this many recent completions


class BaselineStore(StoreBase):
    def recompute_baselines(self, *, now: datetime, max_samples: int = MAX_SAMPLES,
                            scan: int = SCAN_EVENTS) -> int:
        """Rewrite every baseline from the most recent completed steps that recorded usage, newest
        first; returns how many (graph, node, metric) baselines it wrote."""
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
                tokens = samples[(graph_hash, step_id, "tokens")]
                if len(tokens) < max_samples:
                    used = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
                    tokens.append(float(used))
                    cost = Decimal(str(usage.get("cost_usd", "0")))
                    samples[(graph_hash, step_id, "cost_usd")].append(float(cost))
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
