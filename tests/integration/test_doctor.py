"""`pal doctor` finds every kind of invariant violation planted in a real journal, and nothing in a
clean one (on SQLite and on Postgres)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from pal.client import Client
from pal.core.clock import utcnow
from pal.engine.steps import execute_step
from pal.storage.schema import journal_events, pruned_runs, run_locks, runs, side_effect_receipts
from tests.conftest import Backend
from tests.support.graphs import linear


def finished_run(client: Client, counter: Path) -> str:
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    run_id = client.start_run(linear(counter, 2), {})
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    return run_id


def event(run_id: str, kind: str, step: str | None = None, attempt: int | None = None,
          payload: dict[str, object] | None = None) -> sa.Insert:
    return journal_events.insert().values(run_id=run_id, step_id=step, attempt=attempt, kind=kind,
                                          payload=payload or {}, generation=1, created_at=utcnow())


def drop_guards(conn: sa.Connection) -> None:
    """The database refuses these violations itself; a broken build (or a hand edit) might not."""
    for index in ("uq_journal_step_completed", "uq_journal_terminal"):
        conn.execute(sa.text(f"DROP INDEX {index}"))


PLANTS: dict[str, Callable[[sa.Connection, str], None]] = {
    "step_completed_twice": lambda c, r: c.execute(event(r, "step_completed", "s0", 1, {"output": 1})),
    "terminal_twice": lambda c, r: c.execute(event(r, "run_failed", payload={"error": {}})),
    "terminal_run_has_lease": lambda c, r: c.execute(run_locks.insert().values(
        run_id=r, worker_id="zombie", expires_at=utcnow(), generation=9)),
    "status_disagrees_with_journal": lambda c, r: c.execute(
        runs.update().where(runs.c.id == r).values(status="running")),
    "completed_without_start": lambda c, r: c.execute(event(r, "step_completed", "ghost", 1, {"output": 1})),
    "started_after_completion": lambda c, r: c.execute(event(r, "step_started", "s0", 2, {"attempt": 2})),
    "receipt_without_step": lambda c, r: c.execute(side_effect_receipts.insert().values(
        idempotency_key="k" * 64, run_id=r, step_id="never", attempt=1, effect_kind="webhook", target="x",
        status="delivered", response=None, created_at=utcnow(), updated_at=utcnow())),
    "totals_disagree_with_steps": lambda c, r: c.execute(
        runs.update().where(runs.c.id == r).values(output_tokens=99)),
    "anomaly_twice": lambda c, r: [c.execute(event(r, "anomaly_detected", "s0", None, {"kind": "runaway_loop"}))
                                   for _ in range(2)],
    "started_after_budget_stop": lambda c, r: [
        c.execute(event(r, "step_failed", "s1", 1, {"error": {"code": "budget_exceeded"}})),
        c.execute(event(r, "step_started", "s9", 1, {"attempt": 1}))],
    "timer_fired_twice": lambda c, r: [c.execute(event(r, kind, "s0", 1, {"due_at": "2026-12-07T00:00:00+00:00"}))
                                       for kind in ("timer_set", "timer_fired", "timer_fired")],
    "timer_fired_unset": lambda c, r: c.execute(event(r, "timer_fired", "s1", 1, {})),
    "pruned_run_present": lambda c, r: c.execute(pruned_runs.insert().values(  # docs/retention.md
        run_id=r, tenant_id="t", status="succeeded", finished_at=utcnow(), pruned_at=utcnow())),
}


def test_a_clean_journal_has_no_violations(client: Client, counter: Path) -> None:
    finished_run(client, counter)
    assert client.runtime.journal.doctor.violations() == []


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_each_planted_violation_is_reported_with_its_run(client: Client, counter: Path, kind: str) -> None:
    run_id = finished_run(client, counter)
    with client.runtime.journal.engine.begin() as conn:
        drop_guards(conn)
        PLANTS[kind](conn, run_id)
    found = client.runtime.journal.doctor.violations()
    assert kind in {v.kind for v in found}, found
    assert all(v.run_id == run_id for v in found)


def test_pal_doctor_exits_0_only_when_clean(client: Client, backend: Backend, counter: Path) -> None:
    run_id = finished_run(client, counter)
    env = backend.env()

    def doctor() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pal.cli", "doctor"], env=env, capture_output=True,
                              text=True, timeout=60)

    clean = doctor()
    assert clean.returncode == 0 and "journal is clean" in clean.stdout
    with client.runtime.journal.engine.begin() as conn:
        PLANTS["totals_disagree_with_steps"](conn, run_id)
    broken = doctor()
    assert broken.returncode == 1
    assert f"totals_disagree_with_steps: run {run_id}" in broken.stdout and "1 violation(s)" in broken.stdout
