"""`pal.install(app)`: PAL's tasks, runtime and beat entries on a team's own Celery app.

PAL's own app (pal.workers.pal_app) sets Celery's global settings for delivery. A team's app keeps
its own: each of PAL's tasks carries its delivery semantics itself (pal.workers.tasks.PER_TASK:
acknowledged late, given back when its worker is lost, JSON, no result), PAL names its queue
(`PAL_QUEUE`) in everything it sends, and the beat schedule gains PAL's entries beside the app's.
What install checks, and refuses with a clear error, is only what PAL cannot work without: a
broker PAL's clients reach too, and JSON among the content types the app's workers accept.

What stays the team's choice, and what PAL would set on an app of its own (docs/architecture.md,
"Hosting PAL on your Celery app"): `worker_prefetch_multiplier=1` (otherwise a worker may hold a
few doorbells while a step runs: later, never lost), task events for Flower
(`worker_send_task_events`, `task_send_sent_event`), and PAL's faster Redis transport and event
consumer, which are worker-wide.
"""

from __future__ import annotations

from typing import Any

from pal.config import Settings, load_settings
from pal.core.redact import install_log_redaction, redact_text
from pal.engine.runtime import Runtime
from pal.errors import ConfigError
from pal.workers.beat import schedule_of
from pal.workers.pal_app import attach


def install(app: Any, settings: Settings | None = None) -> Runtime:
    """Host PAL on `app` (a `celery.Celery`): its workers run PAL's steps from PAL's queue
    (`PAL_QUEUE`) beside the app's own tasks, and its beat sends PAL's orphan sweep. `settings`
    defaults to the PAL_* environment, whose PAL_BROKER_URL (and PAL_BROKER_KEY_PREFIX) must be the
    app's broker (and its key prefix)."""
    if getattr(app, "runtime", None) is not None:
        raise ConfigError("PAL is installed on this Celery app already")
    settings = settings or load_settings()
    broker = str(app.conf.broker_url or "")
    if broker != settings.broker_url:
        raise ConfigError(redact_text(
            f"this Celery app's broker is {broker or 'not set'}, PAL_BROKER_URL is {settings.broker_url}: "
            "PAL's clients would ring doorbells no worker of this app hears; set PAL_BROKER_URL to the "
            "app's broker_url"))
    app_options = app.conf.broker_transport_options or {}
    prefix = app_options.get("global_keyprefix", "") or ""
    master = settings.broker.transport_options.get("master_name")
    if master is not None and app_options.get("master_name") != master:
        raise ConfigError(f"this Celery app's Sentinel master is {app_options.get('master_name')!r}, "
                          f"PAL_BROKER_TRANSPORT_OPTIONS names {master!r}: PAL's clients would ring "
                          "doorbells on another Redis")
    if prefix != settings.broker_key_prefix:
        raise ConfigError(f"this Celery app's broker key prefix is {prefix!r}, PAL_BROKER_KEY_PREFIX is "
                          f"{settings.broker_key_prefix!r}: PAL's clients would queue doorbells this app's "
                          "workers never read")
    accepted = {str(kind) for kind in (app.conf.accept_content or ())}
    if not accepted & {"json", "application/json"}:
        raise ConfigError(f"this Celery app accepts {sorted(accepted)}, not JSON: PAL's messages are JSON; "
                          "add 'json' to accept_content")
    install_log_redaction()  # PAL's own loggers only (pal.core.redact)
    app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), **schedule_of(settings)}
    return attach(app, settings)
