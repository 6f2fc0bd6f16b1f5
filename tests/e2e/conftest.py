from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.clock import utcnow
from tests.conftest import Backend
from tests.support import web
from tests.support.api_server import RECEIPT_ENV, Api, free_port
from tests.support.processes import Processes


@pytest.fixture
def processes(postgres_backend: Backend, tmp_path: Path) -> Iterator[Processes]:
    """Worker and beat subprocesses on Postgres + Redis, all stopped when the test ends."""
    procs = Processes(postgres_backend, tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
def api_env() -> dict[str, str]:
    """Settings of the `api` fixture's server beyond its backend's: receipts on. A test changes
    them by parametrizing `api_env`."""
    return dict(RECEIPT_ENV)


@pytest.fixture
def api(processes: Processes, postgres_backend: Backend, api_env: dict[str, str]) -> Iterator[Api]:
    """A `pal api` server and a `pal worker` on Postgres + Redis; tokens for tenants acme and globex."""
    client = Client(postgres_backend.settings)
    journal = client.runtime.journal
    _, token = journal.tokens.create_token(tenant_id="acme", name="test", now=utcnow())
    _, other = journal.tokens.create_token(tenant_id="globex", name="test", now=utcnow())
    revoked_id, revoked = journal.tokens.create_token(tenant_id="acme", name="old", now=utcnow())
    journal.tokens.revoke_token(token_id=revoked_id, now=utcnow())
    port = free_port()
    processes.start(["api", "--port", str(port)], "api.log", **api_env)
    processes.worker("w")
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return web.get(url + "/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    assert wait_until(up, timeout=60), (processes.folder / "api.log").read_text()
    yield Api(url, token, other, revoked, client, processes.env(**api_env))
    client.close()
