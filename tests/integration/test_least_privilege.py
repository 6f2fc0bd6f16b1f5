"""PAL's processes work as a database role that owns nothing (`pal db grant ROLE`), and that role
cannot rewrite the journal's history. docs/security.md."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pal.cli.demo import wait_until
from pal.client import Client
from pal.storage.database import create_engine
from tests.conftest import Backend
from tests.support.graphs import approval, fan_out_in, flaky
from tests.support.tools import calls
from tests.support.workers import in_process_worker


@pytest.fixture
def app_role(pg_admin: sa.Engine) -> Iterator[str]:
    role = f"pal_app_{uuid.uuid4().hex[:10]}"
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
    yield role
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))


def test_pal_runs_as_a_least_privileged_role(postgres_backend: Backend, app_role: str, counter: Path) -> None:
    granted = subprocess.run([sys.executable, "-m", "pal.cli", "db", "grant", app_role],
                             env=postgres_backend.env(), capture_output=True, text=True, timeout=120)
    assert granted.returncode == 0, granted.stderr
    assert "GRANT SELECT, INSERT ON" in granted.stdout
    as_role = postgres_backend.settings.database_url.replace("postgresql://postgres@", f"postgresql://{app_role}@")
    client = Client(postgres_backend.settings.with_(database_url=as_role))
    try:
        with in_process_worker(client):
            done = client.start_run(fan_out_in(counter, 3), {})
            retried = client.start_run(flaky(counter, 1, {"maxAttempts": 2}), {})
            gated = client.start_run(approval(counter), {"amount": 1, "customer": "c"})
            assert client.wait(done, timeout=60).status == "succeeded"
            assert client.wait(retried, timeout=60).status == "succeeded"
            assert wait_until(lambda: bool(client.pending_approvals(gated)), 60)
            client.approve(gated, "gate")
            assert client.wait(gated, timeout=60).status == "succeeded"
        assert "pay" in calls(counter)
        assert client.runtime.journal.doctor.violations() == []
    finally:
        client.close()
    engine = create_engine(as_role)
    try:
        for statement in ("UPDATE journal_events SET payload = '{}'", "DELETE FROM journal_events",
                          "DROP TABLE runs", "UPDATE pal_keys SET secret = 'x'"):
            with pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"), \
                    engine.begin() as conn:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()


def test_grant_refuses_bad_or_missing_roles(postgres_backend: Backend) -> None:
    for role, says in (("no_such_role_here", "create it first"), ("Robert'); DROP TABLE runs;--", "plain")):
        result = subprocess.run([sys.executable, "-m", "pal.cli", "db", "grant", role],
                                env=postgres_backend.env(), capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and says in result.stderr, result.stderr
