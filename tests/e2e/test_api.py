"""The control plane against a real `pal api` server process and a real `pal worker`, on Postgres
and Redis: every route, every authentication failure, SSE resumption with Last-Event-ID."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.support import web
from tests.support.api_server import Api
from tests.support.graphs import approval, linear
from tests.support.processes import Processes


def sse(api: Api, run_id: str, last_event_id: int | None = None) -> list[dict[str, Any]]:
    """Read the stream to its end (it ends after the terminal event); returns the events."""
    headers = {"Authorization": f"Bearer {api.token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    events, ids = [], []
    with httpx.stream("GET", f"{api.url}/v1/runs/{run_id}/events", headers=headers, timeout=60) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("id:"):
                ids.append(int(line[3:].strip()))
            elif line.startswith("data:"):
                events.append(json.loads(line[5:].strip()))
    assert ids == [e["seq"] for e in events]  # each event's seq is its SSE id
    return events


def test_every_route_needs_a_live_token_of_the_right_tenant(api: Api, tmp_path: Path) -> None:
    run = api.post("/v1/runs", json={"graph": linear(tmp_path / "c", 1), "input": {}, "run_id": "acme-1"})
    assert run.status_code == 201
    routes = [("GET", "/v1/runs"), ("GET", "/v1/runs/acme-1"), ("GET", "/v1/runs/acme-1/events"),
              ("GET", "/v1/runs/acme-1/journal"), ("GET", "/v1/runs/acme-1/approvals"), ("GET", "/v1/approvals"),
              ("GET", "/v1/runs/acme-1/waterfall"), ("GET", "/v1/runs/acme-1/anomalies"), ("GET", "/v1/anomalies"),
              ("GET", "/v1/runs/acme-1/receipt"), ("GET", "/v1/runs/acme-1/steps/s0"),
              ("POST", "/v1/runs/acme-1/cancel"), ("POST", "/v1/runs/acme-1/resume"),
              ("POST", "/v1/runs/acme-1/steps/s0/approve"), ("POST", "/v1/runs/acme-1/steps/s0/reject"),
              ("POST", "/v1/runs")]
    for method, path in routes:
        for token in (None, "not-a-token", api.revoked):
            reply = api.call(method, path, token, json={"graph": {}} if path == "/v1/runs" else None)
            assert reply.status_code == 401, (method, path, token, reply.text)
            assert "acme-1" not in reply.text and "tenant" not in reply.text
    for method, path in [r for r in routes if "acme-1" in r[1]]:  # another tenant's run does not exist for it
        reply = api.call(method, path, api.other)
        assert reply.status_code == 404, (method, path, reply.text)
        assert reply.json() == {"detail": "no run 'acme-1'"}
    assert api.call("GET", "/v1/runs", api.other).json()["runs"] == []
    assert api.call("GET", "/v1/approvals", api.other).json()["approvals"] == []
    assert api.call("GET", "/v1/anomalies", api.other).json()["anomalies"] == []
    taken = api.call("POST", "/v1/runs", api.other, json={"graph": linear(tmp_path / "c", 1), "run_id": "acme-1"})
    assert taken.status_code == 409


def test_runs_start_idempotently_list_page_and_show(api: Api, tmp_path: Path) -> None:
    graph = linear(tmp_path / "c", 2)
    first = api.post("/v1/runs", json={"graph": graph, "input": {"n": 1}, "run_id": "ticket-42"})
    again = api.post("/v1/runs", json={"graph": graph, "input": {"n": 1}, "run_id": "ticket-42"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] == "ticket-42"
    assert api.client.wait("ticket-42", timeout=60).status == "succeeded"
    for i in range(3):
        assert api.post("/v1/runs", json={"graph": graph, "run_id": f"page-{i}"}).status_code == 201
    page = api.get("/v1/runs", params={"limit": 2}).json()
    assert len(page["runs"]) == 2 and page["next_offset"] == 2
    rest = api.get("/v1/runs", params={"limit": 2, "offset": 2}).json()
    assert len(rest["runs"]) == 2 and rest["next_offset"] is None
    ids = {r["id"] for r in page["runs"] + rest["runs"]}
    assert ids == {"ticket-42", "page-0", "page-1", "page-2"}
    done = api.get("/v1/runs", params={"status": "succeeded"}).json()["runs"]
    assert "ticket-42" in {r["id"] for r in done}
    assert api.get("/v1/runs", params={"status": "sideways"}).status_code == 422
    shown = api.get("/v1/runs/ticket-42").json()
    assert shown["status"] == "succeeded" and shown["tenant_id"] == "acme" and shown["output"] == 1
    journal = api.get("/v1/runs/ticket-42/journal").json()["events"]
    assert [e["kind"] for e in journal][-1] == "run_succeeded"
    assert api.get("/v1/runs/nope").status_code == 404


def test_an_invalid_graph_is_422_with_every_problem_and_writes_nothing(api: Api) -> None:
    reply = api.post("/v1/runs", json={"graph": {"nodes": [{"id": "a", "type": "tool"}]}, "run_id": "bad-1"})
    assert reply.status_code == 422
    body = reply.json()
    assert any("missing trigger" in p for p in body["problems"]) and len(body["problems"]) >= 2
    assert api.get("/v1/runs/bad-1").status_code == 404
    assert api.post("/v1/runs", json={"input": 1}).status_code == 422  # no graph at all


def test_approvals_decisions_cancel_and_resume_over_rest(api: Api, tmp_path: Path) -> None:
    run = api.post("/v1/runs", json={"graph": approval(tmp_path / "c"), "input": {"amount": 3, "customer": "z"},
                                     "run_id": "gate-1"})
    assert run.status_code == 201
    assert wait_until(lambda: bool(api.get("/v1/approvals").json()["approvals"]), timeout=60)
    [pending] = api.get("/v1/runs/gate-1/approvals").json()["approvals"]
    assert pending["step_id"] == "gate" and pending["prompt"] == "Refund 3 to z?"
    wrong = api.post("/v1/runs/gate-1/steps/gate/approve", json={"approval_hash": "0" * 64})
    assert wrong.status_code == 409
    ok = api.post("/v1/runs/gate-1/steps/gate/approve", json={"comment": "fine",
                                                               "approval_hash": pending["approval_hash"]})
    assert ok.status_code == 200 and ok.json()["dispatched"] == ["pay"]
    assert api.post("/v1/runs/gate-1/steps/gate/reject").status_code == 409  # already decided
    assert api.client.wait("gate-1", timeout=60).status == "succeeded"
    assert api.post("/v1/runs/gate-1/resume").status_code == 409  # nothing to resume
    assert api.post("/v1/runs/gate-1/cancel").status_code == 409  # finished
    second = api.post("/v1/runs", json={"graph": approval(tmp_path / "c"), "input": {"amount": 1, "customer": "y"},
                                        "run_id": "gate-2"})
    assert second.status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/gate-2").json()["status"] == "waiting", timeout=60)
    cancelled = api.post("/v1/runs/gate-2/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] == ["gate-2"]
    assert api.get("/v1/runs/gate-2").json()["status"] == "cancelled"


def test_sse_streams_the_journal_and_last_event_id_resumes_without_gap_or_duplicate(
        api: Api, tmp_path: Path) -> None:
    api.post("/v1/runs", json={"graph": linear(tmp_path / "c", 4), "run_id": "stream-1"})
    everything = sse(api, "stream-1")  # from the start, live, to the terminal event
    assert everything[0]["kind"] == "run_queued" and everything[-1]["kind"] == "run_succeeded"
    seqs = [e["seq"] for e in everything]
    assert seqs == sorted(set(seqs))
    for cut in (seqs[0], seqs[len(seqs) // 2], seqs[-2]):
        resumed = sse(api, "stream-1", last_event_id=cut)
        assert [e["seq"] for e in resumed] == [s for s in seqs if s > cut]
    assert sse(api, "stream-1", last_event_id=seqs[-1]) == []
    bad = api.get("/v1/runs/stream-1/events", headers={"Last-Event-ID": "abc"})
    assert bad.status_code == 422


def test_the_openapi_schema_lists_every_route(api: Api) -> None:
    schema = web.get(api.url + "/openapi.json", timeout=10).json()
    assert set(schema["paths"]) == {
        "/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/journal", "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/resume", "/v1/runs/{run_id}/steps/{step_id}/approve",
        "/v1/runs/{run_id}/steps/{step_id}/reject", "/v1/runs/{run_id}/approvals", "/v1/approvals",
        "/v1/runs/{run_id}/events", "/v1/runs/{run_id}/waterfall", "/v1/runs/{run_id}/anomalies",
        "/v1/anomalies", "/v1/runtime/report", "/v1/runs/{run_id}/receipt", "/.well-known/pal-receipt-keys",
        "/v1/runs/{run_id}/retry", "/v1/runs/{run_id}/fork", "/v1/runs/{run_id}/signals/{name}",
        "/v1/runs/{run_id}/steps/{step_id}", "/v1/schedules", "/v1/schedules/{name}",
        "/v1/schedules/{name}/pause", "/v1/schedules/{name}/resume"}


def test_pal_tokens_create_list_revoke(processes: Processes, postgres_backend: Backend) -> None:
    pal = processes.cli

    created = pal("tokens", "create", "--tenant", "acme", "--name", "ci")
    assert created.returncode == 0, created.stderr
    token_id = created.stdout.split()[1]
    secret = created.stdout.strip().splitlines()[-1]
    client = Client(postgres_backend.settings)
    assert client.runtime.journal.tokens.token_tenant(secret) == "acme"
    listed = pal("tokens", "list")
    assert token_id in listed.stdout and secret not in listed.stdout and "live" in listed.stdout
    assert pal("tokens", "revoke", token_id).returncode == 0
    assert client.runtime.journal.tokens.token_tenant(secret) is None
    assert pal("tokens", "revoke", token_id).returncode == 3
    bad = pal("tokens", "create", "--tenant", "no spaces please")
    assert bad.returncode == 2 and "tenant" in bad.stderr
    client.close()


def test_hostile_bodies_and_parameters_are_refused_and_write_nothing(api: Api, tmp_path: Path) -> None:
    graph = linear(tmp_path / "c.log", 1)
    deep = "[" * 100 + "]" * 100
    raw = {"content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/runs", {"content": "{not json", "headers": raw}),
        ("POST", "/v1/runs", {"content": "[" * 100_000 + "]" * 100_000, "headers": raw}),
        ("POST", "/v1/runs", {"content": "\xff\xfe", "headers": raw}),
        ("POST", "/v1/runs", {"json": [graph]}),
        ("POST", "/v1/runs", {"json": {"graph": "nodes: []"}}),
        ("POST", "/v1/runs", {"json": {"graph": graph, "run_id": 42}}),
        ("POST", "/v1/runs", {"json": {"graph": graph, "run_id": "has spaces"}}),
        ("POST", "/v1/runs", {"content": f'{{"graph": {json.dumps(graph)}, "input": {deep}}}', "headers": raw}),
        ("POST", "/v1/runs", {"json": {"graph": graph, "input": "x" * 1_100_000}}),
        ("POST", "/v1/runs", {"json": {"graph": {**graph, "nodes": [*graph["nodes"], {
            "id": "evil", "type": "tool", "data": {"tool": "echo", "args": {"x": "{{ self.__init__ }}"}}}]}}}),
        ("GET", "/v1/runs?limit=abc", {}),
        ("GET", "/v1/runs?offset=-1", {}),
        ("GET", "/v1/runs?limit=100000", {}),
        ("POST", "/v1/runs/nope/approve/gate", {"json": {"comment": ["a"]}}),
        ("POST", "/v1/runs/nope/approve/gate", {"json": {"approval_hash": 7}}),
        ("POST", "/v1/runs/nope/cancel", {"json": {"reason": {"a": 1}}}),
        ("GET", "/v1/runs/nope/events", {"headers": {"Last-Event-ID": "-3"}}),
    ]
    for method, path, kwargs in cases:
        reply = api.call(method, path, api.token, **kwargs)
        assert reply.status_code in (400, 404, 413, 422), (method, path, reply.status_code, reply.text[:300])
        assert "Traceback" not in reply.text
        assert reply.headers["content-type"].startswith("application/json"), (path, reply.text[:200])
    assert api.get("/v1/runs").json()["runs"] == []  # nothing was written


def test_a_runs_budget_and_anomalies_over_rest(api: Api, tmp_path: Path) -> None:
    """A run started with its own limits stops at them; its anomalies are listed for its tenant
    only (docs/anomalies.md)."""
    graph = linear(tmp_path / "c", 5) | {"limits": {"maxSteps": 2}}
    warned = api.post("/v1/runs", json={"graph": graph, "input": {}, "run_id": "acme-warn"})
    stopped = api.post("/v1/runs", json={"graph": graph, "input": {}, "run_id": "acme-stop",
                                         "limits": {"onBreach": "fail"}})
    assert (warned.status_code, stopped.status_code) == (201, 201)
    assert stopped.json()["limits"] == {"onBreach": "fail"}
    refused = api.post("/v1/runs", json={"graph": graph, "limits": {"maxTokens": -5}})
    assert refused.status_code == 422 and "limits.maxTokens" in refused.json()["detail"]
    assert wait_until(lambda: api.get("/v1/runs/acme-stop").json()["status"] == "failed", timeout=60)
    assert wait_until(lambda: api.get("/v1/runs/acme-warn").json()["status"] == "succeeded", timeout=60)
    assert api.get("/v1/runs/acme-stop").json()["error"]["code"] == "budget_exceeded"
    listed = api.get("/v1/runs/acme-warn/anomalies").json()["anomalies"]
    assert [a["kind"] for a in listed] == ["excessive_steps"] and listed[0]["run_id"] == "acme-warn"
    assert [a["run_id"] for a in api.get("/v1/anomalies").json()["anomalies"]] == ["acme-warn"]
    assert api.call("GET", "/v1/anomalies", api.other).json()["anomalies"] == []
