"""Local stand-ins for the network services PAL talks to: model APIs, webhooks and SMTP.

Each one is a context manager that runs in a background thread on 127.0.0.1 with an ephemeral
port and records what it received, so tests can assert on the exact traffic (headers, bodies,
idempotency keys) without any internet access or real credentials.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import json
import socket
import threading
from dataclasses import dataclass
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

__all__ = [
    "FakeModelServer",
    "ReceivedMail",
    "RecordedRequest",
    "SmtpReceiver",
    "WebhookReceiver",
]

LOOPBACK = "127.0.0.1"
# A fixed "created" timestamp keeps replies byte-identical for identical requests.
FIXED_CREATED = 1_700_000_000
OPENAI_CHAT_PATH = "/v1/chat/completions"
ANTHROPIC_MESSAGES_PATH = "/v1/messages"


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as the stand-in server saw it (headers lowercased, body parsed as JSON)."""

    path: str
    headers: dict[str, str]
    body: Any
    method: str = "POST"


@dataclass(frozen=True)
class ReceivedMail:
    """One message accepted by :class:`SmtpReceiver` (headers lowercased, body decoded to text)."""

    mail_from: str
    rcpt_tos: list[str]
    headers: dict[str, str]
    body: str


# --------------------------------------------------------------------------------------------
# HTTP plumbing shared by the model server and the webhook receiver
# --------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its owning stand-in, so handlers can reach its state."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # hundreds of steps call at once (socketserver's default backlog is 5)

    def __init__(self, owner: _HttpStandIn) -> None:
        self.owner = owner
        super().__init__((LOOPBACK, 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    """Reads the request, hands it to the owner, writes its JSON answer; never logs to stderr."""

    # HTTP/1.0: one request per connection, so no keep-alive socket outlives the server.
    protocol_version = "HTTP/1.0"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr logging."""

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Drain the trailer section up to the terminating blank line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        raw = self._read_body()
        body: Any
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", errors="replace")
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = RecordedRequest(path=self.path, headers=headers, body=body, method=self.command)
        status, payload = self.server.owner._respond(request)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (e.g. a worker killed mid-call); nothing left to answer.
            pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class _HttpStandIn:
    """Start/stop and request recording common to the HTTP stand-ins."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind an ephemeral loopback port and serve in a daemon thread."""
        if self._server is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._stopping.clear()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}-{self.port}", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; wakes handlers still sleeping out their ``delay``."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.stop()

    # addresses -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (only while started)."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://{LOOPBACK}:{self.port}"

    # recordings ------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot copy of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def idempotency_keys(self) -> list[str | None]:
        """The ``Idempotency-Key`` header of each request in order (None where absent)."""
        return [r.headers.get("idempotency-key") for r in self.requests]

    def clear(self) -> None:
        """Forget recorded requests (counters that drive behaviour are kept)."""
        with self._lock:
            self._requests.clear()

    def _record(self, request: RecordedRequest) -> int:
        """Record a request on arrival; returns its 1-based position."""
        with self._lock:
            self._requests.append(request)
            return len(self._requests)

    def _sleep(self) -> None:
        if self.delay > 0:
            self._stopping.wait(self.delay)

    def _respond(self, request: RecordedRequest) -> tuple[int, Any]:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Model API stand-in
# --------------------------------------------------------------------------------------------


def _words(text: str) -> int:
    return len(text.split())


def _content_words(content: Any) -> int:
    """Words in a message ``content``: a string, or a list of text/tool_use/tool_result blocks."""
    if content is None:
        return 0
    if isinstance(content, str):
        return _words(content)
    if isinstance(content, list):
        return sum(_content_words(block) for block in content)
    if isinstance(content, dict):
        kind = content.get("type")
        if kind == "tool_use":
            return _words(json.dumps(content.get("input", {})))
        if kind == "tool_result":
            return _content_words(content.get("content"))
        text = content.get("text")
        return _words(text) if isinstance(text, str) else 0
    return 0


def _message_words(message: Any) -> int:
    """Words in one chat message, including OpenAI-style tool_call arguments."""
    if not isinstance(message, dict):
        return 0
    total = _content_words(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "")
        total += _words(arguments if isinstance(arguments, str) else json.dumps(arguments))
    return total


def _content_text(content: Any) -> str:
    """The readable text of a message ``content`` (text blocks and tool results, space-joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(t for t in (_content_text(block) for block in content) if t)
    if isinstance(content, dict):
        if content.get("type") == "tool_result":
            return _content_text(content.get("content"))
        text = content.get("text")
        return text if isinstance(text, str) else ""
    return ""


@dataclass(frozen=True)
class _Turn:
    """The reply chosen for one request, independent of the wire format."""

    index: int
    text: str | None
    tool_calls: list[dict[str, Any]]
    input_tokens: int
    output_tokens: int
    digest: str


class FakeModelServer(_HttpStandIn):
    """Stand-in for the OpenAI Chat Completions and Anthropic Messages APIs.

    Replies are a pure function of the request (script index = number of assistant messages),
    so a replayed request after a crash gets exactly the reply the first attempt got.
    """

    def __init__(
        self, script: list[dict[str, Any]] | None = None, delay: float = 0.0, fail_first: int = 0,
    ) -> None:
        super().__init__(delay=delay)
        self.script: list[dict[str, Any]] = list(script or [])
        self.fail_first = fail_first
        self._model_calls = 0

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for ``openai.OpenAI``."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` for ``anthropic.Anthropic`` (the SDK appends ``/v1/messages`` itself)."""
        return self.url

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """Recorded requests for one path only, e.g. ``/v1/chat/completions``."""
        return [r for r in self.requests if r.path == path]

    # reply selection -------------------------------------------------------------------------

    def turn_for(self, body: Any) -> _Turn:
        """Compute the deterministic reply for a request body (exposed so tests can predict it)."""
        body = body if isinstance(body, dict) else {}
        messages = body.get("messages") or []
        messages = messages if isinstance(messages, list) else []
        index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if index < len(self.script):
            entry = self.script[index]
            text: str | None = entry.get("text")
            tool_calls: list[dict[str, Any]] = list(entry.get("tool_calls") or [])
        else:
            last_user = next(
                (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), {},
            )
            text = f"ok: {_content_text(last_user.get('content'))[:60]}"
            tool_calls = []
        input_tokens = sum(_message_words(m) for m in messages) + _content_words(body.get("system"))
        output_tokens = _words(text or "") + 5 * len(tool_calls)
        canonical = json.dumps(
            {"model": body.get("model"), "system": body.get("system"), "messages": messages}, sort_keys=True,
        )
        return _Turn(
            index=index, text=text, tool_calls=tool_calls, input_tokens=max(1, input_tokens),
            output_tokens=max(1, output_tokens), digest=hashlib.sha256(canonical.encode()).hexdigest()[:24],
        )

    # wire formats ----------------------------------------------------------------------------

    @staticmethod
    def _openai_reply(body: dict[str, Any], turn: _Turn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text, "refusal": None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{turn.index}_{i}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
                }
                for i, call in enumerate(turn.tool_calls)
            ]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "id": f"chatcmpl-{turn.digest}",
            "object": "chat.completion",
            "created": FIXED_CREATED,
            "model": body.get("model", "fake-model"),
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if turn.tool_calls else "stop",
            }],
            "usage": {
                "prompt_tokens": turn.input_tokens,
                "completion_tokens": turn.output_tokens,
                "total_tokens": turn.input_tokens + turn.output_tokens,
            },
        }

    @staticmethod
    def _anthropic_reply(body: dict[str, Any], turn: _Turn) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if turn.text or not turn.tool_calls:
            content.append({"type": "text", "text": turn.text or ""})
        content.extend(
            {"type": "tool_use", "id": f"toolu_{turn.index}_{i}", "name": call["name"],
             "input": call.get("arguments", {})}
            for i, call in enumerate(turn.tool_calls)
        )
        return {
            "id": f"msg_{turn.digest}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake-model"),
            "content": content,
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens},
        }

    def _respond(self, request: RecordedRequest) -> tuple[int, Any]:
        self._record(request)
        path = request.path.split("?", 1)[0]
        if request.method != "POST" or path not in (OPENAI_CHAT_PATH, ANTHROPIC_MESSAGES_PATH):
            return HTTPStatus.NOT_FOUND, {"error": {"type": "not_found_error", "message": f"no route {path}"}}
        with self._lock:
            self._model_calls += 1
            failing = self._model_calls <= self.fail_first
        self._sleep()
        if failing:
            error = {"type": "server_error", "message": "injected failure (fail_first)"}
            if path == ANTHROPIC_MESSAGES_PATH:
                return HTTPStatus.INTERNAL_SERVER_ERROR, {"type": "error", "error": error}
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {**error, "param": None, "code": None}}
        body = request.body if isinstance(request.body, dict) else {}
        turn = self.turn_for(body)
        if path == OPENAI_CHAT_PATH:
            return HTTPStatus.OK, self._openai_reply(body, turn)
        return HTTPStatus.OK, self._anthropic_reply(body, turn)


