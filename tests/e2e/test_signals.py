"""Signals and `wait_event` over a real worker, beat, Postgres and Redis: a signal sent during the
wait wakes it at once, one sent before it is kept, two wake one wait, `match` picks the one meant,
an expiry takes the timeout branch; REST, the CLI, pal.Client and the `pal.signal` task all send;
a foreign, oversized or malformed signal is refused and nothing is kept."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.errors import InputError, Refused, RunNotFound
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.api_server import Api
from tests.support.processes import Processes


def waiting_graph(*, before: float = 0.0, expires: str | None = None, timeout_edge: bool = True) -> dict[str, Any]:
    wait: dict[str, Any] = {"name": "paid", "match": {"order": "{{ input.order }}"}}
    if expires:
        wait["expiresIn"] = expires
    nodes: list[dict[str, Any]] = [
        {"id": "t", "type": "trigger"},
        {"id": "work", "type": "tool", "data": {"tool": "nap", "args": {"seconds": before}}},
        {"id": "wait", "type": "wait_event", "data": wait},
        {"id": "done", "type": "output", "data": {"value": "{{ nodes.wait.output.signal.payload.amount }}"}}]
    edges = [{"source": "t", "target": "work"}, {"source": "work", "target": "wait"},
             {"source": "wait", "target": "done", "sourceHandle": "received"}]
    if timeout_edge:
        nodes.append({"id": "late", "type": "output", "data": {"value": "no payment"}})
        edges.append({"source": "wait", "target": "late", "sourceHandle": "timeout"})
    return {"nodes": nodes, "edges": edges}


@pytest.fixture
def client(processes: Processes, postgres_backend: Backend) -> Client:
    processes.worker("w")
    processes.beat()
    return Client(postgres_backend.settings)


def waiting_run(client: Client, **graph: Any) -> str:
    run_id = client.start_run(waiting_graph(**graph), {"order": "o-1"})
    assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
    return run_id


def test_a_signal_during_the_wait_wakes_it_and_match_picks_the_one_meant(client: Client) -> None:
    run_id = waiting_run(client)
    client.signal(run_id, "paid", {"order": "o-2", "amount": 5})  # another order's: not this wait's
    client.signal(run_id, "shipped", {"order": "o-1"})  # another name
    assert client.get_run(run_id).status == "waiting"
    client.signal(run_id, "paid", {"order": "o-1", "amount": 40}, by="billing")
    run = client.wait(run_id, timeout=60)
    assert (run.status, run.output) == ("succeeded", 40)
    received = [e for e in client.events(run_id) if e.kind == "signal_received"]
    assert len(received) == 1 and received[0].step_id == "wait"
    assert [s["name"] for s in client.runtime.journal.signals.pending(run_id)] == ["paid", "shipped"]
    assert_exactly_once(client, run_id)


def test_a_signal_before_the_wait_is_kept_and_two_wake_one_wait(client: Client) -> None:
    run_id = client.start_run(waiting_graph(before=1.5), {"order": "o-1"})
    client.signal(run_id, "paid", {"order": "o-1", "amount": 1})
    client.signal(run_id, "paid", {"order": "o-1", "amount": 2})
    run = client.wait(run_id, timeout=60)
    assert (run.status, run.output) == ("succeeded", 1)  # the oldest
    assert Counter(e.kind for e in client.events(run_id))["signal_received"] == 1
    assert len(client.runtime.journal.signals.pending(run_id)) == 1  # the second, kept untaken
    assert_exactly_once(client, run_id)


def test_an_expired_wait_takes_its_timeout_branch_or_fails_the_run(client: Client) -> None:
    branch = waiting_run(client, expires="1s")
    assert (client.wait(branch, timeout=60).output) == "no payment"
    failing = waiting_run(client, expires="1s", timeout_edge=False)
    run = client.wait(failing, timeout=60)
    assert run.status == "failed" and run.error["code"] == "event_timeout"


def test_refused_signals_keep_nothing(client: Client) -> None:
    run_id = waiting_run(client)
    for name in ("", "has space", "x" * 65, "../etc", "-leading"):
        with pytest.raises(InputError):
            client.signal(run_id, name, {})
    with pytest.raises(InputError):
        client.signal(run_id, "paid", {"blob": "x" * 70_000})
    with pytest.raises(InputError):
        client.signal(run_id, "paid", {"n": float("nan")})
    with pytest.raises(RunNotFound):
        client.signal(run_id, "paid", {"order": "o-1"}, tenant_id="globex")  # another tenant's run
    with pytest.raises(RunNotFound):
        client.signal("run_nope", "paid", {})
    assert client.runtime.journal.signals.pending(run_id) == []
    client.cancel(run_id)
    with pytest.raises(Refused):
        client.signal(run_id, "paid", {"order": "o-1"})


def test_rest_cli_and_the_celery_task_send_signals(api: Api, processes: Processes) -> None:
    processes.beat()
    client = api.client
    run_id = client.start_run(waiting_graph(), {"order": "o-1"}, tenant_id="acme")
    assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
    path = f"/v1/runs/{run_id}/signals/paid"
    assert api.call("POST", path, api.other, json={"payload": {"order": "o-1"}}).status_code == 404
    assert api.post(f"/v1/runs/{run_id}/signals/bad%20name", json={}).status_code == 422
    assert api.post(path, json={"payload": {"blob": "x" * 70_000}}).status_code in (413, 422)
    assert client.runtime.journal.signals.pending(run_id) == []
    sent = api.post(path, json={"payload": {"order": "o-1", "amount": 7}})
    assert sent.status_code == 202, sent.text
    assert client.wait(run_id, timeout=60).output == 7
    assert api.post(path, json={"payload": {}}).status_code == 409  # a finished run takes no more

    by_cli = client.start_run(waiting_graph(), {"order": "o-1"}, tenant_id="acme")
    assert wait_until(lambda: client.get_run(by_cli).status == "waiting", timeout=60)
    bad = processes.cli("runs", "signal", by_cli, "paid", "--payload", "{nope", PAL_TENANT="acme")
    assert bad.returncode == 2 and "not JSON" in bad.stderr
    done = processes.cli("runs", "signal", by_cli, "paid", "--payload", '{"order": "o-1", "amount": 8}',
                         PAL_TENANT="acme")
    assert done.returncode == 0, done.stderr
    assert client.wait(by_cli, timeout=60).output == 8

    by_task = client.start_run(waiting_graph(), {"order": "o-1"}, tenant_id="acme")
    assert wait_until(lambda: client.get_run(by_task).status == "waiting", timeout=60)
    client.app.send_task("pal.signal", args=[by_task, "paid", {"order": "o-1", "amount": 9}],
                         kwargs={"tenant_id": "acme"}, queue=client.settings.queue)
    assert client.wait(by_task, timeout=60).output == 9


def test_a_forged_or_malformed_signal_task_keeps_nothing(api: Api, processes: Processes) -> None:
    """Anyone who reaches the broker can send `pal.signal`: another tenant's run is not found, and
    a run id or tenant that is not a string, a bad name or an oversized payload is refused; the
    waiting run goes on waiting and no signal is kept. The genuine one after them wakes it."""
    client = api.client
    run_id = client.start_run(waiting_graph(), {"order": "o-1"}, tenant_id="acme")
    assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
    queue = client.settings.queue
    forged: list[tuple[list[Any], dict[str, Any]]] = [
        ([run_id, "paid", {"order": "o-1", "amount": 1}], {"tenant_id": "globex"}),
        ([run_id, "paid", {"order": "o-1", "amount": 2}], {"tenant_id": ["acme"]}),
        ([[run_id], "paid", {"order": "o-1", "amount": 3}], {"tenant_id": "acme"}),
        ([run_id, "bad name", {"order": "o-1", "amount": 4}], {"tenant_id": "acme"}),
        ([run_id, "paid", {"order": "o-1", "blob": "x" * 70_000}], {"tenant_id": "acme"}),
    ]
    for args, kwargs in forged:
        client.app.send_task("pal.signal", args=args, kwargs=kwargs, queue=queue)
    log = processes.folder / "w.log"
    assert wait_until(lambda: log.read_text().count("pal.signal refused") >= len(forged), timeout=60)
    assert client.get_run(run_id).status == "waiting"
    assert client.runtime.journal.signals.pending(run_id) == []
    client.app.send_task("pal.signal", args=[run_id, "paid", {"order": "o-1", "amount": 5}],
                         kwargs={"tenant_id": "acme"}, queue=queue)
    assert client.wait(run_id, timeout=60).output == 5


def test_a_cancel_on_signal_cancels_the_run_and_its_children_and_others_do_not(client: Client) -> None:
    child = waiting_graph()
    parent = {"nodes": [{"id": "t", "type": "trigger"},
                        {"id": "sub", "type": "subagent", "data": {"graph": child, "input": {"order": "o-1"}}}],
              "edges": [{"source": "t", "target": "sub"}], "cancelOn": ["order.cancelled", "abort"]}
    run_id = client.start_run(parent, {})
    assert wait_until(lambda: [c.status for c in client.runtime.journal.runs.children(run_id)] == ["waiting"],
                      timeout=60)
    (child_id,) = [c.id for c in client.runtime.journal.runs.children(run_id)]
    client.signal(run_id, "order.changed", {})  # not named in cancelOn: kept, nothing cancelled
    assert client.get_run(run_id).status == "waiting"
    with pytest.raises(RunNotFound):
        client.signal(run_id, "abort", {}, tenant_id="globex")  # another tenant cannot cancel it
    assert client.get_run(run_id).status == "waiting"
    client.signal(run_id, "order.cancelled", {"why": "customer"}, by="shop")
    run = client.get_run(run_id)
    assert run.status == "cancelled" and run.error["by"] == "signal:order.cancelled"
    assert "shop" in run.error["reason"]
    assert client.get_run(child_id).status == "cancelled"
    assert Counter(e.kind for e in client.events(run_id))["run_cancelled"] == 1
    with pytest.raises(Refused):  # a finished run takes no more signals, cancelOn or not
        client.signal(run_id, "abort", {})
