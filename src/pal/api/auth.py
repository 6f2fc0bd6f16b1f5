"""Bearer tokens: every /v1 route needs `Authorization: Bearer <token>`; the token names a tenant,
and every query is scoped to it (another tenant's run is a 404, never a 403 that leaks it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from pal.journal import Journal


@dataclass(frozen=True)
class Caller:
    tenant_id: str


COOKIE = "pal_token"  # the dashboard's HttpOnly cookie holds the same bearer token


def presented_token(request: Request) -> str | None:
    """The bearer token of the request: the Authorization header, else the dashboard's cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE) or None


def tenant_of(request: Request, token: str) -> str | None:
    journal: Journal = request.app.state.runtime.journal
    return journal.token_tenant(token)


def bearer(request: Request) -> Caller:
    token = presented_token(request)
    if token is None:
        raise HTTPException(401, "missing bearer token: send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
    tenant = tenant_of(request, token)
    if tenant is None:
        raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return Caller(tenant_id=tenant)


Auth = Annotated[Caller, Depends(bearer)]  # module level: FastAPI resolves annotations by name here
