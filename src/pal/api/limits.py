"""What the control plane refuses before routing or authentication: request bodies over a size cap,
and text Postgres cannot store (NUL, lone surrogates) in the path, the query or a JSON body.

`BodyLimit` and `UnstorableUrl` are pure ASGI middleware wrapped around the whole app (see
`pal.api.app.create_api`), so a body is capped before any route, dependency or token check reads
it (docs/api.md, "Limits")."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pal.config import Settings

# The largest legitimate body is `POST /v1/runs`: a graph (PAL_MAX_GRAPH_BYTES) plus its input
# (PAL_MAX_INPUT_BYTES), measured compactly; the margin leaves room for the rest of the object and
# for a client that pretty-prints its JSON.
REQUEST_BYTES_MARGIN = 1_048_576

# Postgres refuses U+0000 in text and jsonb, and a lone surrogate is not Unicode text at all (it
# cannot be encoded as UTF-8): either would fail at the journal, far from the client's mistake.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def max_request_bytes(settings: Settings) -> int:
    """The request body cap for `settings`: graph + input limits plus `REQUEST_BYTES_MARGIN`."""
    return settings.max_graph_bytes + settings.max_input_bytes + REQUEST_BYTES_MARGIN


async def send_json(send: Send, status: int, detail: str, *, close: bool = False) -> None:
    """A complete JSON error response from ASGI middleware (below the app's own handlers)."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the server closes the connection after the response instead of reading the rest
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyLimit:
    """Refuses a request body over `max_bytes` with 413, before the app sees the request.

    With a Content-Length the verdict is immediate and nothing of the body is read (the server
    ends a body at its declared length, so a length under the cap is trusted). Without one
    (chunked), the body is read here as it arrives, counted, and refused as soon as the count
    passes the cap; a body under the cap is handed to the app as one message. Either way the 413
    asks the server to close the connection rather than drain what the client still sends."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return (f"request body over the limit of {self.max_bytes} bytes "
                "(PAL_MAX_GRAPH_BYTES + PAL_MAX_INPUT_BYTES + 1 MiB)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lengths = {value.strip() for name, value in scope["headers"] if name.lower() == b"content-length"}
        if lengths:
            try:
                [length] = (int(value) for value in lengths)
            except ValueError:
                await send_json(send, 400, "bad Content-Length header", close=True)
                return
            if length > self.max_bytes:
                await send_json(send, 413, self._too_large(), close=True)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body ended: nothing to answer
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await send_json(send, 413, self._too_large(), close=True)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # after the body: the disconnect an SSE stream waits for

        await self.app(scope, replay, send)


class UnstorableUrl:
    """Refuses with 400 a path or query parameter holding NUL or a lone surrogate: the route would
    otherwise pass it to the journal's database, which fails (a 500 or a misleading 503)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = url_problem(scope)
            if problem is not None:
                await send_json(send, 400, problem)
                return
        await self.app(scope, receive, send)


def url_problem(scope: Scope) -> str | None:
    problem = unstorable_problem(scope["path"], "the path")
    if problem is not None:
        return problem
    # Decoded as Starlette decodes it for the routes (UTF-8, bad bytes replaced).
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    for key, value in query:
        problem = unstorable_problem(key, "a query parameter name") or unstorable_problem(
            value, f"query parameter {_name(key)}")
        if problem is not None:
            return problem
    return None


def unstorable_problem(value: Any, where: str) -> str | None:
    """A message naming the first string (value or object key) in `value` that holds NUL or a lone
    surrogate, None when there is none. Iterative: a deeply nested body cannot exhaust the stack."""
    stack: list[tuple[Any, Any]] = [(value, None)]  # (item, its path as a linked (parent, step) pair)
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _UNSTORABLE.search(item)
            if found:
                return _describe(where + _render(path), found.group())
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (found := _UNSTORABLE.search(key)):
                    return _describe(f"a key of {where}{_render(path)}", found.group())
                stack.append((child, (path, key)))
        elif isinstance(item, list):
            stack.extend((child, (path, index)) for index, child in enumerate(item))
    return None


def _render(path: Any) -> str:
    steps: list[str] = []
    while path is not None:
        path, step = path
        steps.append(f"[{step}]" if isinstance(step, int) else
                     f".{step}" if step.isidentifier() else f"[{_name(step)}]")
    return "".join(reversed(steps))


def _name(text: str) -> str:
    # ascii() escapes NUL and surrogates, so the message itself is always storable and encodable.
    return ascii(text if len(text) <= 40 else text[:40] + "...")


def _describe(where: str, char: str) -> str:
    if char == "\x00":
        return (f"{where} contains a NUL character (U+0000), which PAL cannot store; "
                "remove it or encode the data")
    return (f"{where} contains a lone surrogate (U+{ord(char):04X}), which is not valid Unicode "
            "text; send UTF-8 text")
