"""`alembic upgrade head` produces exactly the schema the SQLAlchemy metadata declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pal.storage.database import create_engine
from pal.storage.schema import metadata
from pal.storage.schema.migrate import current_revision, upgrade
from tests.conftest import Backend


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def test_upgrade_head_equals_metadata(empty_url: str) -> None:
    engine = create_engine(empty_url)
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        indexes = {ix["name"] for ix in sa.inspect(conn).get_indexes("journal_events")}
    engine.dispose()
    assert diff == []
    assert {"uq_journal_step_completed", "uq_journal_terminal", "uq_journal_step_started"} <= indexes


def test_partial_unique_indexes_enforce_exactly_once(empty_url: str) -> None:
    from datetime import UTC, datetime

    from pal.storage.schema import journal_events, runs

    engine = create_engine(empty_url)
    upgrade(engine)
    now = datetime.now(UTC)
    row = {"run_id": "r1", "step_id": "a", "attempt": 1, "payload": {}, "generation": 1, "created_at": now}
    with engine.begin() as conn:
        conn.execute(runs.insert().values(id="r1", tenant_id="t", kind="graph", status="running",
                                          tier="shared", cost_usd=0, input_tokens=0, output_tokens=0,
                                          created_at=now))
        conn.execute(journal_events.insert().values(kind="step_completed", **row))
        conn.execute(journal_events.insert().values(kind="run_succeeded", **(row | {"step_id": None})))
        conn.execute(journal_events.insert().values(kind="step_started", **row))  # other kinds: fine
    for kind, step in (("step_completed", "a"), ("run_failed", None)):
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(journal_events.insert().values(kind=kind, **(row | {"step_id": step})))
    engine.dispose()


def test_pal_db_upgrade_is_idempotent(postgres_backend: Backend, tmp_path: Path) -> None:
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "pal.cli", "db", "upgrade"],
                                env=postgres_backend.env(), capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "journal at revision 0008" in result.stdout
    engine = create_engine(postgres_backend.settings.database_url)
    assert current_revision(engine) == "0008"
    engine.dispose()
