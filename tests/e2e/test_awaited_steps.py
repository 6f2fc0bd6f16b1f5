"""Steps whose effect is awaited (`async def` tools, model calls on the SDK's async client) run on
a worker's event loop: hundreds wait at once in one solo worker process on a handful of Postgres
connections; a time limit and a cancellation stop them; a SIGKILL with hundreds in flight loses
none, re-sends only the cut-off calls, each once (docs/decisions/awaited-steps.md)."""

from __future__ import annotations

import itertools
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pal.client import Client
from pal.nodes import idempotency_key
from pal.storage.database import create_engine
from tests.conftest import Backend
from tests.support.graphs import edge
from tests.support.processes import Processes
from tests.support.servers import FakeModelServer, SmtpReceiver, WebhookReceiver
from tests.support.tools import calls

POOL = 4
IN_FLIGHT = ("SELECT count(*) FILTER (WHERE kind = 'step_started') - count(*) FILTER (WHERE kind IN "
             "('step_completed', 'step_failed', 'step_retrying')) FROM journal_events WHERE step_id LIKE 'm%'")


def chain(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    nodes = [{"id": "start", "type": "trigger"}, *nodes]
    ids = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [edge(a, b) for a, b in itertools.pairwise(ids)]}


def model_steps(count: int) -> dict[str, Any]:
    """start -> m0 -> ... : each an `ai-step` on the OpenAI provider (the stand-in)."""
    return chain([{"id": f"m{i}", "type": "ai-step", "data": {"provider": "openai", "model": "gpt-4o-mini",
                                                              "prompt": f"step {i} of {{{{ input.n }}}}"}}
                  for i in range(count)])


def connections(admin: sa.Engine, name: str) -> int:
    with admin.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                                {"n": name}).scalar_one())


def in_flight(journal: sa.Engine) -> int:
    with journal.connect() as conn:
        return int(conn.execute(sa.text(IN_FLIGHT)).scalar_one())


def test_hundreds_of_model_steps_await_at_once_in_one_solo_worker_on_a_bounded_pool(
        processes: Processes, postgres_backend: Backend, pg_admin: sa.Engine) -> None:
    runs = 200
    name = f"pal-awaited-{uuid.uuid4().hex[:12]}"
    with FakeModelServer(delay=1.0) as model:
        processes.common |= {"PAL_OPENAI_BASE_URL": model.openai_base_url, "OPENAI_API_KEY": "sk-test"}
        processes.worker("solo", PAL_DATABASE_URL=f"{postgres_backend.settings.database_url}&application_name={name}",
                         PAL_DB_POOL_SIZE=str(POOL))
        client = Client(postgres_backend.settings)
        journal = create_engine(postgres_backend.settings.database_url)
        try:
            run_ids = [client.start_run(model_steps(2), {"n": r}) for r in range(runs)]
            peak, most = 0, 0
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:  # bounded: until every run finished
                peak, most = max(peak, connections(pg_admin, name)), max(most, in_flight(journal))
                if all(client.get_run(r).terminal for r in run_ids):
                    break
                time.sleep(0.1)
            failed = [(r, client.get_run(r).error) for r in run_ids if client.get_run(r).status != "succeeded"]
            assert failed == [], failed[:3]
            # One request per step attempt, each with its attempt's Idempotency-Key.
            keys = Counter(r.headers.get("idempotency-key") for r in model.requests_to("/v1/chat/completions"))
            assert keys == Counter({idempotency_key(r, f"m{i}", 1): 1 for r in run_ids for i in range(2)})
            assert most > 10 * POOL, f"at most {most} steps waited at once in a solo worker"
            assert 0 < peak <= POOL, f"{peak} connections for a pool of {POOL}"
            log = (processes.folder / "solo.log").read_text()
            assert "awaited steps: up to 1000 in flight per worker process" in log
        finally:
            client.close()
            journal.dispose()


