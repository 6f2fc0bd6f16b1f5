"""The isolated tier's control plane (docs/isolated-tier.md): a microVM run's first VM, the VM queue's
spawn, the harness's reports, and the sweep's `resumeMicroVMRun`.

Placement needs no scheduler of PAL's own: spawning a VM is a Celery task on PAL_VM_QUEUE, consumed
by `pal worker --vm-host` on the machines that run VMs, and the decision to spawn one is taken in a
transaction under the run's lock row (the first VM at the start; a resume by the sweep pass that
won the lease), so it is taken once whoever else is sweeping.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import socket
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from pal.core.clock import utcnow
from pal.core.limits import output_problem
from pal.core.records import Fence
from pal.core.redact import redact_bounded
from pal.core.secrets import scrub_known
from pal.core.vms import ResumeAction, VmState
from pal.core.vocabulary import EventKind
from pal.engine.runtime import Runtime
from pal.engine.tracing import end_generation
from pal.errors import InputError, PalError, Refused
from pal.storage.vms import VmOrder, VmRecord
from pal.vms import DriverError, Placement
from pal.vms.drivers import driver_of
from pal.vms.paths import place

log = logging.getLogger(__name__)

_STEP_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-\[\]]{0,199}")
_EVENTS = ("started", "completed", "failed")
MAX_VM_ERROR_CHARS = 2000  # what runtime_vms and the journal keep of a VM's error text
UNKNOWN_VM = "unknown, finished or superseded VM"  # one refusal for every token that may not report


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start_vm(rt: Runtime, run_id: str) -> None:
    """Schedule the first VM of a new microVM run (nothing when it has one: a repeated start)."""
    order = rt.journal.vms.first_vm(run_id=run_id, now=utcnow())
    if order is not None:
        rt.publish_vm(order.vm_id)


def resume_microvm_runs(rt: Runtime, now: datetime, limit: int) -> dict[str, str]:
    """The sweep's path for orphaned microVM runs (never the graph re-drive): resumeMicroVMRun for
    each. Returns run id -> what was decided."""
    decided: dict[str, str] = {}
    stale_after = 2 * rt.settings.lease_ttl
    for run_id in rt.journal.recovery.orphaned_microvm_runs(now=now, limit=limit):
        try:
            action, order = rt.journal.vms.resume_microvm_run(run_id=run_id, now=now, stale_after=stale_after,
                                                              boot_lease=stale_after)
        except PalError:
            log.exception("sweep: resuming microVM run %s failed; the next pass retries", run_id)
            continue
        decided[run_id] = str(action)
        if action is not ResumeAction.SKIP:  # a live VM's generation goes on: no root yet
            _trace_vm_takeover(rt, run_id, order, now)
        if order is not None:
            rt.publish_vm(order.vm_id)
            log.info("sweep: microVM run %s resumed in VM %s (attempt %d)", run_id, order.vm_id,
                     order.attempt)
        elif action is ResumeAction.EXHAUSTED:
            log.warning("sweep: microVM run %s failed: microvm_resume_exhausted", run_id)
    return decided


def _trace_vm_takeover(rt: Runtime, run_id: str, order: VmOrder | None, now: datetime) -> None:
    """The root span of the generation whose VM the sweep found gone (respawned or exhausted)."""
    tracing = rt.tracing
    if tracing is None:
        return
    try:
        run = rt.journal.runs.get_run(run_id)
        vms = rt.journal.vms.vms(run_id)
        lost = [v for v in vms if order is None or v.id != order.vm_id]
        if lost:
            end_generation(tracing, rt.journal, run, lost[-1].generation, now,
                           outcome=run.status if run.terminal else "taken_over", lost=True)
    except PalError:
        log.warning("run %s: the root span of a lost VM's generation was not written", run_id, exc_info=True)


def spawn_vm(rt: Runtime, vm_id: str) -> str:
    """The VM queue's task on a VM host: take the pending VM, make its report token (only its hash
    is stored), and start the harness through the VM's driver."""
    token = secrets.token_urlsafe(32)
    order = rt.journal.vms.take_vm(vm_id=vm_id, host=socket.gethostname(), token_hash=token_hash(token),
                                   now=utcnow())
    if order is None:
        return "not pending"  # a duplicate message, or reconciled meanwhile
    try:
        pid = driver_of(str(order.spec.get("driver", "namespace")), rt.settings).spawn(
            order, token, place=placement(rt, order))
    except (DriverError, OSError) as exc:
        log.exception("VM %s of run %s did not start", vm_id, order.run_id)
        rt.journal.vms.vm_failed_to_start(vm_id=vm_id, error=str(exc), now=utcnow())
        return "failed"
    rt.journal.vms.vm_started(vm_id=vm_id, pid=pid, now=utcnow())
    log.info("VM %s (attempt %d) of run %s started: pid %d", vm_id, order.attempt, order.run_id, pid)
    return "started"


