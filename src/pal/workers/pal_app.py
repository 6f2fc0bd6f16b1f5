"""The Celery app: safe delivery settings (docs/architecture.md, "Workers"), one PAL runtime per app."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_shutdown, worker_shutdown

from pal.config import DEFAULT_VISIBILITY_TIMEOUT_SECONDS, Settings
from pal.config.broker import scheme_of
from pal.core.redact import install_log_redaction
from pal.engine.async_steps import AsyncSteps
from pal.engine.runtime import Runtime
from pal.storage.private_files import private_folder
from pal.workers import celery_private
from pal.workers.beat import schedule_of
from pal.workers.fs_transport import TRANSPORT as FILESYSTEM_TRANSPORT
from pal.workers.node_messages import NodePublisher
from pal.workers.publishing import publisher_of
from pal.workers.redis_transport import TRANSPORT as REDIS_TRANSPORT
from pal.workers.shutdown import install_shutdown_grace
from pal.workers.task_names import EXECUTE_NODE, SPAWN_VM
from pal.workers.tasks import register_tasks

log = logging.getLogger(__name__)


class PalCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries its PAL runtime, so tasks need no module globals."""

    runtime: Runtime
    node_publisher: NodePublisher | None  # the fast path for `pal.execute_node` (Redis only)


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {"visibility_timeout": DEFAULT_VISIBILITY_TIMEOUT_SECONDS}
    if settings.is_embedded_broker:
        folder = settings.broker_folder
        for sub in ("queue", "control"):
            private_folder(folder / sub)  # messages name runs and carry signatures: 0700, as the journal's
        options.update(
            data_folder_in=str(folder / "queue"),
            data_folder_out=str(folder / "queue"),
            control_folder=str(folder / "control"),
            polling_interval=settings.filesystem_poll,
        )
    if settings.broker_key_prefix:
        options["global_keyprefix"] = settings.broker_key_prefix
    options.update(settings.broker.transport_options)  # PAL_BROKER_TRANSPORT_OPTIONS, checked on load
    return options


def broker_paths_off(broker_url: str) -> dict[str, str]:
    """The fast paths a broker's kind turns off, and why (the worker's banner says so). They speak
    to one Redis server over one connection kept for the process's life; behind Sentinel that
    server changes at a failover, which only kombu's own Sentinel transport follows."""
    scheme = scheme_of(broker_url)
    if scheme in ("redis", "rediss"):
        return {}
    why = "a Sentinel broker: kombu's Sentinel transport follows the master" if scheme == "sentinel" \
        else f"a {scheme}:// broker"
    return {"publisher": why, "redis_transport": why}


# Delivery semantics (docs/architecture.md, "Workers"). bench/celery_floor.py uses the same dict,
# so the peer it measures PAL against pays exactly what PAL pays for delivery.
DELIVERY_SETTINGS: dict[str, Any] = {
    "broker_connection_retry_on_startup": True,
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    # A task that raised (StepFailed: its failure is journaled) is acknowledged, not redelivered;
    # only a worker lost mid-task gives its message back (Celery's default, spelled out).
    "task_acks_on_failure_or_timeout": True,
    "worker_prefetch_multiplier": 1,
    "task_serializer": "json",
    "accept_content": ["json"],
    "result_serializer": "json",
    "result_backend": None,
    "task_ignore_result": True,
    "task_store_errors_even_if_ignored": False,
    "worker_send_task_events": True,
    "task_send_sent_event": True,
    "worker_hijack_root_logger": False,
}


def create_app(settings: Settings) -> PalCelery:
    install_log_redaction()  # PAL's records in any process; a process PAL runs widens it (pal.core.redact)
    app = PalCelery("pal", set_as_current=False)
    app.conf.update(DELIVERY_SETTINGS)
    app.conf.update(
        broker_url=settings.broker_url,
        broker_transport_options=broker_transport_options(settings),
        task_default_queue=settings.queue,
        worker_concurrency=settings.worker_concurrency,
        beat_schedule=schedule_of(settings),
        beat_schedule_filename=str(settings.home / "celerybeat-schedule"),
    )
    use_ssl = settings.broker.use_ssl()  # PAL_BROKER_TLS_*; else what the rediss:// URL says
    if use_ssl is not None:
        app.conf.update(broker_use_ssl=use_ssl)
    # Each fast path only where the installed Celery and kombu offer what it needs; else Celery's
    # and kombu's own, public, paths (pal.workers.celery_private).
    paths = celery_private.fast_paths()
    if paths.on("event_batches"):
        app.conf.update(worker_consumer="pal.workers.consumer:Consumer")  # task events leave in batches
    if settings.is_embedded_broker:
        # The filesystem transport has no broadcast; these worker chats would only add noise.
        app.conf.update(worker_enable_remote_control=False, worker_send_task_events=False,
                        task_send_sent_event=False,
                        broker_transport=FILESYSTEM_TRANSPORT if paths.on("atomic_files") else "filesystem")
    if paths.on("redis_transport") and "redis_transport" not in broker_paths_off(settings.broker_url):
        app.conf.update(broker_transport=REDIS_TRANSPORT)
    attach(app, settings)
    return app


def attach(app: Any, settings: Settings) -> Runtime:
    """PAL's runtime, tasks and worker hooks on `app`: PAL's own app, or a team's (pal.install).
    Nothing here changes the app's own settings."""
    node_publisher: NodePublisher | None = None
    if celery_private.fast_paths().on("publisher") and "publisher" not in broker_paths_off(
            str(app.conf.broker_url or "filesystem://")):
        node_publisher = NodePublisher(app, EXECUTE_NODE, settings.queue)
    app.node_publisher = node_publisher
    publish, publish_batch, prepare_doorbell = publisher_of(app, settings.queue, node_publisher)
    app.runtime = runtime = Runtime(settings, publish, publish_batch, prepare_doorbell)

    def awaits_steps(sender: Any = None, **_: Any) -> None:  # a worker of this app, not a client
        if getattr(sender, "app", None) is app:
            runtime.async_steps = AsyncSteps(settings.async_steps, runtime.leases)
            install_shutdown_grace(runtime, settings.shutdown_grace)

    worker_init.connect(awaits_steps, weak=False)
    runtime.publish_vm = lambda vm_id: app.send_task(SPAWN_VM, args=[vm_id], queue=settings.vm_queue)
    register_tasks(app)

    def flush_traces(**_: Any) -> None:  # a worker (or pool child) stopping exports its batched spans
        # Awaited steps in flight finish and journal first, within a lease's time; the rest lapse
        # and the sweep re-drives them.
        if runtime.async_steps is not None and not runtime.async_steps.drain(settings.lease_ttl):
            log.warning("pal worker: stopping with awaited steps in flight; the orphan sweep re-drives them")
        tracing = runtime.__dict__.get("tracing")  # only if this process made one
        if tracing is not None:
            tracing.shutdown()

    worker_process_shutdown.connect(flush_traces, weak=False)
    worker_shutdown.connect(flush_traces, weak=False)
    return runtime
