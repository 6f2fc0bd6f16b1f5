"""Dedupe and debounce keys over a real worker, beat, Postgres and Redis: a burst of debounced starts
runs only its last (the others cancelled `debounced`, none of their steps run); a dedupe key gives
its run again over REST, the CLI and the `pal.start_run` task, to its tenant only; malformed keys are
refused and write nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.api_server import Api
from tests.support.processes import Processes
from tests.support.tools import calls


def counting_graph(path: Path) -> dict[str, Any]:
    return {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "work", "type": "tool", "data": {"tool": "count", "args": {
                          "path": str(path), "label": "{{ input.n }}"}}}],
            "edges": [{"source": "t", "target": "work"}]}


def test_a_debounced_burst_runs_only_its_last_start(processes: Processes, postgres_backend: Backend,
                                                   tmp_path: Path) -> None:
    processes.worker("w")
    processes.beat()
    client = Client(postgres_backend.settings)
    ran = tmp_path / "ran.log"
    burst = [client.start_run(counting_graph(ran), {"n": n}, debounce_key="customer-9", debounce="2s")
             for n in range(3)]
    other = client.start_run(counting_graph(ran), {"n": "other"}, debounce_key="customer-10", debounce="1s")
    last = client.wait(burst[-1], timeout=60)
    assert last.status == "succeeded"
    assert client.wait(other, timeout=60).status == "succeeded"  # another key: not superseded
    for earlier in burst[:-1]:
        run = client.get_run(earlier)
        assert run.status == "cancelled" and run.error["code"] == "debounced"
        assert {e.kind for e in client.events(earlier)} == {"run_queued", "run_cancelled"}
    assert Counter(calls(ran)) == Counter(["2", "other"])
    queued = client.events(burst[-1])[0].payload["debounce"]
    assert queued["key"] == "customer-9" and last.started_at is not None
    assert_exactly_once(client, burst[-1])
    client.close()


def test_a_dedupe_key_gives_its_run_again_by_rest_cli_and_task(api: Api, processes: Processes,
                                                              tmp_path: Path) -> None:
    client = api.client
    graph = counting_graph(tmp_path / "ran.log")
    body = {"graph": graph, "input": {"n": 1}, "dedupe_key": "order-7", "dedupe_window": "1h"}
    first = api.post("/v1/runs", json=body)
    assert first.status_code == 201, first.text
    run_id = first.json()["id"]
    again = api.post("/v1/runs", json=body | {"input": {"n": 2}})
    assert (again.status_code, again.json()["id"]) == (200, run_id)
    foreign = api.call("POST", "/v1/runs", api.other, json=body | {"input": {"n": "g"}})  # another tenant: a run of its own
    assert foreign.status_code == 201 and foreign.json()["id"] != run_id

    cli = processes.cli("run", str(write_graph(tmp_path, graph)), "--input", '{"n": 3}', "--dedupe-key",
                        "order-7", "--no-follow", PAL_TENANT="acme")
    assert cli.returncode == 0 and f"run {run_id} queued" in cli.stdout, cli.stderr
    sent = client.app.send_task("pal.start_run", args=[graph, {"n": 4}], kwargs={
        "tenant_id": "acme", "dedupe_key": "order-7", "run_id": "by-task"}, queue=client.settings.queue)
    log = processes.folder / "w.log"
    assert wait_until(lambda: f"pal.start_run[{sent.id}] succeeded" in log.read_text(), timeout=60)
    assert client.wait(run_id, timeout=60).status == "succeeded"
    assert [r.id for r in client.runtime.journal.runs.list_runs(tenant_id="acme")] == [run_id]
    assert client.wait(foreign.json()["id"], timeout=60).status == "succeeded"
    assert Counter(calls(tmp_path / "ran.log")) == Counter(["1", "g"])  # acme's one run, and globex's


def test_malformed_keys_are_refused_and_write_nothing(api: Api, processes: Processes, tmp_path: Path) -> None:
    client = api.client
    graph = counting_graph(tmp_path / "ran.log")
    for extra in ({"dedupe_key": ""}, {"dedupe_key": "x" * 300}, {"dedupe_key": "a\u0000b"},
                  {"dedupe_key": "k", "dedupe_window": "forever"}, {"dedupe_key": "k", "dedupe_window": 1e12},
                  {"debounce_key": "k"}, {"debounce_key": "k", "debounce": "8d"},
                  {"dedupe_key": "a", "debounce_key": "b", "debounce": "1s"}, {"dedupe_window": "1h"},
                  {"dedupe_key": ["k"]}, {"priority": 9}, {"priority": "first"}):
        response = api.post("/v1/runs", json={"graph": graph, "input": {}} | extra)
        assert response.status_code == 422, (extra, response.text)
    bad = processes.cli("run", str(write_graph(tmp_path, graph)), "--debounce-key", "k", "--debounce", "0s",
                        "--no-follow", PAL_TENANT="acme")
    assert bad.returncode == 2 and "from 1s to 7 days" in bad.stderr
    client.app.send_task("pal.start_run", args=[graph, {}], kwargs={
        "tenant_id": "acme", "dedupe_key": "k", "dedupe_window": "-1s"}, queue=client.settings.queue)
    client.app.send_task("pal.start_run", args=[graph, {}], kwargs={"tenant_id": {"forged": True}},
                         queue=client.settings.queue)
    log = processes.folder / "w.log"
    assert wait_until(lambda: log.read_text().count("pal.start_run refused") >= 2, timeout=60)
    assert client.list_runs() == []


def write_graph(folder: Path, graph: dict[str, Any]) -> Path:
    path = folder / "graph.json"
    path.write_text(json.dumps(graph))
    return path
