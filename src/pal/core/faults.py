"""Named fault points in the step protocol, armed only by tests (PAL_FAULT_POINT).

PAL_FAULT_POINT is a comma-separated list of targets `<point>[:<step_id>][@<run_id>]`: the process
SIGKILLs itself the first time it reaches a target's point (for that step, in that run; a point
with no step, such as `during_finish`, matches on the run alone). PAL_FAULT_ONCE_FILE names a
marker created just before the kill, so a restarted process with the same environment does not die
again; with several targets, target i uses `<PAL_FAULT_ONCE_FILE>.<i>`, so each fires once.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

STEP_POINTS = (
    "after_claim_commit",  # step_started is committed, the node has not run
    "before_effect",  # inside the heartbeat, just before the node's effect
    "after_effect",  # the node returned; step_completed not yet written
    "after_complete_commit",  # step_completed and the hand-off are committed, nothing published
    "before_publish",  # about to publish the first successor
    "during_finish",  # terminal event written, transaction not yet committed
)
DELIVERY_POINTS = (
    "after_receipt_claim",  # a delivery's receipt is claimed and committed, nothing sent yet
    "after_delivery",  # the delivery was sent, its receipt not yet settled (the in-doubt window)
)
RETRY_POINTS = ("after_retry_commit",)  # step_retrying is committed, the next attempt not published
# a claim's anomaly_detected, or a gated step's confidence_evaluated, is committed; the node has not run
WATCH_POINTS = ("after_anomaly_commit", "after_confidence_commit")
POINTS = STEP_POINTS + DELIVERY_POINTS + RETRY_POINTS + WATCH_POINTS


@dataclass(frozen=True)
class Target:
    point: str
    step_id: str | None
    run_id: str | None

    def matches(self, point: str, step_id: str | None, run_id: str | None) -> bool:
        return (self.point == point and self.step_id in (None, step_id)
                and self.run_id in (None, run_id))


def parse(raw: str) -> list[Target]:
    """The targets of a PAL_FAULT_POINT value; ValueError names an unknown point."""
    targets = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        where, _, run_id = part.partition("@")
        point, _, step_id = where.partition(":")
        if point not in POINTS:
            raise ValueError(f"PAL_FAULT_POINT={part!r}: unknown point (known: {', '.join(POINTS)})")
        targets.append(Target(point, step_id or None, run_id or None))
    return targets


def armed() -> list[Target]:
    return parse(os.environ.get("PAL_FAULT_POINT", ""))


def point(name: str, step_id: str | None = None, run_id: str | None = None) -> None:
    """Die here, with SIGKILL, if a test armed this point."""
    raw = os.environ.get("PAL_FAULT_POINT")
    if not raw:  # the production path: one dictionary lookup
        return
    targets = parse(raw)
    for index, target in enumerate(targets):
        if not target.matches(name, step_id, run_id):
            continue
        marker = os.environ.get("PAL_FAULT_ONCE_FILE")
        if marker:
            if len(targets) > 1:
                marker = f"{marker}.{index}"
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
        os.kill(os.getpid(), signal.SIGKILL)
