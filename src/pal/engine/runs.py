"""A run's lifecycle: start one (validate everything first, then one transaction, then publish),
start a subagent's child run, and cancel a run tree."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import datetime
from typing import Any

from pal.config import DEFAULT_MAX_JSON_DEPTH
from pal.core import secrets
from pal.core.admission import Admission
from pal.core.budgets import limits_problems
from pal.core.clock import utcnow
from pal.core.limits import depth_problem
from pal.core.records import RunRecord
from pal.core.start_keys import DEBOUNCE, StartKey, start_key
from pal.engine.admission import admission_of, after_run_ended, ring_first_steps
from pal.engine.runtime import Runtime
from pal.engine.tracing import current_traceparent, parse_traceparent
from pal.engine.vms import start_vm
from pal.engine.waiting import wake_quietly
from pal.errors import BrokerUnavailable, InputError, WorkLimitExceeded
from pal.plan.programs import Plan, parse_plan
from pal.tools import registered_tools

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
CHILD_PREFIX = "child_"  # derived ids of child runs; no caller may choose one (docs/security.md)
SCHEDULE_PREFIX = "sched_"  # derived ids of schedules' runs, reserved as child runs' are


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


def check_run_id(run_id: Any) -> None:
    """InputError unless `run_id` is None or an id a caller may choose (docs/security.md)."""
    if run_id is not None and (not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id)):
        raise InputError(f"run id {run_id!r} is invalid: 1-128 letters, digits, _ . : - "
                         "starting with a letter or digit")
    if run_id is not None and run_id.lower().startswith(CHILD_PREFIX):
        raise InputError(f"run ids starting with {CHILD_PREFIX!r} are reserved for subagents' child runs")
    if run_id is not None and run_id.lower().startswith(SCHEDULE_PREFIX):
        raise InputError(f"run ids starting with {SCHEDULE_PREFIX!r} are reserved for schedules' runs")


def check_run_input(run_input: Any, max_bytes: int, max_depth: int = DEFAULT_MAX_JSON_DEPTH, *,
                    what: str = "run input", limit: str = "PAL_MAX_INPUT_BYTES") -> Any:
    """The input (or another JSON value a caller hands PAL: `what`, bounded by `limit`) as it will
    be stored; InputError when it is not JSON, too large or too deep."""
    problem = depth_problem(run_input, max_depth, what)
    if problem:
        raise InputError(problem)
    try:
        text = json.dumps(run_input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be JSON: {exc}") from exc
    if len(text.encode()) > max_bytes:
        raise InputError(f"{what} is {len(text.encode())} bytes, over the limit of {max_bytes} ({limit})")
    return json.loads(text)


def start_run(
    rt: Runtime,
    graph: Any,
    run_input: Any = None,
    *,
    run_id: str | None = None,
    tenant_id: str | None = None,
    limits: Any = None,
    traceparent: str | None = None,
    dedupe_key: str | None = None,
    dedupe_window: str | float | None = None,
    debounce_key: str | None = None,
    debounce: str | float | None = None,
    priority: int | None = None,
) -> tuple[RunRecord, bool]:
    """Validate, create the run (idempotent on `run_id`: the same graph and input give the existing
    run, other ones RunIdReused) and publish its first step.

    `dedupe_key`: a start with the key the tenant used within `dedupe_window` (a duration or
    seconds; a day by default) gives that run instead. `debounce_key` with `debounce` (the
    period): this start cancels the run the key's burst queued before it, and starts once the
    period passes with no newer start (pal.core.start_keys; docs/api.md). `priority` (1 first .. 5
    last) overrides the graph's; a run that heeds a limit waits held for its turn (docs/fairness.md).

    `graph` is a graph document, a plain-LLM spec (`{"kind": "llm", ...}`) or a microVM run
    (`{"kind": "microvm", ...}`, whose first VM is scheduled instead); `limits` is the
    run's own budget over the graph's (docs/anomalies.md); a W3C `traceparent` (kept only when
    valid) is what its first trace links to (docs/observability.md). Returns the run and whether
    this call created it. Nothing is written for invalid input.
    """
    settings = rt.settings
    check_run_id(run_id)
    run_input = check_run_input(run_input, settings.max_input_bytes, settings.max_json_depth)
    problems = limits_problems(limits)
    if problems:
        raise InputError("; ".join(problems))
    key = start_key(dedupe_key=dedupe_key, dedupe_window=dedupe_window, debounce_key=debounce_key,
                    debounce=debounce)
    plan = rt.validated_plan(graph)
    if key is not None and plan.kind == "microvm":
        raise InputError("a microVM run takes no dedupe or debounce key")
    tenant = tenant_id or settings.tenant
    admission = admission_of(rt, plan.document, run_input, tenant, priority)
    return _launch(rt, plan, run_id or new_run_id(), tenant, run_input,
                   limits=dict(limits) if limits is not None else None,
                   traceparent=parse_traceparent(traceparent), key=key, admission=admission)


def start_scheduled_run(rt: Runtime, graph: Any, run_input: Any, *, run_id: str,
                        tenant_id: str) -> tuple[RunRecord, bool]:
    """A schedule's tick: start its run under the id the tick derives (a reserved one, so no caller
    can take it first), validated as any start; the same tick again gives the same run."""
    run_input = check_run_input(run_input, rt.settings.max_input_bytes, rt.settings.max_json_depth)
    plan = rt.validated_plan(graph)
    return _launch(rt, plan, run_id, tenant_id, run_input,
                   admission=admission_of(rt, plan.document, run_input, tenant_id, None))


def _launch(rt: Runtime, plan: Plan, run_id: str, tenant_id: str, run_input: Any, *,
            limits: dict[str, Any] | None = None, traceparent: str | None = None,
            key: StartKey | None = None, admission: Admission | None = None) -> tuple[RunRecord, bool]:
    """Create the validated run and send its first step: not a debounced run's (the sweep's, later)
    nor a held one's (its admission's, in its turn). A microVM or debounced run heeds no admission."""
    debounced = key is not None and key.purpose == DEBOUNCE
    admitted_too: list[str] = []
    record, created = rt.journal.runs.create_run(
        run_id=run_id, tenant_id=tenant_id, kind=plan.kind, graph=plan.document, graph_hash=plan.hash,
        run_input=run_input, now=utcnow(), lease_ttl=rt.settings.lease_ttl,
        max_in_flight=rt.settings.max_runs_in_flight, limits=limits, traceparent=traceparent, start_key=key,
        admission=None if debounced or plan.kind == "microvm" else admission, admitted_too=admitted_too,
    )
    ring_first_steps(rt, admitted_too)  # slots of runs that ended unnoticed, given to runs held before
    if plan.kind == "microvm":
        start_vm(rt, record.id)  # the isolated tier: a VM, not a doorbell (docs/isolated-tier.md)
    elif created and not debounced and record.admitted is not False:
        try:
            rt.publish(record.id, plan.program.first_step, 1)
        except BrokerUnavailable as exc:
            raise BrokerUnavailable(f"run {record.id} is journaled, but {exc}; the orphan sweep sends its "
                                    "first step once its lease lapses", run_id=record.id) from exc
    return record, created


def child_run_id(parent_run_id: str, step_id: str, attempt: int) -> str:
    """The child run of a subagent step attempt: the same id every time the parent asks again."""
    digest = hashlib.sha256(f"{parent_run_id}|{step_id}|{attempt}".encode()).hexdigest()
    return f"{CHILD_PREFIX}{digest[:40]}"


def start_child_run(rt: Runtime, parent_run_id: str, step_id: str, attempt: int, document: Any,
                    child_input: Any) -> str:
    """Create (or find) the child run of a subagent step and publish its first step.

    The child's input is stored with each secret value the worker knows replaced by its placeholder,
    which the child's steps resolve again when they run (pal.core.secrets.hand_on and reveal)."""
    parent = rt.journal.runs.get_run(parent_run_id)
    child_id = child_run_id(parent_run_id, step_id, attempt)
    if not rt.journal.runs.run_exists(child_id):  # a re-driven parent asking again is not new work
        _check_room_for_a_child(rt, parent)
    child_input = check_run_input(secrets.hand_on(child_input), rt.settings.max_input_bytes,
                                  rt.settings.max_json_depth)
    plan = parse_plan(document, known_tools=registered_tools(), max_bytes=rt.settings.max_graph_bytes,
                      max_depth=rt.settings.max_json_depth)
    record, created = rt.journal.runs.create_run(
        run_id=child_id, tenant_id=parent.tenant_id, kind=plan.kind,
        graph=plan.document, graph_hash=plan.hash, run_input=child_input, now=utcnow(),
        lease_ttl=rt.settings.lease_ttl, parent_run_id=parent_run_id, parent_step_id=step_id,
        traceparent=current_traceparent(),  # the parent step's span, when this worker traces
    )
    if created:
        rt.publish(record.id, plan.program.first_step, 1)
    return record.id


