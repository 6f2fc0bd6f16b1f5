"""A worker told to stop (SIGTERM, as a deploy sends) takes no new step, lets the steps it runs finish
within PAL_SHUTDOWN_GRACE, then hands back the leases of those it could not finish and exits.

Handed back, a run's lease is taken over at once (pal.engine.recovery.hand_back): another worker
runs the cut-off step again with the same attempt, so with the same idempotency key, a second after
the grace rather than after the lease lapses and the next sweep comes (up to PAL_LEASE_TTL +
PAL_RECOVERY_INTERVAL). The grace should end before the platform's own (Kubernetes sends SIGKILL
after `terminationGracePeriodSeconds`, 30 s by default); a worker killed first is recovered by the
sweep as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any

import billiard  # type: ignore[import-untyped]
from celery.signals import worker_shutting_down

from pal.engine.recovery import hand_back
from pal.engine.runtime import Runtime, worker_id_of

log = logging.getLogger(__name__)


class ShutdownGrace:
    """The grace of one worker process: armed by its first warm shutdown, fired once."""

    def __init__(self, runtime: Runtime, grace: float) -> None:
        self.runtime, self.grace = runtime, grace
        self._timer: threading.Timer | None = None

    def arm(self, **_: Any) -> None:
        if self._timer is not None:
            return
        log.warning("pal worker: stopping; steps in flight have %gs to finish (PAL_SHUTDOWN_GRACE), then "
                    "their leases are handed back", self.grace)
        self._timer = threading.Timer(self.grace, self.expire)
        self._timer.daemon = True  # a worker whose steps all finished exits without waiting for it
        self._timer.start()

    def expire(self) -> None:
        """The grace is over: hand back what is still held, stop the pool's processes, exit."""
        children = [child.pid for child in billiard.active_children() if child.pid]
        # The worker ids this worker's steps hold leases as: its own process and its pool's.
        holders = [worker_id_of(os.getpid()), *(worker_id_of(pid) for pid in children)]
        try:
            recovered = hand_back(self.runtime, holders)
        except Exception:  # the journal or the broker is gone: the sweep recovers them later
            log.exception("pal worker: leases not handed back; the orphan sweep recovers their runs")
            recovered = {}
        for run_id, recovery in recovered.items():
            log.warning("pal worker: run %s handed back: step(s) %s rung again (generation %d)", run_id,
                        ", ".join(recovery.resumed_steps) or "none", recovery.generation)
        log.warning("pal worker: grace over; %d run(s) handed back; exiting", len(recovered))
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        logging.shutdown()
        os._exit(0)  # the thread running the cut-off step must not go on: its work is another's now


def install_shutdown_grace(runtime: Runtime, grace: float) -> ShutdownGrace:
    """Arm the grace on this process's warm shutdown (Celery's worker_shutting_down, sent in a
    worker's main process only)."""
    keeper = ShutdownGrace(runtime, grace)
    worker_shutting_down.connect(keeper.arm, weak=False)
    return keeper
