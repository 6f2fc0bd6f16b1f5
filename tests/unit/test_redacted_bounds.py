"""Redact first, cut after, everywhere PAL bounds a text it journals: a credential placed at every
position around each limit leaves no piece of itself of 6 characters or more (its start is the piece
a cut keeps). Each bound is reached through the code that applies it: failure messages
(MAX_MESSAGE_CHARS), template errors (MAX_MESSAGE), a webhook's refusal and its text answer (a real
HTTP server on 127.0.0.1), the confidence gate's action and a model's unreadable score."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from pal.core import failures, templates
from pal.core.confidence import EstimatorFailed, verbalized_score
from pal.engine import gate
from pal.errors import DeliveryError, DeliveryOutcomeUnknown, TemplateError
from pal.nodes import connector
from pal.nodes.base import StepContext
from pal.plan.model import Node

GRAPH_SECRET = "Qzk-graph-secret-value-for-bounds"  # no digits: a score's text must hold no number
PROVIDER_KEY = "sk-proj-ABCDEFGHJKLMNPQRSTUVWXYZabcdef"  # recognised by its shape only
MARK = "<mark>"
PIECE = 6  # no prefix this long of a credential may survive


@pytest.fixture(autouse=True)
def graph_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_SECRET_BOUNDS_TOKEN", GRAPH_SECRET)


def around(produce: Callable[[str], str], credential: str, limit: int) -> Iterator[tuple[int, str]]:
    """(position, what `produce` made) for the credential starting at every position in
    the message from wholly before the limit to past it. `produce` turns a text into the bounded
    message that quotes it; where the text lands in the message is measured once with a mark."""
    offset = produce(MARK).index(MARK)
    for start in range(limit - len(credential) - 2, limit + 3):
        # Not a word character on either side: a provider key is recognised at a word boundary.
        text = "." * (start - offset) + credential + "," * limit
        yield start, produce(text)


def assert_no_piece_survives(produce: Callable[[str], str], credential: str, limit: int) -> None:
    for start, out in around(produce, credential, limit):
        assert credential[:PIECE] not in out, (start, out[limit - 80:limit + 80])
        assert "," * limit not in out, start  # the message really was cut: its end is gone


def _failure_message(text: str) -> str:
    return str(failures.failure_payload(RuntimeError(text))["message"])


def _template_message(text: str) -> str:
    with pytest.raises(TemplateError) as caught:  # the missing key is quoted in the message
        templates.render_string("{{ input.d[input.k] }}", {"input": {"d": {}, "k": text}})
    return str(caught.value)


def _score_message(text: str) -> str:
    with pytest.raises(EstimatorFailed) as caught:
        verbalized_score(text)
    return str(caught.value)


def _gate_action(text: str) -> str:
    node = Node("hook", "connector", {"url": "https://example.com/hook", "body": "{{ input.text }}"})
    ctx = StepContext(run_id="r", step_id="hook", attempt=1, input={"text": text})
    return str(gate._action(node, ctx)["data"])


@pytest.mark.parametrize("credential", [GRAPH_SECRET, PROVIDER_KEY])
@pytest.mark.parametrize(("produce", "limit"), [
    (_failure_message, failures.MAX_MESSAGE_CHARS),
    (_template_message, templates.MAX_MESSAGE),
    (_score_message, 80),
], ids=["failure", "template", "score"])
def test_a_journaled_message_is_redacted_before_it_is_cut(produce: Callable[[str], str], limit: int,
                                                          credential: str) -> None:
    assert_no_piece_survives(produce, credential, limit)


def test_the_gates_action_is_scrubbed_before_it_is_cut() -> None:
    # What an approval shows of the action: a graph secret in it is replaced, then the text cut.
    assert_no_piece_survives(_gate_action, GRAPH_SECRET, gate._MAX_ACTION_CHARS)


class _Answers(ThreadingHTTPServer):
    """A receiver on 127.0.0.1 that answers every request with `status` and `text` (text/plain)."""

    status = 200
    text = ""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()


class _Answer(BaseHTTPRequestHandler):
    server: _Answers

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = self.server.text.encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def answers() -> Iterator[_Answers]:
    server = _Answers()
    yield server
    server.shutdown()
    server.server_close()


def _webhook(server: _Answers, status: int) -> Callable[[str], str]:
    """What a connector's delivery makes of an answer: its error's message, or its delivered body."""
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"

    async def answer() -> str:
        async with httpx.AsyncClient(trust_env=False) as client:
            send = connector._sender(client, lambda: client.build_request("POST", url, json={}), "127.0.0.1",
                                     (ipaddress.IPv4Address("127.0.0.1"),), None, "webhook POST", 10)
            try:
                return str((await send())["body"])
            except (DeliveryError, DeliveryOutcomeUnknown) as exc:
                return str(exc)

    def produce(text: str) -> str:
        server.status, server.text = status, text
        return asyncio.run(answer())

    return produce


@pytest.mark.parametrize("credential", [GRAPH_SECRET, PROVIDER_KEY])
@pytest.mark.parametrize("status", [400, 503])
def test_a_refused_webhooks_answer_is_redacted_before_it_is_cut(answers: _Answers, status: int,
                                                                credential: str) -> None:
    assert_no_piece_survives(_webhook(answers, status), credential, 500)


def test_a_delivered_text_answer_is_scrubbed_before_it_is_cut(answers: _Answers) -> None:
    # The step's own data: only secret values are replaced (docs/security.md), then the text bounded.
    assert_no_piece_survives(_webhook(answers, 200), GRAPH_SECRET, connector.MAX_TEXT_ANSWER_CHARS)
