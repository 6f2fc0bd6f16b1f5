"""The words of the journal: run statuses, event kinds, lock-row markers and receipt states.

Each is a `StrEnum`, so a member is the very string stored in Postgres and sent over JSON, and
compares equal to it; code names the member, never the literal (docs/architecture.md, "Tables").
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"  # parked: steps wait (approval, child run) and no worker is held
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


IN_FLIGHT_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
TERMINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
ALL_STATUSES = (*IN_FLIGHT_STATUSES, RunStatus.WAITING, *TERMINAL_STATUSES)


class EventKind(StrEnum):
    RUN_QUEUED = "run_queued"
    RUN_RECOVERED = "run_recovered"  # the sweep (or an operator) stole the lease: generation + 1
    RUN_REDELIVERED = "run_redelivered"  # a recovery's messages sent again
    RUN_RETRIED = "run_retried"  # this run retries another: its reused steps follow (docs/retry-and-fork.md)
    RUN_FORKED = "run_forked"  # this run forks another from a step: its reused steps follow
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    STEP_RETRYING = "step_retrying"
    STEP_WAITING = "step_waiting"  # parked at an approval, a subagent or a timer
    TIMER_SET = "timer_set"  # a sleep node's timer, journaled with its step_waiting
    TIMER_FIRED = "timer_fired"  # that timer woke its step, at most once (pal doctor checks)
    SIGNAL_RECEIVED = "signal_received"  # a wait_event step took a signal sent to its run
    STEP_IN_DOUBT = "step_in_doubt"  # a claimed delivery was never confirmed
    APPROVAL_DECIDED = "approval_decided"
    ANOMALY_DETECTED = "anomaly_detected"  # informational, at most once per (run, kind, step)
    CONFIDENCE_EVALUATED = "confidence_evaluated"  # the gate's score, once per step
    CONFIDENCE_GATE_BYPASSED = "confidence_gate_bypassed"  # policy let a low or unknown score through


TERMINAL_EVENT = {RunStatus.SUCCEEDED: EventKind.RUN_SUCCEEDED, RunStatus.FAILED: EventKind.RUN_FAILED,
                  RunStatus.CANCELLED: EventKind.RUN_CANCELLED}
"""The one terminal event of a run that ends with each status."""
TERMINAL_EVENT_KINDS = tuple(TERMINAL_EVENT.values())


class SourceKind(StrEnum):
    """How a run derives from another (`runs.source_kind`, docs/retry-and-fork.md)."""

    RETRY = "retry"  # the same graph and input, from a failed or cancelled run's failed steps
    FORK = "fork"  # from a chosen step on, with the source's input or a new one


DERIVED_EVENT = {SourceKind.RETRY: EventKind.RUN_RETRIED, SourceKind.FORK: EventKind.RUN_FORKED}
"""The event that opens a derived run's journal, before the steps it reuses."""


class LockHolder(StrEnum):
    """`run_locks.worker_id` values that name no worker."""

    QUEUED = "queued"  # a new or resumed run's lease before any worker claimed a step
    PARKED = "waiting"  # a parked run's row is a wake-up timer, not a lease
    HELD = "held"  # a run waiting for an admission slot: no lease, never an orphan (pal.engine.admission)


class ReceiptStatus(StrEnum):
    CLAIMED = "claimed"  # the delivery is owned; an unconfirmed claim is in doubt
    DELIVERED = "delivered"
    FAILED = "failed"
