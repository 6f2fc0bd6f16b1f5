"""kombu's Redis transport, minus a new redis-py client object for every command, and minus the
unacked bookkeeping of a doorbell that a solo worker runs inline.

kombu 5.7 builds a fresh `redis.Redis` for each publish, ack and event it sends outside the
consumer's poll (`Channel.conn_or_acquire`). Building one is mostly copying redis-py's table of
response callbacks, and a step sends four or five of them (its message and task-sent event from
the pool process; the ack and the task events from the worker's main process): a noticeable share
of the CPU a step costs (docs/benchmarks.md). The client object holds no
connection of its own (every command takes one from the channel's pool and gives it back), so
one object per pool does the same work. It is rebuilt when the channel replaces its pool (after a
fork or a disconnect).

kombu emulates acknowledgements on Redis: every message received is first written to the
`unacked` hash and its index (one round trip), and removed from both when acknowledged (another),
so that a message whose worker died is put back after the visibility timeout (an hour). For a
`pal.execute_node` message that a solo worker runs inline (pal.workers.inline), PAL skips both:
the doorbell is taken at most once. A step lost with its worker is recovered by its run's lease
and the orphan sweep, long before that hour; nothing else reads the copy (docs/architecture.md,
"Delivery"). A message with an ETA or an expiry keeps kombu's bookkeeping: it may wait in the
worker's memory.

Anyone who reaches Redis can push anything onto a queue. Stock kombu decodes what BRPOP returns
inside the worker's event loop, and bytes that are not a kombu message (not UTF-8, not JSON, not an
envelope) stop the worker with "Unrecoverable error". Here they are logged and dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis, virtual

log = logging.getLogger(__name__)

# kombu's methods are untyped: called through these.
_REDIS_QOS: Any = redis.QoS
_MEMORY_QOS: Any = virtual.QoS
_REDIS_CHANNEL: Any = redis.Channel
_REDIS_TRANSPORT: Any = redis.Transport


def waits_in_memory(headers: dict[str, Any]) -> bool:
    """A message with an ETA or an expiry: Celery's timer holds it in the worker, so kombu's copy
    in Redis stays and the message takes Celery's own path (pal.workers.inline)."""
    return bool(headers.get("eta") or headers.get("expires"))


def is_envelope(payload: Any) -> bool:
    """Whether `payload` (a decoded queue item) has what kombu reads from a message."""
    if not isinstance(payload, dict):
        return False
    properties, body = payload.get("properties"), payload.get("body")
    if not (isinstance(properties, dict) and isinstance(properties.get("delivery_tag"), str)
            and isinstance(properties.get("delivery_info"), dict)
            and isinstance(payload.get("headers", {}), dict | None) and isinstance(body, str | None)):
        return False
    info = properties["delivery_info"]
    if not (isinstance(info.get("exchange"), str) and isinstance(info.get("routing_key"), str)):
        return False
    if properties.get("body_encoding") == "base64" and body:
        try:
            base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return False
    return True


def take_at_most_once(connection: Any, task_name: str) -> None:
    """Take `task_name`'s doorbells at most once on this consumer connection (pal.workers.inline);
    nothing on another transport. Celery's consumer asks again on each connection it opens."""
    transport = getattr(connection, "transport", None)
    if isinstance(transport, Transport):
        transport.at_most_once_tasks = transport.at_most_once_tasks | {task_name}


class QoS(redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _REDIS_QOS.__init__(self, *args, **kwargs)
        self._unindexed: set[str] = set()  # delivery tags held in memory only

    def append(self, message: Any, delivery_tag: str) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        if headers.get("task") in self.channel.connection.at_most_once_tasks and not waits_in_memory(headers):
            self._unindexed.add(delivery_tag)
            _MEMORY_QOS.append(self, message, delivery_tag)
            return
        _REDIS_QOS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self._unindexed:
            self._unindexed.discard(delivery_tag)
            _MEMORY_QOS.ack(self, delivery_tag)
            return
        _REDIS_QOS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag in self._unindexed:  # nothing in Redis to put back: the sweep re-drives
            self.ack(delivery_tag)
            return
        _REDIS_QOS.reject(self, delivery_tag, requeue=requeue)


class Channel(redis.Channel):
    QoS = QoS
    _kept_client: Any = None  # the redis-py client of the channel's current pool

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(_REDIS_CHANNEL._brpop_read(self, **options))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # raised before any delivery
            log.warning("a message on the broker was not a kombu message, dropped: %r", exc)
            return True

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._kept_client is None or self._kept_client.connection_pool is not self.pool:
            self._kept_client = self._create_client()  # type: ignore[no-untyped-call]
        yield self._kept_client


class Transport(redis.Transport):
    Channel = Channel
    at_most_once_tasks: frozenset[str] = frozenset()  # take_at_most_once

    def _deliver(self, message: Any, queue: str) -> None:
        if not is_envelope(message):
            log.warning("a message on queue %.200s was not a kombu message, dropped: %.200r", queue, message)
            return
        _REDIS_TRANSPORT._deliver(self, message, queue)


TRANSPORT = f"{__name__}:Transport"
