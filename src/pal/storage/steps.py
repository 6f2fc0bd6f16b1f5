"""The step protocol's writes: claim, complete, retry, fail, doubt, and the lease heartbeat.

On Postgres the usual claim and the usual completion are one statement each, a server-side function
run in autocommit mode (pal.storage.one_call, migration 0006): the decision is predicted from the
process's step log and the function applies it only if the journal has nothing newer, under the
same fence; otherwise the transaction decides (docs/architecture.md, "The life of one step").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from pal.core import retry
from pal.core.records import (
    Claim,
    ClaimAhead,
    ClaimOutcome,
    Fence,
    Frontier,
    Handoff,
    Meanwhile,
    Needs,
    Plan,
    Ready,
    Usage,
)
from pal.core.step_log import StepLog
from pal.core.views import WithOne
from pal.core.vocabulary import TERMINAL_STATUSES, EventKind, RunStatus
from pal.errors import journal_error
from pal.storage.base import EventRow, Outcome, event_rows, json_safe, lease_lost
from pal.storage.one_call import AutocommitCalls
from pal.storage.primitives import Primitives, started_payload
from pal.storage.schema import runs
from pal.storage.sql.queries import query

# The one-call statements (storage/sql/queries.sql), looked up once: a step only executes them.
_READ_LOG = query("read_step_log")
_CLAIM_STEP = query("claim_step")
_COMPLETE_STEP = query("complete_step")
# How long after its completion's fence a claimed successor is still its caller's to run without
# a statement (at most a quarter of the lease, which the heartbeat renews after a third): the
# message it was taken with runs next (pal.workers.inline), within milliseconds. A later claim goes
# to the journal, finds the step started, and leaves it to the sweep after its lease.
CLAIMED_AHEAD_S = 1.0


def _predictable(known: StepLog, step_id: str, fence: Fence) -> bool:
    """Whether a one-call claim of the step can be predicted from this log: it has not completed,
    does not wait, and is not backing off. Otherwise a transaction decides."""
    if step_id in known.outputs or step_id in known.waited:
        return False
    due = known.backoff_due(step_id)
    return due is None or due <= fence.now


ClaimNext = bool | Callable[[str], bool]
"""complete_step's `claim_next`: whether to start the one successor for the caller, or which one."""


class _NotReady(Exception):
    """Control flow: the claimed step is not ready; roll the claim's transaction back."""