def test_webhook_and_email_deliveries_await_at_once_in_one_solo_worker_each_delivered_once(
        processes: Processes, postgres_backend: Backend) -> None:
    runs = 60
    with WebhookReceiver(delay=1.0) as hooks, SmtpReceiver() as smtp:
        graph = chain([
            {"id": "m-hook", "type": "connector", "data": {"url": hooks.url, "body": {"n": "{{ input.n }}"}}},
            {"id": "m-mail", "type": "email", "data": {"to": "ada@example.test", "from": "pal@example.test",
                                                       "subject": "run {{ input.n }}", "body": "done"}}])
        processes.common["PAL_SMTP_URL"] = f"smtp://{smtp.host}:{smtp.port}"
        processes.worker("solo")
        client = Client(postgres_backend.settings)
        journal = create_engine(postgres_backend.settings.database_url)
        try:
            run_ids = [client.start_run(graph, {"n": r}) for r in range(runs)]
            most, deadline = 0, time.monotonic() + 120
            while time.monotonic() < deadline:  # bounded: until every run finished
                most = max(most, in_flight(journal))
                if all(client.get_run(r).terminal for r in run_ids):
                    break
                time.sleep(0.05)
            failed = [(r, client.get_run(r).error) for r in run_ids if client.get_run(r).status != "succeeded"]
            assert failed == [], failed[:3]
            # A solo worker has one thread: a webhook sent from it would wait its second alone.
            assert most > 10, f"at most {most} deliveries waited at once in a solo worker"
            assert sorted(hooks.idempotency_keys()) == sorted(idempotency_key(r, "m-hook", 1) for r in run_ids)
            assert sorted(smtp.message_ids()) == sorted(f"<{idempotency_key(r, 'm-mail', 1)}@pal>" for r in run_ids)
            statuses = Counter(row["status"] for r in run_ids for row in client.runtime.journal.receipts.receipts(r))
            assert statuses == Counter({"delivered": 2 * runs})
        finally:
            client.close()
            journal.dispose()


def test_an_async_tool_and_a_sync_tool_in_one_graph(processes: Processes, postgres_backend: Backend,
                                                     tmp_path: Path) -> None:
    ledger = tmp_path / "calls.txt"
    graph = chain([
        {"id": "a", "type": "tool", "data": {"tool": "anap", "args": {"seconds": 0.2, "path": str(ledger),
                                                                       "label": "a"}}},
        {"id": "b", "type": "tool", "data": {"tool": "count", "args": {
            "path": str(ledger), "label": "b", "value": "{{ nodes.a.output.slept }}"}}},
        {"id": "out", "type": "output", "data": {"value": {"a": "{{ nodes.a.output }}",
                                                           "b": "{{ nodes.b.output.value }}"}}},
    ])
    processes.worker("solo")
    client = Client(postgres_backend.settings)
    try:
        run = client.wait(client.start_run(graph, {}), timeout=60)
        assert run.status == "succeeded", run
        assert run.output["a"] == {"slept": 0.2, "thread": "pal-async-steps"}  # awaited on the loop
        assert run.output["b"] == 0.2
        assert calls(ledger) == ["a", "b"]
    finally:
        client.close()


