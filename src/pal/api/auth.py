"""Bearer tokens: every /v1 route needs `Authorization: Bearer <token>`; the token names a tenant,
and every query is scoped to it (another tenant's run is a 404, never a 403 that leaks it).

The dashboard's HttpOnly cookie holds the same token; a browser sends it by itself, so a
state-changing request it authenticates must also pass the CSRF checks of `pal.api.csrf`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from pal.api.csrf import HEADER, UNSAFE_METHODS, require_same_origin, session_token


@dataclass(frozen=True)
class Caller:
    tenant_id: str
    # The presented secret (never in a repr): a long-lived stream re-checks that it is still live.
    token: str = field(repr=False)
    token_name: str = ""  # the token's name (`pal tokens create --name`): who decides an approval

    @property
    def decider(self) -> str:
        """Who a decision made with this token is journaled as (approval_decided's `by`)."""
        return f"token:{self.token_name}"


COOKIE = "pal_token"  # the dashboard's HttpOnly cookie holds the same bearer token


def presented_credential(request: Request) -> tuple[str | None, bool]:
    """The bearer token of the request and whether it came from the dashboard's cookie (the
    Authorization header wins)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip(), False
    cookie = request.cookies.get(COOKIE) or None
    return cookie, cookie is not None


def presented_token(request: Request) -> str | None:
    """The bearer token of the request: the Authorization header, else the dashboard's cookie."""
    return presented_credential(request)[0]


def tenant_of(request: Request, token: str) -> str | None:
    owner = request.app.state.runtime.control.token_owner(token)
    return owner[0] if owner else None


def bearer(request: Request) -> Caller:
    token, from_cookie = presented_credential(request)
    if token is None:
        raise HTTPException(401, "missing bearer token: send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
    owner = request.app.state.runtime.control.token_owner(token)
    if owner is None:
        raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
    if from_cookie and request.method in UNSAFE_METHODS:
        require_same_origin(request, request.headers.get(HEADER), session_token(token))
    return Caller(tenant_id=owner[0], token=token, token_name=owner[1])


Auth = Annotated[Caller, Depends(bearer)]  # module level: FastAPI resolves annotations by name here
