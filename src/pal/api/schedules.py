"""The schedule routes of /v1: a tenant's cron schedules (pal.engine.schedules), each by name."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from pal.api.auth import Auth
from pal.api.bodies import AddSchedule
from pal.api.deps import Rt
from pal.engine import schedules as service

router = APIRouter()
Name = Annotated[str, Path(max_length=64)]


@router.post("/v1/schedules", status_code=201)
def create_schedule(body: AddSchedule, caller: Auth, rt: Rt) -> dict[str, Any]:
    """Add a schedule: `graph` runs with `input` at each tick of `cron` in `timezone`. 409 when the
    tenant has one of that name (or 1,000 schedules); 422 for a bad name, cron, zone, overlap, graph
    or input, with nothing written."""
    return service.add_schedule(rt, tenant_id=caller.tenant_id, name=body.name, cron=body.cron,
                                graph=body.graph, run_input=body.input, timezone=body.timezone,
                                overlap=body.overlap, catch_up=body.catch_up).as_dict()


@router.get("/v1/schedules")
def list_schedules(caller: Auth, rt: Rt) -> dict[str, Any]:
    """The tenant's schedules, by name."""
    return {"schedules": [s.as_dict() for s in service.list_schedules(rt, caller.tenant_id)]}


@router.get("/v1/schedules/{name}")
def get_schedule(name: Name, caller: Auth, rt: Rt) -> dict[str, Any]:
    """One schedule, with its graph; 404 when the tenant has none of that name."""
    schedule = service.get_schedule(rt, caller.tenant_id, name)
    return schedule.as_dict() | {"graph": schedule.graph}


@router.post("/v1/schedules/{name}/pause")
def pause_schedule(name: Name, caller: Auth, rt: Rt) -> dict[str, Any]:
    """Pause: no tick runs until it is resumed."""
    return service.pause(rt, caller.tenant_id, name).as_dict()


@router.post("/v1/schedules/{name}/resume")
def resume_schedule(name: Name, caller: Auth, rt: Rt) -> dict[str, Any]:
    """Resume from the cron's next tick after now; the ticks of the pause do not run."""
    return service.resume(rt, caller.tenant_id, name).as_dict()


@router.delete("/v1/schedules/{name}", status_code=204, response_class=Response)
def delete_schedule(name: Name, caller: Auth, rt: Rt) -> Response:
    """Delete it; the runs it started stay."""
    service.delete_schedule(rt, caller.tenant_id, name)
    return Response(status_code=204)  # no body: FastAPI's lowest supported version insists
