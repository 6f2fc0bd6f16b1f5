"""Durable waits: approval decisions, children waking their parents, expiries, timers.

A parked step (`step_waiting`) is resumed only here, each time in one journal transaction
(`WaitStore.resume_waiting`, pal.storage.waits), after which the successors are published under
the generation it returns. A parked run holds no lease and no worker; its lock row is a wake-up
timer the sweep honours (an approval's expiry, a finished child, a periodic re-check), so a lost
wake-up message costs time, never the run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pal.core.clock import utcnow
from pal.core.confidence import LOW_CONFIDENCE
from pal.core.failures import failure_payload
from pal.core.limits import MAX_DECIDER_CHARS, MAX_DECISION_COMMENT_CHARS
from pal.core.records import Handoff, RunRecord
from pal.core.step_log import DECIDED_WAITS, RESUMING_WAITS
from pal.core.vocabulary import EventKind
from pal.engine.gate import ConfidenceRejected
from pal.engine.runtime import Runtime
from pal.engine.watch import budget_failure
from pal.errors import InputError, PalError, Refused, StepError
from pal.nodes.sleep import WAIT_KIND as TIMER
from pal.nodes.wait_event import WAIT_KIND as EVENT
from pal.plan.interpreter import GraphProgram, Program
from pal.storage.primitives import WAIT_RECHECK_SECONDS

log = logging.getLogger(__name__)

DECISIONS = ("approved", "rejected")
# What a person decides: an approval node, a step past the budget, an action the gate diverted.
DECIDED_KINDS = DECIDED_WAITS


class ChildRunFailed(StepError):
    """The child run of a subagent step did not succeed."""

    code = "child_run_failed"
    error_class = "tool"


class ChildRunForeign(ChildRunFailed):
    """A run answered a subagent step that is not that step's own child (docs/security.md)."""

    code = "child_run_foreign"


class ApprovalNotGranted(StepError):
    """An approval was rejected or expired and the graph has no edge for that branch."""

    error_class = "approval"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class EventTimedOut(StepError):
    """A wait_event expired with no signal and the graph has no `timeout` edge for it."""

    code = "event_timeout"


class ChildRunPaused(StepError):
    """The child run stopped on an approval and the subagent node says onChildApproval: fail
    (ErrChildRunPaused in docs/specification.md)."""

    code = "child_run_paused"


@dataclass(frozen=True)
class PendingApproval:
    run_id: str
    step_id: str
    prompt: Any
    show: Any
    approval_hash: str
    requested_at: str
    expires_at: str | None
    depth: int  # 0: the run itself; 1: its child; ...
    kind: str = "approval"  # or "budget": a step paused by the run's budget

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step_id": self.step_id, "kind": self.kind, "prompt": self.prompt,
                "show": self.show, "approval_hash": self.approval_hash, "requested_at": self.requested_at,
                "expires_at": self.expires_at, "depth": self.depth}


def _resume(rt: Runtime, run: RunRecord, step_id: str, *, output: Any = None,
            error: Mapping[str, Any] | None = None, event: tuple[str, Mapping[str, Any]] | None = None,
            check: Any = None, now: datetime | None = None, rerun: bool = False,
            signal: tuple[str, Mapping[str, Any]] | None = None) -> Handoff:
    program = rt.program_of(run)
    decision, generation = rt.journal.waits.resume_waiting(
        run_id=run.id, step_id=step_id, now=now or utcnow(), lease_ttl=rt.settings.lease_ttl,
        plan=lambda completed: program.handoff(completed, step_id), output=output, error=error,
        event=event, check=check, frontier=program.redrive_steps, rerun=rerun, signal=signal)
    # The decider's hand-off has the worker's fault points: a decider killed here leaves a lease
    # that lapses, and the sweep publishes the branch.
    rt.hand_off(run.id, step_id, decision.dispatch, generation)
    if decision.finished and run.parent_run_id:
        wake_quietly(rt, run.parent_run_id)
    return decision


def _branch_wired(program: Program, step_id: str, branch: str) -> bool:
    if not isinstance(program, GraphProgram):
        return False
    return any(e.source_handle == branch for e in program.outgoing(step_id))


def _branch_outcome(program: Program, step_id: str, branch: str, detail: Mapping[str, Any]
                    ) -> tuple[Any, dict[str, Any] | None]:
    """(output, error): follow `branch`; a rejection or expiry with no edge for it fails the run."""
    if branch == "approved" or _branch_wired(program, step_id, branch):
        return {"branch": branch, **detail}, None
    code = "approval_rejected" if branch == "rejected" else "approval_expired"
    refusal = ApprovalNotGranted(f"approval {step_id!r} was {branch} and the graph has no {branch!r} branch",
                                 code)
    return None, failure_payload(refusal, **detail)


