"""PAL's celery beat schedule: the orphan sweep every PAL_RECOVERY_INTERVAL (default 30s).

`celery -A pal.workers beat` (or `pal beat`) already uses this schedule; this module is where it is
declared for operators, and `celery beat` deployments that load configuration from a module can
point at it.
"""

from pal.config import load_settings
from pal.workers.beat import sweep_schedule

beat_schedule = sweep_schedule(load_settings())
