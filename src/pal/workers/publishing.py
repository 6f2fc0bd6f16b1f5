"""How the runtime rings doorbells on Celery: signed `pal.execute_node` messages, sent one at a time
or batched into one broker round trip (pal.engine.runtime.Publish, PublishBatch)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kombu.exceptions
import redis.exceptions

from pal.core.records import ClaimAhead
from pal.engine.runtime import PrepareDoorbell, Publish, PublishBatch
from pal.errors import BrokerUnavailable
from pal.workers import celery_private
from pal.workers.node_messages import Built, NodePublisher, OwnMessage, Take
from pal.workers.task_names import EXECUTE_NODE, SENT_AT_HEADER

# What a broker that cannot be reached, or refuses the connection, raises: kombu's (send_task) and
# redis-py's (the fast path's own connection).
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError,
                 redis.exceptions.TimeoutError)


def publisher_of(app: Any, queue: str, node_publisher: NodePublisher | None
                 ) -> tuple[Publish, PublishBatch, PrepareDoorbell | None]:
    """`app` is the PalCelery whose runtime signs the messages; `node_publisher` its Redis fast path."""

    def send_task(run_id: str, step_id: str, generation: int, countdown: float, producer: Any = None) -> None:
        # A countdown is held by the consuming worker's timer, not by a blocked process.
        app.send_task(EXECUTE_NODE, args=_signed(app, run_id, step_id, generation), queue=queue,
                      countdown=countdown if countdown > 0 else None, producer=producer,
                      headers={SENT_AT_HEADER: time.time() + max(countdown, 0.0)})

    def publish(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0,
                prepared: object = None) -> None:
        try:
            if node_publisher is not None and countdown <= 0:
                node_publisher.publish(_message(app, prepared, run_id, step_id, generation))
                return
            send_task(run_id, step_id, generation, countdown)
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"the broker did not take the doorbell: {exc}") from exc

    @contextmanager
    def publish_batch() -> Iterator[Publish]:
        # The batch's messages (and their task-sent events) go out in one Redis transaction at its
        # end; a countdown goes at once, to the worker whose timer holds it.
        if node_publisher is not None:
            with node_publisher.batch() as hold:
                def held(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0,
                         prepared: object = None) -> None:
                    if countdown > 0:
                        send_task(run_id, step_id, generation, countdown)
                    else:
                        hold(_message(app, prepared, run_id, step_id, generation))
                yield held
            return
        with app.producer_or_acquire() as producer, celery_private.publish_batch(producer):
            def batched(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0,
                        prepared: object = None) -> None:
                send_task(run_id, step_id, generation, countdown, producer)
            yield batched

    if node_publisher is None:
        return publish, publish_batch, None

    def build(run_id: str, step_id: str, generation: int, own: bool = False) -> object:
        """A doorbell's message, signed, built ahead of its publish (pal.engine.runtime.PrepareDoorbell)."""
        return node_publisher.build(_signed(app, run_id, step_id, generation), own)

    return publish, publish_batch, build


class TakeBack:
    """`RunsNext` on PAL's Redis transport, for one step of a solo worker's chain (pal.workers.inline):
    the step's hand-off takes a message back into `take`, its own successor's or the queue's
    oldest, for the worker to run next."""

    def __init__(self, app: Any, node_publisher: NodePublisher, take: Take) -> None:
        self._app, self._publisher, self.take = app, node_publisher, take

    def may_claim(self) -> bool:
        return self._publisher.can_take(self.take)

    def ring(self, run_id: str, step_id: str, generation: int, prepared: object = None) -> None:
        self._publisher.publish(_message(self._app, prepared, run_id, step_id, generation), take=self.take)

    def ring_own(self, run_id: str, step_id: str, generation: int, prepared: object = None,
                 ahead: ClaimAhead | None = None) -> bool:
        message = _message(self._app, prepared, run_id, step_id, generation)
        return self._publisher.publish_taken(message, self.take, ahead)


def _message(app: Any, prepared: object, run_id: str, step_id: str,
             generation: int) -> list[Any] | Built | OwnMessage:
    """The message `build` made ahead for this doorbell, if it did; else its signed arguments."""
    return prepared if isinstance(prepared, Built | OwnMessage) else _signed(app, run_id, step_id, generation)


def _signed(app: Any, run_id: str, step_id: str, generation: int) -> list[Any]:
    """A doorbell's arguments, signed, so that a worker can tell PAL's doorbells from forged ones
    (pal.core.doorbell)."""
    return [run_id, step_id, generation, app.runtime.doorbell_signature(run_id, step_id, generation)]
