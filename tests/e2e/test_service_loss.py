"""Redis loses everything, Postgres restarts: runs in flight still finish."""

from __future__ import annotations

import itertools
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import redis

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.processes import Processes

# A Redis database of its own, so that flushing it cannot touch any other test's keys.
FLUSHED_DB_URL = "redis://127.0.0.1:6379/9"


def napping_graph(seconds: float, steps: int) -> dict[str, object]:
    nodes = [{"id": "t", "type": "trigger"}]
    nodes += [{"id": f"n{i}", "type": "tool", "data": {"tool": "nap", "args": {"seconds": seconds}}}
              for i in range(steps)]
    ids = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [{"source": a, "target": b} for a, b in itertools.pairwise(ids)]}


@pytest.fixture
def flushable_backend(postgres_backend: Backend) -> Backend:
    return Backend("postgres", postgres_backend.settings.with_(broker_url=FLUSHED_DB_URL))


def test_redis_flush_mid_run_every_run_still_finishes(flushable_backend: Backend, tmp_path: Path) -> None:
    procs = Processes(flushable_backend, tmp_path)
    try:
        procs.worker("w1")
        procs.start(["worker", "--concurrency", "2", "--loglevel", "INFO"], "w2.log")
        procs.beat()
        client = Client(flushable_backend.settings)
        run_ids = [client.start_run(napping_graph(0.5, 4), {"i": i}) for i in range(5)]
        assert wait_until(lambda: sum(e.kind == "step_completed" for r in run_ids
                                      for e in client.events(r)) >= 8, timeout=60)
        redis.Redis.from_url(FLUSHED_DB_URL).flushdb()
        runs = [client.wait(r, timeout=180) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 5
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
        recovered = Counter(e.kind for r in run_ids for e in client.events(r))["run_recovered"]
        assert recovered >= 1  # at least one run lost its doorbell and was re-driven by the sweep
        client.close()
    finally:
        procs.stop_all()


@pytest.mark.disruptive  # restarts Postgres: run alone (tests/run_suite.py)
def test_postgres_restart_mid_run_workers_reconnect(postgres_backend: Backend, tmp_path: Path) -> None:
    procs = Processes(postgres_backend, tmp_path)
    try:
        procs.start(["worker", "--concurrency", "2", "--loglevel", "INFO"], "w.log")
        procs.beat()
        client = Client(postgres_backend.settings)
        run_ids = [client.start_run(napping_graph(0.5, 4), {"i": i}) for i in range(3)]
        assert wait_until(lambda: sum(e.kind == "step_completed" for r in run_ids
                                      for e in client.events(r)) >= 4, timeout=60)
        subprocess.run("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart",
                       shell=True, check=True, timeout=120)
        client.runtime.journal.engine.dispose()  # this process's pooled connections died too
        runs = [client.wait(r, timeout=180) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 3
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
        client.close()
    finally:
        procs.stop_all()
