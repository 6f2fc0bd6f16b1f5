"""kombu's Redis transport, minus a new redis-py client object for every command.

kombu 5.7 builds a fresh `redis.Redis` for each publish, ack and event it sends outside the
consumer's poll (`Channel.conn_or_acquire`). Building one is mostly copying redis-py's table of
response callbacks, and a step sends four or five of them (its message and task-sent event from
the pool process; the ack and the task events from the worker's main process): a noticeable share
of the CPU a step costs (docs/benchmarks.md). The client object holds no
connection of its own (every command takes one from the channel's pool and gives it back), so
one object per pool does the same work. It is rebuilt when the channel replaces its pool (after a
fork or a disconnect).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _kept_client: Any = None  # the redis-py client of the channel's current pool

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


TRANSPORT = f"{__name__}:Transport"
