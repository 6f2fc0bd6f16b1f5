from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Backend
from tests.support.processes import Processes


@pytest.fixture
def processes(postgres_backend: Backend, tmp_path: Path) -> Iterator[Processes]:
    """Worker and beat subprocesses on Postgres + Redis, all stopped when the test ends."""
    procs = Processes(postgres_backend, tmp_path)
    yield procs
    procs.stop_all()
