"""The run routes of /v1: start a run, list and read runs, their journal and waterfall, cancel
and resume. Each calls a run service (pal.engine.runs, pal.engine.recovery) or a named read of the
journal, always scoped to the caller's tenant."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi.responses import JSONResponse

from pal.api.auth import Auth
from pal.api.bodies import Cancel, StartRun
from pal.api.deps import Rt, own_run
from pal.api.steps import drawn
from pal.core.run_filters import MAX_GRAPH_CHARS, MAX_OFFSET, MAX_SEARCH_CHARS, MAX_TIME_CHARS, run_filter
from pal.engine.recovery import resume as resume_run
from pal.engine.runs import cancel as cancel_run
from pal.engine.runs import start_run

router = APIRouter()

# Route functions keep their names: FastAPI derives each route's name, summary and OpenAPI
# operationId from them, and clients may rely on those.


@router.post("/v1/runs", status_code=201)
def start(body: StartRun, caller: Auth, rt: Rt,
          traceparent: Annotated[str | None, Header(max_length=256)] = None) -> JSONResponse:
    """Start a run; with `run_id`, idempotent: the same id, graph and input return the existing run
    (200), the same id for another graph or input is a 409; a live `dedupe_key` returns its run
    (200); a `debounce_key` run waits `debounce`, and a newer start with the key cancels it. A W3C
    `traceparent` header is what the run's first trace links to (an invalid one is ignored)."""
    record, created = start_run(rt, body.graph, body.input, run_id=body.run_id, limits=body.limits,
                                tenant_id=caller.tenant_id, traceparent=traceparent,
                                dedupe_key=body.dedupe_key, dedupe_window=body.dedupe_window,
                                debounce_key=body.debounce_key, debounce=body.debounce,
                                priority=body.priority)
    return JSONResponse(record.as_dict(), status_code=201 if created else 200)


@router.get("/v1/runs")
def list_runs(caller: Auth, rt: Rt, status: Annotated[str | None, Query(max_length=32)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
              graph: Annotated[str | None, Query(max_length=MAX_GRAPH_CHARS)] = None,
              search: Annotated[str | None, Query(max_length=MAX_SEARCH_CHARS)] = None,
              since: Annotated[str | None, Query(max_length=MAX_TIME_CHARS)] = None,
              until: Annotated[str | None, Query(max_length=MAX_TIME_CHARS)] = None) -> dict[str, Any]:
    """Runs of the caller's tenant, newest first (created_at, then id: a stable order to page
    through). Filters: `status`, `graph` (the graph's name, exactly), `search` (text in the run id,
    any case), `since` (inclusive) and `until` (exclusive): creation time, ISO 8601, UTC unless an
    offset is given. A malformed or oversized filter is a 422."""
    try:
        chosen = run_filter(status=status, graph=graph, search=search, since=since, until=until)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    # One more than a page: whether it comes back says if there is a next page.
    records = rt.control.list_runs(tenant_id=caller.tenant_id, limit=limit + 1, offset=offset,
                                   **chosen.as_kwargs())
    return {"runs": [r.as_dict() | {"graph_name": r.graph_name} for r in records[:limit]],
            "next_offset": offset + limit if len(records) > limit else None}


@router.get("/v1/runs/{run_id}")
def get_run(run_id: str, caller: Auth, rt: Rt) -> dict[str, Any]:
    """The run; `derived_runs` lists the runs retried or forked from it (docs/retry-and-fork.md)."""
    return own_run(rt, run_id, caller).as_dict() | {"derived_runs": rt.control.derived_runs(run_id)}


@router.get("/v1/runs/{run_id}/journal")
def journal(run_id: str, caller: Auth, rt: Rt, after: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
    """The run's journal events after `after` (a seq), as JSON."""
    own_run(rt, run_id, caller)
    return {"events": [e.as_dict() for e in rt.control.events(run_id, after)]}


@router.post("/v1/runs/{run_id}/cancel")
def cancel(run_id: str, caller: Auth, rt: Rt, body: Cancel | None = None) -> dict[str, Any]:
    own_run(rt, run_id, caller)
    return {"cancelled": cancel_run(rt, run_id, by=f"tenant:{caller.tenant_id}",
                                    reason=body.reason if body else None)}


@router.post("/v1/runs/{run_id}/resume")
def resume(run_id: str, caller: Auth, rt: Rt) -> dict[str, Any]:
    own_run(rt, run_id, caller)
    recovery = resume_run(rt, run_id)  # ResumeRefused: a 409 (pal.api.errors)
    return {"generation": recovery.generation, "resumed_steps": list(recovery.resumed_steps)}


@router.get("/v1/runs/{run_id}/waterfall")
def waterfall(run_id: str, caller: Auth, rt: Rt) -> dict[str, Any]:
    """The run waterfall: one row per step on a shared time axis, each attempt its own bar, the
    plan's unrun nodes as skipped rows, and the run's graph laid out as a DAG (what the dashboard
    draws, docs/api.md, "The dashboard")."""
    run = own_run(rt, run_id, caller)
    return drawn(rt, run, rt.control.events(run_id))


@router.get("/v1/runs/{run_id}/anomalies")
def run_anomalies(run_id: str, caller: Auth, rt: Rt,
                  limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict[str, Any]:
    """The anomalies journaled for the run (docs/anomalies.md), newest first."""
    own_run(rt, run_id, caller)
    return {"anomalies": rt.control.anomalies(run_id=run_id, limit=limit)}


@router.get("/v1/anomalies")
def anomalies(caller: Auth, rt: Rt, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict[str, Any]:
    """The anomalies of every run of the caller's tenant, newest first."""
    return {"anomalies": rt.control.anomalies(tenant_id=caller.tenant_id, limit=limit)}
