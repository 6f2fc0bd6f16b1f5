"""Named fault points in the step protocol, armed only by tests (PAL_FAULT_POINT).

PAL_FAULT_POINT=<point>[:<step_id>] makes the process SIGKILL itself the first time it reaches that
point (for that step); PAL_FAULT_ONCE_FILE names a marker file created just before the kill, so a
restarted process with the same environment does not die again.
"""

from __future__ import annotations

import os
import signal

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
POINTS = STEP_POINTS + DELIVERY_POINTS + RETRY_POINTS


def armed() -> tuple[str, str | None] | None:
    raw = os.environ.get("PAL_FAULT_POINT", "").strip()
    if not raw:
        return None
    point, _, step = raw.partition(":")
    if point not in POINTS:
        raise ValueError(f"PAL_FAULT_POINT={raw!r}: unknown point (known: {', '.join(POINTS)})")
    return point, step or None


def point(name: str, step_id: str | None = None) -> None:
    """Die here, with SIGKILL, if a test armed this point."""
    target = armed()
    if target is None or target[0] != name or (target[1] is not None and target[1] != step_id):
        return
    marker = os.environ.get("PAL_FAULT_ONCE_FILE")
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
