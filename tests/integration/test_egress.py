"""The egress guard and the delivery input checks, end to end: real graphs, a real Celery worker or
the step protocol, real loopback listeners, on SQLite and on Postgres + Redis.

The test settings allow 127.0.0.1 (tests/conftest.py); the clients here drop or narrow that allow
list, so the loopback receivers play the admin port a graph must not reach. Nothing connects
anywhere but 127.0.0.1.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.config import load_settings
from pal.errors import GraphError
from pal.nodes.connector import tls_context
from tests.conftest import Backend
from tests.integration.test_deliveries import capture, drain
from tests.support.api_server import free_port
from tests.support.graphs import email, single, webhook
from tests.support.servers import SmtpReceiver, WebhookReceiver
from tests.support.workers import in_process_worker


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as server:
        yield server


def client_allowing(backend: Backend, allow: str) -> Client:
    """A client whose PAL_EGRESS_ALLOW is `allow` (empty: none), read as the variable is."""
    return Client(backend.settings.with_(egress_allow=load_settings({"PAL_EGRESS_ALLOW": allow}).egress_allow))


@pytest.fixture
def guarded(backend: Backend) -> Iterator[Client]:
    """A client with no allow list: loopback is refused, as in a default deployment."""
    client = client_allowing(backend, "")
    yield client
    client.close()


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that only counts the connections it accepts."""

    def __init__(self) -> None:
        self.accepted = 0
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.05)
        self.port = int(self._socket.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()


def notify_events(client: Client, run_id: str) -> list[str]:
    return [e.kind for e in client.events(run_id) if e.step_id == "notify"]


# --- the guard ------------------------------------------------------------------------------------

def test_a_loopback_webhook_is_refused_without_an_allow_list_and_delivered_with_one(
        backend: Backend, guarded: Client, receiver: WebhookReceiver) -> None:
    graph = webhook(receiver.url + "/hook", retry={"maxAttempts": 3})  # a retry would change nothing
    with in_process_worker(guarded):
        run_id = guarded.start_run(graph, {"ticket": "T-1"})
        run = guarded.wait(run_id, timeout=60)
    assert run.status == "failed"
    assert run.error["code"] == "egress_refused" and run.error["step_id"] == "notify"
    assert "PAL_EGRESS_ALLOW" in run.error["message"] and "nothing was sent" in run.error["message"]
    assert receiver.requests == []
    assert guarded.runtime.journal.receipts.receipts(run_id) == []  # nothing claimed
    assert notify_events(guarded, run_id) == ["step_started", "step_failed"]  # not retried, not in doubt

    for allow, delivered in ((f"127.0.0.1:{receiver.port + 1}", False), (f"127.0.0.1:{receiver.port}", True)):
        client = client_allowing(backend, allow)
        with in_process_worker(client):
            run = client.wait(client.start_run(graph, {"ticket": "T-2"}), timeout=60)
        client.close()
        assert (run.status == "succeeded") is delivered, (allow, run.error)
    [request] = receiver.requests
    assert request.path == "/hook" and request.body == {"ticket": "T-2"}


SPELLINGS = ["127.0.0.1", "localhost", "LOCALHOST.", "api.localhost", "127.1", "0177.1", "2130706433",
             "0x7f000001", "0x7f.0.0.1", "0.0.0.0", "0", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::1]",
             "[::]", "[0:0:0:0:0:0:0:1]"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_no_spelling_of_loopback_gets_through(guarded: Client, spelling: str) -> None:
    counter = ConnectionCounter()
    try:
        sent = capture(guarded)
        run_id = guarded.start_run(webhook(f"http://{spelling}:{counter.port}/admin"), {"ticket": "T-3"})
        drain(guarded, sent)
    finally:
        counter.close()
    run = guarded.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "egress_refused", run.error
    assert counter.accepted == 0  # not even a TCP connection
    assert guarded.runtime.journal.receipts.receipts(run_id) == []


def test_the_refusal_reads_the_same_for_an_open_and_a_closed_port(
        guarded: Client, receiver: WebhookReceiver) -> None:
    """No port-scan oracle: the guard refuses before connecting, so the port's state cannot show."""
    sent = capture(guarded)
    messages = []
    for port in (receiver.port, free_port()):
        run_id = guarded.start_run(webhook(f"http://127.0.0.1:{port}/"), {"ticket": "T-4"})
        drain(guarded, sent)
        messages.append(guarded.get_run(run_id).error["message"].replace(str(port), "PORT"))
    assert messages[0] == messages[1]
    assert receiver.requests == []


def test_an_allowed_name_keeps_its_host_header_while_the_connection_goes_to_the_checked_address(
        backend: Backend, receiver: WebhookReceiver) -> None:
    client = client_allowing(backend, f"localhost:{receiver.port}")
    sent = capture(client)
    run_id = client.start_run(webhook(f"http://localhost:{receiver.port}/hook"), {"ticket": "T-5"})
    drain(client, sent)
    assert client.get_run(run_id).status == "succeeded", client.get_run(run_id).error
    [request] = receiver.requests
    assert request.headers["host"] == f"localhost:{receiver.port}"
    client.close()


class RedirectingServer(ThreadingHTTPServer):
    """Answers every POST with 307 to `location` and counts them."""

    def __init__(self, location: str) -> None:
        self.location, self.hits = location, 0
        super().__init__(("127.0.0.1", 0), _Redirect)
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


class _Redirect(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: RedirectingServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr logging."""

    def do_POST(self) -> None:
        self.server.hits += 1
        self.send_response(307)
        self.send_header("Location", self.server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_redirect_is_not_followed(client: Client, receiver: WebhookReceiver) -> None:
    """A 3xx is the receiver's answer (its outcome unknown, as before), never a hop elsewhere."""
    server = RedirectingServer(receiver.url + "/elsewhere")
    try:
        sent = capture(client)
        run_id = client.start_run(webhook(server.url), {"ticket": "T-6"})
        drain(client, sent)
    finally:
        server.close()
    run = client.get_run(run_id)
    assert run.status == "failed" and "HTTP 307" in run.error["message"]
    assert server.hits == 1
    assert receiver.requests == []


def make_certificate(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """(CA file, certificate, key) for `name`, made with the openssl command line tool."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is required (Debian: apt-get install openssl)")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=pal-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={name}")
    (folder / "server.ext").write_text(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: TlsReceiver

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr logging."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.hosts.append(self.headers["Host"])
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


class TlsReceiver(ThreadingHTTPServer):
    """An https endpoint on 127.0.0.1 that records the Host header of each request."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.hosts: list[str] = []
        super().__init__(("127.0.0.1", 0), _Recorder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


def test_https_to_a_pinned_address_still_verifies_the_certificate_against_the_name(
        backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection goes to the checked 127.0.0.1, while SNI and certificate verification use the
    URL's name: a certificate for `localhost` is accepted for https://localhost, not for the bare IP."""
    ca, certificate, key = make_certificate(tmp_path, "localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the connector still reads SSL_CERT_FILE
    server = TlsReceiver(certificate, key)
    port = server.server_address[1]
    client = client_allowing(backend, f"localhost:{port},127.0.0.1:{port}")
    try:
        sent = capture(client)
        by_name = client.start_run(webhook(f"https://localhost:{port}/hook"), {"ticket": "T-10"})
        by_address = client.start_run(webhook(f"https://127.0.0.1:{port}/hook"), {"ticket": "T-11"})
        drain(client, sent)
        assert client.get_run(by_name).status == "succeeded", client.get_run(by_name).error
        failed = client.get_run(by_address)
        assert failed.status == "failed" and "CERTIFICATE_VERIFY_FAILED" in failed.error["message"]
        assert server.hosts == [f"localhost:{port}"]
    finally:
        server.close()
        client.close()


def test_the_tls_context_is_built_once_per_certificate_setting(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Built once per process (a CA bundle costs ~50 ms of CPU to load), yet a changed SSL_CERT_FILE
    still gets a context that trusts exactly that file."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    default = tls_context()
    assert tls_context() is default
    ca, _, _ = make_certificate(tmp_path, "localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    ours = tls_context()
    assert ours is not default and tls_context() is ours
    assert [dict(c["subject"][0])["commonName"] for c in ours.get_ca_certs()] == ["pal-test-ca"]


# --- headers ----------------------------------------------------------------------------------------

def hook(receiver: WebhookReceiver, **data: Any) -> dict[str, Any]:
    return single({"id": "notify", "type": "connector", "data": {"url": receiver.url + "/hook", **data}})


def test_a_literal_forbidden_header_is_refused_when_the_run_starts(
        client: Client, receiver: WebhookReceiver) -> None:
    with pytest.raises(GraphError, match="header 'Host' is set by PAL"):
        client.start_run(hook(receiver, headers={"Host": "admin.internal"}), {})
    assert client.list_runs() == []


@pytest.mark.parametrize(("data", "run_input", "fragment"), [
    ({"headers": "{{ input.headers }}"}, {"headers": {"Host": "admin.internal"}}, "header 'Host' is set by PAL"),
    ({"headers": "{{ input.headers }}"}, {"headers": {"Transfer-Encoding": "chunked"}}, "set by PAL"),
    ({"headers": "{{ input.headers }}"}, {"headers": {"X-A\r\nHost": "x"}}, "not an HTTP field name"),
    ({"headers": {"X-Note": "{{ input.note }}"}}, {"note": "hi\r\nHost: admin.internal"}, "control character"),
    ({"headers": {"X-Note": "{{ input.note }}"}}, {"note": "caf\u00e9"}, "not a request PAL can send"),
    ({"url": "{{ input.url }}"}, {"url": "http://[::1/x"}, "not a request PAL can send"),
    ({"url": "{{ input.url }}"}, {"url": "ftp://127.0.0.1/x"}, "not an http(s) URL"),
])
def test_a_rendered_request_that_cannot_be_sent_fails_before_anything_is_claimed(
        client: Client, receiver: WebhookReceiver, data: dict[str, Any], run_input: Any, fragment: str) -> None:
    sent = capture(client)
    run_id = client.start_run(hook(receiver, **data), run_input)
    drain(client, sent)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "delivery_failed", run.error
    assert fragment in run.error["message"]
    assert receiver.requests == [] and client.runtime.journal.receipts.receipts(run_id) == []


def test_a_local_http_error_after_the_claim_is_a_definite_failure_not_in_doubt(
        client: Client, receiver: WebhookReceiver) -> None:
    """h11 refuses a header value with a leading space while forming the request head, before a
    byte is written: the receipt is settled `failed`, not left in doubt."""
    sent = capture(client)
    run_id = client.start_run(hook(receiver, headers={"X-Note": "{{ input.note }}"}), {"note": " padded"})
    drain(client, sent)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "delivery_failed", run.error
    assert "refused before sending" in run.error["message"]
    assert [r["status"] for r in client.runtime.journal.receipts.receipts(run_id)] == ["failed"]
    assert "step_in_doubt" not in notify_events(client, run_id)
    assert receiver.requests == []


# --- email addresses ---------------------------------------------------------------------------------

@pytest.mark.parametrize("to", [
    "ada@example.test, eve@evil.test",
    "ada@example.test;eve@evil.test",
    ["ada@example.test", "bob@example.test, eve@evil.test"],
    "ada@example.test\r\nBcc: eve@evil.test",
    "friends: ada@example.test, eve@evil.test;",
])
def test_one_to_item_cannot_add_a_recipient(mail_client: Client, smtp: SmtpReceiver, to: Any) -> None:
    sent = capture(mail_client)
    run_id = mail_client.start_run(email(), {"ticket": "T-7", "to": to})
    drain(mail_client, sent)
    run = mail_client.get_run(run_id)
    assert run.status == "failed" and "not e-mail addresses" in run.error["message"], run.error
    assert smtp.messages == [] and mail_client.runtime.journal.receipts.receipts(run_id) == []


def test_each_to_item_is_one_recipient(mail_client: Client, smtp: SmtpReceiver) -> None:
    sent = capture(mail_client)
    to = ["Ada <ada@example.test>", '"Lovelace, Ada" <lovelace@example.test>']
    run_id = mail_client.start_run(email(), {"ticket": "T-8", "to": to})
    drain(mail_client, sent)
    assert mail_client.get_run(run_id).status == "succeeded", mail_client.get_run(run_id).error
    [mail] = smtp.messages
    assert mail.rcpt_tos == ["ada@example.test", "lovelace@example.test"]
    assert "Lovelace, Ada" in mail.headers["to"]


def test_a_subject_cannot_inject_a_header(mail_client: Client, smtp: SmtpReceiver) -> None:
    sent = capture(mail_client)
    run_id = mail_client.start_run(email(), {"ticket": "T-9\r\nBcc: eve@evil.test", "to": "ada@example.test"})
    drain(mail_client, sent)
    run = mail_client.get_run(run_id)
    assert run.status == "failed" and "cannot form the message" in run.error["message"], run.error
    assert smtp.messages == [] and mail_client.runtime.journal.receipts.receipts(run_id) == []


# An address literal names the host the SMTP server delivers to: the graph would choose it.
ADDRESS_LITERALS = ["ada@[127.0.0.1]", "ada@[IPv6:::1]", "Ada <ada@[169.254.169.254]>", "ada@[ 10.0.0.1 ]",
                    "ada@[IPv6:fe80::1]", "ada@127.0.0.1", "ada@2130706433", "ada@0x7f000001"]


@pytest.mark.parametrize("literal", ADDRESS_LITERALS)
def test_an_address_literal_is_refused_at_validation(mail_client: Client, smtp: SmtpReceiver, literal: str) -> None:
    """As `to`, as one item of a `to` list, or as `from`: the graph is refused, nothing is written."""
    sent = capture(mail_client)
    for field, value in (("to", literal), ("to", ["ada@example.test", literal]), ("from", literal)):
        graph = email()
        graph["nodes"][1]["data"][field] = value
        with pytest.raises(GraphError, match=r"names a host by IP address") as caught:
            mail_client.start_run(graph, {"ticket": "T-10"})
        assert f"node 'notify': {field!r}" in str(caught.value)
    assert mail_client.list_runs() == [] and sent == [] and smtp.messages == []


@pytest.mark.parametrize("to", ADDRESS_LITERALS)
def test_an_address_literal_rendered_by_a_template_is_never_sent_to(mail_client: Client, smtp: SmtpReceiver,
                                                                     to: str) -> None:
    sent = capture(mail_client)
    run_id = mail_client.start_run(email(), {"ticket": "T-11", "to": ["ada@example.test", to]})
    drain(mail_client, sent)
    run = mail_client.get_run(run_id)
    assert run.status == "failed" and "names a host by IP address" in run.error["message"], run.error
    assert "nothing was sent" in run.error["message"]
    assert smtp.messages == [] and mail_client.runtime.journal.receipts.receipts(run_id) == []

