"""The orphan sweep and re-drive (docs/specification.md, "Recovery sweep").

Every PAL_RECOVERY_INTERVAL celery beat sends `pal.sweep_orphans`. A pass finds at most 20 runs that
are queued or running with a missing or expired lease, steals each lease with one UPSERT (fresh
10-minute TTL, generation + 1; an unexpired lease is never stolen, so only one sweeper wins), journals
`run_recovered {generation, resumed_steps}` and publishes the first incomplete steps. Messages of the
old generation are then dropped at their claim, and a zombie worker is fenced out of the journal.

Until a worker claims one of the re-driven steps, the pass also re-sends their messages (same
generation, `run_redelivered`) after PAL_LEASE_TTL + PAL_RECOVERY_INTERVAL, then at doubling
intervals: messages lost after a steal (a Redis flush, a claim refused while Postgres restarted)
cost seconds, not the 10-minute recovery lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pal.config import Settings
from pal.core.clock import utcnow
from pal.core.records import Recovery, RunRecord
from pal.engine.admission import admit_everywhere
from pal.engine.runtime import Publish, Runtime
from pal.engine.tracing import end_generation
from pal.engine.vms import resume_microvm_runs
from pal.engine.waiting import wake
from pal.errors import LeaseBusy, PalError

log = logging.getLogger(__name__)

SWEEP_BATCH = 20  # runs per pass (docs/specification.md, Recovery sweep)
RECOVERY_LEASE_SECONDS = 600.0  # the stolen lease's TTL: a fresh 10 minutes


class ResumeRefused(PalError):
    """The run cannot be resumed now."""


@dataclass
class SweepReport:
    found: int = 0
    recovered: dict[str, Recovery] = field(default_factory=dict)
    woken: dict[str, int] = field(default_factory=dict)  # parked runs looked at: steps resumed
    redelivered: dict[str, Recovery] = field(default_factory=dict)  # recoveries sent again
    # orphaned microVM runs: resumeMicroVMRun's decision for each
    microvm: dict[str, str] = field(default_factory=dict)
    admitted: int = 0  # held runs given a slot whose end went unnoticed (pal.engine.admission)


def redrive(rt: Runtime, run_id: str, *, require_expired: bool = True, allow_idle: bool = False,
            lease_ttl: float = RECOVERY_LEASE_SECONDS, now: datetime | None = None,
            publish: Publish | None = None, held_by: Sequence[str] = ()) -> Recovery | None:
    """Take over the run's lease and dispatch its first incomplete steps (a replay), with
    `publish` (the runtime's, unless a batch's).

    A finished run, or one whose lease is still live (when `require_expired`, unless one of
    `held_by` holds it), is left alone.
    """

    recovery = rt.journal.recovery.recover_run(
        run_id=run_id, worker_id=f"recovery:{rt.worker_id}", now=now or utcnow(),
        lease_ttl=lease_ttl, plan=_replay_plan(rt), require_expired=require_expired,
        allow_idle=allow_idle, redeliver_after=redelivery_gap(rt.settings), held_by=held_by,
    )
    if recovery is not None:
        _publish(publish or rt.publish, run_id, recovery)
        _trace_takeover(rt, run_id, recovery, now or utcnow())
    return recovery


def hand_back(rt: Runtime, holders: Sequence[str]) -> dict[str, Recovery]:
    """A stopping worker's leases (`holders`: the worker ids of its processes), taken over at
    once rather than after they lapse: generation + 1, each run's first incomplete steps rung again
    for another worker, a step still running here fenced out of the journal. A re-run step keeps
    its attempt, so its idempotency key is the same."""
    recovered: dict[str, Recovery] = {}
    with rt.publish_batch() as publish:
        for run_id in rt.journal.recovery.leases_held_by(holders):
            try:
                recovery = redrive(rt, run_id, held_by=holders, publish=publish)
            except PalError:  # left to the sweep, after its lease lapses
                log.warning("run %s: its lease was not handed back", run_id, exc_info=True)
                continue
            if recovery is not None:
                recovered[run_id] = recovery
    return recovered


def _trace_takeover(rt: Runtime, run_id: str, recovery: Recovery, now: datetime) -> None:
    """The root span of the generation this recovery took over, when tracing (its worker, lost or
    stopped, never wrote it): ended now, marked as an error (docs/observability.md)."""
    tracing = rt.tracing
    if tracing is None:
        return
    try:
        end_generation(tracing, rt.journal, rt.journal.runs.get_run(run_id), recovery.generation - 1, now,
                       outcome="taken_over", lost=True)
    except PalError:  # a trace is never worth failing a recovery
        log.warning("run %s: the root span of generation %d was not written", run_id,
                    recovery.generation - 1, exc_info=True)


def redelivery_gap(settings: Settings) -> float:
    """The first wait before a recovery's unclaimed messages are sent again: a lease's length plus
    one sweep period, time enough for an idle worker to claim a message that is not lost."""
    return settings.lease_ttl + settings.recovery_interval


def _replay_plan(rt: Runtime) -> Callable[[RunRecord, Mapping[str, Any]], tuple[str, ...]]:
    def plan(run: RunRecord, completed: Mapping[str, Any]) -> tuple[str, ...]:
        return rt.program_of(run).redrive_steps(completed)

    return plan


def _publish(publish: Publish, run_id: str, recovery: Recovery) -> None:
    for step_id in recovery.resumed_steps:
        publish(run_id, step_id, recovery.generation)


def sweep(rt: Runtime, now: datetime | None = None) -> SweepReport:
    """One pass of the orphan sweep."""
    now = now or utcnow()
    report = SweepReport()
    orphans = rt.journal.recovery.orphaned_runs(now=now, limit=SWEEP_BATCH)
    report.found = len(orphans)
    # The pass's messages go out together at its end: one broker round trip instead of two per
    # message. Each is published only after its run's recovery committed, as before; a pass that
    # dies first leaves them to the redelivery below (redeliver_at).
    with rt.publish_batch() as publish:
        _redrive_all(rt, publish, orphans, now, report)
        _redeliver_all(rt, publish, now, report)
    report.microvm = resume_microvm_runs(rt, now, SWEEP_BATCH)
    for run_id in rt.journal.waits.due_waiting_runs(now=now, limit=SWEEP_BATCH):
        try:
            report.woken[run_id] = wake(rt, run_id, now=now)
        except PalError:
            log.exception("sweep: waking parked run %s failed; the next pass retries", run_id)
    try:
        report.admitted = admit_everywhere(rt)
    except PalError:
        log.exception("sweep: the admission pass failed; the next pass retries")
    return report


def _redrive_all(rt: Runtime, publish: Publish, orphans: list[str], now: datetime,
                 report: SweepReport) -> None:
    """Re-drive the orphans in one transaction; run by run if the batch fails as a whole (one run
    whose plan cannot be made must not hold up the others)."""
    if not orphans:
        return
    try:
        recoveries = rt.journal.recovery.recover_orphans(
            run_ids=orphans, worker_id=f"recovery:{rt.worker_id}", now=now,
            lease_ttl=RECOVERY_LEASE_SECONDS, plan=_replay_plan(rt),
            redeliver_after=redelivery_gap(rt.settings))
    except PalError:
        log.warning("sweep: re-driving %d orphans together failed; one by one", len(orphans),
                    exc_info=True)
        _redrive_one_by_one(rt, publish, orphans, now, report)
        return
    for run_id, recovery in recoveries.items():
        _publish(publish, run_id, recovery)
        _recovered(report, run_id, recovery)
        _trace_takeover(rt, run_id, recovery, now)


def _recovered(report: SweepReport, run_id: str, recovery: Recovery) -> None:
    report.recovered[run_id] = recovery
    log.info("sweep: run %s re-driven at generation %d: %s", run_id,
             recovery.generation, ", ".join(recovery.resumed_steps) or "nothing to resume")


def _redrive_one_by_one(rt: Runtime, publish: Publish, orphans: list[str], now: datetime,
                        report: SweepReport) -> None:
    for run_id in orphans:
        try:
            recovery = redrive(rt, run_id, now=now, publish=publish)
        except PalError:
            log.exception("sweep: re-drive of run %s failed; the next pass retries", run_id)
            continue
        if recovery is not None:
            _recovered(report, run_id, recovery)


def _redeliver_all(rt: Runtime, publish: Publish, now: datetime, report: SweepReport) -> None:
    for run_id in rt.journal.recovery.redeliverable_runs(now=now, limit=SWEEP_BATCH):
        try:
            again = rt.journal.recovery.redeliver(run_id=run_id, now=now, min_gap=redelivery_gap(rt.settings),
                                                  plan=_replay_plan(rt))
        except PalError:
            log.exception("sweep: redelivery of run %s failed; the next pass retries", run_id)
            continue
        if again is not None:
            _publish(publish, run_id, again)
            report.redelivered[run_id] = again
            log.info("sweep: run %s: no claim since its recovery, sent again: %s", run_id,
                     ", ".join(again.resumed_steps))


def resume(rt: Runtime, run_id: str, now: datetime | None = None) -> Recovery:
    """An operator's resume: re-drive a run now instead of waiting for the sweep.

    Takes over a lease that has expired, or a live lease under which no step is running (the run
    only waits for messages, which may be lost: after a Redis flush, a stolen 10-minute lease would
    otherwise hold the run that long). Refuses a terminal run, a waiting run, and a run with a step
    running under a live lease, since taking that over could run the step twice.
    """
    now = now or utcnow()
    run = rt.journal.runs.get_run(run_id)
    if run.terminal:
        raise ResumeRefused(f"run {run_id} is {run.status}; there is nothing to resume")
    if run.status not in ("queued", "running"):
        raise ResumeRefused(f"run {run_id} is {run.status}; only queued or running runs resume")
    if run.admitted is False:
        raise ResumeRefused(f"run {run_id} waits for an admission slot (docs/fairness.md); it starts in "
                            "its turn")
    try:
        recovery = redrive(rt, run_id, allow_idle=True, now=now)
    except LeaseBusy as exc:
        raise ResumeRefused(f"{exc}; its lease is live. Wait for the step to finish, or for the "
                            "lease to lapse if its worker died") from exc
    if recovery is None:
        raise ResumeRefused(f"run {run_id} finished or was taken over by another process just now")
    return recovery