class StepStore(Primitives):
    def claim_step(self, fence: Fence, step_id: str, *, ready: Ready | None = None,
                   needs: Needs | None = None, ahead: ClaimAhead | None = None) -> Claim:
        """Step protocol, phase 1: fence on the lease and append `step_started`.

        A step that is not on the run's ready frontier (`ready`) is refused with nothing written:
        a message is a doorbell, it cannot start a step the journal has not made ready. `needs`
        lets a one-call claim whose log is behind have Postgres check the missing completions.
        `ahead`: the claim the completion before this step took for its caller
        (`complete_step(claim_next=...)`, `Handoff.ahead`), which answers this claim with no
        statement when it is of this run, step and generation and still fresh."""
        if ahead is not None and ahead.answers(fence.run_id, step_id, fence.generation, time.monotonic()):
            return ahead.claim
        if self.calls is not None:
            claim = self._claim_in_one_call(self.calls, fence, step_id, ready, needs)
            if claim is not None:
                return claim
        try:
            return self._claim_in_transaction(fence, step_id, ready)
        except _NotReady:
            return Claim(ClaimOutcome.NOT_READY)

    def _claim_in_transaction(self, fence: Fence, step_id: str, ready: Ready | None) -> Claim:
        with self._tx() as conn:
            log = self._fence_and_read(conn, fence)
            if log is None:
                status = conn.execute(sa.select(runs.c.status).where(runs.c.id == fence.run_id)).scalar()
                terminal = status is None or status in TERMINAL_STATUSES
                return Claim(ClaimOutcome.TERMINAL if terminal else ClaimOutcome.STALE)
            # The fence held, so the run is in flight (a finished run has no lock row, a parked
            # one a newer generation): what a claim needs of it never changes once written.
            run = self._known_run(conn, fence.run_id)
            if step_id in log.outputs:
                return Claim(ClaimOutcome.COMPLETED, run)
            if step_id in log.waited:
                return Claim(ClaimOutcome.WAITING, run)  # parked: only a decision or its child resumes it
            if ready is not None and not ready(run, log.outputs):
                raise _NotReady(step_id)  # rolls the fence back: nothing is written
            # The attempt comes from the journal: a crash mid-attempt resumes the same attempt.
            attempt = log.next_attempt(step_id)
            due = log.backoff_due(step_id)
            if due is not None and due > fence.now:  # an early message (a re-drive): the backoff holds
                wait_s = (due - fence.now).total_seconds()
                hold, _ = retry.backoff_lease(wait_s, fence.lease_ttl)
                self._fence(conn, fence.held_for(hold))
                return Claim(ClaimOutcome.BACKOFF, run, attempt, wait_s=wait_s)
            if self._start(conn, fence, step_id, attempt) is None:
                return Claim(ClaimOutcome.DUPLICATE, run)
            if not log.outputs:  # a first step: the run may still be queued
                conn.execute(runs.update().where(runs.c.id == fence.run_id, runs.c.status == RunStatus.QUEUED)
                             .values(status=RunStatus.RUNNING, started_at=fence.now))
        return Claim(ClaimOutcome.RUN, run, attempt, log.outputs, log=log)

    def _claim_in_one_call(self, calls: AutocommitCalls, fence: Fence, step_id: str,
                           ready: Ready | None, needs: Needs | None) -> Claim | None:
        """Postgres: the usual claim as one call of `pal_claim`, its attempt predicted from this
        process's step log (a run never seen is read first; its plan and input never change); the
        function starts it only if no newer event concerns the step. None (the caller decides in
        a transaction) when there is nothing to predict from or the prediction did not hold."""
        run_id = fence.run_id
        known = self._known_log(run_id)
        if not _predictable(known, step_id, fence):
            return None
        run = self._known_run_unfenced(run_id)  # a run this process never claimed: read it first
        if run is None:
            return None
        needed: frozenset[str] | None = None
        if ready is not None and not ready(run, known.outputs):
            # Usually this process's log is only behind: another process completed the step's
            # predecessor. When the plan names the completions that would make the step ready,
            # the claim itself checks them (`pal_claim`); otherwise read what came
            # after the log in one more autocommit call, which writes nothing, and decide on it.
            needed = needs(run, known.outputs) if needs is not None else None
            if needed is None:
                fresh = self._read_ahead(calls, fence, known)
                if fresh is None or not _predictable(fresh, step_id, fence) or not ready(run, fresh.outputs):
                    return None  # the transaction decides, and refuses a step that is not ready
                known = fresh
        attempt = known.next_attempt(step_id)
        payload = json.dumps(started_payload(fence, attempt))
        [(word, events)] = calls.rows(_CLAIM_STEP, (
            run_id, fence.generation, fence.worker_id, fence.expires_at, known.seq,
            step_id, attempt, payload, fence.now, not known.outputs, sorted(needed) if needed else None))
        outcome = Outcome(word)
        log = known.extended(event_rows(events)) if events else known
        if events:
            self._remember(run_id, log)  # the call has committed
        if outcome is Outcome.STARTED:
            if needed is not None and ready is not None and not ready(run, log.outputs):
                # Cannot happen while Program.needs is right. If it does, the start is already
                # committed: the step must not run, and it stays started until its lease lapses.
                raise journal_error(f"step {step_id!r} of run {run_id!r} was claimed on completions "
                                    f"{sorted(needed)} that do not make it ready")
            return Claim(ClaimOutcome.RUN, run, attempt, log.outputs, log=log)
        if outcome is Outcome.DUPLICATE:
            return Claim(ClaimOutcome.DUPLICATE, run)
        return None  # refused, or the log moved: the transaction decides

    def _read_ahead(self, calls: AutocommitCalls, fence: Fence, known: StepLog) -> StepLog | None:
        """`known` with the run's events after it (one autocommit call that writes nothing); None
        when the fence no longer holds."""
        [(word, events)] = calls.rows(_READ_LOG, (fence.run_id, fence.generation, known.seq))
        if Outcome(word) is Outcome.FENCED_OUT:
            return None  # stale or over: the transaction says which
        if events:
            known = known.extended(event_rows(events))
            self._remember(fence.run_id, known)  # the call has committed
        return known

    def renew_lease(self, fence: Fence) -> bool:
        """Heartbeat: extend the lease if this generation still holds it."""
        with self._tx() as conn:
            return self._fence(conn, fence)

    def complete_step(self, fence: Fence, step_id: str, attempt: int, output: Any, *, plan: Plan,
                      usage: Usage | None = None, frontier: Frontier | None = None,
                      claim_next: ClaimNext = False, meanwhile: Meanwhile | None = None) -> Handoff:
        """Step protocol, phase 3: `step_completed` (its usage joins the run's totals once), the
        hand-off and maybe the finish, fenced by generation; LeaseLost when fenced out.

        `claim_next` (True, or a predicate on the successor): the caller runs a lone successor
        itself, so a one-call completion also starts its attempt and returns the claim as
        `Handoff.ahead` (docs/decisions/claim-ahead.md). `meanwhile(decision)` runs while a
        one-call completion is on its way (the caller builds the successors' messages); it must not
        raise."""
        payload: dict[str, Any] = {"output": json_safe(output)}
        if usage is not None and (usage.input_tokens or usage.output_tokens or usage.cost_usd):
            payload["usage"] = {"input_tokens": usage.input_tokens,
                                "output_tokens": usage.output_tokens,
                                "cost_usd": str(usage.cost_usd)}
        if self.calls is not None:
            handoff = self._complete_in_one_call(self.calls, fence, step_id, attempt, payload, plan,
                                                 claim_next, meanwhile)
            if handoff is not None:
                return handoff
        with self._tx() as conn:
            log = self._complete_and_read(conn, fence, step_id, attempt, payload)
            if log is None:
                return Handoff(dispatch=(), finished=False)
            if "usage" in payload and usage is not None:
                conn.execute(runs.update().where(runs.c.id == fence.run_id).values(
                    input_tokens=runs.c.input_tokens + usage.input_tokens,
                    output_tokens=runs.c.output_tokens + usage.output_tokens,
                    cost_usd=runs.c.cost_usd + usage.cost_usd))
            decision = plan(log.outputs)
            # The log is the run's whole step log, read under its lock row: when it shows no
            # parked step that a decision has not ended, none waits, and the completion skips the
            # journal's query for waiting steps (a fan-out asked it at each branch's completion,
            # docs/benchmarks.md).
            parking_frontier = frontier if log.waited else None  # None: the run cannot park
            self._settle(conn, fence.run_id, decision, fence.generation, fence.now, parking_frontier)
            return decision

    def _complete_in_one_call(self, calls: AutocommitCalls, fence: Fence, step_id: str, attempt: int,
                              payload: Mapping[str, Any], plan: Plan, claim_next: ClaimNext,
                              meanwhile: Meanwhile | None) -> Handoff | None:
        """Postgres: a completion that only hands off, as one call of `pal_complete`, planned from
        this process's step log; the function appends only if no step event came after that log.
        None (the caller decides in a transaction) when the plan would finish the run, may park it
        (nothing dispatched while a parked step is undecided), or the log was not the latest."""
        run_id = fence.run_id
        known = self._known_log(run_id)
        if step_id in known.outputs:
            return None
        decision = plan(WithOne(known.outputs, step_id, payload["output"]))
        # Writes beyond the completion need the transaction: the run's finish, or its parking
        # when nothing is dispatched and a step of it waits. A completion that dispatches nothing
        # while no step waits (a fan-out's branches, before the last) is one call.
        if decision.finished or (not decision.dispatch and known.waited):
            return None
        # The successor is claimed as the one-call claim would claim it: from the same log, which
        # the function checks is the latest.
        run = self._claimed_runs.get(run_id)
        successor = decision.dispatch[0] if claim_next and len(decision.dispatch) == 1 else None
        if successor is not None and callable(claim_next) and not claim_next(successor):
            successor = None
        if successor is not None and (run is None or successor == step_id
                                      or not _predictable(known, successor, fence)):
            successor = None
        next_attempt = known.next_attempt(successor) if successor is not None else 0
        fenced_at = time.monotonic()  # the lease runs from about now: the claim ahead must not outlive it
        [(word, seq)] = calls.rows(_COMPLETE_STEP, (
            run_id, fence.generation, fence.worker_id, fence.expires_at, known.seq,
            step_id, attempt, json.dumps(payload), fence.now, successor, next_attempt if successor else None,
            json.dumps(started_payload(fence, next_attempt)) if successor else None),
            meanwhile=None if meanwhile is None else lambda: meanwhile(decision))
        outcome = Outcome(word)
        if outcome is Outcome.LOG_MOVED:
            return None
        if outcome is Outcome.FENCED_OUT:
            raise lease_lost(run_id, fence.generation)
        if outcome is Outcome.ALREADY_COMPLETED:
            return Handoff(dispatch=(), finished=False)
        log = known.extended([EventRow(seq, step_id, EventKind.STEP_COMPLETED, payload)])
        self._remember(run_id, log)  # the call has committed
        if run is None or successor is None or outcome is not Outcome.NEXT_STARTED:
            return decision
        claim = Claim(ClaimOutcome.RUN, run, next_attempt, log.outputs, log=log)
        until = fenced_at + min(CLAIMED_AHEAD_S, fence.lease_ttl / 4)
        return replace(decision, ahead=ClaimAhead(run_id, successor, fence.generation, until, claim))

    def retry_step(self, fence: Fence, step_id: str, attempt: int, *, of: int, error: Mapping[str, Any],
                   backoff_s: float) -> bool:
        """Journal `step_retrying {attempt, of, error, wake_at}`; False when fenced out.

        A short backoff extends the lease past the wake-up time, so the sweep leaves the run
        alone while a countdown message waits; a long one lets the lease lapse at the wake-up
        time, and the sweep re-drives the step then (pal.core.retry.backoff_lease). A re-drive that
        comes early finds the wake-up time in the journal and waits (ClaimOutcome.BACKOFF)."""
        wake_at = fence.now + timedelta(seconds=backoff_s)
        hold, _ = retry.backoff_lease(backoff_s, fence.lease_ttl)
        with self._tx() as conn:
            if not self._fence(conn, fence.held_for(hold)):
                return False
            self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_RETRYING,
                         {"attempt": attempt, "of": of, "error": dict(error),
                          "wake_at": wake_at.isoformat()}, fence.generation, fence.now)
        return True

    def fail_step(self, fence: Fence, step_id: str, attempt: int, error: Mapping[str, Any]) -> bool:
        """Journal `step_failed` and fail the run; False when fenced out or already terminal."""
        with self._tx() as conn:
            if not self._fence(conn, fence):
                return False
            self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_FAILED, {"error": dict(error)},
                         fence.generation, fence.now)
            return self._finish(conn, fence.run_id, RunStatus.FAILED, fence.generation, fence.now,
                                error={**error, "step_id": step_id})

    def mark_in_doubt(self, fence: Fence, step_id: str, attempt: int, detail: Mapping[str, Any]) -> None:
        """Journal `step_in_doubt`: a claimed delivery was never confirmed."""
        with self._tx() as conn:
            self._fence_or_lose(conn, fence)
            self._append(conn, fence.run_id, step_id, attempt, EventKind.STEP_IN_DOUBT,
                         json_safe(dict(detail)), fence.generation, fence.now)
