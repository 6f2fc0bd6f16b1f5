"""The confidence gate's journal: `confidence_evaluated` at most once per step, which a unique index
decides (migration 0012), with the usage of its model calls added to the run's totals, and
`confidence_gate_bypassed` beside it when policy let the action through (docs/anomalies.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from pal.core.records import Fence, Usage
from pal.core.vocabulary import EventKind
from pal.storage.base import json_safe
from pal.storage.primitives import Primitives
from pal.storage.schema import journal_events, runs


class ConfidenceStore(Primitives):
    def record_confidence(self, fence: Fence, step_id: str, attempt: int, evaluated: Mapping[str, Any],
                          usage: Usage) -> Mapping[str, Any]:
        """Journal the step's evaluation in one fenced transaction; the evaluation that stands (an
        earlier one when the step had been evaluated already: the score is never taken twice).
        Raises LeaseLost when fenced out."""
        with self._tx() as conn:
            self._fence_or_lose(conn, fence)
            payload: Mapping[str, Any] = json_safe(dict(evaluated))
            seq = self._append(conn, fence.run_id, step_id, attempt, EventKind.CONFIDENCE_EVALUATED, payload,
                               fence.generation, fence.now, on_conflict_skip=True)
            if seq is None:
                standing: Mapping[str, Any] = conn.execute(sa.select(journal_events.c.payload).where(
                    journal_events.c.run_id == fence.run_id, journal_events.c.step_id == step_id,
                    journal_events.c.kind == EventKind.CONFIDENCE_EVALUATED)).scalar_one()
                return standing
            if evaluated.get("bypassed"):
                self._append(conn, fence.run_id, step_id, attempt, EventKind.CONFIDENCE_GATE_BYPASSED,
                             {"reason": evaluated["bypassed"], "score": evaluated["score"],
                              "mode": evaluated["mode"]}, fence.generation, fence.now)
            if usage.input_tokens or usage.output_tokens or usage.cost_usd:
                conn.execute(runs.update().where(runs.c.id == fence.run_id).values(
                    input_tokens=runs.c.input_tokens + usage.input_tokens,
                    output_tokens=runs.c.output_tokens + usage.output_tokens,
                    cost_usd=runs.c.cost_usd + usage.cost_usd))
            return payload
