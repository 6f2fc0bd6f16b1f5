"""PAL inside someone else's process leaves its logging alone: a uvicorn app that makes a
`pal.Client()` keeps its access log as uvicorn writes it (its formatter unpacks each record's
arguments; what the app logs is the app's), while PAL's own records there are redacted."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.processes import Processes

APP = '''
import logging

import pal

client = pal.Client()  # as an app that starts runs would, at import
logging.getLogger("pal.hostcheck").warning("PAL calls https://u:hunter2hunter2@h/x")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_uvicorn_app_with_a_pal_client_keeps_its_access_log(processes: Processes, tmp_path: Path) -> None:
    (tmp_path / "hostapp.py").write_text(APP)
    port, log = free_port(), tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "hostapp:app", "--host", "127.0.0.1",
                                   "--port", str(port), "--log-level", "info"],
                                  cwd=tmp_path, env=processes.env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:  # bounded: until it answers
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/ping?page=2", timeout=2).text == "ok"
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        httpx.get(f"http://127.0.0.1:{port}/hook?token=abcdefabcdefabcdef", timeout=5)
    finally:
        server.terminate()
        server.wait(10)
    text = log.read_text()
    assert '"GET /ping?page=2 HTTP/1.1" 200' in text, text
    assert "Traceback" not in text and "TypeError" not in text, text
    assert '"GET /hook?token=abcdefabcdefabcdef HTTP/1.1" 200' in text, text  # the app's own record
    assert "PAL calls https://[redacted]@h/x" in text and "hunter2hunter2" not in text, text
