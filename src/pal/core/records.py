"""The records every layer passes around: what storage returns and the engine and API read.

Plain frozen dataclasses with no behaviour beyond their JSON form, so storage, the planner, nodes
and the API can share them without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any

from pal.core.step_log import StepLog
from pal.core.vocabulary import TERMINAL_STATUSES


def plain_decimal(value: Decimal) -> str:
    """`value` as people write money: "0", "0.0125", "100" (never `str`'s "0E-8" or "1E+2")."""
    return format(value.normalize(), "f")


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class RunRecord:
    id: str
    tenant_id: str
    kind: str  # "graph" | "llm" | "microvm"
    status: str  # a RunStatus
    graph: Any
    graph_hash: str | None
    input: Any
    output: Any
    error: Any
    parent_run_id: str | None
    parent_step_id: str | None
    cost_usd: Decimal
    input_tokens: int
    output_tokens: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    limits: Mapping[str, Any] | None = None  # the run's own budget, over its plan's (docs/anomalies.md)
    # Lineage (docs/retry-and-fork.md): the run this one retries or forks, how, and the fork's step.
    source_run_id: str | None = None
    source_kind: str | None = None  # a SourceKind
    source_step_id: str | None = None
    priority: int | None = None  # 1 first .. 5 last; None: 3 (pal.core.admission)
    admitted: bool | None = None  # holds an admission slot, waits for one (False), or neither (None)

    @property
    def held(self) -> bool:
        """Queued, waiting for an admission slot (no worker, no message)."""
        return self.admitted is False and not self.terminal

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def graph_name(self) -> str | None:
        """The `name` of the run's plan snapshot, if it has one (what the runs list shows)."""
        name = self.graph.get("name") if isinstance(self.graph, Mapping) else None
        return name if isinstance(name, str) else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "tenant_id": self.tenant_id, "kind": self.kind, "status": self.status,
            "graph_hash": self.graph_hash, "input": self.input, "output": self.output,
            "error": self.error, "parent_run_id": self.parent_run_id,
            "parent_step_id": self.parent_step_id, "cost_usd": plain_decimal(self.cost_usd),
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "created_at": iso(self.created_at), "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at), "limits": self.limits,
            "source_run_id": self.source_run_id, "source_kind": self.source_kind,
            "source_step_id": self.source_step_id, "priority": self.priority or 3, "held": self.held,
        }


@dataclass(frozen=True)
class Event:
    """One row of journal_events."""

    seq: int
    run_id: str
    step_id: str | None
    attempt: int | None
    kind: str  # an EventKind
    payload: Any
    generation: int
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "run_id": self.run_id, "step_id": self.step_id,
            "attempt": self.attempt, "kind": self.kind, "payload": self.payload,
            "generation": self.generation, "created_at": iso(self.created_at),
        }


@dataclass(frozen=True)
class Violation:
    """One breach of a journal invariant, found by `pal doctor`."""

    kind: str
    run_id: str
    step_id: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "run_id": self.run_id, "step_id": self.step_id, "detail": self.detail}


@dataclass(frozen=True)
class Lease:
    """A run's row of run_locks while a generation holds it."""

    run_id: str
    worker_id: str
    expires_at: datetime
    generation: int
    redeliver_at: datetime | None = None  # unclaimed recovery: when its messages are sent again


@dataclass(frozen=True)
class Fence:
    """Who writes for a run, and until when: every fenced write first proves that `generation`
    still holds the run's lease and extends it to `now + lease_ttl` for `worker_id`."""

    run_id: str
    generation: int
    worker_id: str
    now: datetime
    lease_ttl: float

    @property
    def expires_at(self) -> datetime:
        return self.now + timedelta(seconds=self.lease_ttl)

    def held_for(self, lease_ttl: float) -> Fence:
        """The same fence with another lease length (a retry's backoff holds the lease longer)."""
        return Fence(self.run_id, self.generation, self.worker_id, self.now, lease_ttl)


