"""The signal route of /v1: tell a run of the caller's tenant something (pal.engine.signals)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from pal.api.auth import Auth
from pal.api.bodies import Signal
from pal.api.deps import Rt
from pal.engine.signals import send_signal

router = APIRouter()


@router.post("/v1/runs/{run_id}/signals/{name}", status_code=202)
def signal(run_id: str, name: Annotated[str, Path(max_length=64)], caller: Auth, rt: Rt,
           body: Signal | None = None) -> dict[str, Any]:
    """Send signal `name` with `payload` to the run: a `wait_event` step waiting for it takes it
    now, else the next one does. 404 for another tenant's run, 409 for a finished one or one holding
    1,000 untaken signals, 422 for a bad name or payload (over 64 KiB as JSON); nothing is kept then."""
    signal_id = send_signal(rt, run_id, name, body.payload if body else None, tenant_id=caller.tenant_id,
                            by=caller.decider)
    return {"signal_id": signal_id, "run_id": run_id, "name": name}
