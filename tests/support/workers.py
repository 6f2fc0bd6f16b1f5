"""An in-process Celery worker (threads pool) on a client's app, for integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import start_worker

from pal.client import Client


@contextmanager
def in_process_worker(client: Client, concurrency: int = 4) -> Iterator[None]:
    """A real Celery worker consuming the client's broker, in this process."""
    with start_worker(client.app, pool="threads", concurrency=concurrency, perform_ping_check=False,
                      shutdown_timeout=30, loglevel="WARNING"):
        yield
