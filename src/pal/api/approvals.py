"""The approval routes of /v1: decide a step that waits for a human (approve, reject), and list
what waits, for one run (its child runs nested) or for the whole tenant."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from pal.api.auth import Auth, Caller
from pal.api.bodies import Decision
from pal.api.deps import Rt, own_run
from pal.engine.runtime import Runtime
from pal.engine.waiting import decide as decide_step
from pal.engine.waiting import pending_approvals, tenant_approvals

router = APIRouter()


def decide(rt: Runtime, run_id: str, step_id: str, decision: str, body: Decision | None,
           caller: Caller) -> dict[str, Any]:
    """Record `decision` on the caller's run's step; who decided is the caller's token, by name."""
    own_run(rt, run_id, caller)
    outcome = decide_step(rt, run_id, step_id, decision, by=caller.decider,
                          comment=body.comment if body else None,
                          expected_hash=body.approval_hash if body else None)
    return {"decision": decision, "dispatched": list(outcome.dispatch), "finished": outcome.finished}


@router.post("/v1/runs/{run_id}/steps/{step_id}/approve")
def approve(run_id: str, step_id: str, caller: Auth, rt: Rt,
            body: Decision | None = None) -> dict[str, Any]:
    return decide(rt, run_id, step_id, "approved", body, caller)


@router.post("/v1/runs/{run_id}/steps/{step_id}/reject")
def reject(run_id: str, step_id: str, caller: Auth, rt: Rt,
           body: Decision | None = None) -> dict[str, Any]:
    return decide(rt, run_id, step_id, "rejected", body, caller)


@router.get("/v1/runs/{run_id}/approvals")
def run_approvals(run_id: str, caller: Auth, rt: Rt) -> dict[str, Any]:
    """Pending approvals of the run and of its child runs (nested)."""
    own_run(rt, run_id, caller)
    return {"approvals": [p.as_dict() for p in pending_approvals(rt, run_id)]}


@router.get("/v1/approvals")
def approvals(caller: Auth, rt: Rt, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict[str, Any]:
    """Every pending approval of the caller's tenant (each under the run that waits on it)."""
    return {"approvals": [p.as_dict() for p in tenant_approvals(rt, caller.tenant_id, limit)]}
