"""The step protocol (DESIGN.md): claim, run with heartbeat, complete and hand off, publish.

Transport-agnostic: the Celery task `pal.execute_node` calls `execute_step`, and so can a test.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from pal import faults, interpreter
from pal.errors import LeaseLost, PalError
from pal.journal import ClaimOutcome
from pal.nodes import StepContext
from pal.runtime import Runtime

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class StepResult:
    outcome: str  # a ClaimOutcome value, or "completed" / "failed" / "fenced"
    dispatched: tuple[str, ...] = ()
    finished: bool = False


class Heartbeat:
    """Renews the run's lease every third of its TTL while a node runs."""

    def __init__(self, rt: Runtime, run_id: str, generation: int) -> None:
        self._rt, self._run_id, self._generation = rt, run_id, generation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease:{run_id}", daemon=True)
        self.lost = False

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        interval = self._rt.settings.lease_ttl / 3
        worker_id = self._rt.worker_id
        while not self._stop.wait(interval):
            try:
                held = self._rt.journal.renew_lease(
                    run_id=self._run_id, generation=self._generation, worker_id=worker_id,
                    now=utcnow(), lease_ttl=self._rt.settings.lease_ttl)
            except PalError:
                log.warning("lease renewal of run %s failed; will retry", self._run_id,
                            exc_info=True)
                continue
            if not held:
                self.lost = True
                log.warning("run %s: lease generation %d was taken over", self._run_id,
                            self._generation)
                return


def _error_of(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:4000]}


def execute_step(rt: Runtime, run_id: str, step_id: str, generation: int) -> StepResult:
    """Run one step of one run, exactly as one `pal.execute_node` message asks."""
    settings, journal, worker_id = rt.settings, rt.journal, rt.worker_id
    claim = journal.claim_step(run_id=run_id, step_id=step_id, generation=generation,
                               worker_id=worker_id, now=utcnow(), lease_ttl=settings.lease_ttl)
    if claim.outcome is not ClaimOutcome.RUN or claim.run is None:
        log.info("run %s step %s gen %d: %s, nothing to do", run_id, step_id, generation,
                 claim.outcome.value)
        return StepResult(claim.outcome.value)
    faults.point("after_claim_commit", step_id)
    graph = rt.graph_of(claim.run)
    ctx = StepContext(run_id=run_id, step_id=step_id, attempt=claim.attempt,
                      input=claim.run.input, outputs=claim.completed or {})
    try:
        node = graph.nodes[step_id]
        with Heartbeat(rt, run_id, generation):
            faults.point("before_effect", step_id)
            output = node.kind.execute(node.data, ctx)
            faults.point("after_effect", step_id)
            json.dumps(output)  # a non-JSON output fails the step here, not the journal later
    except Exception as exc:  # a node's failure is data for the journal, not a worker crash
        if isinstance(exc, KeyError) and step_id not in graph.nodes:
            exc = PalError(f"step {step_id!r} is not a node of the run's graph")
        elif isinstance(exc, TypeError | ValueError) and "JSON" in str(exc):
            exc = PalError(f"step {step_id!r} returned a value that is not JSON: {exc}")
        failed = journal.fail_step(run_id=run_id, step_id=step_id, attempt=claim.attempt,
                                   generation=generation, error=_error_of(exc),
                                   worker_id=worker_id, now=utcnow(),
                                   lease_ttl=settings.lease_ttl)
        log.info("run %s step %s failed: %s", run_id, step_id, exc)
        return StepResult("failed" if failed else "fenced", finished=failed)
    try:
        handoff = journal.complete_step(
            run_id=run_id, step_id=step_id, attempt=claim.attempt, generation=generation,
            output=output, worker_id=worker_id, now=utcnow(), lease_ttl=settings.lease_ttl,
            plan=lambda completed: interpreter.handoff(graph, completed, step_id),
        )
    except LeaseLost:
        log.warning("run %s step %s: fenced out (generation %d)", run_id, step_id, generation)
        return StepResult("fenced")
    # Publish only after the commit: a crash here leaves a lease that expires and the sweep
    # re-drives the successors.
    faults.point("after_complete_commit", step_id)
    for successor in handoff.dispatch:
        faults.point("before_publish", step_id)
        rt.publish(run_id, successor, generation)
    return StepResult("completed", handoff.dispatch, handoff.finished)