# --------------------------------------------------------------------------------------------
# Webhook stand-in
# --------------------------------------------------------------------------------------------


class WebhookReceiver(_HttpStandIn):
    """A webhook endpoint that records every delivery and answers with a configurable status.

    ``effective_deliveries()`` is what a receiver honouring ``Idempotency-Key`` would act on,
    which is the number exactly-once delivery tests care about.
    """

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        super().__init__(delay=delay)
        self.status = status  # may be changed while running, e.g. to fail then recover

    def effective_deliveries(self) -> list[RecordedRequest]:
        """Requests de-duplicated by Idempotency-Key (first kept); requests without one all count."""
        seen: set[str] = set()
        effective: list[RecordedRequest] = []
        for request in self.requests:
            key = request.headers.get("idempotency-key")
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            effective.append(request)
        return effective

    def _respond(self, request: RecordedRequest) -> tuple[int, Any]:
        if request.method not in ("POST", "PUT"):
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": {"type": "method_not_allowed",
                                                             "message": request.method}}
        n = self._record(request)
        self._sleep()
        return self.status, {"received": True, "n": n}


# --------------------------------------------------------------------------------------------
# SMTP stand-in
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _mail_body(message: Message) -> str:
    """The text of a message (first text/plain part when multipart), with ``\\n`` line endings."""
    part: Message = message
    if message.is_multipart():
        part = next((p for p in message.walk() if p.get_content_type() == "text/plain"), message)
        if part.is_multipart():
            return ""
    payload = part.get_payload(decode=True)
    if isinstance(payload, bytes):
        text = payload.decode(part.get_content_charset() or "utf-8", errors="replace")
    else:
        text = str(part.get_payload())
    # SMTP carries CRLF line endings; tests compare against Python strings written with "\n".
    return text.replace("\r\n", "\n")


