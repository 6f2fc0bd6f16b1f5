"""Helpers of the storage contract tests: journals on databases of their own, and the calls
every test makes, with time always an explicit `now` counted from T0 (no sleeps, no wall clock).
The tests import the few basics (T0 arithmetic `at`, `fence`, `new_run`, TTL) by name and call the
rest as `kit.<helper>`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pal.core.records import Event, Fence, Frontier, Handoff, Plan, RunRecord
from pal.core.vocabulary import EventKind
from pal.storage.database import create_engine
from pal.storage.journal import Journal
from pal.storage.schema import run_locks
from tests.conftest import fresh_schema
from tests.support import migrated

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TTL = 30.0  # the lease every helper takes, in seconds
BACKENDS = ["sqlite", "postgres"]


def at(seconds: float) -> datetime:
    """T0 plus `seconds`: every `now` of these tests."""
    return T0 + timedelta(seconds=seconds)


@contextmanager
def migrated_journal(url: str) -> Iterator[Journal]:
    """A Journal over the empty database at `url`, migrated first; its engine is disposed
    afterwards."""
    engine = create_engine(url)
    try:
        migrated.migrate(engine)
        yield Journal(engine)
    finally:
        engine.dispose()


@contextmanager
def postgres_journal(pg_admin: sa.Engine) -> Iterator[Journal]:
    """A Journal over a Postgres schema of its own, dropped afterwards."""
    with fresh_schema(pg_admin) as url, migrated_journal(url) as journal:
        yield journal


def new_run(journal: Journal, run_id: str = "r1", *, tenant: str = "t1", seconds: float = 0.0,
            parent: tuple[str, str] | None = None, max_in_flight: int | None = None) -> RunRecord:
    """Create a queued run (generation 1, lease until `seconds` + TTL); it must be new."""
    record, created = journal.runs.create_run(
        run_id=run_id, tenant_id=tenant, kind="graph", graph={"nodes": []}, graph_hash=None,
        run_input={"x": 1}, now=at(seconds), lease_ttl=TTL,
        parent_run_id=parent[0] if parent else None, parent_step_id=parent[1] if parent else None,
        max_in_flight=max_in_flight)
    assert created
    return record


def fence(run_id: str = "r1", generation: int = 1, worker: str = "w1", seconds: float = 0.0) -> Fence:
    return Fence(run_id, generation, worker, at(seconds), TTL)


def dispatching(*steps: str) -> Plan:
    """A plan that hands off to `steps` and does not finish."""
    return lambda _completed: Handoff(dispatch=steps, finished=False)


def finishing(output: Any = None) -> Plan:
    """A plan that finishes the run with `output`."""
    return lambda _completed: Handoff(dispatch=(), finished=True, output=output)


def only(*steps: str) -> Frontier:
    """A frontier that always finds exactly `steps` ready."""
    return lambda _completed: steps


def events(journal: Journal, run_id: str = "r1", kind: str | None = None) -> list[Event]:
    return [e for e in journal.runs.events(run_id) if kind is None or e.kind == kind]


def started(journal: Journal, run_id: str = "r1") -> list[tuple[str | None, int | None, int]]:
    """(step, attempt, generation) of every step_started, in journal order."""
    return [(e.step_id, e.attempt, e.generation) for e in events(journal, run_id, EventKind.STEP_STARTED)]


def lock_row(journal: Journal, run_id: str = "r1") -> dict[str, Any] | None:
    """The run's raw run_locks row (a lease or a parked run's wake-up timer), None without one."""
    with journal.engine.connect() as conn:
        row = conn.execute(sa.select(run_locks).where(run_locks.c.run_id == run_id)).mappings().first()
    return dict(row) if row else None


def claim_and_complete(journal: Journal, step_id: str, plan: Plan, *, run_id: str = "r1",
                       generation: int = 1, seconds: float = 0.0) -> Handoff:
    """Claim `step_id` (it must start) and complete it with output {"step": step_id}."""
    f = fence(run_id, generation, seconds=seconds)
    claim = journal.steps.claim_step(f, step_id)
    assert claim.outcome.value == "run", claim
    return journal.steps.complete_step(f, step_id, claim.attempt, {"step": step_id}, plan=plan)
