"""The Celery app: safe delivery settings from DESIGN.md, one PAL runtime per app."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

from pal.config import DEFAULT_VISIBILITY_TIMEOUT_SECONDS, Settings
from pal.core.redact import install_log_redaction
from pal.engine.recovery import sweep_schedule
from pal.engine.runtime import Runtime
from pal.workers.node_messages import NodePublisher

EXECUTE_NODE = "pal.execute_node"
START_RUN = "pal.start_run"


class PalCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries its PAL runtime, so tasks need no module globals."""

    runtime: Runtime
    node_publisher: NodePublisher | None  # the fast path for `pal.execute_node` (Redis only)


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {"visibility_timeout": DEFAULT_VISIBILITY_TIMEOUT_SECONDS}
    if settings.is_embedded_broker:
        folder = settings.broker_folder
        for sub in ("queue", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        options.update(
            data_folder_in=str(folder / "queue"),
            data_folder_out=str(folder / "queue"),
            control_folder=str(folder / "control"),
            polling_interval=settings.filesystem_poll,
        )
    if settings.broker_key_prefix:
        options["global_keyprefix"] = settings.broker_key_prefix
    return options


# Delivery semantics from DESIGN.md. bench/celery_floor.py uses the same dict, so the peer it
# measures PAL against pays exactly what PAL pays for delivery.
DELIVERY_SETTINGS: dict[str, Any] = {
    "broker_connection_retry_on_startup": True,
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
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
    install_log_redaction()  # every process that runs or sends PAL's tasks (pal.core.redact)
    app = PalCelery("pal", set_as_current=False)
    app.conf.update(DELIVERY_SETTINGS)
    app.conf.update(
        broker_url=settings.broker_url,
        broker_transport_options=broker_transport_options(settings),
        task_default_queue=settings.queue,
        worker_concurrency=settings.worker_concurrency,
        beat_schedule=sweep_schedule(settings),
        beat_schedule_filename=str(settings.home / "celerybeat-schedule"),
        worker_consumer="pal.workers.consumer:Consumer",  # task events leave in batches
    )
    if settings.is_embedded_broker:
        from pal.workers.fs_transport import TRANSPORT

        # The filesystem transport has no broadcast; these worker chats would only add noise.
        app.conf.update(worker_enable_remote_control=False, worker_send_task_events=False,
                        task_send_sent_event=False, broker_transport=TRANSPORT)
    node_publisher: NodePublisher | None = None
    if settings.broker_url.startswith("redis://"):
        from pal.workers.redis_transport import TRANSPORT as REDIS_TRANSPORT

        app.conf.update(broker_transport=REDIS_TRANSPORT)
        node_publisher = NodePublisher(app, EXECUTE_NODE, settings.queue)
    app.node_publisher = node_publisher

    batching = threading.local()  # the producer of this thread's open publish batch, if any

    def publish(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0) -> None:
        # Signed, so that a worker can tell PAL's doorbells from forged ones (pal.core.doorbell).
        args = [run_id, step_id, generation, app.runtime.doorbell_signature(run_id, step_id, generation)]
        if node_publisher is not None and countdown <= 0:
            node_publisher.publish(args)  # held if a batch is open
            return
        # A countdown is held by the consuming worker's timer, not by a blocked process.
        app.send_task(EXECUTE_NODE, args=args, queue=settings.queue,
                      countdown=countdown if countdown > 0 else None,
                      producer=getattr(batching, "producer", None))

    @contextmanager
    def publish_batch() -> Iterator[None]:
        # The batch's messages (and their task-sent events) go out in one Redis pipeline at its
        # end; a transport without batches publishes at once.
        if node_publisher is not None:
            with node_publisher.batch():
                yield
            return
        if getattr(batching, "producer", None) is not None:  # already batching: join it
            yield
            return
        with app.producer_or_acquire() as producer, producer.batch():
            batching.producer = producer
            try:
                yield
            finally:
                batching.producer = None

    app.runtime = Runtime(settings, publish, publish_batch)
    from pal.workers.tasks import register_tasks

    register_tasks(app)
    return app
