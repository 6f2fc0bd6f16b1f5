"""Flower against a real worker: task events arrive, and /api/workers and /api/tasks answer behind
basic auth with PAL's readable task names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.support import web
from tests.support.api_server import free_port
from tests.support.graphs import linear
from tests.support.processes import Processes

AUTH = ("admin", "s3cret")


def test_flower_sees_pal_tasks_behind_basic_auth(processes: Processes, postgres_backend: Backend,
                                                 tmp_path: Path) -> None:
    port = free_port()
    processes.worker("w")
    processes.start(["flower", "--port", str(port)], "flower.log", PAL_FLOWER_BASIC_AUTH=":".join(AUTH))
    url = f"http://127.0.0.1:{port}"

    def get(path: str, auth: tuple[str, str] | None = AUTH) -> httpx.Response | None:
        try:
            return web.get(url + path, auth=auth, timeout=10)
        except httpx.TransportError:
            return None

    assert wait_until(lambda: get("/api/workers") is not None, timeout=60), (tmp_path / "flower.log").read_text()
    client = Client(postgres_backend.settings)

    def tasks() -> dict[str, dict[str, object]]:
        reply = get("/api/tasks")
        return reply.json() if reply is not None and reply.status_code == 200 else {}

    # Task events are fire-and-forget (Redis pub/sub): Flower sees those sent after its event
    # receiver has subscribed, a moment after its web server answers. Run until it has seen one.
    def finished_run() -> str:
        run_id = client.start_run(linear(tmp_path / "c.log", 2), {})
        assert client.wait(run_id, timeout=60).status == "succeeded"
        return run_id

    def seen() -> bool:
        finished_run()
        return wait_until(lambda: any(t.get("name") == "pal.execute_node" for t in tasks().values()), 2)

    assert wait_until(seen, timeout=60)
    # The run Flower first saw may have begun before its receiver subscribed and so miss its first
    # events (the likely cause of a CI failure under load): follow a run started after Flower listens.
    run_id = finished_run()
    names = {t.get("name") for t in tasks().values()}
    assert {"pal.execute_node"} <= names

    # Every message of that run (trigger, 2 tools, output) reaches Flower as sent and succeeded:
    # its task-sent event (PAL's publisher's, or for a message the worker ran itself, the worker's
    # batched with its other events) and the worker's batched task events all arrive.
    def run_tasks() -> list[dict[str, object]]:
        return [t for t in tasks().values() if run_id in str(t.get("args"))]

    assert wait_until(lambda: len(run_tasks()) == 4 and all(
        t.get("state") == "SUCCESS" and t.get("sent") for t in run_tasks()), timeout=30), run_tasks()
    ids = {t.get("uuid") for t in run_tasks()}
    assert sum(t.get("parent_id") in ids for t in run_tasks()) >= 3  # each node links to its sender
    assert wait_until(lambda: bool((get("/api/workers?refresh=1") or httpx.Response(500)).json()), timeout=60)
    for auth in (None, ("admin", "wrong")):
        refused = get("/api/tasks", auth=auth)
        assert refused is not None and refused.status_code == 401
    client.close()


def test_pal_flower_refuses_to_run_without_basic_auth(processes: Processes) -> None:
    env = processes.env() | {"PAL_FLOWER_BASIC_AUTH": ""}
    result = subprocess.run([sys.executable, "-m", "pal.cli", "flower"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "PAL_FLOWER_BASIC_AUTH" in result.stderr
