"""Celery tasks with stable names, so other services can `send_task` without importing PAL.

Each task is a thin doorbell handler: it calls the step protocol or the run service, which call
the journal. A message is never the truth.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from pal.core.clock import utcnow
from pal.core.records import ClaimAhead
from pal.engine.recovery import sweep
from pal.engine.runs import start_run
from pal.engine.schedules import fire_due
from pal.engine.signals import send_signal
from pal.engine.steps import execute_step
from pal.engine.vms import spawn_vm
from pal.errors import GraphError, InputError, Refused, RunNotFound, StepFailed
from pal.workers.publishing import TakeBack
from pal.workers.task_names import (
    CLAIM_AHEAD,
    EXECUTE_NODE,
    FIRE_SCHEDULES,
    RECOMPUTE_BASELINES,
    RUNS_NEXT,
    SENT_AT_HEADER,
    SIGNAL,
    SPAWN_VM,
    START_RUN,
    SWEEP_ORPHANS,
)

log = logging.getLogger(__name__)


# Delivery semantics per task, so that they hold on an app whose
# own defaults differ (pal.install): a message is acknowledged after its step, given back if its
# worker is lost, JSON only, no result stored.
PER_TASK: dict[str, Any] = {
    "acks_late": True, "reject_on_worker_lost": True, "acks_on_failure_or_timeout": True,
    "serializer": "json", "ignore_result": True, "store_errors_even_if_ignored": False, "send_events": True,
}


def register_tasks(app: Celery) -> None:
    """Register PAL's tasks on `app` (PAL's own app, or a team's: pal.install), whose `runtime` they
    use. Every sender of PAL names its queue (PAL_QUEUE, PAL_VM_QUEUE): a task's own `queue`
    attribute is deprecated in Celery 5.7, and task_routes would be the app's setting."""
    task = app.task  # bound (the task is the first argument), one task class per app
    # `throws`: Celery logs a StepFailed in one INFO line; the engine logged it at ERROR with the
    # step's own traceback (pal.engine.steps), which Celery's would only bury.
    task(name=EXECUTE_NODE, bind=True, shared=False, throws=(StepFailed,),
         Strategy="pal.workers.inline:execute_node_strategy", **PER_TASK)(execute_node)
    task(name=SWEEP_ORPHANS, bind=True, shared=False, **PER_TASK)(sweep_orphans)
    task(name=FIRE_SCHEDULES, bind=True, shared=False, **PER_TASK)(fire_schedules)
    task(name=SPAWN_VM, bind=True, shared=False, **PER_TASK)(spawn_vm_task)
    task(name=RECOMPUTE_BASELINES, bind=True, shared=False, **PER_TASK)(recompute_baselines)
    task(name=START_RUN, bind=True, shared=False, **PER_TASK)(start_run_task)
    task(name=SIGNAL, bind=True, shared=False, **PER_TASK)(signal_task)


def execute_node(task: Any, run_id: Any, step_id: Any, generation: Any, signature: Any = None) -> str:
    """Execute one graph node of one run, if the message carries PAL's signature of exactly (run,
    step, generation) (pal.core.doorbell): anyone who reaches the broker can send one. A step that
    failed for good ends the task as FAILURE (StepFailed) for Flower; every other outcome
    (completed, retrying, waiting, stale, duplicate, forged) is a success."""
    rt = task.app.runtime
    if not (isinstance(run_id, str) and isinstance(step_id, str) and type(generation) is int
            and rt.doorbell_is_genuine(run_id, step_id, generation, signature)):
        log.warning("pal.execute_node refused: not a message PAL sent (run %.128r step %.256r "
                    "generation %.32r)", run_id, step_id, generation)
        return "forged"
    sent_at = getattr(task.request, SENT_AT_HEADER, None)
    # A solo worker's (pal.workers.inline): objects, which a message's headers can never forge.
    ahead, runs_next = getattr(task.request, CLAIM_AHEAD, None), getattr(task.request, RUNS_NEXT, None)
    result = execute_step(rt, run_id, step_id, generation,
                          sent_at=sent_at if isinstance(sent_at, float) else None,
                          ahead=ahead if isinstance(ahead, ClaimAhead) else None,
                          runs_next=runs_next if isinstance(runs_next, TakeBack) else None)
    if result.outcome == "failed":
        error = result.error or {}
        raise StepFailed(run_id, step_id, str(error.get("type", "")), str(error.get("message", ""))[:500])
    return result.outcome


