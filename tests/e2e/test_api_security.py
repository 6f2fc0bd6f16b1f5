"""The control plane's defences against a real `pal api` server process on Postgres + Redis: request
bodies capped before authentication, security headers on every response, nothing reflected
unescaped into HTML, NUL and lone surrogates refused with 400/422, a revoked token's SSE stream
ended, and Flower's every route behind its basic auth. The dashboard in Chromium and its CSRF
defence: tests/e2e/test_dashboard_security.py."""

from __future__ import annotations

import json
import os
import select
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import markupsafe
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.cli.demo import wait_until
from pal.core.clock import utcnow
from tests.support import web
from tests.support.api_server import Api, free_port
from tests.support.processes import Processes

MB = 1_000_000
SECURITY_HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer"}
CSP_DIRECTIVES = ["default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
                  "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'self'"]


def gated() -> dict[str, Any]:
    """start -> gate (an approval) -> done: the run waits until someone decides."""
    return {"nodes": [{"id": "start", "type": "trigger"},
                      {"id": "gate", "type": "approval", "data": {"prompt": "Go?"}},
                      {"id": "done", "type": "output", "data": {"value": "ok"}}],
            "edges": [{"source": "start", "target": "gate"},
                      {"source": "gate", "target": "done", "sourceHandle": "approved"}]}


