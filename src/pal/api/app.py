"""Routes under /v1. Each route calls the run services (pal.engine.runs, pal.engine.waiting,
pal.engine.recovery) or the journal's named reads; none writes SQL itself. Errors map to
statuses with a JSON `detail`:
400 NUL or a lone surrogate in the path or query, 401 no/invalid token, 403 a cookie-authenticated
change that fails the CSRF checks, 404 no such run (or another tenant's), 409 refused in the run's
state (or a run id that is not available), 413 a body over the cap, 422 invalid graph or input
(with every problem), 429 the tenant has PAL_MAX_RUNS_IN_FLIGHT runs in flight, 501 receipts are
off (no PAL_SIGNING_KEY), 503 the journal database failed."""

# The docstring above is the API's OpenAPI description (`description=__doc__`), so it speaks to
# clients. This module assembles the control plane: the guarded FastAPI app, its lifespan, the
# error handlers of pal.api.errors and the routers of pal.api.runs, .approvals, .lineage, .stream
# and .dashboard, which reach the runtime and the notifier through pal.api.deps.

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from pal.api import approvals, lineage, receipts, runs, schedules, signals, steps, stream
from pal.api import runtime as runtime_reports
from pal.api.dashboard import add_dashboard
from pal.api.errors import add_error_handlers
from pal.api.headers import SecurityHeaders, add_docs
from pal.api.limits import BodyLimit, UnstorableUrl, max_request_bytes
from pal.config import Settings
from pal.engine.run_receipts import trusted_keys
from pal.engine.runtime import Runtime
from pal.storage.database import normalize_url
from pal.storage.notify import JournalNotifier
from pal.workers.pal_app import create_app


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


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    """The notifier listens while the app serves: it hands wake-ups to this event loop."""
    notifier: JournalNotifier | None = api.state.notifier
    if notifier is not None:
        notifier.start(asyncio.get_running_loop())
    yield
    if notifier is not None:
        notifier.stop()


def journal_notifier(settings: Settings) -> JournalNotifier | None:
    """A LISTEN/NOTIFY notifier for a Postgres journal; None for SQLite, where streams poll."""
    if normalize_url(settings.database_url).get_backend_name() != "postgresql":
        return None
    return JournalNotifier(settings.database_url)


def create_api(settings: Settings, runtime: Runtime | None = None,
               max_body_bytes: int | None = None) -> FastAPI:
    """The control plane's FastAPI app for `settings` (publishing through the Celery broker).
    Request bodies are capped at `max_body_bytes` (default: `limits.max_request_bytes`)."""
    # /docs is served by add_docs under its own CSP; ReDoc is off (its inline styles need
    # 'unsafe-inline') and so is Swagger's OAuth redirect page (PAL uses bearer tokens).
    api = GuardedAPI(max_request_bytes=max_body_bytes or max_request_bytes(settings),
                     title="PAL control plane", version="1", description=__doc__, lifespan=lifespan,
                     docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    api.state.runtime = runtime if runtime is not None else create_app(settings).runtime
    api.state.notifier = journal_notifier(settings)
    add_error_handlers(api)
    if settings.signing_key:  # a bad key stops `pal api` at its start, not at the first receipt
        trusted_keys(settings)
    for router in (runs.router, approvals.router, signals.router, schedules.router, stream.router,
                   runtime_reports.router, receipts.router, lineage.router, steps.router):
        api.include_router(router)
    add_docs(api)
    add_dashboard(api)
    return api
