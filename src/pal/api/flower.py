"""`pal flower`: Flower with its basic auth on every route (docs/api.md, "Flower").

Flower's `--basic-auth` guards the pages and /api only: its handlers for /metrics (Prometheus,
which names every task and worker) and /healthcheck carry no authentication, nor do its static
files, login and not-found pages. PAL starts Flower with an application whose router answers 401
to any request without valid credentials before choosing a handler, so no route is left open,
including routes a later Flower adds."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence
from typing import Any

import tornado.httputil
import tornado.web

REALM = 'Basic realm="flower"'


def authorized(header: str, credentials: Sequence[str]) -> bool:
    """Whether an Authorization header carries one of `credentials` ("user:password")."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        presented = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    found = False
    for expected in credentials:  # compare with every entry: the time does not tell which matched
        found |= hmac.compare_digest(presented, expected.encode())
    return found


class Unauthorized(tornado.web.RequestHandler):
    """The answer to every request without valid credentials, whatever its path or method."""

    def check_xsrf_cookie(self) -> None:
        """Tornado checks XSRF before prepare(); this request is refused either way, as a 401."""

    def prepare(self) -> None:
        self.set_status(401)
        self.set_header("WWW-Authenticate", REALM)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish("Access denied")


def guard(application: tornado.web.Application, credentials: Sequence[str]) -> None:
    """Make `application` refuse any request without one of `credentials` (before routing)."""
    route = application.find_handler

    def find_handler(request: tornado.httputil.HTTPServerRequest, **kwargs: Any) -> Any:
        if not authorized(request.headers.get("Authorization", ""), credentials):
            return application.get_handler_delegate(request, Unauthorized)
        return route(request, **kwargs)

    application.find_handler = find_handler  # type: ignore[method-assign]


def start_flower(celery_app: Any, basic_auth: str, argv: Sequence[str]) -> None:
    """Run `celery flower` for `celery_app` with `--basic-auth=basic_auth` and `argv`, every route
    of the Flower it builds guarded by that auth."""
    import flower.command  # type: ignore[import-untyped]

    credentials = [pair.strip() for pair in basic_auth.split(",") if pair.strip()]
    build = flower.command.Flower

    def guarded_flower(*args: Any, **kwargs: Any) -> Any:
        application = build(*args, **kwargs)
        guard(application, credentials)
        return application

    # flower.command builds its application by this module-level name when the command runs.
    flower.command.Flower = guarded_flower
    celery_app.start(["flower", f"--basic-auth={basic_auth}", *argv])
