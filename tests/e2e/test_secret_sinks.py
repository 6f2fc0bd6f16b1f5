"""No credential reaches any sink PAL writes: the journal (step_failed, run_failed), the receipts'
target, the REST journal, SSE, the waterfall and the worker's log. Real `pal api` and `pal worker`
processes, a webhook receiver and a model-API stand-in that echo what they were sent, the way the
review's leaking providers did. docs/security.md, "Secrets"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pal.client import Client
from pal.core.clock import utcnow
from tests.conftest import Backend
from tests.support import web
from tests.support.api_server import free_port
from tests.support.graphs import single
from tests.support.processes import Processes
from tests.support.servers import RecordedRequest, _HttpStandIn
from tests.support.sinks import wait_for_api

USER_INFO = "hunter2-userinfo-credential"
QUERY = "query-string-credential-42"
HEADER = "header-bearer-credential-77"
MODEL_KEY = "sk-operator-shared-model-key-123456"


class Echo(_HttpStandIn):
    """Refuses every request (400) with the request echoed back: path, query and headers."""

    def _respond(self, request: RecordedRequest) -> tuple[int, Any]:
        self._record(request)
        return 400, {"error": {"message": f"bad request to {request.path}", "echo": request.headers}}


def test_credentials_reach_no_sink(processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    with Echo() as echo:
        processes.common |= {"PAL_OPENAI_BASE_URL": f"{echo.url}/v1", "OPENAI_API_KEY": MODEL_KEY,
                             "PAL_EGRESS_ALLOW": "127.0.0.1"}
        client = Client(postgres_backend.settings)
        try:
            _, token = client.runtime.journal.tokens.create_token(tenant_id=postgres_backend.settings.tenant,
                                                                  name="t", now=utcnow())
            port = free_port()
            processes.start(["api", "--port", str(port)], "api.log")
            processes.worker("w")
            hook = single({"id": "hook", "type": "connector", "data": {
                "url": f"http://alice:{USER_INFO}@127.0.0.1:{echo.port}/hook?token={QUERY}&n=1",
                "headers": {"Authorization": f"Bearer {HEADER}"}, "body": {"ok": True}}})
            ask = single({"id": "ask", "type": "ai-step", "data": {
                "provider": "openai", "model": "gpt-4o-mini", "prompt": "hi"}})
            runs = [client.start_run(hook, {}), client.start_run(ask, {})]
            for run_id in runs:
                assert client.wait(run_id, timeout=60).status == "failed"
            assert len(echo.requests) >= 2  # both really sent their credentials to the stand-in
            api = f"http://127.0.0.1:{port}"
            wait_for_api(api)
            auth = {"Authorization": f"Bearer {token}"}
            sinks: dict[str, str] = {"worker log": (processes.folder / "w.log").read_text()}
            for run_id in runs:
                run = client.get_run(run_id)
                sinks[f"{run_id} stored"] = json.dumps(
                    [run.as_dict(), [e.as_dict() for e in client.events(run_id)],
                     client.runtime.journal.receipts.receipts(run_id)], default=str)
                for route in ("", "/journal", "/waterfall", "/events"):
                    reply = web.get(f"{api}/v1/runs/{run_id}{route}", headers=auth, timeout=30)
                    assert reply.status_code == 200, (route, reply.text)
                    sinks[f"{run_id} GET {route or '/'}"] = reply.text
            for sink, text in sinks.items():
                for credential in (USER_INFO, QUERY, HEADER, MODEL_KEY):
                    assert credential not in text, f"{credential} leaked into {sink}"
            stored = sinks[f"{runs[0]} stored"]
            assert "[redacted]" in stored and f"127.0.0.1:{echo.port}/hook" in stored  # still readable
        finally:
            client.close()


def test_a_secret_by_name_is_used_but_never_journaled(processes: Processes, postgres_backend: Backend,
                                                      counter: Path) -> None:
    """`{{ secrets.NAME }}` resolves on the worker, at the last moment: the receiver gets the value,
    the journal, the receipts and the log only `[secret:NAME]`."""
    secret = "crm-token-value-0123456789"
    with Echo() as echo:
        processes.common |= {"PAL_SECRET_CRM_TOKEN": secret, "PAL_EGRESS_ALLOW": "127.0.0.1"}
        client = Client(postgres_backend.settings)
        try:
            processes.worker("w")
            echoed = single({"id": "echo", "type": "tool", "data": {"tool": "count", "args": {
                "path": str(counter), "label": "x", "value": "token {{ secrets.CRM_TOKEN }}"}}})
            hook = single({"id": "hook", "type": "connector", "data": {
                "url": f"http://127.0.0.1:{echo.port}/crm",
                "headers": {"X-Crm": "{{ secrets.CRM_TOKEN }}"}, "body": {"a": 1}}})
            done, failed = client.start_run(echoed, {}), client.start_run(hook, {})
            assert client.wait(done, timeout=60).status == "succeeded"
            assert client.wait(failed, timeout=60).status == "failed"
            assert echo.requests[0].headers["x-crm"] == secret  # the receiver got the real value
            assert client.get_run(done).output == {"label": "x", "value": "token [secret:CRM_TOKEN]"}
            for run_id in (done, failed):
                stored = json.dumps([client.get_run(run_id).as_dict(),
                                     [e.as_dict() for e in client.events(run_id)],
                                     client.runtime.journal.receipts.receipts(run_id)], default=str)
                assert secret not in stored
            assert secret not in (processes.folder / "w.log").read_text()
        finally:
            client.close()
