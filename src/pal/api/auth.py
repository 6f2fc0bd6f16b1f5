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


def bearer(request: Request) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "missing bearer token: send Authorization: Bearer <token>",
                            headers={"WWW-Authenticate": "Bearer"})
    journal: Journal = request.app.state.runtime.journal
    tenant = journal.token_tenant(token.strip())
    if tenant is None:
        raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return Caller(tenant_id=tenant)


Auth = Annotated[Caller, Depends(bearer)]  # module level: FastAPI resolves annotations by name here
