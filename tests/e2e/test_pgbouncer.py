"""The journal behind PgBouncer in transaction mode: consecutive statements of one PAL connection may
run in different server sessions, so the step protocol's prepared statements go missing (PAL then
calls unprepared). Solo, prefork and threads workers run runs to the end through it, every step once,
`pal doctor` clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pal.client import Client
from tests.conftest import REDIS_URL, Backend, migrated_postgres_backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.e2e.test_service_loss import napping_graph
from tests.support.pgbouncer import pgbouncer_database
from tests.support.processes import Processes

POOLS = {"solo": ["--pool", "solo"], "prefork": ["--pool", "prefork", "--concurrency", "2"],
         "threads": ["--pool", "threads", "--concurrency", "8"]}


@pytest.fixture
def bounced_backend(pg_admin: sa.Engine, redis_prefix: str, tmp_path: Path) -> Iterator[Backend]:
    with pgbouncer_database(pg_admin) as (through, direct):
        migrated = migrated_postgres_backend(tmp_path, direct, REDIS_URL, redis_prefix)  # DDL goes direct
        yield Backend("postgres", migrated.settings.with_(database_url=through))


@pytest.mark.parametrize("pool", list(POOLS))
def test_runs_finish_through_pgbouncer_in_transaction_mode(bounced_backend: Backend, tmp_path: Path,
                                                           pool: str) -> None:
    procs = Processes(bounced_backend, tmp_path)
    client = Client(bounced_backend.settings)
    try:
        procs.start(["worker", *POOLS[pool], "--loglevel", "INFO"], "w.log")
        procs.beat()
        run_ids = [client.start_run(napping_graph(0.02, 8), {"i": i}) for i in range(10)]
        runs = [client.wait(r, timeout=180) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 10
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
    finally:
        client.close()
        procs.stop_all()
