"""PAL's Redis transport (pal.workers.redis_transport) against the real Redis: one client object per
connection pool instead of one per command, and messages still go through."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from pal.workers.pal_app import create_app
from pal.workers.redis_transport import Channel
from tests.conftest import Backend


def _connection(backend: Backend) -> Connection:
    app = create_app(backend.settings)
    connection: Connection = app.connection_for_write()
    return connection


def test_a_channel_keeps_one_client_per_pool(postgres_backend: Backend) -> None:
    with _connection(postgres_backend) as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
        mine = object()
        with channel.conn_or_acquire(mine) as given:
            assert given is mine  # a caller's own client is used as given
        channel._disconnect_pools()  # what kombu does after a fork
        with channel.conn_or_acquire() as third:
            assert third is not first
            assert third.connection_pool is channel.pool


def test_messages_published_through_the_kept_client_arrive(postgres_backend: Backend,
                                                          redis_client: redis.Redis) -> None:
    queue = postgres_backend.settings.queue + "-transport-test"
    prefix = postgres_backend.settings.broker_key_prefix
    with _connection(postgres_backend) as connection:
        simple = connection.SimpleQueue(queue)
        try:
            for n in range(3):
                simple.put({"n": n})
            assert redis_client.llen(f"{prefix}{queue}") == 3  # under this test's key prefix
            received = []
            for _ in range(3):
                message = simple.get(timeout=10)
                received.append(message.payload["n"])
                message.ack()
            assert received == [0, 1, 2]
            with pytest.raises(simple.Empty):
                simple.get(timeout=0.2)
            assert redis_client.hlen(f"{prefix}unacked") == 0  # every ack went through
        finally:
            simple.close()
