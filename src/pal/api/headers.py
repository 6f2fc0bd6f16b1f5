"""Security headers on every response of `pal api`, errors included (docs/api.md, "Security
headers"): a strict Content-Security-Policy, no framing, no MIME sniffing, no Referer.

`SecurityHeaders` is pure ASGI and wraps the whole app, outside Starlette's error middleware, so a
500, a 413 from the body cap and a static file get the same headers as a page."""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The dashboard's own scripts and styles are static files (/static): nothing inline is needed, so
# nothing inline is allowed, and an injected <script> or on*= attribute would not run.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")

ALWAYS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

# /docs is FastAPI's Swagger UI: its bundle and stylesheet come from this CDN, and it starts with
# one inline script, allowed by its hash alone (so an injected script still does not run).
DOCS_CDN = "https://cdn.jsdelivr.net"
DOCS_CSP = ("default-src 'self'; script-src 'self' {cdn} {hashes}; style-src 'self' {cdn}; "
            "img-src 'self' data: https://fastapi.tiangolo.com; connect-src 'self'; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class SecurityHeaders:
    """Adds the headers to every HTTP response start. A response that sets its own CSP (only
    /docs) keeps it; the other headers are always these."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("content-security-policy", CSP)
                for name, value in ALWAYS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def add_docs(api: FastAPI) -> None:
    """/docs (Swagger UI) under a CSP that names its CDN and its one inline script's hash."""
    page = bytes(get_swagger_ui_html(openapi_url=api.openapi_url or "/openapi.json",
                                     title=f"{api.title} - Swagger UI").body)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
                      for script in re.findall(rb"<script>(.*?)</script>", page, re.S))
    policy = DOCS_CSP.format(cdn=DOCS_CDN, hashes=hashes)

    @api.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": policy})
