"""Real processes: `pal worker` subprocesses, `pal run --follow`, `pal demo`, plain `send_task`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from pal.cli.demo import stop_process
from pal.client import Client
from tests.conftest import REDIS_URL, Backend
from tests.support.graphs import fan_out_in, linear
from tests.support.tools import calls


def start_pal_worker(backend: Backend, log: Path, concurrency: int = 2) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pal.cli", "worker", "--concurrency", str(concurrency),
             "--loglevel", "INFO"],
            env=backend.env(), stdout=out, stderr=subprocess.STDOUT, cwd=backend.settings.home.parent,
        )


@pytest.fixture
def pal_worker(backend: Backend, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start_pal_worker(backend, tmp_path / "worker.log")
    yield process
    stop_process(process)
    assert process.returncode is not None


def test_pal_worker_subprocess_runs_graphs(backend: Backend, pal_worker: subprocess.Popen[bytes],
                                           tmp_path: Path) -> None:
    client = Client(backend.settings)
    linear_id = client.start_run(linear(tmp_path / "linear.log", 4), {})
    fan_id = client.start_run(fan_out_in(tmp_path / "fan.log", 3), {})
    assert client.wait(linear_id, timeout=120).status == "succeeded"
    assert client.wait(fan_id, timeout=120).status == "succeeded"
    assert calls(tmp_path / "linear.log") == ["s0", "s1", "s2", "s3"]
    assert sorted(calls(tmp_path / "fan.log")) == ["b0", "b1", "b2", "join"]
    workers = {e.payload["worker"] for e in client.events(fan_id) if e.kind == "step_started"}
    assert all(w.split(":")[1] != str(os.getpid()) for w in workers)  # ran in the worker's children
    client.close()


def test_pal_worker_starts_without_mingle_or_gossip(postgres_backend: Backend, tmp_path: Path) -> None:
    """On Redis, Celery's mingle would hold every worker start for a second waiting for neighbours'
    revoked-task ids, which PAL never uses: the worker skips it."""
    log = tmp_path / "worker.log"
    worker = start_pal_worker(postgres_backend, log)
    try:
        client = Client(postgres_backend.settings)
        run_id = client.start_run(linear(tmp_path / "c.log", 1), {})
        assert client.wait(run_id, timeout=120).status == "succeeded"
        client.close()
    finally:
        stop_process(worker)
    text = log.read_text()
    assert " ready." in text, text
    assert "mingle:" not in text, text
    # Its banner says what it runs against and which tools it loaded.
    settings = postgres_backend.settings
    assert f"pal worker: queues {settings.queue}, broker {settings.broker_url}\n" in text, text
    assert "pal worker: journal postgresql://[redacted]@127.0.0.1:5432/" in text, text  # no credentials
    assert f"pal worker: lease {settings.lease_ttl:g}s, orphan sweep every" in text, text
    assert ", count, " in text, text  # tests.support.tools, loaded from PAL_TOOL_MODULES


def test_pal_run_follow_shows_steps_live(backend: Backend, pal_worker: subprocess.Popen[bytes],
                                         tmp_path: Path) -> None:
    graph_file = tmp_path / "g.json"
    graph_file.write_text(json.dumps(linear(tmp_path / "c.log", 2)))
    result = subprocess.run(
        [sys.executable, "-m", "pal.cli", "run", str(graph_file), "--input", '{"who": "cli"}',
         "--run-id", "cli-run-1", "--timeout", "120"],
        env=backend.env(), capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "run cli-run-1 queued"
    assert any("step_completed s0" in line for line in lines)
    assert lines[-1] == "run cli-run-1 succeeded"
    shown = subprocess.run([sys.executable, "-m", "pal.cli", "runs", "events", "cli-run-1", "--json"],
                           env=backend.env(), capture_output=True, text=True, timeout=120)
    kinds = [e["kind"] for e in json.loads(shown.stdout)]
    assert kinds[0] == "run_queued" and kinds[-1] == "run_succeeded"


def test_pal_run_exits_1_when_the_run_fails(backend: Backend, pal_worker: subprocess.Popen[bytes],
                                            tmp_path: Path) -> None:
    graph_file = tmp_path / "g.yaml"
    graph_file.write_text(
        "nodes:\n  - {id: t, type: trigger}\n  - {id: bad, type: tool, data: {tool: explode}}\n"
        "edges:\n  - {source: t, target: bad}\n")
    result = subprocess.run([sys.executable, "-m", "pal.cli", "run", str(graph_file)],
                            env=backend.env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    assert "step_failed bad" in result.stdout
    assert "failed" in result.stdout.splitlines()[-1]


def test_another_service_enqueues_with_send_task_only(postgres_backend: Backend, tmp_path: Path) -> None:
    """A service that knows nothing of PAL but the task name and the broker starts a run."""
    worker = start_pal_worker(postgres_backend, tmp_path / "worker.log")
    settings = postgres_backend.settings
    producer = Celery("other-service", broker=REDIS_URL, set_as_current=False)
    producer.conf.broker_transport_options = {"global_keyprefix": settings.broker_key_prefix}
    try:
        graph = linear(tmp_path / "c.log", 2)
        producer.send_task("pal.start_run", kwargs={"graph": graph, "input": {"from": "billing"},
                                                     "run_id": "billing-7"}, queue=settings.queue)
        client = Client(settings)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(r.id == "billing-7" for r in client.list_runs()):
                break
            time.sleep(0.1)
        run = client.wait("billing-7", timeout=120)
        assert run.status == "succeeded"
        assert run.input == {"from": "billing"}
        client.close()
    finally:
        producer.close()
        stop_process(worker)
