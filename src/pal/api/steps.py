"""What the dashboard shows of a run beyond the journal's rows: the waterfall with the plan's
skipped nodes and the DAG (`drawn`), and the step panel, GET /v1/runs/{run_id}/steps/{step_id}: the
step's node as the plan defines it, its output, its error (with the traceback when journaled), each
attempt with its idempotency key, its side-effect receipts and its approval.

A step's resolved input is not journaled (`step_started` carries the attempt and the worker only),
so the panel shows what is: the node's definition from the run's plan snapshot. Everything here is
read from the journal, which redacts at the write (pal.core.redact); the node's definition is
redacted again on the way out, as it was never journaled through that function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path

from pal.api.auth import Auth
from pal.api.dag import layout, node_states, plan_view
from pal.api.deps import Rt, own_run
from pal.api.waterfall import waterfall
from pal.core.clock import utcnow
from pal.core.records import Event, RunRecord
from pal.core.redact import redact
from pal.engine.runtime import Runtime
from pal.errors import PalError
from pal.nodes import idempotency_key
from pal.plan.interpreter import Program

router = APIRouter()
_ENDED = ("retrying", "failed")  # the outcomes whose attempt journaled an error
INPUT_NOTE = ("the step's resolved input is not journaled; `node` is its definition in the run's plan, "
              "whose templates were rendered against the outputs above it")


def drawn(rt: Runtime, run: RunRecord, events: Sequence[Event]) -> dict[str, Any]:
    """The waterfall (pal.api.waterfall) with the plan's unrun nodes as rows, and the DAG."""
    completed = {e.step_id: e.payload.get("output") for e in events
                 if e.kind == "step_completed" and e.step_id is not None}
    try:
        program: Program | None = rt.program_of(run)
    except PalError:  # a snapshot this version cannot parse: the journal's rows only
        program = None
    plan = plan_view(program, completed)
    result = waterfall(run, events, utcnow(), plan_nodes=plan.nodes, skipped=plan.skipped)
    result["dag"] = (layout(plan.document, node_states(plan.nodes, result["rows"]))
                     if plan.document is not None else None)
    return result


@router.get("/v1/runs/{run_id}/steps/{step_id}")
def step_panel(run_id: str, step_id: Annotated[str, Path(max_length=256)], caller: Auth,
               rt: Rt) -> dict[str, Any]:
    """One step of the caller's run: node definition, output, error, attempts (each with its
    idempotency key and outcome), receipts and approval. 404 for a step neither journaled nor in
    the plan, as for another tenant's run."""
    run = own_run(rt, run_id, caller)
    events = rt.control.events(run_id)
    mine = [e for e in events if e.step_id == step_id]
    whole = drawn(rt, run, events)
    row = next((r for r in whole["rows"] if r["step_id"] == step_id), None)
    node = _node(rt, run, step_id)
    if row is None and node is None:
        raise HTTPException(404, f"run {run_id} has no step {step_id!r}")
    errors = {e.attempt: e.payload.get("error") for e in mine if e.kind in ("step_retrying", "step_failed")}
    attempts = [bar | {"error": errors.get(bar["attempt"]) if bar["outcome"] in _ENDED else None,
                       "idempotency_key": idempotency_key(run_id, step_id, int(bar["attempt"] or 1))}
                for bar in (row or {}).get("bars", [])]
    completed = next((e for e in mine if e.kind == "step_completed"), None)
    failed = next((e for e in reversed(mine) if e.kind == "step_failed"), None)
    return {
        "run_id": run_id, "step_id": step_id, "status": row["status"] if row else "not reached",
        "skip_reason": row["skip_reason"] if row else None, "node": node, "input": None,
        "input_note": INPUT_NOTE,
        "output": completed.payload.get("output") if completed else None,
        "error": failed.payload.get("error") if failed else None,
        "attempts": attempts, "dead": (row or {}).get("dead", []),
        "idempotency_key": attempts[-1]["idempotency_key"] if attempts else None,
        "receipts": [_receipt(r) for r in rt.control.receipts(run_id) if r["step_id"] == step_id],
        "approval": (row or {}).get("approval"), "child_run_id": (row or {}).get("child_run_id"),
    }


def _node(rt: Runtime, run: RunRecord, step_id: str) -> dict[str, Any] | None:
    """The step's node in the run's plan (a loop's body node for its steps), redacted."""
    try:
        node = rt.program_of(run).node(step_id)
    except (PalError, KeyError):  # a step of no node (an LLM run's turn past its spec, a microVM's)
        return None
    return {"id": node.id, "type": node.type, "data": redact(dict(node.data))}


def _receipt(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("idempotency_key", "attempt", "effect_kind", "target", "status", "response", "created_at",
            "updated_at")
    return {key: row[key] for key in keep}
