"""Publishes `pal.execute_node` messages without Celery's generic send path.

Every step hands off by publishing one message per successor, so this is the hottest publish PAL
makes. `Celery.send_task` serves any task on any broker: it looks the task up and merges its
options, routes it, copies and binds the queue and the event exchange to declare them (cached or
not), wraps the publish in a retry, and sends the message and its task-sent event as two Redis
round trips, a large share of all the CPU a step costs (docs/benchmarks.md).
This publisher builds the same protocol-2 message with Celery's own
`amqp.as_task_v2` and the same task-sent event with the app's event dispatcher, declares the queue
and the exchange once per connection, and sends both through kombu's Redis publish batch: one
pipeline, one round trip.

It is used only for plain dispatches on PAL's Redis transport. A batch (the sweep's re-drives)
holds its messages and sends them all in one pipeline when it ends. A countdown, or any failure of
the fast path, goes through `send_task`, which retries.
Sending a message twice after a failed batch (whose delivery is uncertain) is safe: a step's
message is idempotent, a duplicate claim finds the step already started or done.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.common import maybe_declare
from kombu.utils.uuid import uuid

from pal.workers.task_names import SENT_AT_HEADER

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
PERSISTENT = 2  # AMQP delivery mode of a task message, as Celery sets it
TRANSIENT = 1  # the event exchange's delivery mode


class NodePublisher:
    """Sends `task_name` messages to one queue, each with its task-sent event, in one round trip."""

    def __init__(self, app: Any, task_name: str, queue: str) -> None:
        self.app = app
        self.task_name = task_name
        self.queue_name = queue
        self.sent_event = bool(app.conf.task_send_sent_event)
        self.sent = 0  # messages this publisher sent itself (the rest went through send_task)
        self._held = threading.local()  # args: the messages of this thread's open batch, if any

    @contextmanager
    def taking_next(self, until: float = float("inf")) -> Iterator[list[bytes]]:
        """The first pipeline this thread sends inside the block also takes the queue's oldest
        message (RPOP, the end BRPOP takes from), returned in the yielded list: a solo worker runs
        it next without another round trip (pal.workers.inline). The pipeline is one transaction,
        so when the queue was empty the message taken is the step's own successor, not one an idle
        worker took first. Nothing is taken when the block publishes nothing, or only through
        `send_task`, or after `until` (time.monotonic())."""
        taken: list[bytes] = []
        self._held.taken = taken
        self._held.until = until
        try:
            yield taken
        finally:
            self._held.taken = None

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Hold this thread's publishes until the block ends, then send them in one round trip.

        A block that raises sends nothing (its callers publish only what they committed, and
        recover what they did not). A block inside an open one joins it.
        """
        if getattr(self._held, "args", None) is not None:
            yield
            return
        held: list[list[Any]] = []
        self._held.args = held
        try:
            yield
        finally:
            self._held.args = None
        if held:
            self._send_or_fall_back(held)

    def publish(self, args: list[Any]) -> None:
        """Publish one message, or hold it for the thread's open batch."""
        held = getattr(self._held, "args", None)
        if held is not None:
            held.append(args)
            return
        self._send_or_fall_back([args])

    def _send_or_fall_back(self, messages_args: list[list[Any]]) -> None:
        try:
            self._send(messages_args)
        except Exception as exc:  # the slow path has the retries and raises the errors
            log.warning("fast publish of %d %s message(s) failed (%r); sending through send_task",
                        len(messages_args), self.task_name, exc)
            for args in messages_args:
                self.app.send_task(self.task_name, args=args, queue=self.queue_name)
            return
        self.sent += len(messages_args)

    def _send(self, messages_args: list[list[Any]]) -> None:
        with self.app.producer_or_acquire() as producer:
            channel = producer.channel
            messages = [message for args in messages_args for message in self._messages(args, channel)]
            if not channel.supports_batch_publish:  # a client that retries would replay a pipeline
                for message, exchange, routing_key in messages:
                    channel.basic_publish(message, exchange=exchange, routing_key=routing_key)
                return
            taken: list[bytes] | None = getattr(self._held, "taken", None)
            self._held.taken = None  # one take per block
            if taken is not None and time.monotonic() >= self._held.until:
                taken = None  # the taker has run long enough: it goes back to its event loop
            # One more than the commands, so that the batch does not flush itself before the take.
            batch = channel.create_publish_batch(max_size=len(messages) + 1)
            try:
                if taken is not None:
                    # MULTI/EXEC: Redis serves a worker blocked in BRPOP only after the EXEC, so an
                    # idle worker cannot snatch the successor from the step that is free to run it.
                    batch.pipeline.multi()
                for message, exchange, routing_key in messages:
                    batch.publish(message, exchange=exchange, routing_key=routing_key)
                replies: list[Any] = []
                if taken is not None:
                    replies = _replies_of(batch.pipeline)
                    batch.pipeline.rpop(self.queue_name)  # the client prefixes the key
                batch.flush()
            finally:
                batch.close()
            if taken is not None and replies and replies[-1] is not None:
                taken.append(replies[-1])

    def _messages(self, args: list[Any], channel: Any) -> list[tuple[Any, str, str]]:
        """The task message for `args` and its task-sent event, each with exchange and routing key."""
        app, amqp = self.app, self.app.amqp
        task_id = uuid()
        root_id = parent_id = None
        parent = app.current_worker_task
        if parent is not None:  # as send_task links a message to the task that sent it (Flower)
            root_id = parent.request.root_id or parent.request.id
            parent_id = parent.request.id
        headers, properties, body, sent_event = amqp.as_task_v2(
            task_id, self.task_name, args=args, kwargs={}, root_id=root_id, parent_id=parent_id,
            reply_to=app.thread_oid, create_sent_event=self.sent_event,
            argsrepr=repr(args), kwargsrepr="{}", ignore_result=None)  # as send_task: the task decides
        properties["delivery_mode"] = PERSISTENT
        headers[SENT_AT_HEADER] = time.time()  # a step span's queue wait starts here (when tracing)
        self._declare(amqp.queues[self.queue_name], channel)
        messages = [(channel.prepare_message(json.dumps(body), 0, CONTENT_TYPE, CONTENT_ENCODING,
                                             headers, properties), "", self.queue_name)]
        if sent_event is not None:
            dispatcher = amqp._event_dispatcher
            self._declare(dispatcher.exchange, channel)
            event = dispatcher._prepare_event("task-sent", dict(
                sent_event, queue=self.queue_name, exchange="", routing_key=self.queue_name))
            messages.append((channel.prepare_message(json.dumps(event), 0, CONTENT_TYPE,
                                                     CONTENT_ENCODING, dispatcher.headers,
                                                     {"delivery_mode": TRANSIENT}),
                             dispatcher.exchange.name, "task.sent"))
        return messages

    @staticmethod
    def _declare(entity: Any, channel: Any) -> None:
        # kombu's maybe_declare binds a copy of the entity on every call before it looks at its
        # cache; look first. The cache belongs to the connection, so a new connection declares.
        if hash(entity) not in channel.connection.client.declared_entities:
            maybe_declare(entity, channel)  # type: ignore[no-untyped-call]


def _replies_of(pipeline: Any) -> list[Any]:
    """A list that will hold the replies of `pipeline`'s next execute (kombu's batch drops them)."""
    replies: list[Any] = []
    execute = pipeline.execute

    def execute_keeping_replies(*args: Any, **kwargs: Any) -> list[Any]:
        result: list[Any] = execute(*args, **kwargs)
        replies.extend(result)
        return result

    pipeline.execute = execute_keeping_replies
    return replies
