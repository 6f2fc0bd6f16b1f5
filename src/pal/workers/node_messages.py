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

A solo worker's step that runs its one successor itself keeps that message in memory (an
`OwnMessage`): it is neither serialized nor queued, and nothing of it goes out here but a count of
the queue, whose reply is read later (`NodePublisher._take_own`); the worker sends its task-sent
event with the step's other task events (pal.workers.inline).

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
from dataclasses import dataclass, field, replace
from typing import Any

from kombu.utils.uuid import uuid

from pal.core.records import ClaimAhead
from pal.workers import celery_private
from pal.workers.broker_wire import SENT_ROUTING_KEY, BrokerWire
from pal.workers.task_names import SENT_AT_HEADER

log = logging.getLogger(__name__)

# A thread that takes its own successor's message back (its completion claimed the step) keeps to
# its run; while other messages wait on the queue it does so at most this many steps in a row, then
# takes the oldest, so a busy queue is still served in about its order (docs/architecture.md,
# "Delivery").
OWN_TAKES_WHILE_OTHERS_WAIT = 2
PERSISTENT = 2  # AMQP delivery mode of a task message, as Celery sets it
TRANSIENT = 1  # the event exchange's delivery mode


@dataclass(frozen=True)
class Built:
    """A message built ahead of its publish (`NodePublisher.build`): its arguments, and the Redis
    commands that queue it and send its task-sent event."""

    args: list[Any]
    commands: list[tuple[str, ...]]


@dataclass(frozen=True)
class OwnMessage:
    """A message its worker runs itself next (`publish_taken`), kept in memory: never serialized,
    never queued, so no other worker can take it. Its fields are those the message would have
    carried, so its task runs with the same request and Flower gets the same task events; its
    task-sent event (`sent_event`) is sent by the worker that runs it, with that step's other task
    events (pal.workers.inline)."""

    args: list[Any]
    task_id: str
    root_id: str
    parent_id: str | None
    sent_at: float  # SENT_AT_HEADER: a step span's queue wait starts here (when tracing)
    sent_event: dict[str, Any] | None  # its task-sent event's fields (as_task_v2's), if sent
    claim_ahead: ClaimAhead | None = None  # its step's claim, taken by the completion before it

    @property
    def argsrepr(self) -> str:
        return repr(self.args)  # as `_commands` gives the message's argsrepr header


@dataclass
class Lane:
    """What one solo worker's chain of steps keeps from one step to the next (pal.workers.inline)."""

    own_streak: int = 0  # own takes in a row while others waited (OWN_TAKES_WHILE_OTHERS_WAIT)
    unanswered: bool = False  # the queue count the last own take asked for is not read yet


@dataclass
class Take:
    """One step's chance to take the message its worker runs next, with its hand-off's publish: the
    queue's oldest (RPOP, the end BRPOP takes from), or its own successor (`publish_taken`). Passed
    to the publishes that may take; `taken` holds what was taken, at most one message."""

    lane: Lane
    until: float = float("inf")  # time.monotonic(): nothing is taken after it
    taken: list[str | bytes | OwnMessage] = field(default_factory=list)
    spent: bool = False  # one take per step: its first transaction's

