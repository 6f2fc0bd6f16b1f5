"""Retry and fork (docs/retry-and-fork.md): POST /v1/runs/{run_id}/retry and /fork create a new run
derived from one of the caller's finished runs (pal.engine.lineage). 201 with the new run's id, its
source and the kind; the same `run_id` asked again for the same work is 200 with the same answer.
Another tenant's run is a 404 like a missing one; a source in the wrong state a 409; an unknown step
or a bad input a 422; PAL_MAX_RUNS_IN_FLIGHT reached a 429."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from pal.api.auth import Auth
from pal.api.bodies import ForkRun, RetryRun
from pal.api.deps import Rt
from pal.engine.lineage import SAME_INPUT, fork_run, retry_run
from pal.storage.lineage import Derived

router = APIRouter()


def _answer(derived: Derived) -> JSONResponse:
    run = derived.run
    return JSONResponse({"run_id": run.id, "source_run_id": run.source_run_id, "kind": run.source_kind},
                        status_code=201 if derived.created else 200)


@router.post("/v1/runs/{run_id}/retry", status_code=201)
def retry(run_id: str, caller: Auth, rt: Rt, body: RetryRun | None = None) -> JSONResponse:
    """A new run that retries a failed or cancelled run: its completed steps reused, the others
    run again; with `graph`, on that fixed graph."""
    return _answer(retry_run(rt, run_id, run_id=body.run_id if body else None, tenant_id=caller.tenant_id,
                             graph=body.graph if body else None))


@router.post("/v1/runs/{run_id}/fork", status_code=201)
def fork(run_id: str, body: ForkRun, caller: Auth, rt: Rt) -> JSONResponse:
    """A new run from a finished run's step `from_step` on, with the source's input or `input`:
    the completed steps neither at nor after `from_step` are reused."""
    new_input = body.input if "input" in body.model_fields_set else SAME_INPUT
    return _answer(fork_run(rt, run_id, body.from_step, new_input, run_id=body.run_id,
                            tenant_id=caller.tenant_id))
