"""Retry and fork end to end on Postgres + Redis with real `pal worker`, `pal api` and `pal`
processes (docs/retry-and-fork.md): the tools' ledgers prove reused steps never run again, `pal
doctor` finds the journal clean, and every abuse is refused with nothing written."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from pal.cli.demo import wait_until
from tests.support.api_server import Api
from tests.support.graphs import approval, counted, edge
from tests.support.processes import Processes
from tests.support.tools import calls


def pipeline(ledger: Path, flaky: Path, failures: int) -> dict[str, Any]:
    """start -> a -> f (fails its first `failures` calls) -> b (value: input.n) -> out."""
    f = {"id": "f", "type": "tool", "data": {"tool": "flaky", "args": {
        "path": str(flaky), "label": "f", "failures": failures}}}
    nodes = [{"id": "start", "type": "trigger"}, counted("a", ledger), f, counted("b", ledger, "{{ input.n }}"),
             {"id": "out", "type": "output", "data": {"value": "{{ nodes.b.output.value }}"}}]
    return {"nodes": nodes, "edges": [edge("start", "a"), edge("a", "f"), edge("f", "b"), edge("b", "out")]}


def finished(api: Api, run_id: str, token: str | None = None) -> dict[str, Any]:
    def done() -> bool:
        return api.call("GET", f"/v1/runs/{run_id}", token or api.token).json()["status"] in (
            "succeeded", "failed", "cancelled")

    assert wait_until(done, timeout=60), f"run {run_id} did not finish"
    body: dict[str, Any] = api.call("GET", f"/v1/runs/{run_id}", token or api.token).json()
    return body


def start(api: Api, graph: dict[str, Any], run_input: Any, run_id: str) -> str:
    reply = api.post("/v1/runs", json={"graph": graph, "input": run_input, "run_id": run_id})
    assert reply.status_code == 201, reply.text
    return run_id


def doctor_clean(processes: Processes) -> None:
    doctor = processes.cli("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_pal_runs_retry_reruns_only_the_failed_step(api: Api, processes: Processes, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=1), {"n": 3}, "src-1")
    assert finished(api, source)["status"] == "failed" and calls(ledger) == ["a"]
    retried = processes.cli("runs", "retry", source, "--run-id", "retry-1")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "run retry-1 queued (retry of run src-1)" in retried.stdout and "run retry-1 succeeded" in retried.stdout
    assert calls(ledger) == ["a", "b"] and calls(flaky) == ["f", "f"]  # `a` was reused, not run again
    run = finished(api, "retry-1")
    assert (run["output"], run["source_run_id"], run["source_kind"]) == (3, "src-1", "retry")
    assert finished(api, source)["derived_runs"] == [{"run_id": "retry-1", "kind": "retry", "status": "succeeded"}]
    shown = processes.cli("runs", "show", source)
    assert '"run_id": "retry-1"' in shown.stdout and "derived_runs" in shown.stdout
    assert '"src-1"' in processes.cli("runs", "show", "retry-1").stdout
    doctor_clean(processes)


def test_pal_runs_fork_reruns_the_step_and_what_follows_on_a_new_input(
        api: Api, processes: Processes, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=0), {"n": 3}, "src-2")
    assert finished(api, source)["output"] == 3
    forked = processes.cli("runs", "fork", source, "--from", "b", "--input", '{"n": 7}', "--run-id", "fork-1")
    assert forked.returncode == 0, forked.stdout + forked.stderr
    assert calls(ledger) == ["a", "b", "b"] and calls(flaky) == ["f"]  # a and f reused
    run = finished(api, "fork-1")
    assert (run["output"], run["input"], run["source_step_id"], run["source_kind"]) == (7, {"n": 7}, "b", "fork")
    journal = api.get("/v1/runs/fork-1/journal").json()["events"]
    reused = [e for e in journal if e["kind"] == "step_completed" and "reused_from" in e["payload"]]
    assert [e["step_id"] for e in reused] == ["start", "a", "f"]
    assert all(e["payload"]["reused_from"]["run_id"] == "src-2" for e in reused)
    assert [e["kind"] for e in journal[:2]] == ["run_queued", "run_forked"]
    receipt = api.get("/v1/runs/fork-1/receipt")  # the new run's journal is self-contained: it signs
    assert receipt.status_code == 200
    no_follow = processes.cli("runs", "fork", source, "--from", "a", "--no-follow")
    assert no_follow.returncode == 0 and "pal runs events" in no_follow.stdout
    doctor_clean(processes)


def test_the_rest_routes_and_their_refusals(api: Api, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=1), {"n": 3}, "src-3")
    assert finished(api, source)["status"] == "failed"
    made = api.post(f"/v1/runs/{source}/retry", json={"run_id": "rest-retry"})
    assert (made.status_code, made.json()) == (201, {"run_id": "rest-retry", "source_run_id": source,
                                                     "kind": "retry"})
    again = api.post(f"/v1/runs/{source}/retry", json={"run_id": "rest-retry"})
    assert (again.status_code, again.json()) == (200, made.json())  # idempotent
    assert finished(api, "rest-retry")["status"] == "succeeded"
    generated = api.post(f"/v1/runs/{source}/retry")  # no body: a generated id
    assert generated.status_code == 201 and generated.json()["run_id"].startswith("run_")
    finished(api, generated.json()["run_id"])
    fork = api.post(f"/v1/runs/{source}/fork", json={"from_step": "b", "input": {"n": 9}})
    assert fork.status_code == 201 and fork.json()["kind"] == "fork"
    assert finished(api, fork.json()["run_id"])["output"] == 9
    assert api.post("/v1/runs/rest-retry/retry").status_code == 409  # succeeded: nothing to retry
    assert len(api.get(f"/v1/runs/{source}").json()["derived_runs"]) == 3


def refusal(api: Api, path: str, body: Any, token: str | None = None) -> httpx.Response:
    return api.call("POST", path, token or api.token, json=body)


def test_abuse_is_refused_and_writes_nothing(api: Api, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=1), {"n": 3}, "src-4")
    assert finished(api, source)["status"] == "failed"
    parked = start(api, approval(ledger), {"amount": 1, "customer": "c"}, "parked-1")
    assert wait_until(lambda: api.get(f"/v1/runs/{parked}").json()["status"] == "waiting", timeout=60)
    runs_before = api.get("/v1/runs", params={"limit": 500}).json()["runs"]
    big = "x" * (api.client.settings.max_input_bytes + 1)
    for path, body, status in [
        (f"/v1/runs/{parked}/fork", {"from_step": "pay"}, 409),  # in flight (waiting for approval)
        (f"/v1/runs/{parked}/retry", None, 409),
        (f"/v1/runs/{source}/fork", {"from_step": "nope"}, 422),
        (f"/v1/runs/{source}/fork", {"from_step": "x" * 300}, 422),
        (f"/v1/runs/{source}/fork", {"from_step": "b\u0000"}, 422),
        (f"/v1/runs/{source}/fork", {"from_step": 5}, 422),
        (f"/v1/runs/{source}/fork", {}, 422),
        (f"/v1/runs/{source}/fork", {"from_step": "b", "input": {"big": big}}, 422),
        (f"/v1/runs/{source}/fork", {"from_step": "b", "run_id": "child_abc"}, 422),
        (f"/v1/runs/{source}/retry", {"run_id": "has space"}, 422),
        (f"/v1/runs/{source}/retry", {"run_id": parked}, 409),  # an id in use for other work
        ("/v1/runs/no-such-run/retry", None, 404),
    ]:
        reply = refusal(api, path, body)
        assert reply.status_code == status, (path, body, reply.text)
    # Another tenant's run looks exactly like a missing one: the same status and message.
    theirs = refusal(api, f"/v1/runs/{source}/retry", None, api.other)
    missing = refusal(api, "/v1/runs/src-4x/retry", None, api.other)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["detail"].replace("src-4", "?") == missing.json()["detail"].replace("src-4x", "?")
    forked = refusal(api, f"/v1/runs/{source}/fork", {"from_step": "b"}, api.other)
    assert (forked.status_code, forked.json()) == (404, {"detail": f"no run {source!r}"})
    assert api.get("/v1/runs", params={"limit": 500}).json()["runs"] == runs_before
    assert api.get(f"/v1/runs/{source}").json()["derived_runs"] == []
    assert api.call("GET", "/v1/runs", api.other).json()["runs"] == []
    assert calls(ledger) == ["a"]
    api.post(f"/v1/runs/{parked}/cancel")


def test_racing_retries_under_one_id_make_one_run(api: Api, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=1), {"n": 3}, "src-5")
    assert finished(api, source)["status"] == "failed"
    barrier = threading.Barrier(6)

    def retry(_: int) -> httpx.Response:
        barrier.wait()
        return api.post(f"/v1/runs/{source}/retry", json={"run_id": "raced"})

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(retry, range(6)))
    assert sorted(r.status_code for r in replies) == [200] * 5 + [201]
    assert {json.dumps(r.json(), sort_keys=True) for r in replies} == {
        json.dumps({"kind": "retry", "run_id": "raced", "source_run_id": source}, sort_keys=True)}
    assert finished(api, "raced")["status"] == "succeeded"
    assert calls(flaky) == ["f", "f"] and calls(ledger) == ["a", "b"]  # one retry ran, once
    assert len(api.get(f"/v1/runs/{source}").json()["derived_runs"]) == 1


def test_cli_refusals_use_the_exit_code_table(api: Api, processes: Processes, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "calls.log", tmp_path / "flaky.log"
    source = start(api, pipeline(ledger, flaky, failures=0), {"n": 3}, "src-6")
    assert finished(api, source)["status"] == "succeeded"
    big = json.dumps({"big": "x" * 2000})  # over the PAL_MAX_INPUT_BYTES these commands get
    for args, code in [
        (("runs", "retry", source), 6),  # succeeded: refused
        (("runs", "retry", "no-such-run"), 3),
        (("runs", "fork", source, "--from", "nope"), 2),
        (("runs", "fork", source, "--from", "b", "--input", "{not json"), 2),
        (("runs", "fork", source, "--from", "b", "--input", big), 2),
        (("runs", "fork", source), 2),  # --from is required
    ]:
        result = processes.cli(*args, PAL_MAX_INPUT_BYTES="1000")
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    assert api.get(f"/v1/runs/{source}").json()["derived_runs"] == []


def test_a_retry_with_a_fixed_graph_over_the_cli_and_rest(api: Api, processes: Processes, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.log"
    bug = pipeline(ledger, tmp_path / "flaky.log", failures=0)
    bug["nodes"][2] = {"id": "f", "type": "tool", "data": {"tool": "explode", "args": {"message": "graph bug"}}}
    source = start(api, bug, {"n": 4}, "src-bug")
    assert finished(api, source)["status"] == "failed"
    fixed = json.loads(json.dumps(bug))
    fixed["nodes"][2] = counted("f", ledger, "fixed")
    changed = json.loads(json.dumps(fixed))
    changed["nodes"][1]["data"]["args"]["label"] = "A"  # `a` completed in the source run
    (tmp_path / "fixed.json").write_text(json.dumps(fixed))
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    refused = processes.cli("runs", "retry", source, "--graph", str(tmp_path / "changed.json"))
    assert refused.returncode == 2 and "node 'a', whose step 'a' completed in run src-bug" in refused.stderr
    missing = processes.cli("runs", "retry", source, "--graph", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert refusal(api, f"/v1/runs/{source}/retry", {"graph": changed}).status_code == 422
    assert refusal(api, f"/v1/runs/{source}/retry", {"graph": {"nodes": "x"}}).status_code == 422
    assert finished(api, source)["derived_runs"] == []  # nothing written by any refusal
    retried = processes.cli("runs", "retry", source, "--graph", str(tmp_path / "fixed.json"), "--run-id", "fixed-cli")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert finished(api, "fixed-cli")["output"] == 4
    made = api.post(f"/v1/runs/{source}/retry", json={"graph": fixed, "run_id": "fixed-rest"})
    assert made.status_code == 201 and finished(api, "fixed-rest")["status"] == "succeeded"
    assert calls(ledger).count("a") == 1  # reused by both retries, never run again
    doctor_clean(processes)
