"""The celery beat schedule: the orphan sweep and the due schedules' ticks every
PAL_RECOVERY_INTERVAL, and the baselines every PAL_BASELINE_INTERVAL (declared for operators in
beat_schedule.py at the repository root)."""

from __future__ import annotations

from typing import Any

from pal.config import Settings
from pal.workers.task_names import FIRE_SCHEDULES, RECOMPUTE_BASELINES, SWEEP_ORPHANS


def schedule_of(settings: Settings) -> dict[str, dict[str, Any]]:
    return {
        "pal-sweep-orphans": {
            "task": SWEEP_ORPHANS,
            "schedule": settings.recovery_interval,
            # A pass older than one interval is pointless: the next one is already due.
            "options": {"queue": settings.queue, "expires": settings.recovery_interval},
        },
        "pal-fire-schedules": {
            "task": FIRE_SCHEDULES,
            "schedule": settings.recovery_interval,
            "options": {"queue": settings.queue, "expires": settings.recovery_interval},
        },
        "pal-recompute-baselines": {
            "task": RECOMPUTE_BASELINES,
            "schedule": settings.baseline_interval,
            "options": {"queue": settings.queue, "expires": settings.baseline_interval},
        },
    }
