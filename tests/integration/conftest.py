from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker

from pal.client import Client
from tests.conftest import Backend


@pytest.fixture
def client(backend: Backend) -> Iterator[Client]:
    c = Client(backend.settings)
    yield c
    c.close()


@pytest.fixture
def worker(client: Client) -> Iterator[None]:
    """A real Celery worker consuming the backend's broker, in this process (threads pool)."""
    with start_worker(client.app, pool="threads", concurrency=4, perform_ping_check=False,
                      shutdown_timeout=30, loglevel="WARNING"):
        yield