def test_an_awaited_step_that_fails_is_retried_by_its_policy_then_fails_the_run(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.txt"
    failing = chain([{"id": "bad", "type": "tool", "data": {
        "tool": "aexplode", "args": {"message": "no luck", "path": str(ledger), "label": "bad"},
        "retry": {"maxAttempts": 2, "backoffMs": 0}}}])
    strange = chain([{"id": "odd", "type": "tool", "data": {"tool": "anot_json"}}])
    processes.worker("solo")
    client = Client(postgres_backend.settings)
    try:
        run = client.wait(client.start_run(failing, {}), timeout=60)
        assert run.status == "failed"
        kinds = [(e.kind, e.attempt) for e in client.events(run.id) if e.step_id == "bad"]
        assert kinds == [("step_started", 1), ("step_retrying", 1), ("step_started", 2), ("step_failed", 2)]
        failed = next(e for e in client.events(run.id) if e.kind == "step_failed")
        assert failed.payload["error"]["message"] == "no luck" and "aexplode" in failed.payload["error"]["traceback"]
        assert calls(ledger) == ["bad", "bad"]
        run = client.wait(client.start_run(strange, {}), timeout=60)
        assert run.status == "failed"  # a value that is not JSON is refused, nothing of it journaled
        failed = next(e for e in client.events(run.id) if e.kind == "step_failed")
        assert "not JSON" in failed.payload["error"]["message"]
        assert not [e for e in client.events(run.id) if e.kind == "step_completed" and e.step_id == "odd"]
    finally:
        client.close()


def test_an_awaited_step_past_its_time_limit_is_stopped_and_fails(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    ledger = tmp_path / "calls.txt"
    graph = chain([{"id": "slow", "type": "tool", "data": {
        "tool": "anap", "args": {"seconds": 30, "path": str(ledger), "label": "slow"}, "timeoutMs": 500}}])
    processes.worker("solo")
    client = Client(postgres_backend.settings)
    try:
        run = client.wait(client.start_run(graph, {}), timeout=60)
        assert run.status == "failed"
        failed = [e for e in client.events(run.id) if e.kind == "step_failed"]
        assert [e.payload["error"]["type"] for e in failed] == ["StepTimeout"]
        assert "time limit of 0.5s" in failed[0].payload["error"]["message"]
        assert calls(ledger) == ["slow", "slow:stopped"]  # the coroutine itself was cancelled
    finally:
        client.close()


def test_cancelling_a_run_stops_its_awaited_step(processes: Processes, postgres_backend: Backend,
                                                 tmp_path: Path) -> None:
    ledger = tmp_path / "calls.txt"
    graph = chain([{"id": "long", "type": "tool", "data": {
        "tool": "anap", "args": {"seconds": 25, "path": str(ledger), "label": "long"}}},
        {"id": "after", "type": "tool", "data": {"tool": "count", "args": {"path": str(ledger), "label": "after"}}}])
    processes.worker("solo")
    client = Client(postgres_backend.settings)
    try:
        run_id = client.start_run(graph, {})
        deadline = time.monotonic() + 30
        while "long" not in calls(ledger) and time.monotonic() < deadline:
            time.sleep(0.05)
        client.cancel(run_id, reason="test")
        while "long:stopped" not in calls(ledger) and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        assert calls(ledger) == ["long", "long:stopped"]  # stopped by the lease's loss, long before 25 s
        assert client.get_run(run_id).status == "cancelled"
        completed = {e.step_id for e in client.events(run_id) if e.kind == "step_completed"}
        assert completed == {"start"}  # the stopped step journaled nothing, its successor never ran
    finally:
        client.close()


def test_a_sigkill_with_hundreds_of_awaited_steps_in_flight_loses_none(
        processes: Processes, postgres_backend: Backend) -> None:
    runs = 150
    with FakeModelServer(delay=3.0) as model:
        processes.common |= {"PAL_OPENAI_BASE_URL": model.openai_base_url, "OPENAI_API_KEY": "sk-test"}
        doomed = processes.worker("doomed")
        client = Client(postgres_backend.settings)
        try:
            run_ids = [client.start_run(model_steps(2), {"n": r}) for r in range(runs)]
            deadline = time.monotonic() + 120
            # Kill once every run has finished m0 and most wait on m1: hundreds of calls in flight.
            while time.monotonic() < deadline and len(model.requests_to("/v1/chat/completions")) < runs + 100:
                time.sleep(0.05)
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(timeout=30)
            time.sleep(0.5)  # requests on their way when the process died reach the stand-in
            sent_before = Counter(r.headers.get("idempotency-key")
                                  for r in model.requests_to("/v1/chat/completions"))
            completed_before = {(e.run_id, e.step_id) for r in run_ids for e in client.events(r)
                                if e.kind == "step_completed"}
            cut_off = {(r, step) for r in run_ids for step in ("m0", "m1")} - completed_before
            cut_keys = {idempotency_key(r, step, 1) for r, step in cut_off}
            waiting = sum(1 for key in sent_before if key in cut_keys)
            assert waiting >= 100, f"only {waiting} model calls were in flight at the kill"
            processes.worker("fresh")
            processes.beat()
            for run_id in run_ids:
                assert client.wait(run_id, timeout=180).status == "succeeded"
            keys = Counter(r.headers.get("idempotency-key") for r in model.requests_to("/v1/chat/completions"))
            for run_id in run_ids:
                for step in ("m0", "m1"):
                    key = idempotency_key(run_id, step, 1)
                    # A finished step is never re-sent; a cut-off one is sent once more, under the
                    # same attempt's key (the provider may de-duplicate it); no further attempt.
                    again = 1 if (run_id, step) in cut_off else 0
                    assert keys[key] == sent_before[key] + again, (run_id, step, keys[key], sent_before[key])
                    assert keys[idempotency_key(run_id, step, 2)] == 0
                completed = Counter(e.step_id for e in client.events(run_id) if e.kind == "step_completed")
                assert completed == Counter({"start": 1, "m0": 1, "m1": 1})
            assert client.runtime.journal.doctor.violations() == []
        finally:
            client.close()
