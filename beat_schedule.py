"""PAL's celery beat schedule: the orphan sweep and the due ticks of `pal schedules` every
PAL_RECOVERY_INTERVAL (default 30s), and the per-node baselines of anomaly detection every
PAL_BASELINE_INTERVAL (default 5m).

`celery -A pal.workers beat` (or `pal beat`) already uses this schedule; this module is where it is
declared for operators, and `celery beat` deployments that load configuration from a module can
point at it.
"""

from pal.config import load_settings
from pal.workers.beat import schedule_of

beat_schedule = schedule_of(load_settings())
