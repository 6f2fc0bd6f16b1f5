"""The storage boundary: the only module that opens transactions.

Every correctness decision is taken inside one transaction, fenced by the run's lease row:
claims and completions first UPDATE `run_locks ... WHERE generation = :g`, which both proves the
caller still holds the lease and serializes all writers of that run (a row lock on Postgres,
the database write lock on SQLite). Unique partial indexes make step_completed once per step and
the terminal event once per run.

On Postgres the usual claim and the usual completion are one statement each, a server-side function
run in autocommit mode (pal.storage.one_call, migration 0006): the decision is predicted from the
process's step log and the function applies it only if the journal has nothing newer, under the
same fence; otherwise the transaction below decides.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from pal.core import faults, retry
from pal.core.lru import Lru
from pal.core.step_log import LOG_KINDS, StepLog
from pal.core.views import WithOne
from pal.errors import (
    LeaseBusy,
    LeaseLost,
    QuotaExceeded,
    Refused,
    RunIdTaken,
    RunNotFound,
    StorageError,
    journal_error,
)
from pal.nodes.base import Receipt, Usage
from pal.plan.interpreter import Handoff
from pal.plan.programs import program_of
from pal.storage.one_call import AutocommitCalls, FunctionCall, calls_for
from pal.storage.schema import (
    FENCE_KEY,
    IN_FLIGHT_STATUSES,
    TERMINAL_STATUSES,
    api_tokens,
    journal_events,
    pal_keys,
    run_locks,
    runs,
    side_effect_receipts,
)

TERMINAL_EVENT = {"succeeded": "run_succeeded", "failed": "run_failed", "cancelled": "run_cancelled"}
_ON_COMMIT = "pal_on_commit"  # Connection.info key of the current transaction's after-commit work

# Statements of the step protocol, built once (bind parameter names differ from column names).
_FENCE = (
    run_locks.update()
    .where(run_locks.c.run_id == sa.bindparam("fence_run"),
           run_locks.c.generation == sa.bindparam("fence_generation"))
    .values(expires_at=sa.bindparam("fence_expires"), worker_id=sa.bindparam("fence_worker"),
            redeliver_at=None)
    .returning(run_locks.c.generation)
)
_RUN_ROWS = sa.select(*(c for c in runs.c if c.name != "graph"))
_RUN_ROW = _RUN_ROWS.where(runs.c.id == sa.bindparam("row_run"))
_LOG_SINCE = (
    sa.select(journal_events.c.seq, journal_events.c.step_id, journal_events.c.kind, journal_events.c.payload)
    .where(journal_events.c.run_id == sa.bindparam("log_run"),
           journal_events.c.seq > sa.bindparam("log_after"), journal_events.c.kind.in_(LOG_KINDS))
    .order_by(journal_events.c.seq)
)
_LOGS_SINCE = (  # several runs' step logs at once (a sweep batch)
    sa.select(journal_events.c.run_id, journal_events.c.seq, journal_events.c.step_id, journal_events.c.kind,
              journal_events.c.payload)
    .where(journal_events.c.run_id.in_(sa.bindparam("logs_runs", expanding=True)),
           journal_events.c.seq > sa.bindparam("logs_after"), journal_events.c.kind.in_(LOG_KINDS))
    .order_by(journal_events.c.run_id, journal_events.c.seq)
)
_EVENT_COLUMNS = {"run_id": "ev_run", "step_id": "ev_step", "attempt": "ev_attempt", "kind": "ev_kind",
                  "payload": "ev_payload", "generation": "ev_generation", "created_at": "ev_at"}
_EVENT_VALUES: dict[str, Any] = {column: sa.bindparam(name) for column, name in _EVENT_COLUMNS.items()}


# Postgres: the step protocol's server-side functions (migration 0005 says why), and the seqs of
# the rows they return instead of events.
_CLAIM_FENCE = "SELECT * FROM pal_claim_fence(%s, %s, %s, %s, %s)"
_COMPLETE_FENCE = "SELECT * FROM pal_complete_fence(%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s)"
_START_STEP = "SELECT pal_start_step(%s, %s, %s, %s, %s::jsonb, %s)"
_CLAIM_FENCE_CALL = FunctionCall.of("pal_claim_fence", ("text", "integer", "text", "timestamptz", "bigint"))
_CLAIM_STEP = FunctionCall.of("pal_claim_step", (
    "text", "integer", "text", "timestamptz", "bigint", "text", "integer", "jsonb", "timestamptz", "boolean"))
_COMPLETE_STEP = FunctionCall.of("pal_complete_step", (
    "text", "integer", "text", "timestamptz", "bigint", "text", "integer", "jsonb", "timestamptz"))
FENCED_OUT, ALREADY_COMPLETED, STARTED, DUPLICATE = -1, -2, -3, -4


class EventRow(NamedTuple):
    """A row of the step functions: an event of the step log, or a marker (negative seq)."""

    seq: int
    step_id: str | None
    kind: str
    payload: Any


Frontier = Callable[[Mapping[str, Any]], Sequence[str]]
"""frontier(completed): the steps a plan finds ready (in flight or waiting), as in a re-drive."""
PARKED = "waiting"  # worker_id of a parked run's lock row: a wake-up timer, not a lease
WAIT_RECHECK_SECONDS = 600.0  # a parked run is looked at again at least this often
GRAPH_CACHE_SIZE = 128  # plan documents kept decoded per process
OUTPUT_CACHE_RUNS = 64  # runs whose completed outputs are kept decoded per process


@dataclass(frozen=True)
class RunRecord:
    id: str
    tenant_id: str
    kind: str
    status: str
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

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "tenant_id": self.tenant_id, "kind": self.kind, "status": self.status,
            "graph_hash": self.graph_hash, "input": self.input, "output": self.output,
            "error": self.error, "parent_run_id": self.parent_run_id,
            "parent_step_id": self.parent_step_id, "cost_usd": str(self.cost_usd),
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "created_at": _iso(self.created_at), "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


@dataclass(frozen=True)
class Event:
    seq: int
    run_id: str
    step_id: str | None
    attempt: int | None
    kind: str
    payload: Any
    generation: int
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "run_id": self.run_id, "step_id": self.step_id,
            "attempt": self.attempt, "kind": self.kind, "payload": self.payload,
            "generation": self.generation, "created_at": _iso(self.created_at),
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
    run_id: str
    worker_id: str
    expires_at: datetime
    generation: int
    redeliver_at: datetime | None = None  # unclaimed recovery: when its messages are sent again


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


Ready = Callable[[RunRecord, Mapping[str, Any]], bool]
"""ready(run, completed): whether the claimed step is on the run's ready frontier."""


class _NotReady(Exception):
    """Control flow: the claimed step is not ready; roll the claim's transaction back."""


@dataclass(frozen=True)
class Recovery:
    generation: int
    resumed_steps: tuple[str, ...]


def _token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _json_safe(value: Any) -> Any:
    """Round-trip through JSON so what we store is exactly what a reader gets back."""
    return json.loads(json.dumps(value))