class NodePublisher:
    """Sends `task_name` messages to one queue, each with its task-sent event, in one round trip."""

    def __init__(self, app: Any, task_name: str, queue: str) -> None:
        self.app = app
        self.task_name = task_name
        self.queue_name = queue
        self.sent_event = bool(app.conf.task_send_sent_event)
        # Where a task-sent event says its message went (send_task adds these to as_task_v2's).
        self._route = {"queue": queue, "exchange": "", "routing_key": queue}
        self.sent = 0  # messages this publisher sent itself (the rest went through send_task)
        self._wire: BrokerWire | None = None  # this process's connection (_wire_of_process)
        self._wire_lock = threading.Lock()
        os.register_at_fork(after_in_child=_after_fork_of(weakref.ref(self)))

    @contextmanager
    def batch(self) -> Iterator[Callable[[list[Any] | Built | OwnMessage], None]]:
        """A publish that holds its messages until the block ends, then sends them in one round
        trip. A block that raises sends nothing (its callers publish only what they committed, and
        recover what they did not)."""
        held: list[list[Any] | Built | OwnMessage] = []
        yield held.append
        if held:
            self._send_or_fall_back(held)

    def publish(self, message: list[Any] | Built | OwnMessage, take: Take | None = None) -> None:
        """Publish one message (its arguments, or the message `build` made of them); with `take`,
        the same transaction takes the queue's oldest message for it (`Take`)."""
        self._send_or_fall_back([message], take=take)

    def build(self, args: list[Any], own: bool = False) -> Built | OwnMessage | None:
        """The message for `args`, built now to be published later (while the completion that must
        commit first is on its way: pal.engine.steps); `own`: as this thread's own message, which
        it will most likely take back (`publish_taken`), which needs nothing of the broker. None
        when the broker cannot be reached now (the publish then builds it, or falls back to
        `send_task`)."""
        try:
            if own:
                return self._own(args)  # nothing of it is encoded for the broker
            wire = self._wire_of_process()
            return Built(args, self._commands(args, wire))
        except Exception as exc:  # the publish decides what a broker that is down means
            log.debug("a %s message was not built ahead: %r", self.task_name, exc)
            return None

    def can_take(self, take: Take) -> bool:
        """Whether `take` may still take its step's own message back: not once spent or past its
        deadline, nor when others have waited on the queue while its lane took
        OWN_TAKES_WHILE_OTHERS_WAIT of its own in a row (it takes the oldest instead)."""
        wire = self._wire
        if wire is not None and wire.pid == os.getpid():
            self._settle(wire, take.lane)  # the count of those waiting that the last own take asked for
        return (not take.spent and time.monotonic() < take.until
                and take.lane.own_streak < OWN_TAKES_WHILE_OTHERS_WAIT)

    def publish_taken(self, message: list[Any] | Built | OwnMessage, take: Take,
                      ahead: ClaimAhead | None = None) -> bool:
        """Publish one message and take that very message back into `take` (its step was claimed
        for this worker: pal.storage.steps, `claim_next`). Such a message never goes through the
        queue, where any worker could take it: `take.taken` gets it as an OwnMessage carrying
        `ahead` (the step's claim), and only a count of the queue is sent (`_take_own`; the worker
        that runs it sends its task-sent event). False when it went to the queue after all (the
        take was spent, or the fast path failed): it is whichever worker's that takes it (one finds
        the step started and leaves it, and the sweep re-drives it when its lease lapses)."""
        sent = self._send_or_fall_back([message], take=take, own=True, ahead=ahead)
        return sent and any(isinstance(taken, OwnMessage) for taken in take.taken)

    def _send_or_fall_back(self, messages: list[list[Any] | Built | OwnMessage], take: Take | None = None,
                           own: bool = False, ahead: ClaimAhead | None = None) -> bool:
        """Send on the fast path; True if it did, False if it fell back to `send_task`."""
        try:
            self._send(messages, take, own, ahead)
        except Exception as exc:  # the slow path has the retries and raises the errors
            log.warning("fast publish of %d %s message(s) failed (%r); sending through send_task",
                        len(messages), self.task_name, exc)
            for message in messages:
                self.app.send_task(self.task_name, args=_args(message), queue=self.queue_name)
            return False
        self.sent += len(messages)
        return True

    def _send(self, messages: list[list[Any] | Built | OwnMessage], take: Take | None, own: bool,
              ahead: ClaimAhead | None) -> None:
        wire = self._wire_of_process()
        if take is not None:
            self._settle(wire, take.lane)
            # One take per step. Past its deadline the taker goes back to its event loop, but a
            # successor claimed for it (own) is still taken: queued, its claim would be lost.
            usable = not take.spent and (own or time.monotonic() < take.until)
            take.spent = True
            take = take if usable else None
        if take is not None and own and len(messages) == 1:
            [message] = messages
            own_message = message if isinstance(message, OwnMessage) else self._own(_args(message))
            self._take_own(wire, replace(own_message, claim_ahead=ahead), take)
            return
        # An OwnMessage not taken back after all is queued as a message like any other.
        commands = [command for message in messages for command in
                    (message.commands if isinstance(message, Built)
                     else self._commands(_args(message), wire))]
        if take is not None:  # the queue's oldest
            commands.append(("RPOP", wire.queue_key))
            commands.append(("LLEN", wire.queue_key))  # who is left waiting (can_take)
        try:
            replies = wire.transaction(commands)
        except BaseException:
            self._drop(wire)  # the next send connects afresh
            raise
        if take is not None:
            _count_own_take(take.lane, own=False, waiting=replies[-1])
            if isinstance(replies[-2], bytes):
                take.taken.append(replies[-2])  # taken even if another command failed: EXEC ran the pop
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed

    def _take_own(self, wire: BrokerWire, message: OwnMessage, take: Take) -> None:
        """Take a message its worker runs next without queueing it. Pushed and popped back in one
        transaction it would be seen by nobody; so nothing of it goes out here (the worker that
        runs it sends its task-sent event), only a count of the messages waiting (for `can_take`),
        whose reply is not waited for: `_settle` reads it before the lane's next use of the wire.
        A failure to send it loses that count only, never the message (its step was claimed for
        this worker)."""
        try:
            wire.send_unanswered([("LLEN", wire.queue_key)])
            take.lane.unanswered = True
        except Exception as exc:
            self._drop(wire)  # the next send connects afresh
            log.warning("the queue count of an own %s message was lost: %r", self.task_name, exc)
        take.taken.append(message)

    def publish_sent_event(self, fields: dict[str, Any], lane: Lane | None = None) -> None:
        """Publish an own message's task-sent event by itself (a worker that buffers no task
        events of its own); a failure loses that event only."""
        wire = None
        try:
            wire = self._wire_of_process()
            if lane is not None:
                self._settle(wire, lane)  # the reply the last own take left unread
            wire.transaction(self._sent_event_commands(wire, fields))
        except Exception as exc:
            if wire is not None:
                self._drop(wire)  # the next send connects afresh
            log.warning("the task-sent event of a %s message this worker runs itself was lost: %r",
                        self.task_name, exc)

    def _settle(self, wire: BrokerWire, lane: Lane) -> None:
        """Read the reply of the lane's last own take, if still unread: the count of the messages
        waiting then, for `can_take` (lost if another send used the wire first)."""
        if not lane.unanswered:
            return
        lane.unanswered = False
        replies = wire.answers()
        if replies:
            _count_own_take(lane, own=True, waiting=replies[-1])

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

    def _own(self, args: list[Any]) -> OwnMessage:
        """The message for `args` as this thread's own: the fields `_commands` would give it, and
        those of its task-sent event (the event `as_task_v2` makes, without the message itself)."""
        task_id, root_id, parent_id = self._ids()
        root_id = root_id or task_id  # as as_task_v2 roots a message that no task sent
        sent_at = time.time()
        sent_event = {
            "uuid": task_id, "root_id": root_id, "parent_id": parent_id, "name": self.task_name,
            "args": repr(args), "kwargs": "{}", "retries": 0, "eta": None, "expires": None,
            **self._route, "timestamp": sent_at,  # as the event made at its publish would say
        } if self.sent_event else None
        return OwnMessage(args, task_id, root_id, parent_id, sent_at, sent_event)

    def _ids(self) -> tuple[str, str | None, str | None]:
        """A new message's id, and its root and parent: the task this thread runs, if any, as
        send_task links a message to the task that sent it (Flower)."""
        root_id = parent_id = None
        parent = self.app.current_worker_task
        if parent is not None:
            root_id = parent.request.root_id or parent.request.id
            parent_id = parent.request.id
        return uuid(), root_id, parent_id

    def _sent_event_commands(self, wire: BrokerWire, sent_event: dict[str, Any]) -> list[tuple[str, ...]]:
        """The PUBLISH commands of a task-sent event with `sent_event`'s fields, its route included."""
        dispatcher = celery_private.event_dispatcher(self.app)
        event = celery_private.prepare_event(dispatcher, "task-sent", sent_event)
        payload = wire.envelope(json.dumps(event), dispatcher.headers, {"delivery_mode": TRANSIENT},
                                wire.event_exchange, SENT_ROUTING_KEY)
        return [("PUBLISH", topic, payload) for topic in wire.event_topics]

    def _commands(self, args: list[Any], wire: BrokerWire) -> list[tuple[str, ...]]:
        """The Redis commands that queue the message for `args` and send its task-sent event."""
        app, amqp = self.app, self.app.amqp
        task_id, root_id, parent_id = self._ids()
        headers, properties, body, sent_event = amqp.as_task_v2(
            task_id, self.task_name, args=args, kwargs={}, root_id=root_id, parent_id=parent_id,
            reply_to=app.thread_oid, create_sent_event=self.sent_event,
            argsrepr=repr(args), kwargsrepr="{}", ignore_result=None)  # as send_task: the task decides
        properties["delivery_mode"] = PERSISTENT
        headers[SENT_AT_HEADER] = time.time()  # a step span's queue wait starts here (when tracing)
        message = wire.envelope(json.dumps(body), headers, properties, "", self.queue_name)
        commands: list[tuple[str, ...]] = [("LPUSH", wire.queue_key, message)]
        if sent_event is not None:
            commands.extend(self._sent_event_commands(wire, sent_event | self._route))
        return commands


def _count_own_take(lane: Lane, *, own: bool, waiting: object) -> None:
    """Own takes in a row while others waited (LLEN's reply, `waiting`): taking the queue's oldest,
    or an empty queue, resets the count."""
    others_wait = isinstance(waiting, int) and waiting > 0
    lane.own_streak = lane.own_streak + 1 if own and others_wait else 0


def _args(message: list[Any] | Built | OwnMessage) -> list[Any]:
    """A message's arguments, however far it was built."""
    return message if isinstance(message, list) else message.args


def _after_fork_of(ref: weakref.ref[NodePublisher]) -> Callable[[], None]:
    """A fork hook that does not keep the publisher alive (hooks cannot be unregistered)."""
    def after_fork_in_child() -> None:
        publisher = ref()
        if publisher is not None:
            publisher._after_fork_in_child()
    return after_fork_in_child
