"""A `sleep` node over real workers, beats, Postgres and Redis: the run parks holding no worker and no
message, the sweep fires its timer once (two beats sweeping), and a sleep survives a restart of
every process and a Redis flush."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import redis

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.e2e.test_service_loss import FLUSHED_DB_URL
from tests.support.processes import Processes
from tests.support.tools import calls


def sleeping_graph(duration: str, after: Path) -> dict[str, object]:
    return {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "nap", "type": "sleep", "data": {"duration": duration}},
                      {"id": "after", "type": "tool", "data": {"tool": "count",
                                                               "args": {"path": str(after), "label": "after"}}}],
            "edges": [{"source": "t", "target": "nap"}, {"source": "nap", "target": "after"}]}


def sleeping_run(procs: Processes, client: Client, duration: str, after: Path) -> str:
    """A worker and a beat, and a run of `sleeping_graph` parked at its sleep."""
    procs.worker("w")
    procs.beat()
    run_id = client.start_run(sleeping_graph(duration, after))
    assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
    return run_id


def test_a_sleep_parks_the_run_and_its_timer_fires_once(postgres_backend: Backend, tmp_path: Path) -> None:
    procs = Processes(postgres_backend, tmp_path)
    client = Client(postgres_backend.settings)
    after = tmp_path / "after.log"
    try:
        procs.start(["beat", "--loglevel", "INFO"], "beat2.log", PAL_HOME=str(tmp_path / "beat2"))
        run_id = sleeping_run(procs, client, "2s", after)
        assert client.runtime.journal.runs.get_lease(run_id) is None  # parked: no lease, no worker
        assert calls(after) == []
        assert client.wait(run_id, timeout=60).status == "succeeded"
        events = client.events(run_id)
        kinds = Counter(e.kind for e in events)
        assert kinds["timer_set"] == 1 and kinds["timer_fired"] == 1
        nap = next(e for e in events if e.kind == "step_completed" and e.step_id == "nap").payload["output"]
        assert datetime.fromisoformat(nap["fired_at"]) >= datetime.fromisoformat(nap["due_at"])
        assert calls(after) == ["after"]
        assert_exactly_once(client, run_id)
    finally:
        client.close()
        procs.stop_all()


def test_a_sleep_survives_every_process_restarting_and_a_redis_flush(postgres_backend: Backend,
                                                                     tmp_path: Path) -> None:
    backend = Backend("postgres", postgres_backend.settings.with_(broker_url=FLUSHED_DB_URL))
    procs = Processes(backend, tmp_path)
    client = Client(backend.settings)
    after = tmp_path / "after.log"
    try:
        run_id = sleeping_run(procs, client, "3s", after)
        procs.stop_all()  # every process SIGKILLed while the run sleeps
        redis.Redis.from_url(FLUSHED_DB_URL).flushdb()
        procs.worker("w2")
        procs.beat()  # a fresh beat and worker after the flush
        assert client.wait(run_id, timeout=60).status == "succeeded"
        assert Counter(e.kind for e in client.events(run_id))["timer_fired"] == 1
        assert calls(after) == ["after"]
        assert_exactly_once(client, run_id)
    finally:
        client.close()
        procs.stop_all()


def test_a_sleeping_run_is_cancelled_at_once(postgres_backend: Backend,
                                                                  tmp_path: Path) -> None:
    procs = Processes(postgres_backend, tmp_path)
    client = Client(postgres_backend.settings)
    after = tmp_path / "after.log"
    try:
        run_id = sleeping_run(procs, client, "1h", after)
        assert client.cancel(run_id, reason="no longer needed") == [run_id]
        assert client.get_run(run_id).status == "cancelled"
        sweeps = Counter(e.kind for e in client.events(run_id))
        assert sweeps["timer_set"] == 1 and sweeps["timer_fired"] == 0
        assert client.runtime.journal.doctor.violations() == []
        assert calls(after) == []
    finally:
        client.close()
        procs.stop_all()