class Journal:
    """Named operations on the journal database. Time is always passed in (`now`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Caches, so a step does not decode the whole graph and re-read every earlier event: a
        # plan's document by (kind, hash) (a hash names one document), and each run's step log,
        # read incrementally (pal.core.step_log says why that is sound).
        self._graphs: Lru[tuple[str, str], Any] = Lru(GRAPH_CACHE_SIZE)
        self._logs: Lru[str, StepLog] = Lru(OUTPUT_CACHE_RUNS)
        self._claimed_runs: Lru[str, RunRecord] = Lru(OUTPUT_CACHE_RUNS)
        self._fence_key: bytes | None = None
        self._insert: Callable[..., Any] = (
            postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        )
        # The hot path's statements, built once: a step pays for executing them, not for building
        # their expression trees again.
        self._append_stmt = self._insert(journal_events).values(_EVENT_VALUES).returning(journal_events.c.seq)
        self._append_once_stmt = (self._insert(journal_events).values(_EVENT_VALUES)
                                  .on_conflict_do_nothing().returning(journal_events.c.seq))
        # Postgres: the step functions exist and the one-call claim and completion run here
        # (pal.storage.one_call); None on SQLite, which takes the plain statements.
        self.calls = calls_for(engine) if engine.dialect.name == "postgresql" else None

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        """One transaction; work registered with `_on_commit` runs only once it has committed."""
        committed: list[Callable[[], None]] = []
        with _storage_errors(), self.engine.begin() as conn:
            conn.info[_ON_COMMIT] = committed
            try:
                yield conn
            finally:
                conn.info.pop(_ON_COMMIT, None)
        for action in committed:
            action()

    @staticmethod
    def _on_commit(conn: sa.Connection, action: Callable[[], None]) -> None:
        conn.info[_ON_COMMIT].append(action)

    # ----------------------------------------------------------------- writes

    def create_run(
        self,
        *,
        run_id: str,
        tenant_id: str,
        kind: str,
        graph: Any,
        graph_hash: str | None,
        run_input: Any,
        now: datetime,
        lease_ttl: float,
        parent_run_id: str | None = None,
        parent_step_id: str | None = None,
        max_in_flight: int | None = None,
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, its `run_queued` event and its first lease (generation 1).

        Idempotent on `run_id`: a second call by the same tenant (and, for a child run, the same
        parent step) returns the existing run and `False`; any other caller gets RunIdTaken.
        """
        with self._tx() as conn:
            if parent_run_id is not None:
                # Under the parent's lock row: a cancellation of the parent either sees this child
                # or makes this insert see a finished parent.
                conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == parent_run_id)
                             .with_for_update())
                parent = self._run(conn, parent_run_id)
                if parent.terminal:
                    raise Refused(f"run {parent_run_id} is {parent.status}; it starts no child runs")
            elif max_in_flight is not None and not self._exists(conn, run_id):
                in_flight = conn.execute(sa.select(sa.func.count()).select_from(runs).where(
                    runs.c.tenant_id == tenant_id, runs.c.status.in_(IN_FLIGHT_STATUSES),
                    runs.c.parent_run_id.is_(None))).scalar_one()
                if in_flight >= max_in_flight:
                    raise QuotaExceeded(f"tenant {tenant_id!r} has {in_flight} runs queued or running, the "
                                        f"most PAL_MAX_RUNS_IN_FLIGHT allows ({max_in_flight}); try later")
            inserted = conn.execute(
                self._insert(runs)
                .values(
                    id=run_id, tenant_id=tenant_id, kind=kind, graph=graph,
                    graph_hash=graph_hash, input=run_input, status="queued", tier="shared",
                    parent_run_id=parent_run_id, parent_step_id=parent_step_id,
                    cost_usd=Decimal(0), input_tokens=0, output_tokens=0, created_at=now,
                )
                .on_conflict_do_nothing()
                .returning(runs.c.id)
            ).first()
            if inserted is None:
                # The id exists. It is this caller's run again only if tenant and parent agree,
                # decided here, after the insert, in its transaction: a check made before it would
                # race a concurrent insert by someone else (docs/security.md). The refusal names
                # nothing of the run that holds the id.
                owner = conn.execute(sa.select(runs.c.tenant_id, runs.c.parent_run_id, runs.c.parent_step_id)
                                     .where(runs.c.id == run_id)).one()
                if tuple(owner) != (tenant_id, parent_run_id, parent_step_id):
                    raise RunIdTaken(f"run id {run_id!r} is not available; choose another, or omit it "
                                     "for a generated one")
            else:
                queued: dict[str, Any] = {"graph_hash": graph_hash}
                if parent_run_id is not None:
                    queued |= {"parent_run_id": parent_run_id, "parent_step_id": parent_step_id}
                self._append(conn, run_id, None, None, "run_queued", queued, 1, now)
                conn.execute(
                    run_locks.insert().values(
                        run_id=run_id, worker_id="queued",
                        expires_at=now + timedelta(seconds=lease_ttl), generation=1,
                    )
                )
            record = self._run(conn, run_id)
        return record, inserted is not None

    def claim_step(
        self, *, run_id: str, step_id: str, generation: int, worker_id: str,
        now: datetime, lease_ttl: float, ready: Ready | None = None,
    ) -> Claim:
        """Step protocol, phase 1: fence on the lease and append `step_started`.

        A step that is not on the run's ready frontier (`ready`) is refused with nothing written:
        a message is a doorbell, it cannot start a step the journal has not made ready."""
        if self.calls is not None:
            claim = self._claim_in_one_call(self.calls, run_id, step_id, generation, worker_id, now,
                                            lease_ttl, ready)
            if claim is not None:
                return claim
        try:
            return self._claim_in_transaction(run_id, step_id, generation, worker_id, now, lease_ttl, ready)
        except _NotReady:
            return Claim(ClaimOutcome.NOT_READY)

    def _claim_in_transaction(self, run_id: str, step_id: str, generation: int, worker_id: str,
                              now: datetime, lease_ttl: float, ready: Ready | None) -> Claim:
        with self._tx() as conn:
            log = self._fence_and_read(conn, run_id, generation, worker_id, now, lease_ttl)
            if log is None:
                status = conn.execute(
                    sa.select(runs.c.status).where(runs.c.id == run_id)
                ).scalar()
                terminal = status is None or status in TERMINAL_STATUSES
                return Claim(ClaimOutcome.TERMINAL if terminal else ClaimOutcome.STALE)
            # The fence held, so the run is in flight (a finished run has no lock row, a parked
            # one a newer generation): what a claim needs of it never changes once written.
            run = self._known_run(conn, run_id)
            if step_id in log.outputs:
                return Claim(ClaimOutcome.COMPLETED, run)
            if step_id in log.waited:
                return Claim(ClaimOutcome.WAITING, run)  # parked: only a decision or its child resumes it
            if ready is not None and not ready(run, log.outputs):
                raise _NotReady(step_id)  # rolls the fence back: nothing is written
            # The attempt comes from the journal: a crash mid-attempt resumes the same attempt.
            attempt = log.next_attempt(step_id)
            due = log.backoff_due(step_id)
            if due is not None and due > now:  # an early message (a re-drive): the backoff still holds
                wait_s = (due - now).total_seconds()
                hold, _ = retry.backoff_lease(wait_s, lease_ttl)
                self._fence(conn, run_id, generation, worker_id, now, hold)
                return Claim(ClaimOutcome.BACKOFF, run, attempt, wait_s=wait_s)
            started = self._start(conn, run_id, step_id, attempt, worker_id, generation, now)
            if started is None:
                return Claim(ClaimOutcome.DUPLICATE, run)
            if not log.outputs:  # a first step: the run may still be queued
                conn.execute(
                    runs.update()
                    .where(runs.c.id == run_id, runs.c.status == "queued")
                    .values(status="running", started_at=now)
                )
        return Claim(ClaimOutcome.RUN, run, attempt, log.outputs)

    def _claim_in_one_call(self, calls: AutocommitCalls, run_id: str, step_id: str, generation: int,
                           worker_id: str, now: datetime, lease_ttl: float,
                           ready: Ready | None) -> Claim | None:
        """Postgres: the usual claim as one autocommit call of `pal_claim_step` (migration 0006).

        The attempt is predicted from this process's step log; the function starts it only if no
        newer event concerns the step, so the prediction is what `claim_step`'s transaction would
        decide. None when there is nothing to predict from (a run this process never claimed, a
        step that completed, waits or may be backing off) or the prediction did not hold: the
        caller then decides in a transaction."""
        run, known = self._claimed_runs.get(run_id), self._known_log(run_id)
        if run is None or step_id in known.outputs or step_id in known.waited:
            return None
        if ready is not None and not ready(run, known.outputs):
            # Usually this process's log is only behind (another process completed the step's
            # predecessor): fence and read what came after it in one more autocommit call, then
            # decide on the fresh log. Nothing but the lease's expiry is written by that call.
            rows = [EventRow(*row) for row in calls.rows(_CLAIM_FENCE_CALL, (
                run_id, generation, worker_id, now + timedelta(seconds=lease_ttl), known.seq))]
            if rows and rows[0].seq == FENCED_OUT:
                return None  # stale or over: the transaction says which
            if rows:
                known = known.extended(rows)
                self._remember(run_id, known)  # the call has committed
            if step_id in known.outputs or step_id in known.waited or not ready(run, known.outputs):
                return None  # the transaction decides, and refuses a step that is not ready
        due = known.backoff_due(step_id)
        if due is not None and due > now:
            return None
        attempt = known.next_attempt(step_id)
        payload = json.dumps({"attempt": attempt, "worker": worker_id})
        rows = [EventRow(*row) for row in calls.rows(_CLAIM_STEP, (
            run_id, generation, worker_id, now + timedelta(seconds=lease_ttl), known.seq,
            step_id, attempt, payload, now, not known.outputs))]
        marker = rows[-1].seq if rows and rows[-1].seq < 0 else None
        events = rows[:-1] if marker is not None else rows
        log = known.extended(events) if events else known
        if events:
            self._remember(run_id, log)  # the call has committed
        if marker == STARTED:
            return Claim(ClaimOutcome.RUN, run, attempt, log.outputs)
        if marker == DUPLICATE:
            return Claim(ClaimOutcome.DUPLICATE, run)
        return None

    def _known_run(self, conn: sa.Connection, run_id: str) -> RunRecord:
        """The run as this process first read it: its plan, input and parent are what a claim
        uses, and they never change (its status and totals may be stale)."""
        run = self._claimed_runs.get(run_id)
        if run is None:
            run = self._run(conn, run_id)
            self._claimed_runs.put(run_id, run)
        return run

    def renew_lease(
        self, *, run_id: str, generation: int, worker_id: str, now: datetime, lease_ttl: float
    ) -> bool:
        """Heartbeat: extend the lease if this generation still holds it."""
        with self._tx() as conn:
            return self._fence(conn, run_id, generation, worker_id, now, lease_ttl)

    def complete_step(
        self, *, run_id: str, step_id: str, attempt: int, generation: int, output: Any,
        worker_id: str, now: datetime, lease_ttl: float,
        plan: Callable[[Mapping[str, Any]], Handoff], usage: Usage | None = None,
        frontier: Frontier | None = None,
    ) -> Handoff:
        """Step protocol, phase 3: `step_completed`, successor hand-off and maybe the finish,
        in one transaction fenced by generation. Raises LeaseLost when fenced out.

        The step's usage is added to the run's totals here, only by the transaction whose
        `step_completed` insert won, so a replay or a duplicate message never counts it twice."""
        payload: dict[str, Any] = {"output": _json_safe(output)}
        if usage is not None and (usage.input_tokens or usage.output_tokens or usage.cost_usd):
            payload["usage"] = {"input_tokens": usage.input_tokens,
                                "output_tokens": usage.output_tokens,
                                "cost_usd": str(usage.cost_usd)}
        if self.calls is not None and "usage" not in payload:
            handoff = self._complete_in_one_call(self.calls, run_id, step_id, attempt, payload, generation,
                                                 worker_id, now, lease_ttl, plan)
            if handoff is not None:
                return handoff
        with self._tx() as conn:
            log = self._complete_and_read(conn, run_id, step_id, attempt, payload, generation,
                                          worker_id, now, lease_ttl)
            if log is None:
                return Handoff(dispatch=(), finished=False)
            if "usage" in payload and usage is not None:
                conn.execute(
                    runs.update().where(runs.c.id == run_id).values(
                        input_tokens=runs.c.input_tokens + usage.input_tokens,
                        output_tokens=runs.c.output_tokens + usage.output_tokens,
                        cost_usd=runs.c.cost_usd + usage.cost_usd,
                    )
                )
            decision = plan(log.outputs)
            if decision.finished and decision.error is not None:
                self._finish(conn, run_id, "failed", generation, now,
                             error=_json_safe(dict(decision.error)))
            elif decision.finished:
                self._finish(conn, run_id, "succeeded", generation, now,
                             output=_json_safe(decision.output))
            elif not decision.dispatch:
                self._park_if_idle(conn, run_id, generation, now, frontier)
            return decision

    def _complete_in_one_call(self, calls: AutocommitCalls, run_id: str, step_id: str, attempt: int,
                              payload: Mapping[str, Any], generation: int, worker_id: str,
                              now: datetime, lease_ttl: float,
                              plan: Callable[[Mapping[str, Any]], Handoff]) -> Handoff | None:
        """Postgres: a completion that only hands off, as one autocommit call of
        `pal_complete_step` (migration 0006).

        The hand-off is planned first, from this process's step log plus this step's output; the
        function appends `step_completed` only if no step event came after that log, so the plan
        is what `complete_step`'s transaction would decide. None when the plan would write more
        than the completion (the run finishes, or parks when nothing is dispatched) or the log was
        not the latest: the caller then decides in a transaction."""
        known = self._known_log(run_id)
        if step_id in known.outputs:
            return None
        decision = plan(WithOne(known.outputs, step_id, payload["output"]))
        if decision.finished or not decision.dispatch:
            return None
        rows = [EventRow(*row) for row in calls.rows(_COMPLETE_STEP, (
            run_id, generation, worker_id, now + timedelta(seconds=lease_ttl), known.seq,
            step_id, attempt, json.dumps(payload), now))]
        if not rows:
            return None
        if rows[0].seq == FENCED_OUT:
            raise _lease_lost(run_id, generation)
        if rows[0].seq == ALREADY_COMPLETED:
            return Handoff(dispatch=(), finished=False)
        self._remember(run_id, known.extended(rows))  # the call has committed
        return decision

    # ------------------------------------------------------------ waiting

    def park_step(
        self, *, run_id: str, step_id: str, attempt: int, generation: int,
        payload: Mapping[str, Any], wake_at: datetime | None, worker_id: str, now: datetime,
        lease_ttl: float, frontier: Frontier,
    ) -> bool:
        """Journal `step_waiting {payload}`; when no other step is in flight, park the run
        (status `waiting`, no lease held). Raises LeaseLost when fenced out."""
        body = _json_safe(dict(payload)) | ({"wake_at": wake_at.isoformat()} if wake_at else {})
        with self._tx() as conn:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                raise _lease_lost(run_id, generation)
            self._append(conn, run_id, step_id, attempt, "step_waiting", body, generation, now)
            return self._park_if_idle(conn, run_id, generation, now, frontier)

    def resume_waiting(
        self, *, run_id: str, step_id: str, now: datetime, lease_ttl: float,
        plan: Callable[[Mapping[str, Any]], Handoff], output: Any = None,
        error: Mapping[str, Any] | None = None,
        event: tuple[str, Mapping[str, Any]] | None = None,
        check: Callable[[Mapping[str, Any]], None] | None = None,
        frontier: Frontier | None = None,
    ) -> tuple[Handoff, int]:
        """Complete (or fail) a parked step: a decision, a child's end, an expiry.

        One transaction under the run's lock row: the step must be waiting and undecided (else
        Refused); `check(waiting_payload)` may refuse too; `event` (e.g. approval_decided) and
        `step_completed` are appended together; a parked run takes a fresh lease (generation + 1)
        for the successors, which the caller publishes with the returned generation."""
        with self._tx() as conn:
            # Lock first (the lock row, then the run), then read: a cancellation or another
            # decision that committed meanwhile is seen, never overwritten.
            lock = conn.execute(
                sa.select(run_locks).where(run_locks.c.run_id == run_id).with_for_update()
            ).mappings().first()
            row = (conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update())
                   .mappings().first() or _missing(run_id))
            run = _run_record(row, row["graph"])
            if run.terminal:
                raise Refused(f"run {run_id} is {run.status}; nothing waits there any more")
            if lock is None:
                raise Refused(f"run {run_id} holds no lock row; it is finishing")
            waiting = {w["step_id"]: w for w in self._waiting(conn, run_id)}
            if step_id not in waiting:
                raise Refused(self._why_not_waiting(conn, run_id, step_id))
            if check is not None:
                check(waiting[step_id]["payload"])
            attempt = waiting[step_id]["attempt"]
            if lock["worker_id"] == PARKED:
                generation = lock["generation"] + 1
                self._upsert_lock(conn, run_id, "queued", now + timedelta(seconds=lease_ttl), generation)
                conn.execute(runs.update().where(runs.c.id == run_id, runs.c.status == "waiting")
                             .values(status="running"))
            else:
                generation = lock["generation"]
            if event is not None:
                self._append(conn, run_id, step_id, attempt, event[0], _json_safe(dict(event[1])),
                             generation, now)
            if error is not None:
                self._append(conn, run_id, step_id, attempt, "step_failed", {"error": dict(error)},
                             generation, now)
                self._finish(conn, run_id, "failed", generation, now, error={**error, "step_id": step_id})
                return Handoff(dispatch=(), finished=True), generation
            self._append(conn, run_id, step_id, attempt, "step_completed", {"output": _json_safe(output)},
                         generation, now)
            decision = plan(self._completed(conn, run_id))
            if decision.finished and decision.error is not None:
                self._finish(conn, run_id, "failed", generation, now, error=_json_safe(dict(decision.error)))
            elif decision.finished:
                self._finish(conn, run_id, "succeeded", generation, now, output=_json_safe(decision.output))
            elif not decision.dispatch:
                self._park_if_idle(conn, run_id, generation, now, frontier)
            return decision, generation

    def waiting_steps(self, run_id: str) -> list[dict[str, Any]]:
        """Undecided parked steps of the run: {step_id, attempt, payload, created_at}."""
        with self._tx() as conn:
            return self._waiting(conn, run_id)

    def due_waiting_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Parked runs whose wake-up time has come (an approval expiry, a finished child)."""
        with self._tx() as conn:
            return list(conn.execute(
                sa.select(runs.c.id).join(run_locks, run_locks.c.run_id == runs.c.id)
                .where(runs.c.status == "waiting", run_locks.c.expires_at < now)
                .order_by(run_locks.c.expires_at).limit(limit)
            ).scalars())

    def rearm_wait(self, *, run_id: str, wake_at: datetime, now: datetime) -> None:
        """Set when the sweep looks at a parked run again: `wake_at`, or now when a child it waits
        for has finished meanwhile (its own wake-up may have been lost)."""
        with self._tx() as conn:
            conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == run_id).with_for_update())
            if self._finished_children_waited_for(conn, self._waiting(conn, run_id)):
                wake_at = now
            conn.execute(run_locks.update().where(run_locks.c.run_id == run_id,
                                                  run_locks.c.worker_id == PARKED)
                         .values(expires_at=wake_at))

    def _finished_children_waited_for(self, conn: sa.Connection, waiting: list[dict[str, Any]]) -> bool:
        children = [w["payload"]["child_run_id"] for w in waiting if w["payload"].get("child_run_id")]
        return bool(children) and bool(conn.execute(sa.select(sa.func.count()).select_from(runs).where(
            runs.c.id.in_(children), runs.c.status.in_(TERMINAL_STATUSES))).scalar())

    def run_exists(self, run_id: str) -> bool:
        with self._tx() as conn:
            return self._exists(conn, run_id)

    @staticmethod
    def _exists(conn: sa.Connection, run_id: str) -> bool:
        return conn.execute(sa.select(runs.c.id).where(runs.c.id == run_id)).first() is not None

    def ancestors(self, run_id: str) -> list[str]:
        """The run's parent, its parent's parent, ... up to the top-level run (last)."""
        found: list[str] = []
        with self._tx() as conn:
            parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == run_id)).scalar()
            while parent is not None and parent not in found:
                found.append(parent)
                parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == parent)).scalar()
        return found

    def descendant_count(self, run_id: str) -> int:
        """How many runs descend from `run_id` (children, theirs, ...)."""
        count, level = 0, [run_id]
        with self._tx() as conn:
            while level:
                below = sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))
                level = list(conn.execute(below).scalars())
                count += len(level)
        return count

    def children(self, run_id: str) -> list[RunRecord]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(runs).where(runs.c.parent_run_id == run_id)
                                .order_by(runs.c.created_at)).mappings()
            return [_run_record(r, r["graph"]) for r in rows]

    def cancel_run(self, *, run_id: str, now: datetime, by: str, reason: str | None) -> list[str]:
        """Cancel the run and every descendant that is not finished, in one transaction: each
        gets `run_cancelled` once and loses its lease, so a step still running is fenced out at
        its next journal write (the next step boundary). Returns the ids cancelled."""
        with self._tx() as conn:
            conn.execute(sa.select(run_locks.c.run_id).where(run_locks.c.run_id == run_id).with_for_update())
            root = self._run(conn, run_id)
            if root.terminal:
                raise Refused(f"run {run_id} is {root.status}; it cannot be cancelled")
            cancelled, frontier = [], [run_id]
            while frontier:
                current = frontier.pop(0)
                # The run's lock row first: a child being created under it waits, then sees the
                # parent cancelled (create_run refuses), or it committed and is found below.
                lock = conn.execute(sa.select(run_locks.c.generation).where(run_locks.c.run_id == current)
                                    .with_for_update()).scalar()
                error = {"code": "cancelled", "by": by, "reason": reason,
                         "cancelled_with": run_id if current != run_id else None}
                if self._finish(conn, current, "cancelled", lock or 0, now, error=error):
                    cancelled.append(current)
                frontier += list(conn.execute(sa.select(runs.c.id).where(runs.c.parent_run_id == current)
                                              .order_by(runs.c.created_at)).scalars())
        return cancelled

    def retry_step(
        self, *, run_id: str, step_id: str, attempt: int, of: int, generation: int,
        error: Mapping[str, Any], backoff_s: float, worker_id: str, now: datetime,
        lease_ttl: float,
    ) -> bool:
        """Journal `step_retrying {attempt, of, error, wake_at}`; False when fenced out.

        A short backoff extends the lease past the wake-up time, so the sweep leaves the run
        alone while a countdown message waits; a long one lets the lease lapse at the wake-up
        time, and the sweep re-drives the step then (pal.core.retry.backoff_lease). A re-drive that
        comes early finds the wake-up time in the journal and waits (ClaimOutcome.BACKOFF)."""
        wake_at = now + timedelta(seconds=backoff_s)
        hold, _ = retry.backoff_lease(backoff_s, lease_ttl)
        with self._tx() as conn:
            if not self._fence(conn, run_id, generation, worker_id, now, hold):
                return False
            self._append(conn, run_id, step_id, attempt, "step_retrying",
                         {"attempt": attempt, "of": of, "error": dict(error),
                          "wake_at": wake_at.isoformat()}, generation, now)
        return True

    # ------------------------------------------------------------- receipts

    def claim_receipt(
        self, *, key: str, run_id: str, step_id: str, attempt: int, effect_kind: str,
        target: str, generation: int, worker_id: str, now: datetime, lease_ttl: float,
    ) -> Receipt:
        """Claim the delivery of one step attempt before sending it, fenced by generation.

        One INSERT … ON CONFLICT DO NOTHING decides: the caller that inserts owns the send;
        anyone else gets the existing receipt (delivered, failed, or claimed and in doubt)."""
        with self._tx() as conn:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                raise _lease_lost(run_id, generation)
            inserted = conn.execute(
                self._insert(side_effect_receipts).values(
                    idempotency_key=key, run_id=run_id, step_id=step_id, attempt=attempt,
                    effect_kind=effect_kind, target=target[:2000], status="claimed",
                    response=None, created_at=now, updated_at=now,
                ).on_conflict_do_nothing().returning(side_effect_receipts.c.idempotency_key)
            ).first()
            row = conn.execute(
                sa.select(side_effect_receipts.c.status, side_effect_receipts.c.response)
                .where(side_effect_receipts.c.idempotency_key == key)
            ).one()
        return Receipt(status=row.status, response=row.response, new=inserted is not None)

    def settle_receipt(self, *, key: str, status: str, response: Any, now: datetime) -> None:
        """Record a claimed delivery's outcome. Not fenced: what happened is true whoever
        reports it, and a fenced-out worker's report saves the next one from doubt."""
        with self._tx() as conn:
            conn.execute(
                side_effect_receipts.update()
                .where(side_effect_receipts.c.idempotency_key == key,
                       side_effect_receipts.c.status == "claimed")
                .values(status=status, response=_json_safe(response), updated_at=now)
            )

    def receipts(self, run_id: str) -> list[dict[str, Any]]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(side_effect_receipts).where(side_effect_receipts.c.run_id == run_id)
                .order_by(side_effect_receipts.c.created_at)
            ).mappings()
            return [dict(r) for r in rows]

    def mark_in_doubt(
        self, *, run_id: str, step_id: str, attempt: int, generation: int,
        detail: Mapping[str, Any], worker_id: str, now: datetime, lease_ttl: float,
    ) -> None:
        """Journal `step_in_doubt`: a claimed delivery was never confirmed."""
        with self._tx() as conn:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                raise _lease_lost(run_id, generation)
            self._append(conn, run_id, step_id, attempt, "step_in_doubt", _json_safe(dict(detail)),
                         generation, now)

    def fail_step(
        self, *, run_id: str, step_id: str, attempt: int, generation: int,
        error: Mapping[str, Any], worker_id: str, now: datetime, lease_ttl: float,
    ) -> bool:
        """Journal `step_failed` and fail the run; False when fenced out or already terminal."""
        with self._tx() as conn:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                return False
            self._append(conn, run_id, step_id, attempt, "step_failed", {"error": dict(error)},
                         generation, now)
            return self._finish(conn, run_id, "failed", generation, now,
                                error={**error, "step_id": step_id})

    def recover_run(
        self, *, run_id: str, worker_id: str, now: datetime, lease_ttl: float,
        plan: Callable[[RunRecord, Mapping[str, Any]], Sequence[str]],
        require_expired: bool = True, allow_idle: bool = False, redeliver_after: float | None = None,
    ) -> Recovery | None:
        """Steal the run's lease (generation + 1) and record which steps the re-drive resumes.

        One UPSERT decides the winner: it only updates a lock that has expired, unless
        `require_expired` is False (tests), or `allow_idle` is True and no step is running under
        the live lease (an operator's resume: messages of the old generation are fenced out at
        their claim, so taking an idle lease can never let two workers run one step). None means
        nothing to do: the run is terminal or not in flight, or another holder's lease is live.
        Raises LeaseBusy when `allow_idle` finds a step running under a live lease.
        With `redeliver_after`, the resumed steps' messages are due to be sent again that many
        seconds from now unless a worker claims one first (see `redeliver`).
        """
        expires = now + timedelta(seconds=lease_ttl)
        return self._recover(run_id, worker_id, now, expires, plan, require_expired, allow_idle,
                             redeliver_after)

    def recover_orphans(
        self, *, run_ids: Sequence[str], worker_id: str, now: datetime, lease_ttl: float,
        plan: Callable[[RunRecord, Mapping[str, Any]], Sequence[str]], redeliver_after: float,
    ) -> dict[str, Recovery]:
        """The sweep's re-drive of a batch of orphans, in one transaction: for each run what
        `recover_run` does with `require_expired` (steal an expired lease, never a parked run's
        timer; journal `run_recovered`; redelivery due `redeliver_after` seconds from now), with
        one statement of each kind for the whole batch instead of one transaction per run.

        The leases are taken in run id order, as every sweeper does. Any error (a plan that cannot
        be made, a deadlock with a cancellation walking a run tree) rolls back the whole batch and
        is raised; the caller then recovers the runs one by one."""
        expires = now + timedelta(seconds=lease_ttl)
        redeliver_at = now + timedelta(seconds=redeliver_after)
        with self._tx() as conn:
            rows = {row["id"]: row for row in conn.execute(
                _RUN_ROWS.where(runs.c.id.in_(sorted(set(run_ids))), runs.c.status.in_(IN_FLIGHT_STATUSES))
            ).mappings()}
            if not rows:
                return {}
            stolen = self._steal(conn, sorted(rows), worker_id, now, expires, redeliver_at, take_live=False)
            self._drop_lock_rows_of_finished(conn, stolen, worker_id)
            if not stolen:
                return {}
            known = {run_id: self._known_log(run_id) for run_id in stolen}
            new_events: dict[str, list[Any]] = {run_id: [] for run_id in stolen}
            for event in conn.execute(_LOGS_SINCE, {"logs_runs": list(stolen),
                                                    "logs_after": min(k.seq for k in known.values())}):
                if event.seq > known[event.run_id].seq:
                    new_events[event.run_id].append(event)
            recoveries: dict[str, Recovery] = {}
            for run_id, generation in stolen.items():
                row = rows[run_id]
                run = _run_record(row, self._graph(conn, run_id, row["kind"], row["graph_hash"]))
                log = self._read_on(conn, run_id, known[run_id], new_events[run_id])
                recoveries[run_id] = Recovery(generation, tuple(plan(run, log.outputs)))
            self._record_recoveries(conn, recoveries, now, redelivery=True)
        return recoveries

    def _steal(self, conn: sa.Connection, run_ids: Sequence[str], worker_id: str, now: datetime,
               expires: datetime, redeliver_at: datetime | None, take_live: bool) -> dict[str, int]:
        """Take the runs' leases, in the order given: one UPSERT (generation + 1, or a new lock row
        at generation 1 for a run that had none). Only an expired lease is taken unless
        `take_live`, and never a parked run's wake-up timer (the run may have parked since it was
        read). The generation of each run taken."""
        stmt = self._insert(run_locks).values([
            {"run_id": run_id, "worker_id": worker_id, "expires_at": expires, "generation": 1,
             "redeliver_at": redeliver_at} for run_id in run_ids])
        stmt = stmt.on_conflict_do_update(
            index_elements=[run_locks.c.run_id],
            set_={"worker_id": worker_id, "expires_at": expires, "redeliver_at": redeliver_at,
                  "generation": run_locks.c.generation + 1},
            where=sa.and_(run_locks.c.worker_id != PARKED,
                          sa.true() if take_live else run_locks.c.expires_at < now),
        ).returning(run_locks.c.run_id, run_locks.c.generation)
        return {run_id: generation for run_id, generation in conn.execute(stmt).all()}

    def _record_recoveries(self, conn: sa.Connection, recoveries: Mapping[str, Recovery], now: datetime,
                           *, redelivery: bool) -> None:
        """Journal each `run_recovered`; a recovery that resumes nothing needs no redelivery."""
        conn.execute(journal_events.insert(), [
            {"run_id": run_id, "step_id": None, "attempt": None, "kind": "run_recovered",
             "payload": {"generation": r.generation, "resumed_steps": list(r.resumed_steps)},
             "generation": r.generation, "created_at": now} for run_id, r in recoveries.items()])
        idle = [run_id for run_id, r in recoveries.items() if not r.resumed_steps]
        if redelivery and idle:
            conn.execute(run_locks.update().where(run_locks.c.run_id.in_(idle)).values(redeliver_at=None))

    def _drop_lock_rows_of_finished(self, conn: sa.Connection, stolen: dict[str, int],
                                    worker_id: str) -> None:
        """A lock row the steal inserted (generation 1) rather than stole belongs to a run that had
        none: if that run finished (and dropped its lease) after it was read, the row goes again
        and the run is no longer among the stolen."""
        inserted = [run_id for run_id, generation in stolen.items() if generation == 1]
        if not inserted:
            return
        finished = list(conn.execute(sa.select(runs.c.id).where(
            runs.c.id.in_(inserted), runs.c.status.not_in(IN_FLIGHT_STATUSES))).scalars())
        if finished:
            conn.execute(run_locks.delete().where(run_locks.c.run_id.in_(finished),
                                                  run_locks.c.generation == 1,
                                                  run_locks.c.worker_id == worker_id))
            for run_id in finished:
                del stolen[run_id]

    def _recover(self, run_id: str, worker_id: str, now: datetime, expires: datetime,
                 plan: Callable[[RunRecord, Mapping[str, Any]], Sequence[str]], require_expired: bool,
                 allow_idle: bool, redeliver_after: float | None) -> Recovery | None:
        with self._tx() as conn:
            run = self._run(conn, run_id)
            if run.status not in IN_FLIGHT_STATUSES:
                return None
            take_live = not require_expired
            if allow_idle:
                lease = conn.execute(
                    sa.select(run_locks).where(run_locks.c.run_id == run_id).with_for_update()
                ).mappings().first()
                if lease is not None and lease["expires_at"] >= now:
                    running = self._running_steps(conn, run_id, lease["generation"])
                    if running:
                        raise LeaseBusy(
                            f"run {run_id}: step(s) {', '.join(running)} running under "
                            f"{lease['worker_id']} (generation {lease['generation']}), lease live for "
                            f"{(lease['expires_at'] - now).total_seconds():.1f}s more")
                    take_live = True
            # Due for a resend unless a worker claims a step first (cleared below if none resumes).
            redeliver_at = now + timedelta(seconds=redeliver_after) if redeliver_after is not None else None
            stolen = self._steal(conn, [run_id], worker_id, now, expires, redeliver_at, take_live)
            self._drop_lock_rows_of_finished(conn, stolen, worker_id)
            generation = stolen.get(run_id)
            if generation is None:
                return None
            steps = tuple(plan(run, self._completed(conn, run_id)))
            recovery = Recovery(generation=generation, resumed_steps=steps)
            self._record_recoveries(conn, {run_id: recovery}, now, redelivery=redeliver_at is not None)
        return recovery

    def redeliverable_runs(self, *, now: datetime, limit: int) -> list[str]:
        """Recovered runs whose re-driven steps no worker has claimed by their redelivery time."""
        with self._tx() as conn:
            return list(conn.execute(
                sa.select(run_locks.c.run_id).where(run_locks.c.redeliver_at < now)
                .order_by(run_locks.c.redeliver_at).limit(limit)).scalars())

    def redeliver(
        self, *, run_id: str, now: datetime, min_gap: float,
        plan: Callable[[RunRecord, Mapping[str, Any]], Sequence[str]],
    ) -> Recovery | None:
        """Send a recovery's messages again: no worker claimed a step since the steal, so they may
        be lost (a Redis flush, a worker killed before its claim, a claim refused while Postgres
        restarted), and the 10-minute recovery lease would otherwise idle the run that long.

        The generation stays: a message still queued remains valid and the copies are harmless
        (one claim per attempt and generation wins), so a slow queue never livelocks the run the
        way repeated steals would. Each resend doubles the wait (at least `min_gap`), and none is
        due past the lease's end, where the sweep steals it as usual. Journals `run_redelivered
        {generation, steps}`; None when nothing is due (claimed meanwhile, finished, parked)."""
        with self._tx() as conn:
            lock = conn.execute(sa.select(run_locks).where(
                run_locks.c.run_id == run_id, run_locks.c.redeliver_at < now
            ).with_for_update()).mappings().first()
            if lock is None:
                return None
            run = self._run(conn, run_id)
            stolen_at = conn.execute(sa.select(sa.func.max(journal_events.c.created_at)).where(
                journal_events.c.run_id == run_id, journal_events.c.kind == "run_recovered",
                journal_events.c.generation == lock["generation"])).scalar() or now
            in_flight = run.status in IN_FLIGHT_STATUSES
            steps = tuple(plan(run, self._completed(conn, run_id))) if in_flight else ()
            due = now + timedelta(seconds=max(min_gap, (now - stolen_at).total_seconds()))
            conn.execute(run_locks.update().where(run_locks.c.run_id == run_id).values(
                redeliver_at=due if steps and due < lock["expires_at"] else None))
            if not steps:
                return None
            self._append(conn, run_id, None, None, "run_redelivered",
                         {"generation": lock["generation"], "steps": list(steps)}, lock["generation"], now)
        return Recovery(generation=lock["generation"], resumed_steps=steps)

    def _running_steps(self, conn: sa.Connection, run_id: str, generation: int) -> list[str]:
        """Steps started under `generation` whose attempt has no completion, failure or retry."""
        rows = conn.execute(
            sa.select(journal_events.c.step_id, journal_events.c.attempt, journal_events.c.kind,
                      journal_events.c.generation)
            .where(journal_events.c.run_id == run_id,
                   journal_events.c.kind.in_(("step_started", "step_completed", "step_failed",
                                              "step_retrying", "step_waiting")))
        ).all()
        closed = {(r.step_id, r.attempt) for r in rows if r.kind != "step_started"}
        return sorted({r.step_id for r in rows if r.kind == "step_started" and r.generation == generation
                       and (r.step_id, r.attempt) not in closed})

    # -------------------------------------------------------------- invariants

    def violations(self) -> list[Violation]:
        """Every breach of the journal's invariants (`pal doctor`); empty when the journal is clean."""
        checks = (self._twice, self._terminal_leases, self._status_vs_journal, self._unstarted,
                  self._started_again, self._orphan_receipts, self._totals, self._seq_order,
                  self._out_of_order)
        with self._tx() as conn:
            return [v for check in checks for v in check(conn)]

    def _twice(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        found = [Violation("step_completed_twice", r.run_id, r.step_id, f"{r.n} step_completed events")
                 for r in conn.execute(sa.select(je.c.run_id, je.c.step_id, sa.func.count().label("n"))
                                       .where(je.c.kind == "step_completed")
                                       .group_by(je.c.run_id, je.c.step_id)
                                       .having(sa.func.count() > 1))]
        found += [Violation("terminal_twice", r.run_id, None, f"{r.n} terminal events")
                  for r in conn.execute(sa.select(je.c.run_id, sa.func.count().label("n"))
                                        .where(je.c.kind.in_(TERMINAL_EVENT.values())).group_by(je.c.run_id)
                                        .having(sa.func.count() > 1))]
        return found

    def _terminal_leases(self, conn: sa.Connection) -> list[Violation]:
        rows = conn.execute(sa.select(runs.c.id, runs.c.status)
                            .join(run_locks, run_locks.c.run_id == runs.c.id)
                            .where(runs.c.status.in_(TERMINAL_STATUSES)))
        return [Violation("terminal_run_has_lease", r.id, None, f"{r.status} but holds a lock row")
                for r in rows]

    def _status_vs_journal(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        ends = {r.run_id: r.kind for r in conn.execute(
            sa.select(je.c.run_id, je.c.kind).where(je.c.kind.in_(TERMINAL_EVENT.values())))}
        return [Violation("status_disagrees_with_journal", r.id, None,
                          f"status {r.status}, terminal event {ends.get(r.id)}")
                for r in conn.execute(sa.select(runs.c.id, runs.c.status))
                if TERMINAL_EVENT.get(r.status) != ends.get(r.id)]

    def _unstarted(self, conn: sa.Connection) -> list[Violation]:
        je, started = journal_events, journal_events.alias("started")
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.attempt, je.c.seq).where(
            je.c.kind == "step_completed", ~sa.exists().where(
                started.c.run_id == je.c.run_id, started.c.step_id == je.c.step_id,
                started.c.attempt == je.c.attempt, started.c.kind == "step_started",
                started.c.seq < je.c.seq)))
        return [Violation("completed_without_start", r.run_id, r.step_id,
                          f"step_completed (seq {r.seq}) of attempt {r.attempt} has no earlier step_started")
                for r in rows]

    def _started_again(self, conn: sa.Connection) -> list[Violation]:
        """A step started after it completed: a replay or a claim ran a finished step again."""
        je, done = journal_events, journal_events.alias("done")
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.seq, je.c.generation).where(
            je.c.kind == "step_started", sa.exists().where(
                done.c.run_id == je.c.run_id, done.c.step_id == je.c.step_id,
                done.c.kind == "step_completed", done.c.seq < je.c.seq)))
        return [Violation("started_after_completion", r.run_id, r.step_id,
                          f"step_started (seq {r.seq}, generation {r.generation}) after its step_completed")
                for r in rows]

    def _orphan_receipts(self, conn: sa.Connection) -> list[Violation]:
        je, rc = journal_events, side_effect_receipts
        rows = conn.execute(sa.select(rc.c.run_id, rc.c.step_id, rc.c.attempt, rc.c.status).where(
            ~sa.exists().where(je.c.run_id == rc.c.run_id, je.c.step_id == rc.c.step_id,
                               je.c.attempt == rc.c.attempt, je.c.kind == "step_started")))
        return [Violation("receipt_without_step", r.run_id, r.step_id,
                          f"{r.status} receipt of attempt {r.attempt}, which never started") for r in rows]

    def _totals(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        spent: dict[str, tuple[int, int, Decimal]] = {}
        for row in conn.execute(sa.select(je.c.run_id, je.c.payload).where(je.c.kind == "step_completed")):
            usage = (row.payload or {}).get("usage")
            if usage:
                i, o, c = spent.get(row.run_id, (0, 0, Decimal(0)))
                spent[row.run_id] = (i + int(usage.get("input_tokens", 0)),
                                     o + int(usage.get("output_tokens", 0)),
                                     c + Decimal(str(usage.get("cost_usd", "0"))))
        found = []
        totals = sa.select(runs.c.id, runs.c.input_tokens, runs.c.output_tokens, runs.c.cost_usd)
        for r in conn.execute(totals):
            steps = spent.get(r.id, (0, 0, Decimal(0)))
            run_totals = (r.input_tokens, r.output_tokens, Decimal(r.cost_usd))
            if run_totals != steps:
                found.append(Violation("totals_disagree_with_steps", r.id, None,
                                       f"run {run_totals[0]}+{run_totals[1]} tokens ${run_totals[2]}, "
                                       f"steps {steps[0]}+{steps[1]} tokens ${steps[2]}"))
        return found

    def _seq_order(self, conn: sa.Connection) -> list[Violation]:
        """seq strictly increasing per run (the primary key guarantees it today; a schema change
        that lost it would show here)."""
        je, last, found = journal_events, dict[str, int](), []
        for r in conn.execute(sa.select(je.c.run_id, je.c.seq).order_by(je.c.run_id, je.c.seq)):
            if r.seq <= last.get(r.run_id, 0):
                found.append(Violation("seq_not_increasing", r.run_id, None, f"seq {r.seq}"))
            last[r.run_id] = r.seq
        return found

    def _out_of_order(self, conn: sa.Connection) -> list[Violation]:
        """A step completed that was not on the ready frontier when it completed: replaying each
        run's completions in seq order, every one must be ready given those before it. This is
        what a forged message that started a step would leave, e.g. a step after an approval
        completed while the approval was undecided."""
        je, found = journal_events, []
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.kind, je.c.payload)
                            .where(je.c.kind.in_(("step_completed", "step_waiting")))
                            .order_by(je.c.run_id, je.c.seq)).all()
        plans: dict[tuple[str, str], Any] = {}
        for run_id, events in itertools.groupby(rows, key=lambda r: r.run_id):
            run = self._run(conn, run_id)
            key = (run.kind, run.graph_hash or run_id)
            if key not in plans:
                plans[key] = program_of(run.kind, run.graph)
            program, completed, waiting = plans[key], dict[str, Any](), dict[str, str]()
            for event in events:
                if event.kind == "step_waiting":
                    waiting[event.step_id] = str((event.payload or {}).get("kind", "approval"))
                    continue
                if event.step_id in completed:
                    continue  # a second completion: _twice reports it
                if not program.is_ready(completed, event.step_id):
                    undecided = [s for s, kind in waiting.items()
                                 if kind == "approval" and s not in completed]
                    why = (f"completed while approval {', '.join(undecided)} was undecided" if undecided
                           else "completed before the steps it depends on")
                    found.append(Violation("completed_out_of_order", run_id, event.step_id, why))
                completed[event.step_id] = (event.payload or {}).get("output")
        return found

    # ---------------------------------------------------------------- tokens

    @property
    def fence_key(self) -> bytes:
        """The key that signs PAL's step messages (pal.core.doorbell); read once per process."""
        if self._fence_key is None:
            with self._tx() as conn:
                secret = conn.execute(sa.select(pal_keys.c.secret)
                                      .where(pal_keys.c.name == FENCE_KEY)).scalar()
            if secret is None:
                raise StorageError("the journal has no fence key: run `pal db upgrade`")
            self._fence_key = bytes.fromhex(secret)
        return self._fence_key

    def create_token(self, *, tenant_id: str, name: str, now: datetime) -> tuple[str, str]:
        """A new bearer token for `tenant_id`: (token id, the secret, shown once; only its
        sha256 is stored)."""
        token_id = secrets.token_hex(8)
        secret = f"pal_{token_id}_{secrets.token_urlsafe(32)}"
        with self._tx() as conn:
            conn.execute(api_tokens.insert().values(
                id=token_id, tenant_id=tenant_id, name=name, token_hash=_token_hash(secret),
                created_at=now, revoked_at=None))
        return token_id, secret

    def token_tenant(self, secret: str) -> str | None:
        """The tenant of a live token, None for an unknown or revoked one."""
        with self._tx() as conn:
            return conn.execute(sa.select(api_tokens.c.tenant_id).where(
                api_tokens.c.token_hash == _token_hash(secret), api_tokens.c.revoked_at.is_(None))).scalar()

    def revoke_token(self, *, token_id: str, now: datetime) -> bool:
        with self._tx() as conn:
            return conn.execute(api_tokens.update().where(api_tokens.c.id == token_id,
                                                          api_tokens.c.revoked_at.is_(None))
                                .values(revoked_at=now).returning(api_tokens.c.id)).first() is not None

    def list_tokens(self) -> list[dict[str, Any]]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(api_tokens.c.id, api_tokens.c.tenant_id, api_tokens.c.name,
                                          api_tokens.c.created_at, api_tokens.c.revoked_at)
                                .order_by(api_tokens.c.created_at)).mappings()
            return [dict(r) for r in rows]

    # ------------------------------------------------------------------ reads

    @staticmethod
    def orphan_query(*, now: datetime, limit: int) -> sa.Select[Any]:
        """In-flight runs whose lease is missing or expired (the partial index ix_runs_in_flight
        keeps finished runs out of the scan)."""
        return (
            sa.select(runs.c.id)
            .select_from(runs.outerjoin(run_locks, run_locks.c.run_id == runs.c.id))
            .where(runs.c.status.in_(IN_FLIGHT_STATUSES),
                   sa.or_(run_locks.c.run_id.is_(None), run_locks.c.expires_at < now))
            .order_by(runs.c.id)
            .limit(limit)
        )

    def orphaned_runs(self, *, now: datetime, limit: int) -> list[str]:
        with self._tx() as conn:
            return list(conn.execute(self.orphan_query(now=now, limit=limit)).scalars())

    def stuck_runs(self, *, now: datetime, limit: int = 100) -> list[tuple[RunRecord, Lease | None]]:
        """In-flight runs with a missing or expired lease, with that lease."""
        ids = self.orphaned_runs(now=now, limit=limit)
        with self._tx() as conn:
            found = []
            for run_id in ids:
                lease = conn.execute(
                    sa.select(run_locks).where(run_locks.c.run_id == run_id)
                ).mappings().first()
                found.append((self._run(conn, run_id), Lease(**dict(lease)) if lease else None))
        return found

    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunRecord:
        with self._tx() as conn:
            run = self._run(conn, run_id)
        if tenant_id is not None and run.tenant_id != tenant_id:
            raise RunNotFound(f"no run {run_id!r}")
        return run

    def list_runs(
        self, *, tenant_id: str | None = None, status: str | None = None,
        limit: int = 50, offset: int = 0,
    ) -> list[RunRecord]:
        query = sa.select(runs).order_by(runs.c.created_at.desc(), runs.c.id).limit(limit)
        if tenant_id is not None:
            query = query.where(runs.c.tenant_id == tenant_id)
        if status is not None:
            query = query.where(runs.c.status == status)
        with self._tx() as conn:
            return [_run_record(r, r["graph"]) for r in conn.execute(query.offset(offset)).mappings()]

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        query = (
            sa.select(journal_events)
            .where(journal_events.c.run_id == run_id, journal_events.c.seq > after_seq)
            .order_by(journal_events.c.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        with self._tx() as conn:
            return [Event(**dict(r)) for r in conn.execute(query).mappings()]

    def completed_outputs(self, run_id: str) -> dict[str, Any]:
        with self._tx() as conn:
            return dict(self._completed(conn, run_id))

    def get_lease(self, run_id: str) -> Lease | None:
        """The run's lease; None for a finished run and for a parked one (its lock row is only a
        wake-up timer, see `wake_time`)."""
        with self._tx() as conn:
            row = conn.execute(
                sa.select(run_locks).where(run_locks.c.run_id == run_id)
            ).mappings().first()
        return Lease(**dict(row)) if row and row["worker_id"] != PARKED else None

    def wake_time(self, run_id: str) -> datetime | None:
        """When the sweep next looks at a parked run; None when the run is not parked."""
        with self._tx() as conn:
            return conn.execute(sa.select(run_locks.c.expires_at).where(
                run_locks.c.run_id == run_id, run_locks.c.worker_id == PARKED)).scalar()

    # --------------------------------------------------------------- helpers

    def _fence(self, conn: sa.Connection, run_id: str, generation: int, worker_id: str,
               now: datetime, lease_ttl: float) -> bool:
        """Extend the lease iff `generation` holds it; locks the row for this transaction."""
        row = conn.execute(_FENCE, {"fence_run": run_id, "fence_generation": generation,
                                    "fence_expires": now + timedelta(seconds=lease_ttl),
                                    "fence_worker": worker_id}).first()
        return row is not None

    def _fence_and_read(self, conn: sa.Connection, run_id: str, generation: int, worker_id: str,
                        now: datetime, lease_ttl: float) -> StepLog | None:
        """`_fence`, then the run's step log as this transaction sees it; None when fenced out.
        On Postgres one round trip."""
        if self.calls is None:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                return None
            return self._step_log(conn, run_id)
        known = self._known_log(run_id)
        rows = conn.exec_driver_sql(_CLAIM_FENCE, (
            run_id, generation, worker_id, now + timedelta(seconds=lease_ttl), known.seq)).all()
        if rows and rows[0].seq == FENCED_OUT:
            return None
        return self._read_on(conn, run_id, known, rows)

    def _complete_and_read(self, conn: sa.Connection, run_id: str, step_id: str, attempt: int,
                           payload: Mapping[str, Any], generation: int, worker_id: str,
                           now: datetime, lease_ttl: float) -> StepLog | None:
        """`_fence`, append `step_completed` (once per step), then the run's step log as this
        transaction sees it; None if the step had completed already, LeaseLost when fenced out.
        On Postgres one round trip."""
        if self.calls is None:
            if not self._fence(conn, run_id, generation, worker_id, now, lease_ttl):
                raise _lease_lost(run_id, generation)
            seq = self._append(conn, run_id, step_id, attempt, "step_completed", payload, generation,
                               now, on_conflict_skip=True)
            return None if seq is None else self._step_log(conn, run_id)
        known = self._known_log(run_id)
        rows = conn.exec_driver_sql(_COMPLETE_FENCE, (
            run_id, generation, worker_id, now + timedelta(seconds=lease_ttl), known.seq,
            step_id, attempt, json.dumps(payload), now)).all()
        if rows and rows[0].seq == FENCED_OUT:
            raise _lease_lost(run_id, generation)
        if rows and rows[0].seq == ALREADY_COMPLETED:
            return None
        return self._read_on(conn, run_id, known, rows)

    def _start(self, conn: sa.Connection, run_id: str, step_id: str, attempt: int, worker_id: str,
               generation: int, now: datetime) -> int | None:
        """Append `step_started`: its seq, None if this attempt was claimed under this generation."""
        payload = {"attempt": attempt, "worker": worker_id}
        if self.calls is None:
            return self._append(conn, run_id, step_id, attempt, "step_started", payload, generation,
                                now, on_conflict_skip=True)
        seq: int | None = conn.exec_driver_sql(_START_STEP, (
            run_id, step_id, attempt, generation, json.dumps(payload), now)).scalar()
        return seq

    def _append(self, conn: sa.Connection, run_id: str, step_id: str | None,
                attempt: int | None, kind: str, payload: Mapping[str, Any], generation: int,
                now: datetime, *, on_conflict_skip: bool = False) -> int | None:
        stmt = self._append_once_stmt if on_conflict_skip else self._append_stmt
        seq: int | None = conn.execute(stmt, {
            "ev_run": run_id, "ev_step": step_id, "ev_attempt": attempt, "ev_kind": kind,
            "ev_payload": dict(payload), "ev_generation": generation, "ev_at": now}).scalar()
        return seq

    def _waiting(self, conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
        rows = conn.execute(
            sa.select(journal_events.c.step_id, journal_events.c.attempt, journal_events.c.kind,
                      journal_events.c.payload, journal_events.c.created_at)
            .where(journal_events.c.run_id == run_id,
                   journal_events.c.kind.in_(("step_waiting", "step_completed", "step_failed")))
            .order_by(journal_events.c.seq)
        ).all()
        settled = {r.step_id for r in rows if r.kind != "step_waiting"}
        return [{"step_id": r.step_id, "attempt": r.attempt, "payload": r.payload,
                 "created_at": r.created_at}
                for r in rows if r.kind == "step_waiting" and r.step_id not in settled]

    def _why_not_waiting(self, conn: sa.Connection, run_id: str, step_id: str) -> str:
        kinds = set(conn.execute(
            sa.select(journal_events.c.kind).where(journal_events.c.run_id == run_id,
                                                   journal_events.c.step_id == step_id)).scalars())
        if not kinds:
            return f"run {run_id} has no step {step_id!r} that ever ran"
        if "approval_decided" in kinds:
            return f"step {step_id!r} of run {run_id} was already decided"
        if "step_completed" in kinds:
            return f"step {step_id!r} of run {run_id} is not waiting: it already completed"
        return f"step {step_id!r} of run {run_id} is not waiting"

    def _park_if_idle(self, conn: sa.Connection, run_id: str, generation: int, now: datetime,
                      frontier: Frontier | None) -> bool:
        """Park the run when steps wait and nothing else is in flight (every step the plan
        finds ready is a waiting one): status `waiting`, and the lock row becomes a wake-up
        timer (worker `waiting`, generation + 1 so every older message is stale), due at the
        earliest expiry, now if a waited-for child has already finished, or at the next re-check."""
        if frontier is None:
            return False
        waiting = self._waiting(conn, run_id)
        if not waiting or not set(frontier(self._completed(conn, run_id))) <= {w["step_id"] for w in waiting}:
            return False
        due = [datetime.fromisoformat(w["payload"]["wake_at"])
               for w in waiting if w["payload"].get("wake_at")]
        if self._finished_children_waited_for(conn, waiting):
            due.append(now)
        wake_at = min([*due, now + timedelta(seconds=WAIT_RECHECK_SECONDS)])
        conn.execute(runs.update().where(runs.c.id == run_id, runs.c.status.in_(IN_FLIGHT_STATUSES))
                     .values(status="waiting"))
        self._upsert_lock(conn, run_id, PARKED, wake_at, generation + 1)
        self._parent_due(conn, run_id, now)  # a parent may act on a paused child (onChildApproval)
        return True

    def _parent_due(self, conn: sa.Connection, run_id: str, now: datetime) -> None:
        """Make a parked parent due now: the sweep looks at it even if the wake-up call is lost.

        SKIP LOCKED: a child never waits for its parent's lock row (a parent's transaction may hold
        it and wait for the child's: a cancellation walks down the tree). A parent locked right
        now is being decided, parked (which looks at finished children itself) or cancelled."""
        parent = conn.execute(sa.select(runs.c.parent_run_id).where(runs.c.id == run_id)).scalar()
        if parent is None:
            return
        row = conn.execute(sa.select(run_locks.c.run_id).where(
            run_locks.c.run_id == parent, run_locks.c.worker_id == PARKED
        ).with_for_update(skip_locked=True)).first()
        if row is not None:
            conn.execute(run_locks.update().where(run_locks.c.run_id == parent).values(expires_at=now))

    def _upsert_lock(self, conn: sa.Connection, run_id: str, worker_id: str, expires_at: datetime,
                     generation: int) -> None:
        conn.execute(
            self._insert(run_locks).values(run_id=run_id, worker_id=worker_id, expires_at=expires_at,
                                           generation=generation)
            .on_conflict_do_update(index_elements=[run_locks.c.run_id],
                                   set_={"worker_id": worker_id, "expires_at": expires_at,
                                         "generation": generation, "redeliver_at": None})
        )

    def _completed(self, conn: sa.Connection, run_id: str) -> Mapping[str, Any]:
        """Every completed step's output, as this transaction sees the journal (read-only)."""
        return self._step_log(conn, run_id).outputs

    def _step_log(self, conn: sa.Connection, run_id: str) -> StepLog:
        """The run's step log as this transaction sees it: the process's copy plus the events
        after it; kept for the next step once this transaction commits."""
        known = self._known_log(run_id)
        return self._read_on(conn, run_id, known,
                             conn.execute(_LOG_SINCE, {"log_run": run_id, "log_after": known.seq}).all())

    def _known_log(self, run_id: str) -> StepLog:
        """The run's step log as this process last kept it (empty if it never read it)."""
        return self._logs.get(run_id) or StepLog()

    def _read_on(self, conn: sa.Connection, run_id: str, known: StepLog, rows: Sequence[Any]) -> StepLog:
        """`known` with the events this transaction read after it; kept once it commits."""
        if not rows:
            return known
        log = known.extended(rows)
        self._on_commit(conn, lambda: self._remember(run_id, log))
        return log

    def _remember(self, run_id: str, log: StepLog) -> None:
        # Keep the longest log; an older one would still be a correct prefix, only read more.
        known = self._logs.get(run_id)
        if known is None or known.seq < log.seq:
            self._logs.put(run_id, log)

    def _run(self, conn: sa.Connection, run_id: str) -> RunRecord:
        row = conn.execute(_RUN_ROW, {"row_run": run_id}).mappings().first()
        if row is None:
            raise RunNotFound(f"no run {run_id!r}")
        return _run_record(row, self._graph(conn, run_id, row["kind"], row["graph_hash"]))

    def _graph(self, conn: sa.Connection, run_id: str, kind: str, graph_hash: str | None) -> Any:
        """The run's plan document; a hash names one document, so it is decoded once per process."""
        key = (kind, graph_hash or "")
        cached = self._graphs.get(key) if graph_hash else None
        if cached is not None:
            return cached
        graph = conn.execute(sa.select(runs.c.graph).where(runs.c.id == run_id)).scalar_one()
        if graph_hash:
            self._graphs.put(key, graph)
        return graph

    def _finish(self, conn: sa.Connection, run_id: str, status: str, generation: int,
                now: datetime, *, output: Any = None, error: Any = None) -> bool:
        """Flip the status and append the terminal event together; only the flipper writes it."""
        flipped = conn.execute(
            runs.update()
            .where(runs.c.id == run_id, runs.c.status.not_in(TERMINAL_STATUSES))
            .values(status=status, output=output, error=error, finished_at=now)
            .returning(runs.c.id)
        ).first()
        if flipped is None:
            return False
        payload = {"output": output} if status == "succeeded" else {"error": error}
        self._append(conn, run_id, None, None, TERMINAL_EVENT[status], payload, generation, now)
        # Nothing may act for a failed run: its unfinished children (and theirs) stop with it.
        if status == "failed" or (status == "cancelled" and (error or {}).get("code") == "parent_failed"):
            for child in conn.execute(sa.select(runs.c.id).where(
                    runs.c.parent_run_id == run_id, runs.c.status.not_in(TERMINAL_STATUSES))).scalars():
                self._finish(conn, child, "cancelled", 0, now,
                             error={"code": "parent_failed", "by": "pal", "reason": f"run {run_id} failed",
                                    "cancelled_with": run_id})
        conn.execute(run_locks.delete().where(run_locks.c.run_id == run_id))
        self._parent_due(conn, run_id, now)
        faults.point("during_finish", None, run_id)
        return True


@contextmanager
def _storage_errors() -> Iterator[None]:
    """A database error as the StorageError callers handle (disconnected: worth one more try)."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        raise journal_error(str(exc.orig), disconnected=exc.connection_invalidated) from exc


def _lease_lost(run_id: str, generation: int) -> LeaseLost:
    return LeaseLost(f"run {run_id}: generation {generation} no longer holds the lease")


def _missing(run_id: str) -> Any:
    raise RunNotFound(f"no run {run_id!r}")


def _run_record(row: sa.RowMapping, graph: Any) -> RunRecord:
    return RunRecord(
        id=row["id"], tenant_id=row["tenant_id"], kind=row["kind"], status=row["status"],
        graph=graph, graph_hash=row["graph_hash"], input=row["input"],
        output=row["output"], error=row["error"], parent_run_id=row["parent_run_id"],
        parent_step_id=row["parent_step_id"], cost_usd=Decimal(row["cost_usd"]),
        input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
        created_at=row["created_at"], started_at=row["started_at"],
        finished_at=row["finished_at"],
    )