def sweep_orphans(task: Any) -> dict[str, Any]:
    """One pass of the orphan sweep (celery beat sends it every PAL_RECOVERY_INTERVAL)."""
    report = sweep(task.app.runtime)
    return {"found": report.found,
            "recovered": {r: rec.generation for r, rec in report.recovered.items()},
            "microvm": report.microvm}


def fire_schedules(task: Any) -> dict[str, Any]:
    """Start the runs of the schedules' due ticks (celery beat sends it every PAL_RECOVERY_INTERVAL)."""
    report = fire_due(task.app.runtime)
    return {"started": report.started, "skipped": report.skipped, "failed": report.failed}


def spawn_vm_task(task: Any, vm_id: Any) -> str:
    """Start one VM of a microVM run on this host (`pal worker --vm-host`; docs/isolated-tier.md)."""
    if not isinstance(vm_id, str):
        return "refused: a VM id is a string"
    return spawn_vm(task.app.runtime, vm_id)


def recompute_baselines(task: Any) -> int:
    """Rewrite the per-node baselines from recent steps (celery beat, every PAL_BASELINE_INTERVAL)."""
    written: int = task.app.runtime.journal.baselines.recompute_baselines(now=utcnow())
    return written


def start_run_task(task: Any, graph: Any, input: Any = None, run_id: str | None = None,
                   tenant_id: str | None = None, dedupe_key: Any = None, dedupe_window: Any = None,
                   debounce_key: Any = None, debounce: Any = None, priority: Any = None) -> dict[str, Any]:
    """Validate and start a run; an invalid request is logged and writes nothing. A `traceparent`
    message header is what the run's first trace links to."""
    if not isinstance(tenant_id, str | None):
        log.error("pal.start_run refused: a tenant id is a string")
        return {"error": "a tenant id is a string"}
    headers = task.request.headers if isinstance(task.request.headers, dict) else {}
    traceparent = getattr(task.request, "traceparent", None) or headers.get("traceparent")
    try:
        record, created = start_run(task.app.runtime, graph, input, run_id=run_id,
                                    tenant_id=tenant_id, traceparent=traceparent, dedupe_key=dedupe_key,
                                    dedupe_window=dedupe_window, debounce_key=debounce_key, debounce=debounce,
                                    priority=priority)
    except (GraphError, InputError, Refused) as exc:
        log.error("pal.start_run refused: %s", exc)
        return {"error": str(exc)}
    return {"run_id": record.id, "created": created}


def signal_task(task: Any, run_id: Any, name: Any, payload: Any = None,
                tenant_id: Any = None) -> dict[str, Any]:
    """Send a signal to a run of `tenant_id` (default this worker's PAL_TENANT), as a service that
    imports no PAL would; a refused one is logged and keeps nothing."""
    rt = task.app.runtime
    if not isinstance(run_id, str) or not isinstance(tenant_id, str | None):
        log.error("pal.signal refused: the run id (and a tenant id, if given) must be strings")
        return {"error": "the run id (and a tenant id, if given) must be strings"}
    tenant = tenant_id if tenant_id is not None else rt.settings.tenant
    try:
        signal_id = send_signal(rt, run_id, name, payload, tenant_id=tenant, by="celery:pal.signal")
    except (InputError, Refused, RunNotFound) as exc:
        log.error("pal.signal refused: %s", exc)
        return {"error": str(exc)}
    return {"signal_id": signal_id}