class _MailHandler:
    """aiosmtpd handler: hands each accepted message to the receiver."""

    def __init__(self, receiver: SmtpReceiver) -> None:
        self._receiver = receiver

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        data = raw if isinstance(raw, bytes) else raw.encode()
        message = email.message_from_bytes(data, policy=email.policy.compat32)
        mail = ReceivedMail(
            mail_from=str(envelope.mail_from or ""),
            rcpt_tos=[str(r) for r in envelope.rcpt_tos],
            headers={k.lower(): str(v) for k, v in message.items()},
            body=_mail_body(message),
        )
        self._receiver._record(mail)
        return "250 Message accepted for delivery"


class SmtpReceiver:
    """A local SMTP server (aiosmtpd) that accepts any mail and records it.

    No TLS and no AUTH, so nothing warns (pytest runs with ``filterwarnings = error``).
    """

    ready_timeout: ClassVar[float] = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[ReceivedMail] = []
        self._controller: Controller | None = None
        self._port: int | None = None

    def start(self) -> Self:
        """Pick a free loopback port and start the aiosmtpd controller thread on it."""
        if self._controller is not None:
            raise RuntimeError("SmtpReceiver already started")
        last_error: OSError | None = None
        for _ in range(5):  # the free port can be taken between probing and binding
            port = _free_port()
            controller = Controller(
                _MailHandler(self), hostname=LOOPBACK, port=port, ready_timeout=self.ready_timeout,
                server_hostname="localhost",  # skips socket.getfqdn(), which may hit DNS
                auth_require_tls=False, enable_SMTPUTF8=True,
            )
            try:
                controller.start()
            except OSError as exc:
                last_error = exc
                controller.stop(no_assert=True)
                if not controller.loop.is_closed():
                    controller.loop.close()
                continue
            self._controller, self._port = controller, port
            return self
        raise RuntimeError(f"could not start SMTP receiver: {last_error}")

    def stop(self) -> None:
        """Stop the controller's event loop and join its thread."""
        if self._controller is not None:
            self._controller.stop()
        self._controller = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """Host to hand to ``smtplib.SMTP``."""
        return LOOPBACK

    @property
    def port(self) -> int:
        """Port the receiver listens on (only once started)."""
        if self._port is None:
            raise RuntimeError("SmtpReceiver is not running")
        return self._port

    @property
    def messages(self) -> list[ReceivedMail]:
        """A snapshot copy of the accepted messages, in arrival order."""
        with self._lock:
            return list(self._messages)

    def message_ids(self) -> list[str | None]:
        """The Message-ID header of each accepted message, in order."""
        return [m.headers.get("message-id") for m in self.messages]

    def _record(self, mail: ReceivedMail) -> None:
        with self._lock:
            self._messages.append(mail)

