"""Cross-site request forgery defence for what a browser authenticates by itself: the dashboard's
cookie (docs/api.md, "The dashboard").

SameSite=Strict keeps the cookie off cross-site requests, but not off same-site ones (another port
or subdomain of the same site), so every state-changing request the cookie authenticates must
also pass two checks:

* where it comes from: a foreign `Origin` (or, without one, `Referer`), or a `Sec-Fetch-Site` of
  `cross-site`/`same-site`, is refused outright;
* a token only this origin's pages know: the HMAC of the session's bearer token, put in each
  page's forms and `<meta name="csrf-token">` (the dashboard's script sends it as `X-CSRF-Token`).
  Before login there is no session: the login form carries a random value that must equal its
  HttpOnly cookie (double submit).

The token check is what a same-origin form relies on: under `Referrer-Policy: no-referrer` a
browser sends `Origin: null` on a form POST, so the origin check alone cannot tell it apart."""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FORM_FIELD = "csrf"
HEADER = "x-csrf-token"
LOGIN_COOKIE = "pal_login_csrf"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CONTEXT = b"pal dashboard csrf v1"


def session_token(bearer_token: str) -> str:
    """The CSRF token of a session: it cannot be computed without the HttpOnly bearer token, and
    the bearer token cannot be recovered from it."""
    return hmac.new(bearer_token.encode(), _CONTEXT, hashlib.sha256).hexdigest()


def _endpoint(scheme: str, netloc: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname.lower(), port


def same_origin(url: str, host: str) -> bool:
    """Whether `url` (an Origin or Referer) names the host and port the request was sent to."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return False
    theirs, mine = _endpoint(scheme, parts.netloc), _endpoint(scheme, host)
    return theirs is not None and theirs == mine


def provenance(request: Request) -> Literal["same", "foreign", "unknown"]:
    """Where the browser says the request comes from; "unknown" when it does not say (no Origin,
    `Origin: null`, no Referer), which leaves the decision to the token."""
    site = request.headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return "foreign"
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        return "same" if same_origin(origin, host) else "foreign"
    referer = request.headers.get("referer")
    if referer:
        return "same" if same_origin(referer, host) else "foreign"
    return "unknown"


def require_same_origin(request: Request, presented: str | None, expected: str | None) -> None:
    """403 unless the request is not from another origin and carries the expected token."""
    if provenance(request) == "foreign":
        raise HTTPException(403, "cross-origin request refused (CSRF)")
    if not presented or not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
