"""What the routers receive from the app rather than import: the runtime and the journal
notifier that `pal.api.app.create_api` puts on `api.state`, as FastAPI dependencies, and the
tenant-scoped run lookup every run route starts with.

Routes take `rt: Rt` instead of closing over a runtime, so the routers are plain module-level
`APIRouter`s that any app (or test) can include with its own runtime."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from pal.api.auth import Caller
from pal.core.records import RunRecord
from pal.engine.runtime import Runtime
from pal.storage.notify import JournalNotifier


# async: reading app state needs no thread, and a sync dependency would cost every request a hop
# to the threadpool.
async def runtime_of(request: Request) -> Runtime:
    """The runtime the app was built with."""
    runtime: Runtime = request.app.state.runtime
    return runtime


async def notifier_of(request: Request) -> JournalNotifier | None:
    """The Postgres LISTEN/NOTIFY notifier of the app, None when the journal is not Postgres."""
    notifier: JournalNotifier | None = request.app.state.notifier
    return notifier


Rt = Annotated[Runtime, Depends(runtime_of)]  # module level: FastAPI resolves annotations by name
Notifier = Annotated[JournalNotifier | None, Depends(notifier_of)]


def own_run(rt: Runtime, run_id: str, caller: Caller) -> RunRecord:
    """The run if it belongs to the caller's tenant; RunNotFound (a 404) otherwise, so another
    tenant's run cannot be told apart from no run at all."""
    return rt.control.get_run(run_id, tenant_id=caller.tenant_id)