def _check_room_for_a_child(rt: Runtime, parent: RunRecord) -> None:
    """WorkLimitExceeded when a new child of `parent` would nest deeper than PAL_MAX_RUN_DEPTH or
    put more than PAL_MAX_CHILD_RUNS under its top-level run. Concurrent creations in one tree may
    overshoot the count by the number of them in flight at once (docs/security.md)."""
    ancestors = rt.journal.runs.ancestors(parent.id)
    if len(ancestors) + 1 > rt.settings.max_run_depth:
        raise WorkLimitExceeded(f"a child of run {parent.id} would be nested {len(ancestors) + 1} deep, "
                                f"deeper than PAL_MAX_RUN_DEPTH allows ({rt.settings.max_run_depth})")
    root = ancestors[-1] if ancestors else parent.id
    existing = rt.journal.runs.descendant_count(root)
    if existing >= rt.settings.max_child_runs:
        raise WorkLimitExceeded(f"run {root} already has {existing} child runs, the most "
                                f"PAL_MAX_CHILD_RUNS allows ({rt.settings.max_child_runs})")


def cancel(rt: Runtime, run_id: str, *, by: str, reason: str | None = None,
           now: datetime | None = None) -> list[str]:
    """Cancel a run and its unfinished descendants; each journals `run_cancelled` once. A parent
    waiting on a cancelled run is woken (its subagent step then fails)."""
    run = rt.journal.runs.get_run(run_id)
    cancelled = rt.journal.runs.cancel_run(run_id=run_id, now=now or utcnow(), by=by, reason=reason)
    if run.parent_run_id:
        wake_quietly(rt, run.parent_run_id)
    after_run_ended(rt, run)
    return cancelled