def api_rss(processes: Processes) -> int:
    """The resident memory of the `pal api` process, in bytes (Linux: /proc/PID/statm)."""
    [server] = [p for p in processes.started if isinstance(p.args, list) and "api" in p.args]
    resident_pages = int(Path(f"/proc/{server.pid}/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def connect(api: Api) -> socket.socket:
    parts = urlsplit(api.url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def read_head(sock: socket.socket) -> tuple[int, dict[str, str]]:
    """The status and headers of the response on `sock` (what arrived before any reset)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in head[1:])}
    return int(head[0].split()[1]), headers


def post_declared(api: Api, length: int) -> tuple[int, dict[str, str]]:
    """A POST declaring `length` bytes of body and sending none of it, without a token."""
    with connect(api) as sock:
        sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % length)
        return read_head(sock)


def post_chunked(api: Api, total: int) -> tuple[int, dict[str, str], int]:
    """A chunked POST of up to `total` bytes without a token, sent until the server answers or
    hangs up; returns the status, headers and how many body bytes the socket accepted."""
    piece = b"x" * 65536
    frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
    sent = 0
    with connect(api) as sock:
        sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            while sent < total and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, headers = read_head(sock)
    return status, headers, sent


def test_oversized_bodies_get_413_before_authentication_and_are_not_read(
        api: Api, processes: Processes) -> None:
    assert api.call("GET", "/v1/runs").status_code == 401  # warm: the first request's imports done
    before = api_rss(processes)
    for _ in range(4):
        # Declared: refused at once, though not one byte of the 102 MB was sent.
        status, headers = post_declared(api, 102 * MB)
        assert status == 413 and headers["connection"] == "close"
        assert headers["x-content-type-options"] == "nosniff"
        # Chunked: counted as it arrives and cut off at the cap, far short of the 75 MB offered.
        status, headers, sent = post_chunked(api, 75 * MB)
        assert status == 413 and headers["connection"] == "close"
        assert sent < 40 * MB, sent
    assert api_rss(processes) - before < 64 * MB  # four 75 MB bodies took it to 1.9 GB before
    # A body under the cap still works, chunked or not, and still needs its token.
    body = json.dumps({"graph": gated(), "input": {"pad": "x" * 500_000}, "run_id": "big-1"}).encode()
    assert api.post("/v1/runs", content=body, headers={"Content-Type": "application/json"}).status_code == 201
    chunks = iter([body[:1000], body[1000:]])
    assert api.post("/v1/runs", content=chunks, headers={"Content-Type": "application/json"}).status_code == 200
    assert api.call("POST", "/v1/runs", content=body).status_code == 401


def hostile() -> st.SearchStrategy[str]:
    """Strings made of the characters markup is made of, script fragments and ordinary text."""
    parts = st.sampled_from(["<", ">", '"', "'", "&", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                             "javascript:", "</title>", "&lt;", "{{ 7*7 }}", "\\", "`", "=", " ", "é"])
    return st.lists(st.one_of(parts, st.text("abc<>\"'&;=/ ", max_size=4)), min_size=1, max_size=6).map("".join)


def assert_escaped(reply: httpx.Response, raw: str) -> None:
    """`raw` holds a markup character, so escaping changes it: it may not appear as it is."""
    if any(c in raw for c in "<>\"'&") and reply.headers.get("content-type", "").startswith("text/html"):
        assert raw not in reply.text, (reply.request.url, reply.text)


def test_nothing_hostile_in_a_path_a_query_or_a_tenant_reaches_html_unescaped(api: Api) -> None:
    shown = api.client.runtime.journal
    tenant_raw = "tn<script>alert('t')</script>&\"x'q"
    _, tenant_token = shown.tokens.create_token(tenant_id=tenant_raw, name="xss", now=utcnow())
    runs = web.get(api.url + "/runs", cookies={"pal_token": tenant_token}, timeout=10)
    assert runs.status_code == 200 and tenant_raw not in runs.text
    assert str(markupsafe.escape(tenant_raw)) in runs.text  # shown, escaped

    @settings(max_examples=40, deadline=None, database=None)
    @given(hostile())
    def probe(payload: str) -> None:
        raw = f"zq{payload}kx"  # markers: the raw string can only appear if it was not escaped
        segment = quote(raw, safe="")
        cookies = {"pal_token": api.token}
        for path in (f"/runs/{segment}", f"/{segment}", f"/static/{segment}", f"/v1/runs/{segment}",
                     f"/runs?q={segment}", f"/login?next={segment}", f"/logout?x={segment}",
                     f"/v1/runs/{segment}/waterfall", f"/runs/{segment}/x"):
            for jar in (cookies, {}):
                reply = web.get(api.url + path, cookies=jar, timeout=10)
                assert reply.status_code < 500, (path, reply.text)
                assert_escaped(reply, raw)
                assert_security_headers(reply)
        missing = web.get(f"{api.url}/runs/{segment}", cookies=cookies, timeout=10)
        if "/" not in raw:
            assert missing.status_code == 404 and str(markupsafe.escape(raw)) in missing.text

    probe()


def assert_security_headers(reply: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert reply.headers.get(name) == value, (reply.request.url, reply.status_code, name)
    policy = reply.headers.get("content-security-policy", "")
    assert "'unsafe-inline'" not in policy and "frame-ancestors 'none'" in policy, reply.request.url
    if reply.request.url.path != "/docs":
        assert [d.strip() for d in policy.split(";")] == CSP_DIRECTIVES, (reply.request.url, policy)


def test_every_kind_of_response_carries_the_security_headers(api: Api) -> None:
    assert api.post("/v1/runs", json={"graph": gated(), "run_id": "hdr-1"}).status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/hdr-1").json()["status"] == "waiting", timeout=60)
    assert api.post("/v1/runs/hdr-1/cancel").status_code == 200  # finished: its stream ends
    token, cookie = {"Authorization": f"Bearer {api.token}"}, {"pal_token": api.token}
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("GET", "/openapi.json", {}, 200), ("GET", "/docs", {}, 200), ("GET", "/", {}, 303),
        ("GET", "/login", {}, 200), ("GET", "/runs", {}, 303), ("GET", "/runs", {"cookies": cookie}, 200),
        ("GET", "/runs/hdr-1", {"cookies": cookie}, 200), ("GET", "/runs/nope", {"cookies": cookie}, 404),
        ("GET", "/logout", {"cookies": cookie}, 200), ("POST", "/logout", {"cookies": cookie}, 403),
        ("GET", "/static/waterfall.js", {}, 200), ("GET", "/static/pal.css", {}, 200),
        ("GET", "/static/nope.js", {}, 404), ("GET", "/nope", {}, 404),
        ("GET", "/v1/runs", {}, 401), ("GET", "/v1/runs", {"headers": token}, 200),
        ("GET", "/v1/runs/hdr-1/events", {"headers": token}, 200),
        ("GET", "/v1/runs/hdr-1/waterfall", {"headers": token}, 200),
        ("GET", "/v1/runs?limit=0", {"headers": token}, 422), ("GET", "/v1/runs/a%00b", {"headers": token}, 400),
        ("PUT", "/v1/runs", {"headers": token}, 405), ("POST", "/v1/runs/hdr-1/cancel", {"cookies": cookie}, 403),
        ("POST", "/v1/runs", {"headers": token | {"Content-Length": str(10**9)}}, 413),
    ]
    for method, path, kwargs, status in cases:
        if status == 413:
            code, headers = post_declared(api, 10**9)
            assert code == 413 and all(headers.get(k) == v for k, v in SECURITY_HEADERS.items())
            continue
        reply = web.request(method, api.url + path, timeout=30, **kwargs)
        assert reply.status_code == status, (method, path, reply.status_code, reply.text[:300])
        assert_security_headers(reply)
    docs = web.get(api.url + "/docs", timeout=10).headers["content-security-policy"]
    assert "script-src 'self' https://cdn.jsdelivr.net 'sha256-" in docs  # the CDN and one inline hash


def unstorable() -> st.SearchStrategy[str]:
    """Text with a NUL or a lone surrogate somewhere in it."""
    bad = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"])
    text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
    return st.tuples(text, bad, text).map("".join)


def test_nul_and_lone_surrogates_get_400_or_422_never_500_or_503(api: Api) -> None:
    assert api.post("/v1/runs", json={"graph": gated(), "run_id": "nul-1"}).status_code == 201
    json_headers = {"Content-Type": "application/json"}

    def body(value: Any) -> bytes:
        return json.dumps(value).encode()  # ASCII: NUL as \\u0000, a surrogate as \\udXXX

    @settings(max_examples=40, deadline=None, database=None)
    @given(unstorable(), st.integers(0, 7))
    def probe(text: str, where: int) -> None:
        graph = gated()
        documents = [
            {"graph": graph, "run_id": text},
            {"graph": graph, "input": {"note": text}},
            {"graph": graph, "input": {text: 1}},
            {"graph": graph, "input": [[{"deep": ["ok", text]}]]},
            {"graph": {**graph, "nodes": [*graph["nodes"][:2], {"id": "done", "type": "output",
                                                                "data": {"value": text}}]}},
            {"graph": graph, "input": text},
        ]
        reply = api.post("/v1/runs", content=body(documents[where % len(documents)]), headers=json_headers)
        assert reply.status_code == 422, reply.text
        assert "NUL" in reply.json()["detail"] or "surrogate" in reply.json()["detail"]
        for path, document in (("/v1/runs/nul-1/steps/gate/approve", {"comment": text}),
                               ("/v1/runs/nul-1/steps/gate/reject", {"approval_hash": text}),
                               ("/v1/runs/nul-1/cancel", {"reason": text})):
            reply = api.post(path, content=body(document), headers=json_headers)
            assert reply.status_code == 422, (path, reply.text)
        # A URL cannot carry a surrogate (the server decodes invalid UTF-8 to U+FFFD): NUL stands in.
        nul = quote("".join("\x00" if "\ud800" <= c <= "\udfff" else c for c in text), safe="")
        for path in (f"/v1/runs/{nul}", f"/v1/runs/{nul}/journal", f"/v1/runs/{nul}/events",
                     f"/v1/runs/nul-1/steps/{nul}/approve", f"/runs/{nul}", f"/static/{nul}",
                     f"/v1/runs?status={nul}", f"/v1/runs/nul-1/journal?after={nul}", f"/v1/approvals?{nul}=1"):
            method = "POST" if path.endswith("/approve") else "GET"
            reply = api.call(method, path, api.token, cookies={"pal_token": api.token})
            assert reply.status_code == 400, (path, reply.status_code, reply.text)
            assert "NUL" in reply.json()["detail"]

    probe()
    assert [r["id"] for r in api.get("/v1/runs").json()["runs"]] == ["nul-1"]  # nothing else written
    encoded = api.get("/v1/runs/%ED%A0%80")  # a surrogate's UTF-8 bytes: decoded as U+FFFD, no such run
    assert encoded.status_code == 404
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
        raw = api.post("/v1/runs/nul-1/cancel", content=b'{"reason": "\xed\xa0\x80\x00\xff"}',
                       headers={"Content-Type": content_type})  # bytes that are not UTF-8 at all
        assert raw.status_code in (400, 422), (content_type, raw.status_code, raw.text)
    assert [e["kind"] for e in api.get("/v1/runs/nul-1/journal").json()["events"]][-1] == "step_waiting"


def test_a_revoked_tokens_open_stream_ends(api: Api) -> None:
    journal = api.client.runtime.journal
    token_id, token = journal.tokens.create_token(tenant_id="acme", name="short-lived", now=utcnow())
    assert api.post("/v1/runs", json={"graph": gated(), "run_id": "sse-1"}).status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/sse-1").json()["status"] == "waiting", timeout=60)
    kinds: list[str] = []
    headers = {"Authorization": f"Bearer {token}"}
    # The read timeout bounds the test: without the re-check the stream would stay open (the run
    # waits for its approval indefinitely) and the read would time out.
    with httpx.stream("GET", f"{api.url}/v1/runs/sse-1/events", headers=headers, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("event:"):
                kinds.append(line[6:].strip())
                if kinds[-1] == "step_waiting":
                    assert journal.tokens.revoke_token(token_id=token_id, now=utcnow())
    assert kinds[-1] == "step_waiting" and api.get("/v1/runs/sse-1").json()["status"] == "waiting"
    again = api.call("GET", "/v1/runs/sse-1/events", token)
    assert again.status_code == 401


def test_flower_answers_nothing_without_its_basic_auth(processes: Processes, tmp_path: Path) -> None:
    auth = ("admin", "s3cret")
    port = free_port()
    processes.start(["flower", "--port", str(port)], "flower.log", PAL_FLOWER_BASIC_AUTH=":".join(auth))
    url = f"http://127.0.0.1:{port}"

    def get(path: str, auth: tuple[str, str] | None, method: str = "GET") -> httpx.Response | None:
        try:
            return web.request(method, url + path, auth=auth, timeout=10)
        except httpx.TransportError:
            return None

    def up() -> bool:
        reply = get("/healthcheck", auth)
        return reply is not None and reply.status_code == 200

    assert wait_until(up, timeout=60), (tmp_path / "flower.log").read_text()
    for path in ("/metrics", "/healthcheck", "/api/tasks", "/api/workers", "/", "/tasks", "/broker",
                 "/static/css/flower.css", "/login", "/logout", "/no-such-page", "/api/task/info/x"):
        for wrong in (None, ("admin", "wrong"), ("admin", "s3cret2"), ("", "")):
            reply = get(path, wrong)
            assert reply is not None and reply.status_code == 401, (path, wrong, reply)
            assert reply.headers["www-authenticate"].startswith("Basic") and "flower_" not in reply.text
    refused = get("/api/task/revoke/x", None, method="POST")
    assert refused is not None and refused.status_code == 401
    metrics, health = get("/metrics", auth), get("/healthcheck", auth)
    assert metrics is not None and metrics.status_code == 200 and "flower_" in metrics.text
    assert health is not None and health.status_code == 200 and health.text == "OK"
