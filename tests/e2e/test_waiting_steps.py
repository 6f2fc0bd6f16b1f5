"""Many steps waiting at once on a threads worker hold no Postgres connection while they wait: the
worker's process opens at most PAL_DB_POOL_SIZE connections, counted in pg_stat_activity by the
worker's own application_name, while far more steps than that are in flight; every run finishes and
every step runs once (docs/decisions/bounded-connections.md)."""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from pal.client import Client
from pal.storage.database import create_engine
from tests.conftest import Backend
from tests.support.graphs import edge
from tests.support.processes import Processes
from tests.support.tools import calls

THREADS = 48
POOL = 6
WAITING = ("SELECT count(*) FILTER (WHERE kind = 'step_started') - count(*) FILTER (WHERE kind IN "
           "('step_completed', 'step_failed')) FROM journal_events WHERE step_id LIKE 'n%'")


def napping(path: Path, run: int) -> dict[str, object]:
    """start -> two one-second naps, each recorded -> out."""
    nodes = [{"id": "start", "type": "trigger"}]
    nodes += [{"id": f"n{i}", "type": "tool", "data": {"tool": "nap", "args": {
        "seconds": 1, "path": str(path), "label": f"r{run}.n{i}"}}} for i in range(2)]
    nodes.append({"id": "out", "type": "output", "data": {"value": "{{ nodes.n1.output }}"}})
    ids = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [edge(a, b) for a, b in itertools.pairwise(ids)]}


def test_steps_waiting_on_a_threads_worker_share_a_bounded_pool(
        processes: Processes, postgres_backend: Backend, pg_admin: sa.Engine, tmp_path: Path) -> None:
    name = f"pal-waiting-{uuid.uuid4().hex[:12]}"
    url = f"{postgres_backend.settings.database_url}&application_name={name}"
    processes.start(["worker", "--pool", "threads", "--concurrency", str(THREADS), "--loglevel", "INFO"],
                    "threads.log", PAL_DATABASE_URL=url, PAL_DB_POOL_SIZE=str(POOL))
    client = Client(postgres_backend.settings)
    journal = create_engine(postgres_backend.settings.database_url)
    ledger = tmp_path / "calls.txt"
    try:
        run_ids = [client.start_run(napping(ledger, r), {}) for r in range(THREADS)]
        peak, in_flight = 0, 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # bounded: until every run finished, at most 2 minutes
            with pg_admin.connect() as conn:
                opened = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                                      {"n": name}).scalar_one()
            peak = max(peak, opened)
            with journal.connect() as conn:  # steps started and not yet finished: waiting right now
                in_flight = max(in_flight, conn.execute(sa.text(WAITING)).scalar_one())
            if all(client.get_run(r).terminal for r in run_ids):
                break
            time.sleep(0.05)
        assert [client.get_run(r).status for r in run_ids] == ["succeeded"] * THREADS
        recorded = calls(ledger)
        assert sorted(recorded) == sorted(f"r{r}.n{i}" for r in range(THREADS) for i in range(2))  # each once
        assert in_flight > 2 * POOL  # far more steps were waiting at once than connections exist
        assert 0 < peak <= POOL, f"{peak} connections for a pool of {POOL}"
        log = (processes.folder / "threads.log").read_text()
        assert f"at most {POOL} Postgres connections per worker process" in log
    finally:
        client.close()
        journal.dispose()