class ClaimOutcome(Enum):
    RUN = "run"  # step_started appended: execute the node
    COMPLETED = "completed"  # the step already has step_completed: nothing to do
    DUPLICATE = "duplicate"  # this attempt is already claimed under this generation
    STALE = "stale"  # the message's generation is not the lease's (or the run has no lease)
    TERMINAL = "terminal"  # the run is over
    BACKOFF = "backoff"  # the step is between retry attempts; its next attempt is not due yet
    WAITING = "waiting"  # the step is parked (approval, subagent); a message cannot resume it
    NOT_READY = "not_ready"  # not on the run's ready frontier (unknown, not reachable yet): refused


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    run: RunRecord | None = None  # as first read by this process: status and totals may be stale
    attempt: int = 0
    completed: Mapping[str, Any] | None = None
    wait_s: float = 0.0  # BACKOFF: seconds until the next attempt is due
    log: StepLog | None = None  # RUN: the run's step log the claim decided on (what was spent)


@dataclass(frozen=True)
class ClaimAhead:
    """A successor's attempt that the completion before it started for its caller, the worker
    thread that runs it next: its claim, for that run, step and generation, until `until`
    (time.monotonic()). The completion fenced the lease a moment before; the heartbeat renews it
    after a third of its time, so a claim ahead lives at most a quarter of it."""

    run_id: str
    step_id: str
    generation: int
    until: float
    claim: Claim

    def answers(self, run_id: str, step_id: str, generation: int, now: float) -> bool:
        same = (self.run_id, self.step_id, self.generation) == (run_id, step_id, generation)
        return same and now < self.until


@dataclass(frozen=True)
class Recovery:
    generation: int
    resumed_steps: tuple[str, ...]


@dataclass(frozen=True)
class Handoff:
    """What completing one step leads to: steps to dispatch now, and whether the run is over."""

    dispatch: tuple[str, ...]
    finished: bool
    output: Any = None
    error: Mapping[str, Any] | None = None  # a finished run that failed (e.g. a turn limit)
    ahead: ClaimAhead | None = None  # the claim of the one successor the completion also started


@dataclass(frozen=True)
class Usage:
    """Tokens and dollars one step spent; the journal adds them to the run's totals once."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)


@dataclass(frozen=True)
class Receipt:
    """A row of side_effect_receipts as a delivering node sees it."""

    status: str  # a ReceiptStatus
    response: Any
    new: bool  # this call created the claim (False: an earlier invocation did)


Plan = Callable[[Mapping[str, Any]], Handoff]
"""plan(completed): what the run does next given every completed step's output."""
Meanwhile = Callable[[Handoff], object]
"""meanwhile(decision): work done while a completion that will hand off `decision` is on its way."""
Frontier = Callable[[Mapping[str, Any]], Sequence[str]]
"""frontier(completed): the steps a plan finds ready (in flight or waiting), as in a re-drive."""
Ready = Callable[[RunRecord, Mapping[str, Any]], bool]
"""ready(run, completed): whether the claimed step is on the run's ready frontier."""
Needs = Callable[[RunRecord, Mapping[str, Any]], "frozenset[str] | None"]
"""needs(run, completed): the steps whose completion alone would make the claimed step ready
(pal.plan.interpreter.Program.needs), or None."""
Replay = Callable[[RunRecord, Mapping[str, Any]], Sequence[str]]
"""replay(run, completed): the steps a re-drive resumes."""


@dataclass(frozen=True)
class Schedule:
    tenant_id: str
    name: str
    cron: str
    timezone: str
    graph: Any
    input: Any
    overlap: str  # "skip" | "queue" | "cancel": what a tick does while the previous run is in flight
    catch_up: bool  # fire every missed tick after downtime, rather than one
    paused: bool
    next_at: datetime
    last_run_id: str | None
    last_fired_at: datetime | None
    last_error: str | None
    skipped: int
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """The schedule as the API and CLI show it (its graph left out: it can be large)."""
        shown = {k: v for k, v in self.__dict__.items() if k not in ("graph", "tenant_id")}
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in shown.items()}
