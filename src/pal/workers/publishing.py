"""How the runtime rings doorbells on Celery: signed `pal.execute_node` messages, sent one at a time
or batched into one broker round trip (pal.engine.runtime.Publish, PublishBatch)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pal.core.records import ClaimAhead
from pal.engine.runtime import BuildMessage, Publish, PublishBatch
from pal.workers import celery_private
from pal.workers.node_messages import Built, NodePublisher, OwnMessage
from pal.workers.task_names import EXECUTE_NODE, SENT_AT_HEADER


def publisher_of(app: Any, queue: str,
                 node_publisher: NodePublisher | None) -> tuple[Publish, PublishBatch, BuildMessage | None]:
    """`app` is the PalCelery whose runtime signs the messages; `node_publisher` its Redis fast path."""
    batching = threading.local()  # the producer of this thread's open publish batch, if any

    def publish(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0,
                built: object = None) -> None:
        if node_publisher is not None and countdown <= 0:
            node_publisher.publish(_message(app, built, run_id, step_id, generation))  # held if batching
            return
        args = _signed(app, run_id, step_id, generation)
        # A countdown is held by the consuming worker's timer, not by a blocked process.
        app.send_task(EXECUTE_NODE, args=args, queue=queue,
                      countdown=countdown if countdown > 0 else None,
                      producer=getattr(batching, "producer", None),
                      headers={SENT_AT_HEADER: time.time() + max(countdown, 0.0)})

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
        with app.producer_or_acquire() as producer, celery_private.publish_batch(producer):
            batching.producer = producer
            try:
                yield
            finally:
                batching.producer = None

    if node_publisher is None:
        return publish, publish_batch, None

    def build(run_id: str, step_id: str, generation: int, own: bool = False) -> object:
        """A doorbell's message, signed, built ahead of its publish (pal.engine.runtime.BuildMessage)."""
        return node_publisher.build(_signed(app, run_id, step_id, generation), own)

    return publish, publish_batch, build


class TakenBack:
    """`Runtime.own_messages` on PAL's Redis transport: a solo worker's chain of steps takes the
    message of its step's one successor straight back (pal.workers.inline), so the completion
    may claim that successor for it (pal.engine.steps)."""

    def __init__(self, app: Any, node_publisher: NodePublisher) -> None:
        self._app, self._publisher = app, node_publisher

    def can_take(self) -> bool:
        return self._publisher.can_take()

    def publish_and_take(self, run_id: str, step_id: str, generation: int, built: object = None,
                         ahead: ClaimAhead | None = None) -> bool:
        return self._publisher.publish_taken(_message(self._app, built, run_id, step_id, generation), ahead)


def _message(app: Any, built: object, run_id: str, step_id: str,
             generation: int) -> list[Any] | Built | OwnMessage:
    """The message `build` made ahead for this doorbell, if it did; else its signed arguments."""
    return built if isinstance(built, Built | OwnMessage) else _signed(app, run_id, step_id, generation)


def _signed(app: Any, run_id: str, step_id: str, generation: int) -> list[Any]:
    """A doorbell's arguments, signed, so that a worker can tell PAL's doorbells from forged ones
    (pal.core.doorbell)."""
    return [run_id, step_id, generation, app.runtime.doorbell_signature(run_id, step_id, generation)]
