"""What a claim and a hand-off need of one run's journal, kept per process and read incrementally.

A step's claim must know which steps completed (and their outputs, for templates), which were
retried (the attempt number and the backoff), and which are parked. Reading all of that for every
step makes a run of n steps cost O(n²); instead each process keeps a `StepLog` per run and reads only
the events after the last `seq` it has seen.

That is sound because every event of these kinds is appended under the run's lock row (a fenced
claim, completion, retry or park, or a locked decision): for one run, their seqs are allocated and
committed in the same order, so the visible ones always form a prefix in seq order. A log is kept
only once the transaction that read it has committed, so a completion that was rolled back never
lingers here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from pal.core.views import GrowingOutputs
from pal.core.vocabulary import EventKind

# approval_decided ends a step's wait: it is the one event a budget pause is resumed by (the step
# then runs; docs/anomalies.md, "Budgets"), and an approval's decision comes with its completion.
# confidence_evaluated: the gate's score, read back by a re-drive, and what its samples spent.
LOG_KINDS = (EventKind.STEP_COMPLETED, EventKind.STEP_RETRYING, EventKind.STEP_WAITING,
             EventKind.APPROVAL_DECIDED, EventKind.CONFIDENCE_EVALUATED)
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_SPENDING = (EventKind.STEP_COMPLETED, EventKind.CONFIDENCE_EVALUATED)
RESUMING_WAITS = ("budget", "confidence")  # waits that, approved, let the step itself run on
DECIDED_WAITS = ("approval", *RESUMING_WAITS)  # what a person decides (a subagent waits for its child)


@dataclass(frozen=True)
class StepLog:
    """One run's step events up to `seq`: completed outputs, retry payloads, parked steps, the
    steps a person let run on (past the budget, past the confidence gate), the gate's evaluations,
    and what the steps spent (the usage their `step_completed` and `confidence_evaluated` recorded)."""

    seq: int = 0
    outputs: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    retries: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=lambda: _EMPTY)
    waited: frozenset[str] = frozenset()
    tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    retry_count: int = 0  # step_retrying events of the run
    # step -> the kinds of its waits a person approved that let it run on ("budget", "confidence")
    resumed: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    gates: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _EMPTY)  # confidence_evaluated

    def next_attempt(self, step_id: str) -> int:
        """The attempt a claim of the step starts: 1 plus its retries, plus one per approved wait
        that let it run on (the paused attempt was claimed but its node never ran). A crash
        mid-attempt resumes the same attempt, so it keeps its idempotency key."""
        return 1 + len(self.retries.get(step_id, ())) + len(self.resumed.get(step_id, ()))

    @property
    def over_budget(self) -> frozenset[str]:
        """Steps a person let run past the budget (an approved budget pause)."""
        return frozenset(s for s, kinds in self.resumed.items() if "budget" in kinds)

    def backoff_due(self, step_id: str) -> datetime | None:
        """When the step's last retry lets the next attempt start; None if it set no wait."""
        retries = self.retries.get(step_id, ())
        wake_at = retries[-1].get("wake_at") if retries else None
        return datetime.fromisoformat(wake_at) if wake_at else None

    def extended(self, rows: Iterable[Any]) -> StepLog:
        """This log with later events (rows of seq, step_id, kind, payload, in seq order) added;
        the log itself is never changed, readers in other threads may hold it."""
        outputs: dict[str, Any] = {}  # added to the log's own below: a copy of them costs O(steps)
        retries, waited, seq = dict(self.retries), set(self.waited), self.seq
        tokens, cost, retry_count = self.tokens, self.cost_usd, self.retry_count
        resumed, gates = dict(self.resumed), dict(self.gates)
        for row in rows:
            seq = max(seq, row.seq)
            if row.kind in _SPENDING:  # only model calls record usage
                payload = row.payload or {}
                if row.kind == EventKind.STEP_COMPLETED:
                    outputs[row.step_id] = payload.get("output")
                else:
                    gates[row.step_id] = payload
                usage = payload.get("usage")
                if usage:
                    tokens += int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
                    cost += Decimal(str(usage.get("cost_usd", "0")))
            elif row.kind == EventKind.STEP_RETRYING:
                retries[row.step_id] = (*retries.get(row.step_id, ()), row.payload or {})
                retry_count += 1
            elif row.kind == EventKind.STEP_WAITING:
                waited.add(row.step_id)
            elif row.kind == EventKind.APPROVAL_DECIDED:
                waited.discard(row.step_id)
                payload = row.payload or {}
                if payload.get("kind") in RESUMING_WAITS and payload.get("decision") == "approved":
                    resumed[row.step_id] = (*resumed.get(row.step_id, ()), payload["kind"])
        return StepLog(seq, _outputs_of(self).added(outputs), MappingProxyType(retries), frozenset(waited),
                       tokens, cost, retry_count, MappingProxyType(resumed), MappingProxyType(gates))


def _outputs_of(log: StepLog) -> GrowingOutputs:
    """The log's outputs as a view that grows without copying (a log built with a plain mapping
    is turned into one, once)."""
    if isinstance(log.outputs, GrowingOutputs):
        return log.outputs
    return GrowingOutputs().added(log.outputs)