def decide(rt: Runtime, run_id: str, step_id: str, decision: str, *, by: str,
           comment: str | None = None, expected_hash: str | None = None,
           now: datetime | None = None) -> Handoff:
    """Approve or reject a waiting approval step or budget pause; Refused (nothing changed) when the
    run is not waiting there, the step is unknown or already decided, or `expected_hash` does not
    match what is pending.

    An approval completes its step with the chosen branch. A budget pause (docs/anomalies.md,
    "Budgets") approved lets its step run once past the budget; rejected, it fails the run
    `budget_exceeded`. A diverted low-confidence action approved runs; rejected, the step follows
    its `low_confidence` edge when the graph has one, else fails `confidence_rejected`."""
    if decision not in DECISIONS:
        raise Refused(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    if comment is not None and len(comment) > MAX_DECISION_COMMENT_CHARS:
        raise InputError(f"a decision's comment is at most {MAX_DECISION_COMMENT_CHARS} characters, not "
                         f"{len(comment)}; nothing was decided")
    if len(by) > MAX_DECIDER_CHARS:
        raise InputError(f"who decides is at most {MAX_DECIDER_CHARS} characters; nothing was decided")
    run = rt.journal.runs.get_run(run_id)
    pending = {w["step_id"]: w["payload"] for w in rt.journal.waits.waiting_steps(run_id)}.get(step_id) or {}
    kind = pending.get("kind")

    def check(waiting: Mapping[str, Any]) -> None:
        if waiting.get("kind") not in DECIDED_KINDS:
            raise Refused(f"step {step_id!r} of run {run_id} waits for a {waiting.get('kind')}, "
                          "not a decision")
        if waiting.get("kind") != kind:  # what was read above is not what waits now: decide again
            raise Refused(f"step {step_id!r} of run {run_id} changed while deciding; try again")
        if expected_hash is not None and waiting.get("approval_hash") != expected_hash:
            raise Refused(f"step {step_id!r} of run {run_id} asks to approve something else: its hash is "
                          f"{waiting.get('approval_hash')}, not {expected_hash}")

    detail = {"decision": decision, "by": by, "comment": comment,
              "approval_hash": pending.get("approval_hash")}
    if kind in RESUMING_WAITS:
        detail["kind"] = kind
        event = (EventKind.APPROVAL_DECIDED, detail)
        if decision == "approved":
            return _resume(rt, run, step_id, event=event, check=check, now=now, rerun=True)
        if kind == "budget":
            refused = budget_failure(pending.get("show") or {}, decision="rejected", by=by, comment=comment)
            return _resume(rt, run, step_id, error=refused, event=event, check=check, now=now)
        shown = pending.get("show") or {}
        if _branch_wired(rt.program_of(run), step_id, LOW_CONFIDENCE):
            output = {"branch": LOW_CONFIDENCE, "score": shown.get("score"), **detail}
            return _resume(rt, run, step_id, output=output, event=event, check=check, now=now)
        rejected = ConfidenceRejected(f"the low-confidence action of step {step_id!r} was rejected")
        return _resume(rt, run, step_id, error=failure_payload(rejected, score=shown.get("score"), **detail),
                       event=event, check=check, now=now)
    output, error = _branch_outcome(rt.program_of(run), step_id, decision, detail)
    return _resume(rt, run, step_id, output=output, error=error, event=(EventKind.APPROVAL_DECIDED, detail),
                   check=check, now=now)


def wake(rt: Runtime, run_id: str, now: datetime | None = None) -> int:
    """Look at every parked step of a run: expired approvals take their timeout branch (or fail the
    run); a subagent whose child finished gets its result; a child paused on an approval fails the
    step when the node says onChildApproval: fail; a due timer fires (its sleep completes). Re-arms
    the wake-up timer. Returns how many steps were resumed."""
    now = now or utcnow()
    run = rt.journal.runs.get_run(run_id)
    if run.terminal:
        return 0
    program = rt.program_of(run)
    resumed = 0
    next_due = now + timedelta(seconds=WAIT_RECHECK_SECONDS)
    for waiting in rt.journal.waits.waiting_steps(run_id):
        step_id, payload = waiting["step_id"], waiting["payload"]
        try:
            if payload.get("kind") == "approval":
                expires = payload.get("expires_at")
                if expires is None:
                    continue
                if datetime.fromisoformat(expires) > now:
                    next_due = min(next_due, datetime.fromisoformat(expires))
                    continue
                detail = {"decision": "timeout", "by": "pal:expiry", "comment": None,
                          "approval_hash": payload.get("approval_hash")}
                output, error = _branch_outcome(program, step_id, "timeout", detail)
                _resume(rt, run, step_id, output=output, error=error,
                        event=(EventKind.APPROVAL_DECIDED, detail), now=now)
                resumed += 1
            elif payload.get("kind") == "subagent":
                resumed += _wake_subagent(rt, run, program, step_id, payload["child_run_id"], now)
            elif payload.get("kind") == EVENT:
                woken = _wake_event(rt, run, program, step_id, payload, now)
                resumed += woken
                if not woken and payload.get("expires_at"):  # not yet expired: look again then
                    next_due = min(next_due, datetime.fromisoformat(payload["expires_at"]))
            elif payload.get("kind") == TIMER:
                due = datetime.fromisoformat(payload["due_at"])
                if due > now:
                    next_due = min(next_due, due)
                    continue
                fired = {"due_at": payload["due_at"], "fired_at": now.isoformat()}
                _resume(rt, run, step_id, output=fired, event=(EventKind.TIMER_FIRED, fired), now=now)
                resumed += 1
        except Refused:
            continue  # decided meanwhile by someone else: nothing to do
        if rt.journal.runs.get_run(run_id).terminal:
            return resumed
    rt.journal.waits.rearm_wait(run_id=run_id, wake_at=next_due, now=now)
    return resumed


def _wake_event(rt: Runtime, run: RunRecord, program: Program, step_id: str, payload: Mapping[str, Any],
                now: datetime) -> int:
    """A wait_event step takes a signal sent to its run, else takes its timeout branch once it
    has expired (or fails the run `event_timeout`)."""
    try:
        _resume(rt, run, step_id, signal=(payload["name"], payload.get("match") or {}), now=now)
        return 1
    except Refused:
        pass  # no such signal yet (or the step was woken meanwhile)
    expires = payload.get("expires_at")
    if expires is None or datetime.fromisoformat(expires) > now:
        return 0
    if _branch_wired(program, step_id, "timeout"):
        output, error = {"branch": "timeout", "name": payload["name"]}, None
    else:
        timed_out = EventTimedOut(f"no signal {payload['name']!r} came for step {step_id!r} in time")
        output, error = None, failure_payload(timed_out, name=payload["name"])
    _resume(rt, run, step_id, output=output, error=error, now=now)
    return 1


def _wake_subagent(rt: Runtime, run: RunRecord, program: Program, step_id: str, child_id: str,
                   now: datetime) -> int:
    child = rt.journal.runs.get_run(child_id)
    if (child.parent_run_id, child.parent_step_id, child.tenant_id) != (run.id, step_id, run.tenant_id):
        # Only this step's own child may answer it (docs/security.md): never a run someone else
        # created under the id first.
        stranger = ChildRunForeign(f"run {child_id} is not the child run of step {step_id!r}")
        _resume(rt, run, step_id, now=now, error=failure_payload(stranger, child_run_id=child_id))
        return 1
    if child.status == "succeeded":
        _resume(rt, run, step_id, output=child.output, now=now)
        return 1
    if child.terminal:
        error = ChildRunFailed(f"child run {child_id} {child.status}")
        _resume(rt, run, step_id, now=now,
                error=failure_payload(error, child_run_id=child_id, child_error=child.error))
        return 1
    mode = program.node(step_id).data.get("onChildApproval", "wait")
    if child.status == "waiting" and mode == "fail" and pending_approvals(rt, child_id):
        paused = ChildRunPaused(f"child run {child_id} stopped on an approval")
        _resume(rt, run, step_id, now=now, error=failure_payload(paused, child_run_id=child_id))
        return 1
    return 0


def wake_quietly(rt: Runtime, run_id: str) -> None:
    """Wake a parent right after its child finished; the sweep covers any failure here."""
    try:
        wake(rt, run_id)
    except PalError:
        log.warning("waking run %s failed; the sweep will retry", run_id, exc_info=True)


def pending_approvals(rt: Runtime, run_id: str, depth: int = 0) -> list[PendingApproval]:
    """Undecided approvals of the run and of its descendants (nested approvals), parents first."""
    found = [
        PendingApproval(run_id=run_id, step_id=w["step_id"], prompt=w["payload"].get("prompt"),
                        show=w["payload"].get("show"), approval_hash=w["payload"].get("approval_hash", ""),
                        requested_at=w["payload"].get("requested_at", ""),
                        expires_at=w["payload"].get("expires_at"), depth=depth, kind=w["payload"]["kind"])
        for w in rt.journal.waits.waiting_steps(run_id) if w["payload"].get("kind") in DECIDED_KINDS
    ]
    for child in rt.journal.runs.children(run_id):
        if not child.terminal:
            found += pending_approvals(rt, child.id, depth + 1)
    return found


def tenant_approvals(rt: Runtime, tenant_id: str, limit: int = 100) -> list[PendingApproval]:
    """Every pending approval of the tenant's parked runs (at most `limit` runs, newest first), each
    under the run that waits on it: a child run that waits is itself a parked run of the tenant, so
    its approvals come up once, under it, and not again under its parent."""
    found: list[PendingApproval] = []
    for run in rt.journal.runs.list_runs(tenant_id=tenant_id, status="waiting", limit=limit):
        found += [p for p in pending_approvals(rt, run.id) if p.depth == 0]
    return found

