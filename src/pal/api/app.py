"""Routes under /v1. Each route calls the run services (pal.runs, pal.waiting, pal.recovery) or the
journal's named reads; none writes SQL itself. Errors map to statuses with a JSON `detail`:
401 no/invalid token, 404 no such run (or another tenant's), 409 refused in the run's state,
422 invalid graph or input (with every problem), 503 the journal database failed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from pal.api.auth import Auth, Caller
from pal.api.notify import JournalNotifier
from pal.config import Settings
from pal.database import normalize_url
from pal.errors import GraphError, InputError, PalError, Refused, RunNotFound, StorageError
from pal.journal import Event, RunRecord
from pal.runtime import Runtime
from pal.schema import IN_FLIGHT_STATUSES, TERMINAL_EVENT_KINDS, TERMINAL_STATUSES

STATUSES = (*IN_FLIGHT_STATUSES, "waiting", *TERMINAL_STATUSES)
SSE_POLL_SECONDS = 0.2  # SQLite: how often a stream looks for new events
NOTIFY_FALLBACK_SECONDS = 2.0  # Postgres: streams wake on NOTIFY, and poll this often regardless


class StartRun(BaseModel):
    graph: dict[str, Any] = Field(description="A graph document, or a plain-LLM spec ({\"kind\": \"llm\"})")
    input: Any = None
    run_id: str | None = Field(None, description="Your own id: the same id twice returns the existing run")


class Decision(BaseModel):
    comment: str | None = None
    approval_hash: str | None = Field(None, description="Refuse unless the pending approval has this hash")


class Cancel(BaseModel):
    reason: str | None = None


def _run_json(run: RunRecord) -> dict[str, Any]:
    return run.as_dict()


def _event_json(event: Event) -> dict[str, Any]:
    return event.as_dict()


def create_api(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The control plane's FastAPI app for `settings` (publishing through the Celery broker)."""
    if runtime is None:
        from pal.workers.app import create_app

        runtime = create_app(settings).runtime
    notifier = (JournalNotifier(settings.database_url)
                if normalize_url(settings.database_url).get_backend_name() == "postgresql" else None)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if notifier is not None:
            notifier.start(asyncio.get_running_loop())
        yield
        if notifier is not None:
            notifier.stop()

    api = FastAPI(title="PAL control plane", version="1", description=__doc__, lifespan=lifespan)
    api.state.runtime = runtime
    rt = runtime

    @api.exception_handler(PalError)
    async def _pal_error(_: Request, exc: PalError) -> JSONResponse:
        if isinstance(exc, RunNotFound):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        if isinstance(exc, Refused):
            return JSONResponse({"detail": str(exc)}, status_code=409)
        if isinstance(exc, GraphError):
            return JSONResponse({"detail": str(exc), "problems": exc.problems}, status_code=422)
        if isinstance(exc, InputError):
            return JSONResponse({"detail": str(exc)}, status_code=422)
        if isinstance(exc, StorageError):
            return JSONResponse({"detail": "the journal database failed; try again"}, status_code=503)
        return JSONResponse({"detail": str(exc)}, status_code=400)

    def own_run(run_id: str, caller: Caller) -> RunRecord:
        return rt.journal.get_run(run_id, tenant_id=caller.tenant_id)

    @api.post("/v1/runs", status_code=201)
    def start(body: StartRun, caller: Auth) -> JSONResponse:
        """Start a run; with `run_id`, idempotent: the same id returns the existing run (200)."""
        from pal.runs import start_run

        if body.run_id is not None:
            try:
                existing = rt.journal.get_run(body.run_id)
            except RunNotFound:
                existing = None
            if existing is not None and existing.tenant_id != caller.tenant_id:
                raise HTTPException(409, f"run id {body.run_id!r} is taken")
        record, created = start_run(rt, body.graph, body.input, run_id=body.run_id,
                                    tenant_id=caller.tenant_id)
        return JSONResponse(_run_json(record), status_code=201 if created else 200)

    @api.get("/v1/runs")
    def list_runs(caller: Auth, status: Annotated[str | None, Query()] = None,
                  limit: Annotated[int, Query(ge=1, le=500)] = 50,
                  offset: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
        """Runs of the caller's tenant, newest first."""
        if status is not None and status not in STATUSES:
            raise HTTPException(422, f"unknown status {status!r} (one of: {', '.join(STATUSES)})")
        records = rt.journal.list_runs(tenant_id=caller.tenant_id, status=status, limit=limit + 1,
                                       offset=offset)
        return {"runs": [_run_json(r) for r in records[:limit]],
                "next_offset": offset + limit if len(records) > limit else None}

    @api.get("/v1/runs/{run_id}")
    def get_run(run_id: str, caller: Auth) -> dict[str, Any]:
        return _run_json(own_run(run_id, caller))

    @api.get("/v1/runs/{run_id}/journal")
    def journal(run_id: str, caller: Auth, after: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
        """The run's journal events after `after` (a seq), as JSON."""
        own_run(run_id, caller)
        return {"events": [_event_json(e) for e in rt.journal.events(run_id, after)]}

    @api.post("/v1/runs/{run_id}/cancel")
    def cancel(run_id: str, caller: Auth, body: Cancel | None = None) -> dict[str, Any]:
        from pal.waiting import cancel as cancel_run

        own_run(run_id, caller)
        return {"cancelled": cancel_run(rt, run_id, by=f"tenant:{caller.tenant_id}",
                                        reason=body.reason if body else None)}

    @api.post("/v1/runs/{run_id}/resume")
    def resume(run_id: str, caller: Auth) -> dict[str, Any]:
        from pal.recovery import ResumeRefused
        from pal.recovery import resume as resume_run

        own_run(run_id, caller)
        try:
            recovery = resume_run(rt, run_id)
        except ResumeRefused as exc:
            raise HTTPException(409, str(exc)) from exc
        return {"generation": recovery.generation, "resumed_steps": list(recovery.resumed_steps)}

    def decide(run_id: str, step_id: str, decision: str, body: Decision | None,
               caller: Caller) -> dict[str, Any]:
        from pal.waiting import decide as decide_step

        own_run(run_id, caller)
        outcome = decide_step(rt, run_id, step_id, decision, by=f"tenant:{caller.tenant_id}",
                              comment=body.comment if body else None,
                              expected_hash=body.approval_hash if body else None)
        return {"decision": decision, "dispatched": list(outcome.dispatch), "finished": outcome.finished}

    @api.post("/v1/runs/{run_id}/steps/{step_id}/approve")
    def approve(run_id: str, step_id: str, caller: Auth, body: Decision | None = None) -> dict[str, Any]:
        return decide(run_id, step_id, "approved", body, caller)

    @api.post("/v1/runs/{run_id}/steps/{step_id}/reject")
    def reject(run_id: str, step_id: str, caller: Auth, body: Decision | None = None) -> dict[str, Any]:
        return decide(run_id, step_id, "rejected", body, caller)

    @api.get("/v1/runs/{run_id}/approvals")
    def run_approvals(run_id: str, caller: Auth) -> dict[str, Any]:
        """Pending approvals of the run and of its child runs (nested)."""
        from pal.waiting import pending_approvals

        own_run(run_id, caller)
        return {"approvals": [p.as_dict() for p in pending_approvals(rt, run_id)]}

    @api.get("/v1/approvals")
    def approvals(caller: Auth, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict[str, Any]:
        """Every pending approval of the caller's tenant (each under the run that waits on it)."""
        from pal.waiting import pending_approvals

        found: list[dict[str, Any]] = []
        for run in rt.journal.list_runs(tenant_id=caller.tenant_id, status="waiting", limit=limit):
            found += [p.as_dict() for p in pending_approvals(rt, run.id) if p.depth == 0]
        return {"approvals": found}

    @api.get("/v1/runs/{run_id}/waterfall")
    def waterfall(run_id: str, caller: Auth) -> dict[str, Any]:
        """The run waterfall: one row per step on a shared time axis (what the dashboard draws)."""
        from pal.api.waterfall import waterfall as build
        from pal.steps import utcnow

        run = own_run(run_id, caller)
        return build(run, rt.journal.events(run_id), utcnow())

    @api.get("/v1/runs/{run_id}/events")
    async def events(run_id: str, caller: Auth,
                     last_event_id: Annotated[str | None, Header()] = None,
                     after: Annotated[int | None, Query(ge=0)] = None) -> EventSourceResponse:
        """The journal as it lands (Server-Sent Events; `id` is the event's seq). `Last-Event-ID`
        (or `?after=`) resumes exactly after that event; the stream ends after the terminal event."""
        await anyio.to_thread.run_sync(own_run, run_id, caller)
        try:
            start = int(last_event_id) if last_event_id else (after or 0)
        except ValueError as exc:
            raise HTTPException(422, "Last-Event-ID must be an event seq (a whole number)") from exc

        async def stream() -> AsyncIterator[dict[str, Any]]:
            woken = notifier.subscribe(run_id) if notifier is not None else None
            try:
                async for item in journal_stream(woken):
                    yield item
            finally:
                if notifier is not None and woken is not None:
                    notifier.unsubscribe(run_id, woken)

        async def journal_stream(woken: asyncio.Event | None) -> AsyncIterator[dict[str, Any]]:
            last = start
            while True:
                batch = await anyio.to_thread.run_sync(rt.journal.events, run_id, last)
                for event in batch:
                    last = event.seq
                    yield {"id": str(event.seq), "event": event.kind, "data": json.dumps(_event_json(event))}
                    if event.kind in TERMINAL_EVENT_KINDS:
                        return
                if not batch:
                    run = await anyio.to_thread.run_sync(rt.journal.get_run, run_id)
                    if run.terminal and not await anyio.to_thread.run_sync(rt.journal.events, run_id, last):
                        return
                if woken is None:
                    await asyncio.sleep(SSE_POLL_SECONDS)
                    continue
                with contextlib.suppress(TimeoutError):  # a missed NOTIFY costs one fallback poll
                    await asyncio.wait_for(woken.wait(), NOTIFY_FALLBACK_SECONDS)
                woken.clear()

        return EventSourceResponse(stream())

    from pal.api.dashboard import add_dashboard

    add_dashboard(api, rt)
    return api
