"""Run ids never cross tenants: two tenants racing for one new id, and child-run ids that a caller
might pre-empt. docs/security.md."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from pal.cli.demo import wait_until
from tests.support import web
from tests.support.api_server import Api, free_port
from tests.support.graphs import approval, single
from tests.support.processes import Processes


def _graph(tmp_path: Path) -> dict[str, Any]:
    # A run that waits on an approval: it stays in flight (and its input stays interesting) while
    # the pairs race, and the worker does no other work meanwhile.
    return approval(tmp_path / "counter")


def test_two_tenants_racing_for_one_new_id_never_see_each_others_run(api: Api, tmp_path: Path) -> None:
    """The review's race: 40 pairs of POST /v1/runs with one new id from two tenants; 22 got the
    other tenant's run back, input included. Now exactly one tenant gets the id; the other gets a
    409 that names nothing of the winner's run."""
    graph = _graph(tmp_path)
    tenants = {"acme": api.token, "globex": api.other}
    secrets = {"acme": "acme-secret-input", "globex": "globex-secret-input"}

    def post(tenant: str, run_id: str, barrier: threading.Barrier) -> tuple[str, httpx.Response]:
        barrier.wait()
        return tenant, api.call("POST", "/v1/runs", tenants[tenant],
                                json={"graph": graph, "input": {"secret": secrets[tenant]}, "run_id": run_id})

    with ThreadPoolExecutor(max_workers=2) as pool:
        for pair in range(40):
            barrier = threading.Barrier(2)
            run_id = f"race-{pair}"
            replies = [f.result() for f in [pool.submit(post, t, run_id, barrier) for t in tenants]]
            statuses = sorted(reply.status_code for _, reply in replies)
            assert statuses == [201, 409], (run_id, [(t, r.status_code, r.text) for t, r in replies])
            for tenant, reply in replies:
                other = "globex" if tenant == "acme" else "acme"
                assert secrets[other] not in reply.text and other not in reply.text, reply.text
                if reply.status_code == 201:
                    assert reply.json()["tenant_id"] == tenant
                    assert reply.json()["input"] == {"secret": secrets[tenant]}
                    owner = tenant
                else:
                    assert "not available" in reply.json()["detail"]
            # The id belongs to the winner alone: the loser can neither read nor join it.
            loser = "globex" if owner == "acme" else "acme"
            assert api.call("GET", f"/v1/runs/{run_id}", tenants[loser]).status_code == 404
            again = api.call("POST", "/v1/runs", tenants[loser], json={"graph": graph, "run_id": run_id})
            assert again.status_code == 409 and secrets[owner] not in again.text


def test_a_caller_cannot_choose_a_child_run_id(api: Api, tmp_path: Path) -> None:
    for run_id in ("child_" + "0" * 40, "child_abc", "CHILD_abc", "Child_x"):
        reply = api.call("POST", "/v1/runs", api.other, json={"graph": _graph(tmp_path), "run_id": run_id})
        assert reply.status_code == 422, (run_id, reply.text)
        assert "reserved" in reply.json()["detail"]
        assert api.call("GET", f"/v1/runs/{run_id}", api.other).status_code == 404  # nothing written


def test_a_tenant_over_its_runs_in_flight_gets_429(api: Api, processes: Processes, tmp_path: Path) -> None:
    """PAL_MAX_RUNS_IN_FLIGHT over HTTP: 429 with the setting named, nothing written; another tenant
    and the same tenant's idempotent repeat are not held up."""
    port = free_port()
    processes.start(["api", "--port", str(port)], "api-quota.log", PAL_MAX_RUNS_IN_FLIGHT="2")
    url = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: _up(url), timeout=60)
    # A 30 s step: the worker is busy with the first run, the second stays queued (a parked run
    # holds no worker and does not count).
    graph = single({"id": "nap", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 30}}})

    def start(token: str, run_id: str) -> httpx.Response:
        return web.post(f"{url}/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                          json={"graph": graph, "run_id": run_id})

    assert [start(api.token, f"q-{i}").status_code for i in range(2)] == [201, 201]
    over = start(api.token, "q-2")
    assert over.status_code == 429 and "PAL_MAX_RUNS_IN_FLIGHT" in over.json()["detail"]
    assert api.call("GET", "/v1/runs/q-2", api.token).status_code == 404  # nothing written
    assert start(api.token, "q-0").status_code == 200  # the same run again is no new work
    assert start(api.other, "globex-1").status_code == 201


def _up(url: str) -> bool:
    try:
        return web.get(url + "/openapi.json", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
