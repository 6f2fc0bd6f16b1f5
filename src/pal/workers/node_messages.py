"""Publishes `pal.execute_node` messages without Celery's generic send path.

Every step hands off by publishing one message per successor, so this is the hottest publish PAL
makes. `Celery.send_task` serves any task on any broker: it looks the task up and merges its
options, routes it, copies and binds the queue and the event exchange to declare them (cached or
not), wraps the publish in a retry, and sends the message and its task-sent event as two Redis
round trips, a large share of all the CPU a step costs (docs/benchmarks.md).
This publisher builds the same protocol-2 message with Celery's own
`amqp.as_task_v2` and the same task-sent event with the app's event dispatcher, in the envelope
kombu's Redis transport stores, and writes both on its process's own broker connection as one
MULTI/EXEC (`BrokerWire`): one write, one round trip, and none of the producer pool's, the publish
batch's or redis-py's pipeline bookkeeping.

It is used only for plain dispatches on PAL's Redis transport. A batch (the sweep's re-drives)
holds its messages and sends them all in one transaction when it ends. A countdown, or any failure of
the fast path, goes through `send_task`, which retries.
Sending a message twice after a failed batch (whose delivery is uncertain) is safe: a step's
message is idempotent, a duplicate claim finds the step already started or done.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from kombu.common import maybe_declare
from kombu.utils.uuid import uuid

from pal.workers.task_names import SENT_AT_HEADER

log = logging.getLogger(__name__)

# A thread that takes its own successor's message back (its completion claimed the step) keeps to
# its run; while other messages wait on the queue it does so at most this many steps in a row, then
# takes the oldest, so a busy queue is still served in about its order (docs/architecture.md,
# "Delivery").
OWN_TAKES_WHILE_OTHERS_WAIT = 2
CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
PERSISTENT = 2  # AMQP delivery mode of a task message, as Celery sets it
TRANSIENT = 1  # the event exchange's delivery mode
SENT_ROUTING_KEY = "task.sent"  # the task-sent event's routing key, as Celery sends it


@dataclass(frozen=True)
class Built:
    """A message built ahead of its publish (`NodePublisher.build`): its arguments, and the Redis
    commands that queue it and send its task-sent event."""

    args: list[Any]
    commands: list[tuple[str, ...]]


class NodePublisher:
    """Sends `task_name` messages to one queue, each with its task-sent event, in one round trip."""

    def __init__(self, app: Any, task_name: str, queue: str) -> None:
        self.app = app
        self.task_name = task_name
        self.queue_name = queue
        self.sent_event = bool(app.conf.task_send_sent_event)
        self.sent = 0  # messages this publisher sent itself (the rest went through send_task)
        self._held = threading.local()  # args: the messages of this thread's open batch, if any
        self._wire: BrokerWire | None = None  # this process's connection (_wire_of_process)
        self._wire_lock = threading.Lock()
        os.register_at_fork(after_in_child=_after_fork_of(weakref.ref(self)))

    @contextmanager
    def taking_next(self, until: float = float("inf")) -> Iterator[list[bytes]]:
        """The first transaction this thread sends inside the block also takes the queue's oldest
        message (RPOP, the end BRPOP takes from), returned in the yielded list: a solo worker runs
        it next without another round trip (pal.workers.inline). In one transaction with the
        publish, so when the queue was empty the message taken is the step's own successor, not
        one an idle worker took first. Nothing is taken when the block publishes nothing, or only through
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
        held: list[list[Any] | Built] = []
        self._held.args = held
        try:
            yield
        finally:
            self._held.args = None
        if held:
            self._send_or_fall_back(held)

    def publish(self, message: list[Any] | Built) -> None:
        """Publish one message (its arguments, or the message `build` made of them), or hold it
        for the thread's open batch."""
        held = getattr(self._held, "args", None)
        if held is not None:
            held.append(message)
            return
        self._send_or_fall_back([message])

    def build(self, args: list[Any]) -> Built | None:
        """The message for `args`, built now to be published later (while the completion that must
        commit first is on its way: pal.engine.steps); None when the broker cannot be reached now
        (the publish then builds it, or falls back to `send_task`)."""
        try:
            return Built(args, self._commands(args, self._wire_of_process()))
        except Exception as exc:  # the publish decides what a broker that is down means
            log.debug("a %s message was not built ahead: %r", self.task_name, exc)
            return None

    def can_take(self) -> bool:
        """Whether this thread's next publish, outside a batch, may take its own message back
        (`taking_next`): not when others have waited on the queue while this thread took
        OWN_TAKES_WHILE_OTHERS_WAIT of its own in a row (it takes the oldest instead)."""
        held = self._held
        return (getattr(held, "taken", None) is not None and getattr(held, "args", None) is None
                and time.monotonic() < held.until
                and getattr(held, "own_streak", 0) < OWN_TAKES_WHILE_OTHERS_WAIT)

    def publish_taken(self, message: list[Any] | Built) -> bool:
        """Publish one message and, inside a `taking_next` block, take that very message back:
        LPUSH, then LPOP of the end it was pushed to, in one transaction, so no other worker can
        have it (its step was claimed for this thread: pal.storage.steps, `claim_next`). False when
        it was not taken back: the fast path failed and the message went through `send_task` to
        whichever worker takes it (one finds the step started and leaves it, and the sweep
        re-drives it when its lease lapses)."""
        taken: list[bytes] | None = getattr(self._held, "taken", None)
        return self._send_or_fall_back([message], own=True) and taken is not None and len(taken) > 0

    def _send_or_fall_back(self, messages: list[list[Any] | Built], own: bool = False) -> bool:
        """Send on the fast path; True if it did, False if it fell back to `send_task`."""
        try:
            self._send(messages, own)
        except Exception as exc:  # the slow path has the retries and raises the errors
            log.warning("fast publish of %d %s message(s) failed (%r); sending through send_task",
                        len(messages), self.task_name, exc)
            for message in messages:
                args = message.args if isinstance(message, Built) else message
                self.app.send_task(self.task_name, args=args, queue=self.queue_name)
            return False
        self.sent += len(messages)
        return True

    def _send(self, messages: list[list[Any] | Built], own: bool = False) -> None:
        wire = self._wire_of_process()
        commands = [command for message in messages for command in
                    (message.commands if isinstance(message, Built) else self._commands(message, wire))]
        taken: list[bytes] | None = getattr(self._held, "taken", None)
        self._held.taken = None  # one take per block
        if taken is not None and not own and time.monotonic() >= self._held.until:
            taken = None  # the taker has run long enough: it goes back to its event loop
        if taken is not None:  # its own message (the end LPUSH wrote), or the queue's oldest
            commands.append(("LPOP" if own else "RPOP", wire.queue_key))
            commands.append(("LLEN", wire.queue_key))  # who is left waiting (can_take)
        try:
            replies = wire.transaction(commands)
        except BaseException:
            self._drop(wire)  # the next send connects afresh
            raise
        if taken is not None:
            # Own takes in a row while others waited (LLEN): the queue's oldest, or an empty queue,
            # resets it.
            others_wait = isinstance(replies[-1], int) and replies[-1] > 0
            self._held.own_streak = getattr(self._held, "own_streak", 0) + 1 if own and others_wait else 0
            if isinstance(replies[-2], bytes):
                taken.append(replies[-2])  # taken even if another command failed: EXEC ran the pop
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed

    def _drop(self, wire: BrokerWire) -> None:
        """Forget and close a wire that failed, unless another thread has already replaced it."""
        with self._wire_lock:
            if self._wire is wire:
                self._wire = None
        wire.close()

    def close(self) -> None:
        """Close this process's wire (a Client's close; the next send opens a new one)."""
        wire = self._wire
        if wire is not None:
            self._drop(wire)

    def _after_fork_in_child(self) -> None:
        # The parent's lock may have been held by one of its threads at the fork, and its wire is
        # the parent's socket: the child starts with neither.
        self._wire_lock = threading.Lock()
        self._wire = None

    def _wire_of_process(self) -> BrokerWire:
        """This process's connection for the fast path: made on first use, and again in a forked
        child (a pool process), which must not share its parent's sockets."""
        wire = self._wire
        if wire is None or wire.pid != os.getpid():
            with self._wire_lock:
                wire = self._wire
                if wire is None or wire.pid != os.getpid():
                    wire = self._wire = BrokerWire(self.app, self.queue_name)
        return wire

    def _commands(self, args: list[Any], wire: BrokerWire) -> list[tuple[str, ...]]:
        """The Redis commands that queue the message for `args` and send its task-sent event."""
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
        message = wire.envelope(json.dumps(body), headers, properties, "", self.queue_name)
        commands: list[tuple[str, ...]] = [("LPUSH", wire.queue_key, message)]
        if sent_event is not None:
            dispatcher = amqp._event_dispatcher
            event = dispatcher._prepare_event("task-sent", dict(
                sent_event, queue=self.queue_name, exchange="", routing_key=self.queue_name))
            payload = wire.envelope(json.dumps(event), dispatcher.headers, {"delivery_mode": TRANSIENT},
                                    wire.event_exchange, SENT_ROUTING_KEY)
            commands.extend(("PUBLISH", topic, payload) for topic in wire.event_topics)
        return commands


