"""`alembic upgrade head` produces exactly the schema the SQLAlchemy metadata declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from pal.storage import sql as functions_file
from pal.storage.database import create_engine
from pal.storage.schema import metadata
from pal.storage.schema.migrate import alembic_config, current_revision, upgrade
from tests.conftest import Backend

# The newest migration shipped in the package: every upgrade must reach it.
HEAD = ScriptDirectory.from_config(alembic_config(create_engine("sqlite://"))).get_current_head()


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


def test_0022_keys_the_baselines_by_tenant(empty_url: str) -> None:
    """The shared rows of 0021 are dropped (the beat task rewrites them per tenant), two tenants may
    then hold a baseline of the same graph, node and metric, and Postgres keeps the table's grants."""
    from datetime import UTC, datetime

    from pal.storage.schema import UtcDateTime, step_baselines

    engine = create_engine(empty_url)
    upgrade(engine, "0021")
    before = sa.table("step_baselines", *(sa.column(c) for c in ("graph_hash", "node_id", "metric")),
                      sa.column("samples", sa.JSON()), sa.column("updated_at", UtcDateTime()))  # 0021's
    shared = {"graph_hash": "g", "node_id": "ask", "metric": "tokens", "samples": [1.0],
              "updated_at": datetime.now(UTC)}
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        conn.execute(before.insert().values(**shared))
        if postgres:
            conn.execute(sa.text("GRANT SELECT, INSERT, DELETE ON step_baselines TO PUBLIC"))
    upgrade(engine)
    with engine.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(step_baselines)).scalar_one() == 0
        key = sa.inspect(conn).get_pk_constraint("step_baselines")["constrained_columns"]
        assert key == ["tenant_id", "graph_hash", "node_id", "metric"]
        conn.execute(step_baselines.insert(), [shared | {"tenant_id": "acme"}, shared | {"tenant_id": "globex"}])
        if postgres:
            granted = conn.execute(sa.text(
                "SELECT privilege_type FROM information_schema.role_table_grants WHERE grantee = 'PUBLIC' "
                "AND table_schema = current_schema() AND table_name = 'step_baselines'")).scalars().all()
            assert sorted(granted) == ["DELETE", "INSERT", "SELECT"]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(step_baselines.insert().values(**shared, tenant_id="acme"))
    engine.dispose()


def test_pal_db_upgrade_is_idempotent(postgres_backend: Backend, tmp_path: Path) -> None:
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "pal.cli", "db", "upgrade"],
                                env=postgres_backend.env(), capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"journal at revision {HEAD}" in result.stdout
    engine = create_engine(postgres_backend.settings.database_url)
    assert current_revision(engine) == HEAD
    engine.dispose()


def _function_loaders() -> list[tuple[str, str]]:
    """(revision, SQL_SHA256) of every migration that loads pal/storage/sql/functions.sql."""
    versions = Path(functions_file.__file__).parents[1] / "schema" / "migrations" / "versions"
    found = []
    for path in sorted(versions.glob("*.py")):
        text = path.read_text()
        if "load_functions" in text:
            sha = text.split('SQL_SHA256 = "', 1)[1].split('"', 1)[0]
            found.append((path.name.split("_", 1)[0], sha))
    return found


def test_the_newest_function_loader_was_written_for_the_current_file() -> None:
    """A changed functions.sql without a migration that loads it again would leave every existing
    database on the old definitions: the newest loader must record the file's own hash."""
    loaders = _function_loaders()
    assert loaders, "no migration loads pal/storage/sql/functions.sql"
    assert loaders[-1][1] == functions_file.functions_sha256(), (
        f"functions.sql changed after migration {loaders[-1][0]}: add a migration that loads it")


def test_the_live_functions_are_the_files(pg_url: str) -> None:
    """After `upgrade`, each function's body in Postgres is the body written in functions.sql."""
    engine = create_engine(pg_url)
    upgrade(engine)
    statements = functions_file.function_statements()
    with engine.connect() as conn:
        live = dict(conn.execute(sa.text(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname LIKE 'pal\\_%'")).all())
    engine.dispose()
    assert len(live) == len(statements) == 11
    for statement in statements:
        name = statement.split("FUNCTION ", 1)[1].split("(", 1)[0]
        body = statement.split("$function$", 2)[1]
        assert live[name] == body, name
