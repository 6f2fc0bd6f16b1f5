"""The step protocol (docs/architecture.md): claim, run with heartbeat, complete and hand off, publish.

Transport-agnostic: the Celery task `pal.execute_node` calls `execute_step`, and so can a test.
A node that fails is retried by its `retry` policy (a pure decision in pal.core.retry): the journal
gets `step_retrying` and the next attempt is published with a countdown, so a backoff never
blocks a worker process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pal.config import Settings
from pal.core import faults, retry
from pal.core.budgets import Breach, OnBreach
from pal.core.clock import utcnow
from pal.core.failures import failure_payload
from pal.core.limits import output_problem
from pal.core.records import Claim, ClaimAhead, ClaimOutcome, Handoff, RunRecord, Usage
from pal.core.secrets import reveal, scrub_known
from pal.engine.admission import after_run_ended
from pal.engine.async_steps import Finish, Slot
from pal.engine.gate import gate
from pal.engine.heartbeat import LeaseGone, TimeLimitReached
from pal.engine.receipt_book import JournalReceipts
from pal.engine.runtime import RunsNext, Runtime
from pal.engine.services import NodeServices
from pal.engine.tracing import Tracing, end_generation
from pal.engine.waiting import wake_quietly
from pal.engine.watch import budget_failure, budget_pause, watch_claim, watch_usage
from pal.errors import (
    LeaseLost,
    OutputTooLarge,
    PalError,
    StepTimeout,
    StorageError,
    WorkLimitExceeded,
)
from pal.nodes import NodeResult, StepContext, idempotency_key
from pal.nodes.base import Park
from pal.nodes.wait_event import WAIT_KIND as EVENT
from pal.plan.interpreter import Program
from pal.plan.model import Node
from pal.storage.steps import ClaimNext

log = logging.getLogger(__name__)
T = TypeVar("T")


AWAITING = "awaiting"  # the step's effect runs on the event loop; its outcome is journaled when it ends


@dataclass(frozen=True)
class StepResult:
    outcome: str  # a ClaimOutcome value, or "completed" / "failed" / "retrying" / "fenced"
    dispatched: tuple[str, ...] = ()
    finished: bool = False
    parked: bool = False  # the step waits and nothing else of the run is in flight
    usage: Usage | None = None  # a model call's tokens and cost (for its trace span)
    error: Mapping[str, Any] | None = None  # the failure journaled, retried or final
    ahead: ClaimAhead | None = None  # the successor's claim this completion took, for its caller to run


def _check_output(output: Any, settings: Settings) -> None:
    """A non-JSON, oversized or too deeply nested output fails the step here, not the journal later."""
    problem = output_problem(output, settings.max_output_bytes, settings.max_json_depth)
    if problem:
        raise OutputTooLarge(problem)


def step_time_limit(data: Mapping[str, Any], settings: Settings) -> float:
    """The step's time limit in seconds: its node's `timeoutMs`, else PAL_STEP_TIMEOUT."""
    timeout_ms = data.get("timeoutMs")
    return timeout_ms / 1000 if isinstance(timeout_ms, int) and timeout_ms > 0 else settings.step_timeout


def execute_step(rt: Runtime, run_id: str, step_id: str, generation: int,
                 sent_at: float | None = None, ahead: ClaimAhead | None = None,
                 runs_next: RunsNext | None = None, slot: Slot | None = None) -> StepResult:
    """Run one step of one run, exactly as one `pal.execute_node` message asks (`sent_at`: when
    the message was published or due, Unix seconds, for the step span's queue wait; `ahead`: the
    claim the completion before it took for this caller; `runs_next`: the caller runs one message
    of the hand-off next itself). A worker process runs at most PAL_ASYNC_STEPS at once
    (pal.engine.async_steps); a finisher passes the `slot` its effect held, which this step takes over."""
    if rt.async_steps is None:
        return _execute(rt, run_id, step_id, generation, sent_at, ahead, runs_next, None)
    with rt.async_steps.slot(slot) as held:
        return _execute(rt, run_id, step_id, generation, sent_at, ahead, runs_next, held)


def _execute(rt: Runtime, run_id: str, step_id: str, generation: int, sent_at: float | None,
             ahead: ClaimAhead | None, runs_next: RunsNext | None, slot: Slot | None) -> StepResult:
    settings, journal = rt.settings, rt.journal
    claim = _once_more_if_disconnected(lambda: journal.steps.claim_step(
        rt.fence(run_id, generation), step_id,
        ready=lambda run, completed: rt.program_of(run).is_ready(completed, step_id),
        needs=lambda run, completed: rt.program_of(run).needs(completed, step_id), ahead=ahead))
    if claim.outcome is ClaimOutcome.BACKOFF:
        # A re-drive reached a step that is waiting out its backoff: ring again when it is due
        # (a long wait is left to the sweep, at the lease's end).
        if retry.backoff_lease(claim.wait_s, settings.lease_ttl)[1]:
            rt.publish(run_id, step_id, generation, countdown=claim.wait_s)
        return StepResult(claim.outcome.value)
    if claim.outcome is not ClaimOutcome.RUN or claim.run is None:
        log.info("run %s step %s gen %d: %s, nothing to do", run_id, step_id, generation,
                 claim.outcome.value)
        return StepResult(claim.outcome.value)
    faults.point("after_claim_commit", step_id, run_id)
    tracing = rt.tracing
    if tracing is None:
        return _run_claimed(rt, claim, step_id, generation, runs_next=runs_next, slot=slot)
    return _traced(rt, tracing, claim, step_id, generation, sent_at, runs_next, slot)


def _traced(rt: Runtime, tracing: Tracing, claim: Claim, step_id: str, generation: int,
            sent_at: float | None, runs_next: RunsNext | None, slot: Slot | None) -> StepResult:
    """The claimed attempt inside its span; the generation's root span when the run finishes or
    parks here (docs/observability.md)."""
    assert claim.run is not None
    try:
        node = rt.program_of(claim.run).node(step_id)
        node_type, data = node.type, node.data
    except (PalError, KeyError):  # a step the plan does not have: the attempt fails inside
        node_type, data = "unknown", {}
    span = tracing.start_step(claim.run, step_id, claim.attempt, generation, node_type, data, sent_at)

    def traced(result: StepResult) -> StepResult:  # now, or once an awaited effect is journaled
        span.finish(result.outcome, result.usage, result.error)
        span.end()
        if result.finished or result.parked:
            _end_generation(rt, tracing, claim, generation, result)
        return result

    try:
        with span.current():
            result = _run_claimed(rt, claim, step_id, generation, after=traced, runs_next=runs_next,
                                  slot=slot)
    except BaseException:
        span.end()
        raise
    return result if result.outcome == AWAITING else traced(result)


def _end_generation(rt: Runtime, tracing: Tracing, claim: Claim, generation: int, result: StepResult) -> None:
    assert claim.run is not None
    try:
        run = rt.journal.runs.get_run(claim.run.id)
        end_generation(tracing, rt.journal, run, generation, utcnow(),
                       outcome=run.status if result.finished else "waiting")
    except PalError:  # a trace is never worth failing a step that has committed
        log.warning("run %s: the root span of generation %d was not written", claim.run.id, generation,
                    exc_info=True)


def _run_claimed(rt: Runtime, claim: Claim, step_id: str, generation: int,
                 after: Callable[[StepResult], object] | None = None,
                 runs_next: RunsNext | None = None, slot: Slot | None = None) -> StepResult:
    """Phase 2 and 3 of the step protocol for an attempt this worker claimed. A node whose effect
    is awaitable runs on the process's event loop (pal.engine.async_steps): the attempt is then
    AWAITING, and `after` gets its result once its outcome is journaled (its finisher, not the
    caller, runs what comes next: `runs_next` serves a step settled here only)."""
    assert claim.run is not None
    run_id, settings = claim.run.id, rt.settings
    program = rt.program_of(claim.run)
    over = watch_claim(rt, claim, step_id, generation, program)
    if over is not None and over.on_breach is OnBreach.PAUSE:  # the node waits for a person
        return _park(rt, claim.run, step_id, claim.attempt, generation, budget_pause(over, utcnow()), program)
    if over is not None:  # the budget says stop: the step's node never runs
        return _stopped_by_budget(rt, claim.run, step_id, claim.attempt, generation, over)
    # An approved pause claimed an attempt whose node never ran: the retry policy counts runs.
    paused = len(claim.log.resumed.get(step_id, ())) if claim.log is not None else 0
    receipts = JournalReceipts(rt, idempotency_key(run_id, step_id, claim.attempt), run_id, step_id,
                               claim.attempt, generation)
    policy, limit_s = retry.RetryPolicy(), settings.step_timeout
    outcome: NodeResult | Park | BaseException
    try:
        if len(claim.completed or ()) >= settings.max_steps_per_run:
            raise WorkLimitExceeded(f"the run has completed {len(claim.completed or ())} steps, the most "
                                    f"PAL_MAX_STEPS_PER_RUN allows ({settings.max_steps_per_run})")
        node = program.node(step_id)
        outputs, loop = program.view(step_id, claim.completed or {})
        ctx = StepContext(run_id=run_id, step_id=step_id, attempt=claim.attempt, input=_input(claim.run),
                          outputs=outputs, services=NodeServices(rt), receipts=receipts,
                          started_at=utcnow(), loop=loop)
        policy = retry.parse_policy(node.data.get("retry"))
        limit_s = step_time_limit(node.data, settings)
        # The confidence gate (off unless PAL_CONFIDENCE_GATE says so) judges the action first.
        diverted = gate(rt, claim.run, node, ctx, generation, claim.log)
        settle = _Settle(rt, claim, step_id, generation, program, policy, limit_s, paused, after)
        ran = diverted or _run_node(rt, claim.run, node, ctx, generation, limit_s, settle.awaited, slot)
        if ran is None:
            return StepResult(AWAITING)
        outcome = ran
    except (LeaseLost, LeaseGone, TimeLimitReached, Exception) as exc:
        outcome = exc
    return _Settle(rt, claim, step_id, generation, program, policy, limit_s, paused).settle(
        outcome, runs_next=runs_next)


@dataclass(frozen=True)
class _Settle:
    """What becomes of a claimed attempt once its node has run: completed, parked, retried or failed."""

    rt: Runtime
    claim: Claim
    step_id: str
    generation: int
    program: Program
    policy: retry.RetryPolicy
    limit_s: float
    paused: int  # attempts that were claimed but never ran their node (an approved budget pause)
    after: Callable[[StepResult], object] | None = None

    def awaited(self, outcome: Any, slot: Slot) -> None:
        """The end of an effect that ran on the event loop (pal.engine.async_steps), in its `slot`."""
        assert self.claim.run is not None
        faults.point("after_effect", self.step_id, self.claim.run.id)
        if not isinstance(outcome, BaseException):
            try:
                outcome = _checked(self.rt, self.claim.run, outcome)
            except Exception as exc:
                outcome = exc
        result = self.settle(outcome, chain=True)
        if self.after is not None:
            self.after(result)
        if result.ahead is not None:  # the successor's claim is this thread's: no statement
            ahead = result.ahead
            execute_step(self.rt, self.claim.run.id, ahead.step_id, self.generation, ahead=ahead, slot=slot)

    def settle(self, outcome: NodeResult | Park | BaseException, chain: bool = False,
               runs_next: RunsNext | None = None) -> StepResult:
        rt, claim, step_id, generation = self.rt, self.claim, self.step_id, self.generation
        assert claim.run is not None
        run_id = claim.run.id
        if isinstance(outcome, LeaseLost | LeaseGone):
            log.warning("run %s step %s: fenced out (generation %d)", run_id, step_id, generation)
            return StepResult("fenced")
        if isinstance(outcome, TimeLimitReached):
            exc: BaseException = StepTimeout(
                f"the step ran past its time limit of {self.limit_s:g}s and was stopped")
            exc.__cause__ = outcome  # its traceback shows where the step's code was when it was stopped
            return _failed(rt, run_id, step_id, claim.attempt, generation, exc, self.policy, claim.run,
                           self.paused)
        if isinstance(outcome, BaseException):  # a node's failure is data for the journal
            exc = outcome
            if isinstance(exc, TypeError | ValueError) and "JSON" in str(exc):
                not_json = PalError(f"step {step_id!r} returned a value that is not JSON: {exc}")
                not_json.__cause__ = exc  # the journaled traceback is the encoder's
                exc = not_json
            return _failed(rt, run_id, step_id, claim.attempt, generation, exc, self.policy, claim.run,
                           self.paused)
        if isinstance(outcome, Park):
            # Outside the node's failure handling: a journal error here is not the node's failure (a
            # retry would start a second child); the lease lapses and a re-drive parks the same attempt.
            return _park(rt, claim.run, step_id, claim.attempt, generation, outcome, self.program)
        watch_usage(rt, claim.run, step_id, generation, outcome.usage)
        return _complete(rt, claim.run, step_id, claim.attempt, generation, outcome, self.program, chain,
                         runs_next)


def _input(run: RunRecord) -> Any:
    """The run's input as its steps see it: a child run's stored input names the secrets its parent
    handed on (pal.core.secrets.hand_on), resolved here, in the worker, as a template resolves them."""
    return reveal(run.input) if run.parent_run_id is not None else run.input


def _run_node(rt: Runtime, run: RunRecord, node: Node, ctx: StepContext, generation: int,
              limit_s: float, finish: Finish, slot: Slot | None) -> NodeResult | Park | None:
    """The node's effect, under the lease heartbeat and the step's time limit; its result checked
    (JSON, size, depth) and scrubbed of secret values before anything journals it. On a worker
    that awaits effects, an awaitable one goes to the event loop (pal.engine.async_steps), whose
    finisher gets its outcome (`finish`): None then. It is made under the heartbeat too: making it
    may take a while (a fresh process imports the provider's SDK)."""
    with rt.leases.holding(run.id, generation, limit_s):
        faults.point("before_effect", ctx.step_id, run.id)
        effect = node.kind.awaitable(node.data, ctx) if rt.async_steps is not None else None
        if effect is not None and rt.async_steps is not None:
            rt.async_steps.submit(effect, run_id=run.id, generation=generation, limit_s=limit_s,
                                  finish=finish, slot=slot)
            return None
        raw = node.kind.execute(node.data, ctx)
        faults.point("after_effect", ctx.step_id, run.id)
    return _checked(rt, run, raw)


def _checked(rt: Runtime, run: RunRecord, raw: Any) -> NodeResult | Park:
    """A node's return value as a result, checked (JSON, size, depth) and scrubbed of secrets."""
    result: NodeResult | Park = raw if isinstance(raw, NodeResult | Park) else NodeResult(raw)
    if isinstance(result, NodeResult):
        _check_output(result.output, rt.settings)
        if rt.uses_secrets(run):  # a secret the step rendered and echoed is not journaled
            result = NodeResult(scrub_known(result.output), result.usage)
    elif rt.uses_secrets(run):
        result = Park(scrub_known(result.payload), result.wake_at)
    return result


def _complete(rt: Runtime, run: RunRecord, step_id: str, attempt: int, generation: int, result: NodeResult,
              program: Program, chain: bool = False, runs_next: RunsNext | None = None) -> StepResult:
    """Step protocol, phase 3: journal the completion, then (only after it committed) publish.
    `chain`: the caller (a finisher of awaited steps) runs the one successor next itself when that
    successor is chainable (NodeKind.chainable), instead of publishing its message. `runs_next`:
    the caller runs one message of the hand-off next, so the completion may claim a lone
    successor for it."""
    own = runs_next is not None and runs_next.may_claim()
    claim_next: ClaimNext = own or (chain and (lambda successor: _chainable(rt, program, successor)))
    prepared: dict[str, object] = {}

    def build(decision: Handoff) -> None:  # while the completion is on its way: sent only once it commits
        try:
            prepared.update(rt.prepare_hand_off(run.id, decision.dispatch, generation, own=own))
        except Exception:  # the publish prepares what was not prepared ahead
            log.warning("run %s step %s: successors' doorbells not prepared ahead", run.id, step_id,
                        exc_info=True)

    try:
        handoff = _once_more_if_disconnected(lambda: rt.journal.steps.complete_step(
            rt.fence(run.id, generation), step_id, attempt, result.output,
            plan=lambda completed: program.handoff(completed, step_id), usage=result.usage,
            frontier=program.redrive_steps, claim_next=claim_next, meanwhile=build))
    except LeaseLost:
        log.warning("run %s step %s: fenced out (generation %d)", run.id, step_id, generation)
        return StepResult("fenced")
    # A crash before the publish leaves a lease that expires and the sweep re-drives the successors
    # (a successor the completion started too is resumed with the same attempt).
    kept = handoff.ahead if chain and not own else None  # a finisher's chain: no message at all
    rt.hand_off(run.id, step_id, handoff.dispatch, generation, ahead=handoff.ahead, prepared=prepared,
                kept=kept is not None, runs_next=runs_next)
    if handoff.finished:
        _ended(rt, run)
    return StepResult("completed", handoff.dispatch, handoff.finished, usage=result.usage, ahead=kept)


def _chainable(rt: Runtime, program: Program, step_id: str) -> bool:
    try:
        node = program.node(step_id)
        return node.kind.chainable(node.data, NodeServices(rt))
    except Exception:  # a plan or provider problem shows when the step runs from its message
        return False


def _once_more_if_disconnected(operation: Callable[[], T]) -> T:
    """Run a claim or a completion; once more if the connection it used had died (a Postgres
    restart), on the fresh connection the pool now has. Safe even if the first try committed
    before the connection dropped: the claim then finds its own step_started (a duplicate: the
    lease lapses and the sweep re-drives), the completion its own step_completed (nothing to hand
    off: the same)."""
    try:
        return operation()
    except StorageError as exc:
        if not exc.disconnected:
            raise
        log.warning("journal connection lost (%s); trying once more", exc)
        return operation()


def _park(rt: Runtime, run: RunRecord, step_id: str, attempt: int, generation: int, park: Park,
          program: Program) -> StepResult:
    """Journal `step_waiting` and, when nothing else is in flight, park the run."""
    try:
        parked = rt.journal.waits.park_step(rt.fence(run.id, generation), step_id, attempt,
                                            payload=park.payload, wake_at=park.wake_at,
                                            frontier=program.redrive_steps, event=park.event)
    except LeaseLost:
        log.warning("run %s step %s: fenced out (generation %d)", run.id, step_id, generation)
        return StepResult("fenced")
    except PalError:
        log.exception("run %s step %s: could not park; the sweep re-drives it", run.id, step_id)
        return StepResult("park_failed")
    if park.payload.get("child_run_id") or park.payload.get("kind") == EVENT:
        # The child may already have finished, or the signal come, before the park committed: look
        # once now.
        _wake_parent(rt, run.id)
    if parked:
        _wake_parent(rt, run.parent_run_id)  # it may act on a paused child (onChildApproval: fail)
    log.info("run %s step %s waiting%s", run.id, step_id, "; run parked" if parked else "")
    return StepResult("waiting", parked=bool(parked))


def _stopped_by_budget(rt: Runtime, run: RunRecord, step_id: str, attempt: int, generation: int,
                       over: Breach) -> StepResult:
    """End the run `run_failed {code: budget_exceeded}` through the usual exactly-once path."""
    error = budget_failure(over)
    failed = rt.journal.steps.fail_step(rt.fence(run.id, generation), step_id, attempt, error)
    log.warning("run %s: stopped by its budget before step %s: %s", run.id, step_id,
                over.as_payload()["message"])
    if failed:
        _ended(rt, run)
    return StepResult("failed" if failed else "fenced", finished=failed, error=error)


def _wake_parent(rt: Runtime, parent_run_id: str | None) -> None:
    if parent_run_id is not None:
        wake_quietly(rt, parent_run_id)


def _ended(rt: Runtime, run: RunRecord) -> None:
    """The run ended here: its parent acts on it; its admission slot goes to a held run."""
    _wake_parent(rt, run.parent_run_id)
    after_run_ended(rt, run)


def _failed(rt: Runtime, run_id: str, step_id: str, attempt: int, generation: int,
            exc: BaseException, policy: retry.RetryPolicy, run: RunRecord,
            paused: int = 0) -> StepResult:
    """Retry the step when its policy says so, else fail it (and the run). `paused`: attempts
    that were claimed but never ran their node (an approved budget pause)."""
    settings, journal = rt.settings, rt.journal
    error = failure_payload(exc)
    decision = retry.decide(policy, attempt - paused, error["class"])
    if decision.retry:
        kept = journal.steps.retry_step(rt.fence(run_id, generation), step_id, attempt,
                                        of=policy.max_attempts, error=error, backoff_s=decision.backoff_s)
        if not kept:
            return StepResult("fenced")
        faults.point("after_retry_commit", step_id, run_id)
        # Not a failure yet: one line, without the traceback (journaled in step_retrying).
        log.warning("run %s step %s attempt %d: %s: %s; %s; attempt %d in %.3gs", run_id, step_id,
                    attempt, error["type"], error["message"], decision.reason, decision.next_attempt,
                    decision.backoff_s)
        if retry.backoff_lease(decision.backoff_s, settings.lease_ttl)[1]:
            rt.publish(run_id, step_id, generation, countdown=decision.backoff_s)
        return StepResult("retrying", (step_id,), error=error)
    if policy.max_attempts > 1:
        error["retry"] = decision.reason
    failed = journal.steps.fail_step(rt.fence(run_id, generation), step_id, attempt, error)
    if not failed:
        log.info("run %s step %s failed, but its write was fenced out: %s", run_id, step_id, exc)
        return StepResult("fenced", error=error)
    # The journaled traceback (bounded, redacted), so the log and the journal say the same.
    log.error("run %s step %s failed (attempt %d): %s: %s\n%s", run_id, step_id, attempt, error["type"],
              error["message"], error["traceback"].rstrip() or "(no traceback)")
    _ended(rt, run)
    return StepResult("failed", finished=True, error=error)
