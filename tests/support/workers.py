"""An in-process Celery worker (threads pool) on a client's app, for integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

from pal.client import Client


@contextmanager
def in_process_worker(client: Client, concurrency: int = 4) -> Iterator[None]:
    """A real Celery worker consuming the client's broker, in this process."""
    # Stopping waits for the consumer's current wait on Redis (BRPOP) to time out: 1 s by default,
    # paid by hundreds of tests. A 0.1 s wait makes the idle worker ask Redis more often; a message
    # is delivered as soon as it is pushed either way.
    if not client.settings.is_embedded_broker:
        client.app.conf.broker_transport_options = {**client.app.conf.broker_transport_options,
                                                    "polling_interval": 0.1}
    # A fresh kombu event loop for each worker: Celery 5.5 reuses the process's current one, which
    # an earlier in-process worker closed, and its timer then never fires a countdown's message
    # (Celery 5.6 fixed it). A worker process, as in production, has one worker and one loop.
    set_event_loop(None)
    with start_worker(client.app, pool="threads", concurrency=concurrency, perform_ping_check=False,
                      shutdown_timeout=30, loglevel="WARNING"):
        yield
