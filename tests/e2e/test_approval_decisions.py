"""Deciding an approval over REST records who decided (the token's name) and why (the comment); the
comment is bounded; another tenant's run is a 404 with nothing written; racing decisions make one
decision. A failed step's traceback is in GET /v1/runs/{id} for its tenant only."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from pal.cli.demo import wait_until
from pal.core.clock import utcnow
from tests.support.api_server import Api
from tests.support.graphs import approval, failing


def _decisions(api: Api, run_id: str) -> list[dict[str, object]]:
    return [e.payload for e in api.client.events(run_id) if e.kind == "approval_decided"]


def test_a_rest_decision_records_the_token_name_and_comment_and_refuses_abuse(api: Api, tmp_path: Path) -> None:
    _, named = api.client.runtime.journal.tokens.create_token(tenant_id="acme", name="ops-alice", now=utcnow())
    started = api.post("/v1/runs", json={"graph": approval(tmp_path / "c"), "input": {"amount": 3, "customer": "z"},
                                         "run_id": "gate-who"})
    assert started.status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/gate-who").json()["status"] == "waiting", timeout=60)
    path = "/v1/runs/gate-who/steps/gate/approve"
    before = len(api.client.events("gate-who"))

    too_long = api.call("POST", path, named, json={"comment": "x" * 2001})
    assert too_long.status_code == 422 and "2000" in too_long.text
    for body in ({"comment": ["a"]}, {"comment": "nul\u0000byte"}, {"comment": 7}):
        assert api.call("POST", path, named, json=body).status_code == 422, body
    # Another tenant: the same answer as for a run that does not exist, and nothing decided.
    foreign = api.call("POST", path, api.other, json={"comment": "mine now"})
    assert foreign.status_code == 404 and foreign.json() == {"detail": "no run 'gate-who'"}
    foreign_reject = api.call("POST", "/v1/runs/gate-who/steps/gate/reject", api.other)
    assert foreign_reject.status_code == 404
    assert len(api.client.events("gate-who")) == before and api.get("/v1/runs/gate-who").json()["status"] == "waiting"

    # Two decisions at once: one is recorded, the other refused.
    barrier = threading.Barrier(2)
    replies: list[httpx.Response] = []

    def decide(verb: str, comment: str) -> None:
        barrier.wait()
        replies.append(api.call("POST", f"/v1/runs/gate-who/steps/gate/{verb}", named, json={"comment": comment}))

    racers = [threading.Thread(target=decide, args=("approve", "c" * 2000)),
              threading.Thread(target=decide, args=("reject", "no"))]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=60)
    assert sorted(r.status_code for r in replies) == [200, 409], [r.text for r in replies]
    [payload] = _decisions(api, "gate-who")
    assert payload["by"] == "token:ops-alice"
    winner = next(r for r in replies if r.status_code == 200).json()["decision"]
    assert (payload["decision"], payload["comment"]) == (
        (winner, "c" * 2000) if winner == "approved" else (winner, "no"))
    assert api.client.wait("gate-who", timeout=60).terminal


def test_a_failed_steps_traceback_is_in_the_run_for_its_tenant_only(api: Api) -> None:
    assert api.post("/v1/runs", json={"graph": failing(), "run_id": "fails-1"}).status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/fails-1").json()["status"] == "failed", timeout=60)
    run = api.get("/v1/runs/fails-1").json()
    assert run["error"]["type"] == "RuntimeError" and run["error"]["message"] == "kaput"
    assert "in explode" in run["error"]["traceback"] and run["cost_usd"] == "0"
    journal = api.get("/v1/runs/fails-1/journal").json()
    events = journal["events"] if isinstance(journal, dict) else journal
    [failed] = [e for e in events if e["kind"] == "step_failed"]
    assert failed["payload"]["error"]["traceback"] == run["error"]["traceback"]
    other = api.call("GET", "/v1/runs/fails-1", api.other)
    assert other.status_code == 404 and "explode" not in other.text
