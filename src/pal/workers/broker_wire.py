"""One process's own connection to the broker for `pal.execute_node` messages
(pal.workers.node_messages): kombu's Redis transport's key names and envelope, without its
producer pool, publish batch, redis-py pipeline or connection pool, whose bookkeeping was most of
a step's publishing cost (docs/benchmarks.md)."""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import redis
from kombu.common import maybe_declare

from pal.workers import celery_private

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
SENT_ROUTING_KEY = "task.sent"  # the task-sent event's routing key, as Celery sends it


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
            self.queue_key = prefix + celery_private.queue_key(channel, queue)
            dispatcher = celery_private.event_dispatcher(app)
            self.event_exchange = dispatcher.exchange.name
            self.event_topics = [prefix + topic for topic in celery_private.publish_topics(
                channel, self.event_exchange, SENT_ROUTING_KEY)]
            maybe_declare(app.amqp.queues[queue], channel)  # type: ignore[no-untyped-call]
            maybe_declare(dispatcher.exchange, channel)  # type: ignore[no-untyped-call]
            # Its own redis-py connection, with the channel's options, held for the process's life:
            # a pool's checkout and checkin cost about as much as the write itself.
            pool = channel.pool
            self.redis = pool.connection_class(**pool.connection_kwargs)
            self._lock = threading.Lock()
            self._unanswered = 0  # replies of `send_unanswered` not read yet
            self.closed = False
        except BaseException:
            self.connection.release()
            raise

    def envelope(self, body: str, headers: dict[str, Any], properties: dict[str, Any],
                 exchange: str, routing_key: str) -> str:
        """The JSON kombu's Redis transport stores for a message (`Channel.basic_publish`)."""
        channel = self.channel
        message = channel.prepare_message(body, 0, CONTENT_TYPE, CONTENT_ENCODING, headers, properties)
        celery_private.augment_message(channel, message, exchange, routing_key)
        return json.dumps(message)

    def transaction(self, commands: list[tuple[str, ...]]) -> list[Any]:
        """Run `commands` in one MULTI/EXEC and return their replies, a command's error as an
        exception object in its place (EXEC ran the others). A command Redis refuses to queue, or a
        lost connection, raises, and the connection, whose state is then unknown, is closed."""
        with self._lock:  # threads of one process (an API server's) share the wire
            connection = self._write([("MULTI",), *commands, ("EXEC",)])
            try:
                for _ in range(len(commands) + 1):  # MULTI's OK, then one QUEUED per command
                    connection.read_response()
                replies = connection.read_response()
            except BaseException:
                connection.disconnect()
                raise
        if not isinstance(replies, list) or len(replies) != len(commands):
            raise redis.ResponseError(f"EXEC replied {replies!r:.200}")
        return replies

    def send_unanswered(self, commands: list[tuple[str, ...]]) -> None:
        """Send `commands` (not a transaction: each stands alone) without waiting for their
        replies, which `answers` returns later (or the next use of the wire discards)."""
        with self._lock:
            self._write(commands)
            self._unanswered = len(commands)

    def _write(self, commands: list[tuple[str, ...]]) -> Any:
        """Send `commands` in one write, under the lock, after reading any replies still owed; the
        connection, which is closed if the write fails (its state is then unknown)."""
        if self.closed:  # dropped by another thread: do not reconnect a wire nobody will close
            raise redis.ConnectionError("the broker wire was closed")
        self._read_unanswered()
        connection = self.redis
        try:
            connection.send_packed_command(connection.pack_commands(commands))
        except BaseException:
            connection.disconnect()
            raise
        return connection

    def answers(self) -> list[Any]:
        """The replies to the last `send_unanswered`, a command's error as an exception object in
        its place; empty if they were read already or the connection was lost meanwhile."""
        with self._lock:
            return self._read_unanswered()

    def _read_unanswered(self) -> list[Any]:
        count, self._unanswered = self._unanswered, 0
        replies: list[Any] = []
        connection = self.redis
        try:
            for _ in range(count):
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except Exception as exc:  # lost: the next command connects afresh
            log.warning("replies to %d command(s) sent to the broker were lost: %r", count, exc)
            connection.disconnect()
            return []
        except BaseException:
            connection.disconnect()
            raise
        return replies

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.pid == os.getpid():  # a forked child must not close its parent's sockets
                self.redis.disconnect()
                self.connection.release()
