"""`pal.execute_node` run inline by a solo worker, without Celery's per-message Request and tracer.

A solo worker (`pal worker --pool solo`) runs each task in its one process, from the event loop's
callback that received the message. For a task Celery builds a Request, passes it through the
pool, and wraps the call in its tracer (result states, signals, the request and task stacks).
`pal.execute_node` uses none of it: the message is a doorbell, the journal is the truth, and
the task ignores its result. So in a solo worker this strategy runs the task function on the
message itself, then acknowledges it and sends Flower its task events: received, started, and
succeeded or failed. A step's own successor, which its worker runs next, never becomes a message
at all: it stays in memory as an OwnMessage (pal.workers.node_messages), run with the request and
the task events the message would have given. Worker counters (Flower's "processed") and the
current task (which links a successor's message to its parent and root) are kept as Celery keeps
them.

What differs from Celery's path is documented in docs/decisions/solo-worker-delivery.md: on PAL's
Redis transport the doorbell is taken at most once (pal.workers.redis_transport), because the
lease and the orphan sweep, not a message restored after the visibility timeout, recover a step
lost with its worker. A message with an ETA or an expiry (a backoff's countdown) goes through
Celery's own strategy. Prefork and threads workers use Celery's strategy for every message.
docs/decisions/solo-worker-delivery.md has the figures.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from celery.utils.saferepr import saferepr
from celery.worker import state as worker_state
from celery.worker.strategy import default as celery_strategy
from kombu.utils import json as kombu_json

from pal.errors import StepFailed
from pal.workers import celery_private, redis_transport
from pal.workers.node_messages import Lane, OwnMessage, Take
from pal.workers.publishing import TakeBack
from pal.workers.task_names import CLAIM_AHEAD, RUNS_NEXT, SENT_AT_HEADER

log = logging.getLogger(__name__)

SOLO_POOL_MODULE = "celery.concurrency.solo"


# Steps a solo worker runs back to back, each taking the next message as it publishes its own,
# before it returns to its event loop (heartbeats, control commands, timers, a warm shutdown):
# at most MAX_CHAIN steps, and nothing taken once the chain has run MAX_CHAIN_S seconds, well
# inside Celery's 2 s heartbeat (Flower calls a worker offline after missing heartbeats). A
# step that itself runs long still blocks the loop, as in any solo worker.
MAX_CHAIN = 32
MAX_CHAIN_S = 0.5

_envelope: Callable[[str | bytes], dict[str, Any]] = kombu_json.loads  # a Redis message, as kombu reads it

# What runs next: a message's delivery (the handler's arguments), or this thread's own message.
Delivery = tuple[Any, Any, Any, Any, Any, dict[str, Any]]
Next = Delivery | OwnMessage


def execute_node_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., None]:
    """Celery's `Task.Strategy` hook: the handler the worker's consumer calls per message of `task`."""
    celery_handler: Callable[..., None] = celery_strategy(task, app, consumer, **options)
    if type(consumer.pool).__module__ != SOLO_POOL_MODULE:
        return celery_handler  # the step runs in a pool process or thread, as Celery arranges it
    if not celery_private.fast_paths().on("inline"):
        return celery_handler  # Celery's own strategy: the public path
    redis_transport.take_at_most_once(consumer.connection, task.name)
    log.info("pid %d runs %s inline (solo pool)", os.getpid(), task.name)
    return InlineSteps(task, app, consumer, celery_handler).handle


class InlineSteps:
    """The message handler of one solo worker's `pal.execute_node` messages."""

    def __init__(self, task: Any, app: Any, consumer: Any, celery_handler: Callable[..., None]) -> None:
        self.task, self.app, self.consumer, self.celery_handler = task, app, consumer, celery_handler
        eventer = consumer.event_dispatcher
        sends = eventer is not None and eventer.enabled and task.send_events
        self.send_event = eventer.send if sends else None
        self.publisher = getattr(app, "node_publisher", None)  # None on the filesystem broker
        self.queue = app.runtime.settings.queue
        self.pending: deque[Next] = deque()  # what a step took, and messages delivered during one
        self.running = False
        self.lane = Lane()  # kept from one step of the chain to the next

    def handle(self, message: Any, payload: Any, ack: Any, reject: Any, callbacks: Any,
               **kwargs: Any) -> None:
        delivery: Next = (message, payload, ack, reject, callbacks, kwargs)
        if self.running:  # a message taken by the step before it: it runs next, not inside
            self.pending.append(delivery)
            return
        self.running = True
        began = time.monotonic()
        try:
            chained = 0
            while True:
                chained += 1
                take = chained < MAX_CHAIN and not _stopping()
                taken = self._run(delivery, take=take, until=began + MAX_CHAIN_S)
                if isinstance(taken, OwnMessage):
                    self.pending.append(taken)
                elif taken is not None:
                    self._hand_over(message.channel, taken)
                if not self.pending:
                    return
                delivery = self.pending.popleft()
        finally:
            self.running = False

    def _hand_over(self, channel: Any, raw: str | bytes) -> None:
        """Hand a taken message to kombu and Celery's consumer, as a BRPOP reply would be."""
        try:
            celery_private.deliver_taken(channel, _envelope(raw), self.queue)
        except Exception as exc:  # anyone who reaches the broker can push anything onto the queue
            log.warning("a message taken from queue %s was dropped: %r", self.queue, exc)

    def _run(self, delivery: Next, *, take: bool, until: float) -> str | bytes | OwnMessage | None:
        """Run one message's step; the message its hand-off took, if any (from the queue, or its own)."""
        publisher, taking, runs_next = self.publisher, None, None
        if take and publisher is not None:  # the step's hand-off may take the message run next
            taking = Take(self.lane, until)
            runs_next = TakeBack(self.app, publisher, taking)
        if isinstance(delivery, OwnMessage):
            request = dict(id=delivery.task_id, root_id=delivery.root_id, parent_id=delivery.parent_id,
                           headers=None, delivery_info={"exchange": "", "routing_key": self.queue},
                           **{SENT_AT_HEADER: delivery.sent_at, CLAIM_AHEAD: delivery.claim_ahead,
                              RUNS_NEXT: runs_next})
            received = dict(args=delivery.argsrepr, kwargs="{}", root_id=delivery.root_id,
                            parent_id=delivery.parent_id, retries=0)
            if delivery.sent_event is not None:
                self._sent(delivery.sent_event)
            return self._step(delivery.task_id, received, lambda: self._call(delivery.args, {}, request),
                              None, taking)
        message, payload, ack, reject, callbacks, kwargs = delivery
        headers = message.headers
        if payload is not None or redis_transport.waits_in_memory(headers):
            # A protocol-1 message, or one that must wait: Celery's timer and request hold it.
            self.celery_handler(message, payload, ack, reject, callbacks, **kwargs)
            return None

        def call() -> Any:
            args, task_kwargs = _arguments(message)
            return self._call(args, task_kwargs, dict(
                id=headers.get("id"), root_id=headers.get("root_id"), parent_id=headers.get("parent_id"),
                headers=headers, delivery_info=message.delivery_info,
                **{SENT_AT_HEADER: headers.get(SENT_AT_HEADER), RUNS_NEXT: runs_next}))

        def acknowledge() -> None:
            message.ack_log_error(log, self.consumer.connection_errors)
        received = dict(args=headers.get("argsrepr"), kwargs=headers.get("kwargsrepr"),
                        root_id=headers.get("root_id"), parent_id=headers.get("parent_id"),
                        retries=headers.get("retries", 0))
        return self._step(headers.get("id"), received, call, acknowledge, taking)

    def _sent(self, fields: dict[str, Any]) -> None:
        """An own message's task-sent event: buffered with this step's other events, or, when this
        worker sends no task events of its own (`task_send_sent_event` is the sender's setting,
        not the worker's), published by itself as send_task would."""
        if self.send_event is not None and _sends_task_events(self.consumer.event_dispatcher):
            self.send_event("task-sent", **fields)
        elif self.publisher is not None:
            self.publisher.publish_sent_event(fields, self.lane)

    def _step(self, task_id: Any, received: dict[str, Any], call: Callable[[], Any],
              acknowledge: Callable[[], None] | None, taking: Take | None) -> str | bytes | OwnMessage | None:
        """Run a step (`call`) with its task events (`received`: the task-received event's fields)
        and the worker's counters; then acknowledge its message, if it has one. The message its
        hand-off took into `taking`, if any."""
        task, send_event = self.task, self.send_event
        if send_event is not None:
            send_event("task-received", uuid=task_id, name=task.name, eta=None, expires=None, **received)
            send_event("task-started", uuid=task_id)
        worker_state.total_count[task.name] += 1
        worker_state.all_total_count[0] += 1
        began = time.monotonic()
        failure: Exception | None = None
        try:
            outcome = call()
        except Exception as exc:  # the step's failure is journaled; anything else is logged here
            failure = exc
        if acknowledge is not None:
            acknowledge()
        if failure is not None:
            self._failed(task_id, failure)
        elif send_event is not None:
            result = repr(outcome) if isinstance(outcome, str) else saferepr(outcome)  # an outcome's name
            send_event("task-succeeded", uuid=task_id, result=result, runtime=time.monotonic() - began)
        return taking.taken[0] if taking is not None and taking.taken else None

    def _failed(self, task_id: Any, exc: Exception) -> None:
        """Log a message's failure as Celery would, and tell Flower."""
        name = self.task.name
        if isinstance(exc, StepFailed):
            log.info("Task %s[%s] raised expected: %r", name, task_id, exc)
        elif isinstance(exc, MalformedMessage):
            log.warning("%s refused: %s", name, exc)
        else:
            log.exception("Task %s[%s] raised unexpected: %r", name, task_id, exc, exc_info=exc)
        if self.send_event is not None:
            self.send_event("task-failed", uuid=task_id, exception=saferepr(exc), traceback="")

    def _call(self, args: list[Any], task_kwargs: dict[str, Any], request: dict[str, Any]) -> Any:
        """The task function on its arguments, with the request Celery's tracer would set (its id,
        parent and root link the successors' messages; `sent_at` comes from the message's headers)."""
        task = self.task
        stack = celery_private.task_stack()
        stack.push(task)
        task.push_request(called_directly=False, hostname=self.consumer.hostname, **request)
        try:
            return task.run(*args, **task_kwargs)
        finally:
            task.pop_request()
            stack.pop()


def _sends_task_events(eventer: Any) -> bool:
    """Whether the worker's event dispatcher (enabled: `send_event` is set) sends task events now:
    a worker without task events keeps it for its heartbeats only (its groups: "worker"), and
    `disable_events` drops the task group at run time."""
    return eventer is not None and (not eventer.groups or "task" in eventer.groups)


def _stopping() -> bool:
    """The worker was asked to stop: return to the event loop, which carries that out."""
    return bool(worker_state.should_stop or worker_state.should_terminate)


class MalformedMessage(Exception):
    """A message whose body is not `[args, kwargs, embed]` (anyone who reaches the broker can send one)."""


def _arguments(message: Any) -> tuple[list[Any], dict[str, Any]]:
    body = message.decode()  # refuses a content type the app does not accept
    if not (isinstance(body, (list, tuple)) and len(body) == 3
            and isinstance(body[0], (list, tuple)) and isinstance(body[1], dict)):
        raise MalformedMessage(f"body is not [args, kwargs, embed]: {saferepr(body, maxlen=200)}")
    return list(body[0]), dict(body[1])
