"""A step that fails, seen from everywhere an operator looks, with a real `pal worker` on Postgres and
Redis: the journal (type, message, traceback), the worker's log (ERROR, with the traceback), Celery's
task state in Flower (the failed step's task FAILURE, the others SUCCESS), `pal runs show`."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.support import web
from tests.support.api_server import free_port
from tests.support.graphs import failing, linear
from tests.support.processes import Processes

AUTH = ("admin", "s3cret")


def test_a_failed_step_shows_its_traceback_in_the_journal_log_flower_and_cli(
        processes: Processes, postgres_backend: Backend, redis_client: redis.Redis, tmp_path: Path) -> None:
    port = free_port()
    processes.worker("w")
    processes.start(["flower", "--port", str(port)], "flower.log", PAL_FLOWER_BASIC_AUTH=":".join(AUTH))
    url = f"http://127.0.0.1:{port}"
    client = Client(postgres_backend.settings)

    def tasks() -> dict[str, dict[str, object]]:
        try:
            reply = web.get(url + "/api/tasks", auth=AUTH, timeout=10)
        except httpx.TransportError:
            return {}
        return reply.json() if reply.status_code == 200 else {}

    # Flower sees task events sent after its receiver subscribed (tests/e2e/test_flower.py): run
    # until it has seen one, then start the run under test.
    def seen() -> bool:
        assert client.wait(client.start_run(linear(tmp_path / "c.log", 1), {}), timeout=60).status == "succeeded"
        return wait_until(lambda: any(t.get("name") == "pal.execute_node" for t in tasks().values()), 2)

    assert wait_until(seen, timeout=90), (tmp_path / "flower.log").read_text()
    run_id = client.start_run(failing(), {})
    run = client.wait(run_id, timeout=60)
    assert run.status == "failed" and run.error is not None

    # The journal: one step_failed with type, message and the tool's traceback; the run's error too.
    events = client.events(run_id)
    [failed] = [e for e in events if e.kind == "step_failed"]
    error = failed.payload["error"]
    assert (error["type"], error["message"], failed.step_id) == ("RuntimeError", "kaput", "bad")
    assert "Traceback (most recent call last)" in error["traceback"] and "in explode" in error["traceback"]
    assert error["traceback"].rstrip().endswith("RuntimeError: kaput")
    assert run.error["traceback"] == error["traceback"] and run.error["step_id"] == "bad"
    assert [e.kind for e in events].count("run_failed") == 1

    # The worker's log: the failure at ERROR, followed by its traceback; logged once.
    def worker_log() -> str:
        return (tmp_path / "w.log").read_text()

    assert wait_until(lambda: f"run {run_id} step bad failed" in worker_log(), timeout=30)
    lines = worker_log().splitlines()
    [at] = [i for i, line in enumerate(lines) if f"run {run_id} step bad failed (attempt 1)" in line]
    assert "ERROR" in lines[at] and "RuntimeError: kaput" in lines[at]
    # Celery's own line for the task is one INFO line (StepFailed is expected), not a second trace.
    assert any("raised expected: StepFailed" in line and "INFO" in line for line in lines)
    following = "\n".join(lines[at + 1: at + 40])
    assert "Traceback (most recent call last)" in following and 'in explode' in following

    # Flower: the failed step's task FAILURE with an exception naming run, step and error; the
    # trigger's SUCCESS. The failed message was acknowledged: nothing waits to be redelivered.
    def run_tasks() -> dict[str, dict[str, object]]:
        return {str(t.get("args")): t for t in tasks().values()
                if t.get("name") == "pal.execute_node" and run_id in str(t.get("args"))}

    def states() -> dict[str, object]:
        return {("bad" if "'bad'" in args else "start" if "'start'" in args else args): t.get("state")
                for args, t in run_tasks().items()}

    assert wait_until(lambda: states() == {"start": "SUCCESS", "bad": "FAILURE"}, timeout=30), run_tasks()
    [bad] = [t for args, t in run_tasks().items() if "'bad'" in args]
    assert f"run {run_id} step bad failed: RuntimeError: kaput" in str(bad.get("exception"))
    prefix = postgres_backend.settings.broker_key_prefix
    assert wait_until(lambda: not redis_client.hlen(f"{prefix}unacked"), timeout=30)
    assert processes.cli("doctor").returncode == 0

    # `pal runs show`: the error, its traceback, a line per step, money as a plain decimal.
    shown = processes.cli("runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "cost_usd: 0\n" in out and "E-" not in out
    assert "traceback:" in out and "    Traceback (most recent call last)" in out and "in explode" in out
    step_rows = {line.split()[0]: line.split(None, 3)[1:] for line in out.split("steps:", 1)[1].splitlines()[2:]}
    assert step_rows["start"] == ["completed", "1"]
    assert step_rows["bad"] == ["failed", "1", "RuntimeError: kaput"]
    client.close()