def placement(rt: Runtime, order: VmOrder) -> Placement:
    """Where the VM lives on this host: its work directory under PAL_VM_ROOT/<tenant> (or the run's
    own, `"workdirScope": "run"`), its state folder under PAL_VM_ROOT/.state."""
    spec = order.spec
    return place(Path(rt.settings.vm_root), order.vm_id, order.tenant_id, order.run_id, str(spec["workdir"]),
                 str(spec.get("workdirScope", "tenant")))


def report(rt: Runtime, token: str | None, body: Any) -> dict[str, Any]:
    """One report of a harness (`POST /v1/runtime/report`). Refused (nothing written) for a token
    of no VM, of a finished VM or run, or of a VM whose lease was taken over; InputError for a
    malformed body."""
    vm = rt.journal.vms.vm_by_token(token_hash(token)) if token else None
    if vm is None or not VmState(vm.state).live:
        raise Refused(UNKNOWN_VM)
    if not isinstance(body, Mapping) or body.get("type") not in ("heartbeat", "step", "resume", "exit"):
        raise InputError("a report is an object whose 'type' is heartbeat, step, resume or exit")
    fence = Fence(vm.run_id, vm.generation, f"vm:{vm.id}", utcnow(), 2 * rt.settings.lease_ttl)
    kind = body["type"]
    if kind == "exit":
        code = body.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise InputError("an exit report needs an integer 'code'")
        output = _checked_output(rt, body.get("output"))
        if not rt.journal.vms.vm_exited(vm, fence, code=code, output=output):
            raise Refused(UNKNOWN_VM)
        _trace_vm_exit(rt, vm)
        return {"ok": True}
    step = _step_of(rt, body) if kind == "step" else None
    if not rt.journal.vms.vm_report(vm, fence, step=step):
        raise Refused(UNKNOWN_VM)
    if step is not None and step[1] in ("completed", "failed"):
        _trace_vm_step(rt, vm, step[0], fence.now)
    if kind == "resume":
        return {"ok": True, "attempt": vm.attempt, "steps": dict(rt.journal.vms.completed_outputs(vm.run_id))}
    return {"ok": True}


def _trace_vm_step(rt: Runtime, vm: VmRecord, step_id: str, at: datetime) -> None:
    """A span for a step the VM reported finished, when tracing and when this report wrote it (a
    repeated report writes nothing and gets none): from its `step_started` to now, under the root
    of the VM's generation (docs/observability.md). Reads the run's journal; only when tracing."""
    tracing = rt.tracing
    if tracing is None:
        return
    try:
        events = rt.journal.runs.events(vm.run_id)
        done = next((e for e in events if e.step_id == step_id and e.created_at == at
                     and e.kind in (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED)), None)
        if done is None:
            return
        began = [e for e in events
                 if e.step_id == step_id and e.kind == EventKind.STEP_STARTED and e.seq < done.seq]
        tracing.reported_step(rt.journal.runs.get_run(vm.run_id), step_id, done.attempt or 1, vm.generation,
                              began[-1].created_at if began else at, at, outcome=str(done.kind), vm_id=vm.id)
    except PalError:
        log.warning("run %s: the span of step %s was not written", vm.run_id, step_id, exc_info=True)


def _trace_vm_exit(rt: Runtime, vm: VmRecord) -> None:
    """The root span of the VM's generation, when its exit finished the run (a VM that ends
    otherwise is resumed by the sweep, which writes it)."""
    tracing = rt.tracing
    if tracing is None:
        return
    try:
        run = rt.journal.runs.get_run(vm.run_id)
        if run.terminal:
            end_generation(tracing, rt.journal, run, vm.generation, utcnow(), outcome=run.status)
    except PalError:
        log.warning("run %s: the root span of generation %d was not written", vm.run_id, vm.generation,
                    exc_info=True)


def _step_of(rt: Runtime, body: Mapping[str, Any]) -> tuple[str, str, Any]:
    step_id, event = body.get("step_id"), body.get("event")
    if not isinstance(step_id, str) or not _STEP_ID.fullmatch(step_id):
        raise InputError("'step_id' must be 1-200 letters, digits and _ . : - [ ], starting with a letter, "
                         "digit or _")
    if event not in _EVENTS:
        raise InputError(f"'event' must be one of {', '.join(_EVENTS)}")
    if event == "completed":
        return step_id, str(event), _checked_output(rt, body.get("output"))
    # A VM's error text is the workload's own words: its credentials are cut out first, then it is bounded.
    return step_id, str(event), redact_bounded(scrub_known(str(body.get("error") or "")), MAX_VM_ERROR_CHARS)


def _checked_output(rt: Runtime, output: Any) -> Any:
    problem = output_problem(output, rt.settings.max_output_bytes, rt.settings.max_json_depth)
    if problem:
        raise InputError(problem)
    return output


def vms_of(rt: Runtime, run_id: str) -> list[VmRecord]:
    return rt.journal.vms.vms(run_id)
