"""What every store shares: the engine, transactions with after-commit work, the per-process
caches, and the reads a claim needs (a run, its plan document, its step log).

Caches, so a step does not decode the whole graph and re-read every earlier event: a plan's
document by (kind, hash) (a hash names one document), each run as this process first read it, and
each run's step log, read incrementally (pal.core.step_log says why that is sound).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from pal.core.lru import Lru
from pal.core.records import RunRecord
from pal.core.step_log import LOG_KINDS, StepLog
from pal.errors import LeaseLost, RunNotFound, journal_error
from pal.storage.one_call import AutocommitCalls, calls_for
from pal.storage.schema import journal_events, runs

GRAPH_CACHE_SIZE = 128  # plan documents kept decoded per process
# Runs whose step logs (and first-read records) a process keeps. A worker busy with more runs than
# this claims by transaction and reads each run's log again from its start (100 busy runs on two
# solo workers ran 18% slower with 64: docs/decisions/step-log-cache.md); each log holds its outputs.
OUTPUT_CACHE_RUNS = 256
_ON_COMMIT = "pal_on_commit"  # Connection.info key of the current transaction's after-commit work

RUN_ROWS = sa.select(*(c for c in runs.c if c.name != "graph"))  # a run without its graph column
_RUN_ROW = RUN_ROWS.where(runs.c.id == sa.bindparam("row_run"))
_LOG_SINCE = (
    sa.select(journal_events.c.seq, journal_events.c.step_id, journal_events.c.kind, journal_events.c.payload)
    # `run_id = run AND seq > after` walks ix_journal_events_run_seq from (run, after). Not the row
    # comparison (run_id, seq) > (run, after): beside the equality it cannot position the scan, which
    # then reads the run's every index entry (docs/decisions/step-log-cache.md). The hot path reads
    # through the functions, whose generic plans never pick the primary key on seq instead.
    .where(journal_events.c.run_id == sa.bindparam("log_run"),
           journal_events.c.seq > sa.bindparam("log_after"),
           journal_events.c.kind.in_(LOG_KINDS))
    .order_by(journal_events.c.seq)
)

class Outcome(StrEnum):
    """What a step function (storage/sql/functions.sql) answers in its `outcome` column."""

    READ = "read"  # the fence held (or, reading only, still holds) and `events` is the log after p_after
    FENCED_OUT = "fenced_out"  # this generation no longer holds the lease: nothing written
    REFUSED = "refused"  # a claim's fence was not taken (fenced out, or a needed step not complete)
    LOG_MOVED = "log_moved"  # the caller predicted from an older log: it decides again in a transaction
    DUPLICATE = "duplicate"  # the attempt was started under this generation already
    STARTED = "started"
    ALREADY_COMPLETED = "already_completed"
    COMPLETED = "completed"
    NEXT_STARTED = "next_started"  # completed, and the caller's successor started
    NEXT_DUPLICATE = "next_duplicate"  # completed; the successor's attempt was started already


class EventRow(NamedTuple):
    """One event of a step log, as the step functions' `events` hold it (seq, step_id, kind, payload)."""

    seq: int
    step_id: str | None
    kind: str
    payload: Any


def event_rows(events: Sequence[Sequence[Any]]) -> list[EventRow]:
    """A step function's `events` (a JSON array of [seq, step_id, kind, payload]) as rows."""
    return [EventRow(*event) for event in events]


@dataclass(frozen=True)
class Caches:
    """What the stores of one journal share in a process: decoded plan documents by (kind, hash),
    each run as this process first read it, and each run's step log."""

    graphs: Lru[tuple[str, str], Any] = field(default_factory=lambda: Lru(GRAPH_CACHE_SIZE))
    logs: Lru[str, StepLog] = field(default_factory=lambda: Lru(OUTPUT_CACHE_RUNS))
    claimed_runs: Lru[str, RunRecord] = field(default_factory=lambda: Lru(OUTPUT_CACHE_RUNS))


class StoreBase:
    """The state and reads every store of the journal uses (pal.storage.journal composes them)."""

    def __init__(self, engine: Engine, caches: Caches | None = None) -> None:
        self.engine = engine
        caches = Caches() if caches is None else caches
        self._graphs, self._logs, self._claimed_runs = caches.graphs, caches.logs, caches.claimed_runs
        self._insert: Callable[..., Any] = (
            postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        )
        # Postgres: the step functions exist and the one-call claim and completion run here
        # (pal.storage.one_call); None on SQLite, which takes the plain statements.
        postgres = engine.dialect.name == "postgresql"
        self.calls: AutocommitCalls | None = calls_for(engine) if postgres else None

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

    @staticmethod
    def _exists(conn: sa.Connection, run_id: str) -> bool:
        return conn.execute(sa.select(runs.c.id).where(runs.c.id == run_id)).first() is not None

    def _run(self, conn: sa.Connection, run_id: str) -> RunRecord:
        row = conn.execute(_RUN_ROW, {"row_run": run_id}).mappings().first()
        if row is None:
            raise RunNotFound(f"no run {run_id!r}")
        return run_record(row, self._graph(conn, run_id, row["kind"], row["graph_hash"]))

    def _known_run(self, conn: sa.Connection, run_id: str) -> RunRecord:
        """The run as this process first read it: its plan, input and parent are what a claim
        uses, and they never change (its status and totals may be stale)."""
        run = self._claimed_runs.get(run_id)
        if run is None:
            run = self._run(conn, run_id)
            self._claimed_runs.put(run_id, run)
        return run

    def _known_run_unfenced(self, run_id: str) -> RunRecord | None:
        """`_known_run` outside any transaction, for a claim that needs no other statement of one
        (pal.storage.steps): what it keeps never changes, so no fence has to hold while it is read.
        None when there is no such run (the claim's transaction then says so)."""
        run = self._claimed_runs.get(run_id)
        if run is not None:
            return run
        try:
            with _storage_errors(), self.engine.connect() as conn:
                return self._known_run(conn, run_id)
        except RunNotFound:
            return None

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



@contextmanager
def _storage_errors() -> Iterator[None]:
    """A database error as the StorageError callers handle (disconnected: worth one more try)."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        raise journal_error(str(exc.orig), disconnected=exc.connection_invalidated) from exc


def json_safe(value: Any) -> Any:
    """Round-trip through JSON so what we store is exactly what a reader gets back."""
    return json.loads(json.dumps(value))


def lease_lost(run_id: str, generation: int) -> LeaseLost:
    return LeaseLost(f"run {run_id}: generation {generation} no longer holds the lease")


def missing(run_id: str) -> Any:
    raise RunNotFound(f"no run {run_id!r}")


def run_record(row: sa.RowMapping, graph: Any) -> RunRecord:
    return RunRecord(
        id=row["id"], tenant_id=row["tenant_id"], kind=row["kind"], status=row["status"],
        graph=graph, graph_hash=row["graph_hash"], input=row["input"],
        output=row["output"], error=row["error"], parent_run_id=row["parent_run_id"],
        parent_step_id=row["parent_step_id"], cost_usd=Decimal(row["cost_usd"]),
        input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
        created_at=row["created_at"], started_at=row["started_at"],
        finished_at=row["finished_at"], limits=row["limits"], source_run_id=row["source_run_id"],
        source_kind=row["source_kind"], source_step_id=row["source_step_id"],
        priority=row.get("priority"), admitted=row.get("admitted"),
    )
