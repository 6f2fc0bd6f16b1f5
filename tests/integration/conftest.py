from __future__ import annotations

from collections.abc import Iterator

import pytest

from pal.client import Client
from tests.conftest import Backend
from tests.support.servers import SmtpReceiver
from tests.support.workers import in_process_worker


@pytest.fixture
def client(backend: Backend) -> Iterator[Client]:
    c = Client(backend.settings)
    yield c
    c.close()


@pytest.fixture
def worker(client: Client) -> Iterator[None]:
    """A real Celery worker consuming the backend's broker, in this process (threads pool)."""
    with in_process_worker(client):
        yield


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    """A local SMTP server that records every message it accepts."""
    with SmtpReceiver() as server:
        yield server


@pytest.fixture
def mail_client(backend: Backend, smtp: SmtpReceiver) -> Iterator[Client]:
    """A client whose email nodes send to `smtp`."""
    client = Client(backend.settings.with_(smtp_url=f"smtp://{smtp.host}:{smtp.port}"))
    yield client
    client.close()
