"""GET /v1/runs's filters and the step panel route against a real `pal api` on Postgres, and
`pal runs list`'s options: what each filter returns, and hostile values (malformed or oversized
dates and text, another tenant's run or step) refused or answered with nothing of anyone else's."""

from __future__ import annotations

from typing import Any

from pal.core.clock import utcnow
from tests.support.api_server import Api
from tests.support.processes import Processes


def seed(api: Api) -> None:
    journal = api.client.runtime.journal
    for run_id, tenant, name in (("ref-1", "acme", "refunds"), ("ref-2", "acme", "refunds"),
                                 ("rep-1", "acme", "reports"), ("ref-x", "globex", "refunds")):
        journal.runs.create_run(run_id=run_id, tenant_id=tenant, kind="graph", graph={"name": name, "nodes": []},
                                graph_hash=None, run_input=None, now=utcnow(), lease_ttl=600)


def ids(api: Api, **params: Any) -> list[str]:
    reply = api.get("/v1/runs", params=params)
    assert reply.status_code == 200, reply.text
    return sorted(r["id"] for r in reply.json()["runs"])


def test_the_list_filters_and_refuses_bad_filters(api: Api) -> None:
    seed(api)
    assert ids(api, graph="refunds") == ["ref-1", "ref-2"]  # never globex's ref-x
    assert ids(api, search="REF") == ["ref-1", "ref-2"] and ids(api, search="%") == []
    assert ids(api, since="2000-01-01", until="2999-01-01T00:00:00+02:00", status="queued") == [
        "ref-1", "ref-2", "rep-1"]
    assert ids(api, until="2000-01-01") == []
    named = {r["id"]: r["graph_name"] for r in api.get("/v1/runs").json()["runs"]}
    assert named == {"ref-1": "refunds", "ref-2": "refunds", "rep-1": "reports"}
    page = api.get("/v1/runs", params={"limit": 2}).json()
    assert len(page["runs"]) == 2 and page["next_offset"] == 2
    assert len(api.get("/v1/runs", params={"limit": 2, "offset": 2}).json()["runs"]) == 1
    for bad in ({"since": "yesterday"}, {"until": "2025-13-01"}, {"since": "9" * 41}, {"search": "x" * 129},
                {"graph": "g" * 201}, {"status": "done"}, {"offset": 10_000_001}, {"limit": 0},
                {"since": "2025-02-01", "until": "2025-01-01"}):
        reply = api.get("/v1/runs", params=bad)
        assert reply.status_code == 422, (bad, reply.text)
    assert api.call("GET", "/v1/runs?graph=refunds", api.other).json()["runs"][0]["id"] == "ref-x"


def test_the_step_panel_route_is_tenant_scoped_and_bounded(api: Api) -> None:
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "say", "type": "tool", "data": {"tool": "echo", "args": {"password": "hunter22"}}}],
             "edges": [{"source": "start", "target": "say"}]}
    assert api.post("/v1/runs", json={"graph": graph, "run_id": "panel-1"}).status_code == 201
    api.client.wait("panel-1", timeout=60)
    step = api.get("/v1/runs/panel-1/steps/say").json()
    assert step["status"] == "completed" and step["node"]["type"] == "tool"
    assert step["node"]["data"]["args"]["password"] == "[redacted]"  # the definition is redacted
    [attempt] = step["attempts"]
    assert attempt["outcome"] == "completed" and attempt["idempotency_key"] == step["idempotency_key"]
    assert len(step["idempotency_key"]) == 64 and step["input"] is None and step["input_note"]
    assert api.get("/v1/runs/panel-1/steps/nope").status_code == 404
    assert api.get("/v1/runs/panel-1/steps/" + "s" * 257).status_code == 422
    theirs = api.call("GET", "/v1/runs/panel-1/steps/say", api.other)
    assert theirs.status_code == 404 and theirs.json() == {"detail": "no run 'panel-1'"}


def test_pal_runs_list_filters(api: Api, processes: Processes) -> None:
    seed(api)
    env = {k: v for k, v in api.env.items() if k.startswith("PAL_")}
    listed = processes.cli("runs", "list", "--graph", "refunds", "--search", "REF", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    assert '"ref-1"' in listed.stdout and '"ref-2"' in listed.stdout and "rep-1" not in listed.stdout
    table = processes.cli("runs", "list", "--since", "2000-01-01", "--limit", "1", "--offset", "1", **env)
    assert table.returncode == 0 and table.stdout.count("queued") == 1
    bad = processes.cli("runs", "list", "--since", "yesterday", **env)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr
