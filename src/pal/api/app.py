"""Routes under /v1. Each route calls the run services (pal.engine.runs, pal.engine.waiting,
pal.engine.recovery) or the journal's named reads; none writes SQL itself. Errors map to
statuses with a JSON `detail`:
400 NUL or a lone surrogate in the path or query, 401 no/invalid token, 403 a cookie-authenticated
change that fails the CSRF checks, 404 no such run (or another tenant's), 409 refused in the run's
state (or a run id that is not available), 413 a body over the cap, 422 invalid graph or input
(with every problem), 429 the tenant has PAL_MAX_RUNS_IN_FLIGHT runs in flight, 503 the journal
database failed. The guards of pal.api.limits and pal.api.headers wrap the whole app."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, model_validator
from sse_starlette.sse import EventSourceResponse
from starlette.types import ASGIApp

from pal.api.auth import Auth, Caller, tenant_of
from pal.api.headers import SecurityHeaders, add_docs
from pal.api.limits import BodyLimit, UnstorableUrl, max_request_bytes, unstorable_problem
from pal.api.notify import JournalNotifier
from pal.config import Settings
from pal.core.records import Event, RunRecord
from pal.core.vocabulary import IN_FLIGHT_STATUSES, TERMINAL_EVENT_KINDS, TERMINAL_STATUSES
from pal.engine.runtime import Runtime
from pal.errors import (
    GraphError,
    InputError,
    PalError,
    QuotaExceeded,
    Refused,
    RunNotFound,
    StorageError,
)
from pal.storage.database import normalize_url

STATUSES = (*IN_FLIGHT_STATUSES, "waiting", *TERMINAL_STATUSES)
SSE_POLL_SECONDS = 0.2  # SQLite: how often a stream looks for new events
NOTIFY_FALLBACK_SECONDS = 2.0  # Postgres: streams wake on NOTIFY, and poll this often regardless
# An open stream re-checks its token at most this often (between polls): a revoked token's stream
# ends within about NOTIFY_FALLBACK_SECONDS instead of running as long as the run.
TOKEN_RECHECK_SECONDS = 1.0


class GuardedAPI(FastAPI):
    """FastAPI with PAL's guards around its whole middleware stack, Starlette's error handling
    included: security headers on every response (a 500 too), then the body cap and the URL
    check, before any route or token check runs."""

    def __init__(self, *, max_request_bytes: int, **kwargs: Any) -> None:
        self.max_request_bytes = max_request_bytes
        super().__init__(**kwargs)

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(BodyLimit(UnstorableUrl(super().build_middleware_stack()),
                                         self.max_request_bytes))


class Body(BaseModel):
    """A JSON body: refused (422, naming where) when any string or key holds NUL or a lone
    surrogate, before field validation, so neither reaches the journal nor an error echo."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = unstorable_problem(data, "body")
        if problem is not None:
            raise InputError(problem)  # passes through pydantic to the PalError handler: a 422
        return data


class StartRun(Body):
    graph: dict[str, Any] = Field(description="A graph document, or a plain-LLM spec ({\"kind\": \"llm\"})")
    input: Any = None
    run_id: str | None = Field(None, description="Your own id: the same id twice returns the existing run")


class Decision(Body):
    comment: str | None = None
    approval_hash: str | None = Field(None, description="Refuse unless the pending approval has this hash")


class Cancel(Body):
    reason: str | None = None


def _run_json(run: RunRecord) -> dict[str, Any]:
    return run.as_dict()


def _event_json(event: Event) -> dict[str, Any]:
    return event.as_dict()


def create_api(settings: Settings, runtime: Runtime | None = None,
               max_body_bytes: int | None = None) -> FastAPI:
    """The control plane's FastAPI app for `settings` (publishing through the Celery broker).
    Request bodies are capped at `max_body_bytes` (default: `limits.max_request_bytes`)."""
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

    # /docs is served by add_docs under its own CSP; ReDoc is off (its inline styles need
    # 'unsafe-inline') and so is Swagger's OAuth redirect page (PAL uses bearer tokens).
    api = GuardedAPI(max_request_bytes=max_body_bytes or max_request_bytes(settings),
                     title="PAL control plane", version="1", description=__doc__, lifespan=lifespan,
                     docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    api.state.runtime = runtime
    rt = runtime

    @api.exception_handler(PalError)
    async def _pal_error(_: Request, exc: PalError) -> JSONResponse:
        if isinstance(exc, RunNotFound):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        if isinstance(exc, QuotaExceeded):
            return JSONResponse({"detail": str(exc)}, status_code=429)
        if isinstance(exc, Refused):
            return JSONResponse({"detail": str(exc)}, status_code=409)
        if isinstance(exc, GraphError):
            return JSONResponse({"detail": str(exc), "problems": exc.problems}, status_code=422)
        if isinstance(exc, InputError):
            return JSONResponse({"detail": str(exc)}, status_code=422)
        if isinstance(exc, StorageError):
            return JSONResponse({"detail": "the journal database failed; try again"}, status_code=503)
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @api.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input: a non-JSON body is echoed as bytes, which were a
        # 500 when not UTF-8. Decode with replacement, and write ASCII JSON, which always encodes.
        as_text = {bytes: lambda b: b.decode("utf-8", "replace")}
        detail = jsonable_encoder(exc.errors(), custom_encoder=as_text)
        return Response(json.dumps({"detail": detail}), status_code=422, media_type="application/json")

    def own_run(run_id: str, caller: Caller) -> RunRecord:
        return rt.journal.get_run(run_id, tenant_id=caller.tenant_id)

    @api.post("/v1/runs", status_code=201)
    def start(body: StartRun, caller: Auth) -> JSONResponse:
        """Start a run; with `run_id`, idempotent: the same id returns the existing run (200)."""
        from pal.engine.runs import start_run

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
        from pal.engine.runs import cancel as cancel_run

        own_run(run_id, caller)
        return {"cancelled": cancel_run(rt, run_id, by=f"tenant:{caller.tenant_id}",
                                        reason=body.reason if body else None)}

    @api.post("/v1/runs/{run_id}/resume")
    def resume(run_id: str, caller: Auth) -> dict[str, Any]:
        from pal.engine.recovery import ResumeRefused
        from pal.engine.recovery import resume as resume_run

        own_run(run_id, caller)
        try:
            recovery = resume_run(rt, run_id)
        except ResumeRefused as exc:
            raise HTTPException(409, str(exc)) from exc
        return {"generation": recovery.generation, "resumed_steps": list(recovery.resumed_steps)}

    def decide(run_id: str, step_id: str, decision: str, body: Decision | None,
               caller: Caller) -> dict[str, Any]:
        from pal.engine.waiting import decide as decide_step

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
        from pal.engine.waiting import pending_approvals

        own_run(run_id, caller)
        return {"approvals": [p.as_dict() for p in pending_approvals(rt, run_id)]}

    @api.get("/v1/approvals")
    def approvals(caller: Auth, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> dict[str, Any]:
        """Every pending approval of the caller's tenant (each under the run that waits on it)."""
        from pal.engine.waiting import pending_approvals

        found: list[dict[str, Any]] = []
        for run in rt.journal.list_runs(tenant_id=caller.tenant_id, status="waiting", limit=limit):
            found += [p.as_dict() for p in pending_approvals(rt, run.id) if p.depth == 0]
        return {"approvals": found}

    @api.get("/v1/runs/{run_id}/waterfall")
    def waterfall(run_id: str, caller: Auth) -> dict[str, Any]:
        """The run waterfall: one row per step on a shared time axis (what the dashboard draws)."""
        from pal.api.waterfall import waterfall as build
        from pal.core.clock import utcnow

        run = own_run(run_id, caller)
        return build(run, rt.journal.events(run_id), utcnow())

    @api.get("/v1/runs/{run_id}/events")
    async def events(run_id: str, caller: Auth, request: Request,
                     last_event_id: Annotated[str | None, Header()] = None,
                     after: Annotated[int | None, Query(ge=0)] = None) -> EventSourceResponse:
        """The journal as it lands (Server-Sent Events; `id` is the event's seq). `Last-Event-ID`
        (or `?after=`) resumes exactly after that event; the stream ends after the terminal event,
        or soon after its token is revoked."""
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

        def token_live() -> bool:
            return tenant_of(request, caller.token) == caller.tenant_id

        async def journal_stream(woken: asyncio.Event | None) -> AsyncIterator[dict[str, Any]]:
            last = start
            loop = asyncio.get_running_loop()
            recheck_at = loop.time() + TOKEN_RECHECK_SECONDS
            while True:
                if loop.time() >= recheck_at:
                    if not await anyio.to_thread.run_sync(token_live):
                        return  # revoked: a browser's EventSource reconnects and gets its 401
                    recheck_at = loop.time() + TOKEN_RECHECK_SECONDS
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

    add_docs(api)
    add_dashboard(api, rt)
    return api
