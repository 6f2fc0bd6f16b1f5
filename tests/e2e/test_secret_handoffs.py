"""A graph secret handed on stays out of everything PAL stores or serves: through a subagent's input
into a child run whose own graph never names `secrets`, and back from a webhook that echoes it in a
delivered (2xx) answer. Real `pal api` and `pal worker` processes on Postgres and Redis; the search
covers every row of every table of the test's schema, the REST answers (SSE and the signed receipt
included) and the processes' logs. docs/security.md, "Secrets by name"."""

from __future__ import annotations

import json
from typing import Any

from pal.client import Client
from pal.core.clock import utcnow
from tests.conftest import Backend
from tests.support import sinks
from tests.support.api_server import RECEIPT_ENV, free_port
from tests.support.graphs import single
from tests.support.processes import Processes
from tests.support.servers import RecordedRequest, WebhookReceiver, _HttpStandIn

SECRET = "hook-token-value-5f3a9c1e77"
PLACEHOLDER = "[secret:HOOK_TOKEN]"


class EchoOk(_HttpStandIn):
    """Accepts every request (200) and echoes its headers and body back, as some receivers do."""

    def _respond(self, request: RecordedRequest) -> tuple[int, Any]:
        self._record(request)
        return 200, {"accepted": True, "echo": {"headers": request.headers, "body": request.body}}


class Plane:
    """A `pal api` that knows no secret and a `pal worker` that holds HOOK_TOKEN, on one backend."""

    def __init__(self, processes: Processes, backend: Backend) -> None:
        self.processes, self.backend = processes, backend
        self.client = Client(backend.settings)
        _, self.token = self.client.runtime.journal.tokens.create_token(tenant_id=backend.settings.tenant, name="t",
                                                                        now=utcnow())
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        processes.common |= {"PAL_EGRESS_ALLOW": "127.0.0.1", **RECEIPT_ENV}
        processes.start(["api", "--port", str(port)], "api.log")
        processes.worker("w", PAL_SECRET_HOOK_TOKEN=SECRET)  # only the worker resolves secrets
        sinks.wait_for_api(self.api)

    def everything(self, run_ids: list[str]) -> dict[str, str]:
        found = sinks.database_rows(self.backend.settings.database_url) | sinks.logs(self.processes.folder)
        for run_id in run_ids:
            found |= sinks.run_answers(self.api, self.token, self.client, run_id)
        return found


def test_a_secret_in_a_subagents_input_is_used_by_the_child_and_stored_nowhere(
        processes: Processes, postgres_backend: Backend) -> None:
    """The child's graph names no secret; it gets the value through its input and sends it on. The
    child run's stored input, its steps, its output and the parent's hold only the placeholder."""
    with WebhookReceiver() as receiver:
        plane = Plane(processes, postgres_backend)
        try:
            child = {"nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "call", "type": "connector", "data": {
                    "url": f"{receiver.url}/crm", "headers": {"X-Token": "{{ input.token }}"},
                    "body": {"token": "{{ input.token }}", "note": "{{ input.note }}"}}},
                {"id": "out", "type": "output", "data": {"value": {"sent": "{{ input.token }}",
                                                                  "note": "{{ input.note }}"}}}],
                "edges": [{"source": "start", "target": "call"}, {"source": "call", "target": "out"}]}
            parent = single({"id": "sub", "type": "subagent", "data": {
                "graph": child, "input": {"token": "{{ secrets.HOOK_TOKEN }}", "note": "plain words"}}})
            run_id = plane.client.start_run(parent, {})
            assert plane.client.wait(run_id, timeout=90).status == "succeeded"
            children = plane.client.runtime.journal.runs.children(run_id)
            assert len(children) == 1
            child_run = plane.client.get_run(children[0].id)
            # The child used the real value where it was needed ...
            assert [r.headers["x-token"] for r in receiver.requests] == [SECRET]
            assert receiver.requests[0].body == {"token": SECRET, "note": "plain words"}
            # ... and what was stored of it names the secret instead.
            assert child_run.input == {"token": PLACEHOLDER, "note": "plain words"}
            assert child_run.output == {"sent": PLACEHOLDER, "note": "plain words"}
            assert plane.client.get_run(run_id).output == {"sent": PLACEHOLDER, "note": "plain words"}
            found = plane.everything([run_id, child_run.id])
            assert PLACEHOLDER in found[f"GET /v1/runs/{child_run.id}/"]  # the search reads the right thing
            assert sinks.leaks(SECRET, found) == []
        finally:
            plane.client.close()


def test_a_secret_echoed_in_a_delivered_webhook_answer_is_stored_nowhere(
        processes: Processes, postgres_backend: Backend) -> None:
    """The receiver answers 200 with the secret the request carried: the receipt of the delivery, the
    step's output and the REST step panel hold the placeholder."""
    with EchoOk() as echo:
        plane = Plane(processes, postgres_backend)
        try:
            hook = single({"id": "hook", "type": "connector", "data": {
                "url": f"{echo.url}/hook", "headers": {"X-Token": "{{ secrets.HOOK_TOKEN }}"},
                "body": {"token": "{{ secrets.HOOK_TOKEN }}"}}})
            run_id = plane.client.start_run(hook, {})
            assert plane.client.wait(run_id, timeout=90).status == "succeeded"
            assert echo.requests[0].headers["x-token"] == SECRET  # the receiver really echoed the value
            receipts = plane.client.runtime.journal.receipts.receipts(run_id)
            assert [r["status"] for r in receipts] == ["delivered"]
            echoed = receipts[0]["response"]["body"]["echo"]
            assert echoed["headers"]["x-token"] == PLACEHOLDER and echoed["body"] == {"token": PLACEHOLDER}
            found = plane.everything([run_id])
            assert PLACEHOLDER in found[f"GET /v1/runs/{run_id}/steps/hook"]
            assert sinks.leaks(SECRET, found) == [], json.dumps(receipts, default=str)
        finally:
            plane.client.close()
