"""`POST /v1/runtime/report`: where VM harnesses report (docs/isolated-tier.md).

Authenticated by the VM's own report token, never a tenant's API token: the token is looked up by
its sha256 (the only form stored) and bound to one VM, hence one run of one tenant; an unknown,
foreign, finished or superseded VM gets one indistinguishable 401 and nothing is written. Bodies
are capped like every request's (pal.api.limits).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header
from fastapi.responses import JSONResponse

from pal.api.deps import Rt
from pal.engine.vms import UNKNOWN_VM, report
from pal.errors import Refused

router = APIRouter()


@router.post("/v1/runtime/report", response_model=None)
def runtime_report(rt: Rt, body: Annotated[Any, Body()] = None,
                   authorization: Annotated[str | None, Header()] = None) -> dict[str, Any] | JSONResponse:
    token = authorization[7:] if authorization and authorization[:7].lower() == "bearer " else None
    try:
        return report(rt, token, body)
    except Refused:
        return JSONResponse({"detail": UNKNOWN_VM}, status_code=401)
