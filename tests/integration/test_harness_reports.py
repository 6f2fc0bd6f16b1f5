"""The harness's reports over real HTTP to a local stand-in of the control plane: a control plane
that is briefly down (connection refused, 503) is waited out and the report goes through once it
answers; a refusal (401: this VM no longer holds the run) is final at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pal.harness import ControlPlane, Refused


class Flaky(ThreadingHTTPServer):
    def __init__(self, answers: list[int], port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.answers: list[int] = answers
        self.seen: list[dict[str, Any]] = []

    def start(self) -> Flaky:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server: Flaky

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append({"auth": self.headers["Authorization"], "body": body})
        status = self.server.answers.pop(0) if self.server.answers else 200
        payload = json.dumps({"ok": status == 200}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def control(request: pytest.FixtureRequest) -> Iterator[Flaky]:
    server = Flaky(list(request.param)).start()
    yield server
    server.stop()


@pytest.mark.parametrize("control", [[503, 503, 502]], indirect=True)
def test_a_briefly_unavailable_control_plane_is_waited_out(control: Flaky) -> None:
    plane = ControlPlane(f"http://127.0.0.1:{control.server_address[1]}", "tok")
    assert plane.report({"type": "heartbeat"}) == {"ok": True}
    assert len(control.seen) == 4 and {s["auth"] for s in control.seen} == {"Bearer tok"}


def test_an_unreachable_control_plane_is_retried_until_it_answers() -> None:
    probe = Flaky([])
    port = probe.server_address[1]
    probe.server_close()  # nothing listens on the port now: connections are refused
    plane = ControlPlane(f"http://127.0.0.1:{port}", "tok")
    started: list[Flaky] = []
    comes_back = threading.Timer(0.8, lambda: started.append(Flaky([], port).start()))
    comes_back.start()
    try:
        assert plane.report({"type": "step", "step_id": "s1", "event": "started"}) == {"ok": True}
        assert [s["body"]["step_id"] for s in started[0].seen] == ["s1"]
    finally:
        comes_back.join()
        for server in started:
            server.stop()


@pytest.mark.parametrize("control", [[401]], indirect=True)
def test_a_refusal_is_final(control: Flaky) -> None:
    plane = ControlPlane(f"http://127.0.0.1:{control.server_address[1]}", "tok")
    with pytest.raises(Refused):
        plane.report({"type": "heartbeat"})
    assert len(control.seen) == 1
