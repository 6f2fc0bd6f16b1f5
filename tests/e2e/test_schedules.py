"""Schedules over real beats, a worker, Postgres and Redis: two beats start one run per tick, which
the worker runs; REST and the CLI add, list, pause, resume and delete them, each tenant its own;
hostile schedules are refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.clock import utcnow
from pal.storage.schema import schedules
from tests.e2e.test_start_keys import counting_graph
from tests.support.api_server import Api
from tests.support.processes import Processes
from tests.support.tools import calls


def due_now(client: Client, name: str) -> None:
    """Bring the schedule's next tick to now (its cron's own times are unit-tested): the beats fire
    it at their next pass rather than at the next minute."""
    with client.runtime.journal.engine.begin() as conn:
        conn.execute(sa.update(schedules).where(schedules.c.name == name).values(next_at=utcnow()))


def test_two_beats_start_one_run_per_tick(api: Api, processes: Processes, tmp_path: Path) -> None:
    client = api.client
    processes.beat()
    processes.start(["beat", "--loglevel", "INFO"], "beat2.log", PAL_HOME=str(tmp_path / "beat2"))
    ran = tmp_path / "ran.log"
    added = api.post("/v1/schedules", json={"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                                             "graph": counting_graph(ran), "input": {"n": "tick"}})
    assert added.status_code == 201, added.text
    assert added.json()["next_at"].endswith(("02:00:00+00:00", "01:00:00+00:00"))  # 03:00 in Paris
    due_now(client, "nightly")
    assert wait_until(lambda: api.get("/v1/schedules/nightly").json()["last_run_id"] is not None, timeout=60)
    run_id = api.get("/v1/schedules/nightly").json()["last_run_id"]
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    beats = [processes.folder / "beat.log", processes.folder / "beat2.log"]
    worker = processes.folder / "w.log"
    passes = worker.read_text().count("pal.fire_schedules[")
    assert wait_until(lambda: worker.read_text().count("pal.fire_schedules[") >= passes + 4, timeout=60)
    assert all(b.exists() for b in beats)
    assert calls(ran) == ["tick"]  # every pass after the first found the tick gone
    assert [r.id for r in client.runtime.journal.runs.list_runs(tenant_id="acme")] == [run_id]
    assert api.get("/v1/schedules/nightly").json()["next_at"] > utcnow().isoformat()


def test_rest_and_cli_manage_a_tenants_own_schedules(api: Api, processes: Processes, tmp_path: Path) -> None:
    graph = counting_graph(tmp_path / "ran.log")
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    added = processes.cli("schedules", "add", "weekday", str(path), "--cron", "0 9 * * 1-5", "--tz",
                          "America/New_York", "--overlap", "queue", "--input", '{"n": "cli"}',
                          PAL_TENANT="acme")
    assert added.returncode == 0 and "overlap queue" in added.stdout, added.stderr
    listed = api.get("/v1/schedules").json()["schedules"]
    assert [(s["name"], s["cron"], s["timezone"], s["overlap"]) for s in listed] == [
        ("weekday", "0 9 * * 1-5", "America/New_York", "queue")]
    assert api.call("GET", "/v1/schedules", api.other).json() == {"schedules": []}
    for method, route in (("GET", ""), ("POST", "/pause"), ("POST", "/resume"), ("DELETE", "")):
        assert api.call(method, f"/v1/schedules/weekday{route}", api.other).status_code == 404
    assert api.post("/v1/schedules/weekday/pause").json()["paused"] is True
    shown = processes.cli("schedules", "list", PAL_TENANT="acme")
    assert "weekday" in shown.stdout and "paused" in shown.stdout
    assert processes.cli("schedules", "resume", "weekday", PAL_TENANT="acme").returncode == 0
    assert api.get("/v1/schedules/weekday").json()["paused"] is False
    twice = processes.cli("schedules", "add", "weekday", str(path), "--cron", "@daily", PAL_TENANT="acme")
    assert twice.returncode == 6 and "exists" in twice.stderr
    assert processes.cli("schedules", "delete", "weekday", PAL_TENANT="acme").returncode == 0
    gone = processes.cli("schedules", "delete", "weekday", PAL_TENANT="acme")
    assert gone.returncode == 3 and "no schedule" in gone.stderr


def test_hostile_schedules_are_refused_and_write_nothing(api: Api, processes: Processes, tmp_path: Path) -> None:
    graph = counting_graph(tmp_path / "ran.log")
    base = {"name": "s", "cron": "@daily", "graph": graph}
    for bad in ({"cron": "0 0 31 2 *"}, {"cron": "* * * * * *"}, {"cron": "x" * 129}, {"cron": 5},
                {"timezone": "../../../etc/shadow"}, {"timezone": "Nowhere/Place"}, {"overlap": "all"},
                {"catch_up": "maybe"}, {"name": "../x"}, {"name": "x" * 65}, {"graph": {"nodes": "no"}},
                {"input": {"deep": json.loads("[" * 200 + "]" * 200)}}):
        response = api.post("/v1/schedules", json=base | bad)
        assert response.status_code == 422, (bad, response.text)
    assert api.get("/v1/schedules").json() == {"schedules": []}
    bad_cli = processes.cli("schedules", "add", "s", str(tmp_path / "missing.json"), "--cron", "@daily",
                            PAL_TENANT="acme")
    assert bad_cli.returncode == 2
    assert api.get("/v1/schedules/nope").status_code == 404
    assert api.get("/v1/schedules/" + "x" * 70).status_code == 422