class BrokerWire:
    """One process's own connection to the broker for node messages, and what it needs to write
    them as kombu's Redis transport would: the prefixed queue key, the event topics, the envelope.

    The commands of one send go out as one MULTI/EXEC in one write, and their replies are read
    back in order: no producer pool, no publish batch, no redis-py pipeline object, no connection
    pool (their bookkeeping was most of a step's publishing cost, docs/benchmarks.md). The queue and the event
    exchange are declared once, when the wire opens."""

    def __init__(self, app: Any, queue: str) -> None:
        self.pid = os.getpid()
        self.connection = app.connection_for_write()
        try:
            channel = self.channel = self.connection.default_channel
            prefix = channel.global_keyprefix
            # What kombu's `_put` would vary per message is fixed here, as PAL's queue is set up:
            # priority 0 (no priority queues), no `x-expires` on the queue (no PEXPIRE), no ETA
            # or expiry in the headers (those go through send_task). A queue set up otherwise
            # needs this wire to follow.
            priority = channel._get_message_priority({"properties": {"priority": 0}}, reverse=False)
            self.queue_key = prefix + channel._q_for_pri(queue, priority)
            dispatcher = app.amqp._event_dispatcher
            self.event_exchange = dispatcher.exchange.name
            self.event_topics = [prefix + topic for topic in
                                 channel._get_publish_topics(self.event_exchange, SENT_ROUTING_KEY)]
            maybe_declare(app.amqp.queues[queue], channel)  # type: ignore[no-untyped-call]
            maybe_declare(dispatcher.exchange, channel)  # type: ignore[no-untyped-call]
            # Its own redis-py connection, with the channel's options, held for the process's life:
            # a pool's checkout and checkin cost about as much as the write itself.
            pool = channel.pool
            self.redis = pool.connection_class(**pool.connection_kwargs)
            self._lock = threading.Lock()
            self.closed = False
        except BaseException:
            self.connection.release()
            raise

    def envelope(self, body: str, headers: dict[str, Any], properties: dict[str, Any],
                 exchange: str, routing_key: str) -> str:
        """The JSON kombu's Redis transport stores for a message (`Channel.basic_publish`)."""
        channel = self.channel
        message = channel.prepare_message(body, 0, CONTENT_TYPE, CONTENT_ENCODING, headers, properties)
        channel._inplace_augment_message(message, exchange, routing_key)
        return json.dumps(message)

    def transaction(self, commands: list[tuple[str, ...]]) -> list[Any]:
        """Run `commands` in one MULTI/EXEC and return their replies, a command's error as an
        exception object in its place (EXEC ran the others). A command Redis refuses to queue, or a
        lost connection, raises, and the connection, whose state is then unknown, is closed."""
        with self._lock:  # threads of one process (an API server's) share the wire
            if self.closed:  # dropped by another thread: do not reconnect a wire nobody will close
                raise redis.ConnectionError("the broker wire was closed")
            connection = self.redis
            try:
                connection.send_packed_command(connection.pack_commands([("MULTI",), *commands, ("EXEC",)]))
                for _ in range(len(commands) + 1):  # MULTI's OK, then one QUEUED per command
                    connection.read_response()
                replies = connection.read_response()
            except BaseException:
                connection.disconnect()
                raise
        if not isinstance(replies, list) or len(replies) != len(commands):
            raise redis.ResponseError(f"EXEC replied {replies!r:.200}")
        return replies

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.pid == os.getpid():  # a forked child must not close its parent's sockets
                self.redis.disconnect()
                self.connection.release()


def _after_fork_of(ref: weakref.ref[NodePublisher]) -> Callable[[], None]:
    """A fork hook that does not keep the publisher alive (hooks cannot be unregistered)."""
    def after_fork_in_child() -> None:
        publisher = ref()
        if publisher is not None:
            publisher._after_fork_in_child()
    return after_fork_in_child
