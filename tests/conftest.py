"""Fixtures: every test gets its own Postgres schema, Redis key prefix, or SQLite folder.

Postgres and Redis are required, not optional: a missing service fails the test run with the
command that starts it (under CI=true and everywhere else), it never skips.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import sqlalchemy as sa

from pal.config import Settings, load_settings
from pal.storage.database import create_engine, normalize_url
from tests.support import tools  # noqa: F401  (registers the test tools in this process)
from tests.support.migrated import migrate

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("PAL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("PAL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
START_PG = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
START_REDIS = 'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no'


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    # pre_ping: one test restarts Postgres on purpose; the admin pool must survive it.
    engine = sa.create_engine(normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"Postgres is required at {PG_ADMIN_URL}; start it with: {START_PG}\n{exc}")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def redis_client() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"Redis is required at {REDIS_URL}; start it with: {START_REDIS}\n{exc}")
    return client


@contextmanager
def fresh_schema(pg_admin: sa.Engine) -> Iterator[str]:
    """A database URL whose search_path is a fresh schema, dropped at the end."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    yield f"{PG_ADMIN_URL}?options={quote(f'-csearch_path={schema}')}"
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def pg_url(pg_admin: sa.Engine) -> Iterator[str]:
    with fresh_schema(pg_admin) as url:
        yield url


@pytest.fixture
def redis_prefix(redis_client: redis.Redis) -> Iterator[str]:
    prefix = f"paltest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)


@dataclass(frozen=True)
class Backend:
    name: str
    settings: Settings

    def env(self) -> dict[str, str]:
        """The PAL_* environment a subprocess needs to join this backend."""
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAL_")}
        env.update(
            PAL_HOME=str(s.home), PAL_DATABASE_URL=s.database_url, PAL_BROKER_URL=s.broker_url,
            PAL_QUEUE=s.queue, PAL_BROKER_KEY_PREFIX=s.broker_key_prefix,
            PAL_LEASE_TTL=str(s.lease_ttl), PAL_TOOL_MODULES="tests.support.tools",
            PAL_EGRESS_ALLOW=",".join(s.egress_allow),
            # The checkout's own src first, so a git worktree's processes run its code, not the
            # editable install's.
            PYTHONPATH=os.pathsep.join((str(REPO / "src"), str(REPO))),
        )
        broker = s.broker
        if broker.transport_options:
            env["PAL_BROKER_TRANSPORT_OPTIONS"] = json.dumps(dict(broker.transport_options))
        for name, path in (("CA", broker.tls_ca_file), ("CERT", broker.tls_cert_file),
                           ("KEY", broker.tls_key_file)):
            if path:
                env[f"PAL_BROKER_TLS_{name}_FILE"] = path
        return env


# The stand-in receivers listen on 127.0.0.1 (tests/support/servers.py), which the egress guard
# refuses unless the operator allows it (docs/side-effects.md): test settings allow it, as a
# deployment with an internal receiver would. tests/integration/test_egress.py clears it.
TEST_EGRESS_ALLOW = "127.0.0.1"


def _settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings({"PAL_HOME": str(tmp_path / ".pal"), "PAL_EGRESS_ALLOW": TEST_EGRESS_ALLOW, **env})


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Backend:
    settings = _settings(tmp_path)
    engine = create_engine(settings.database_url)
    migrate(engine)
    engine.dispose()
    return Backend("sqlite", settings)


def migrated_postgres_backend(folder: Path, database_url: str, broker_url: str = REDIS_URL,
                              key_prefix: str = "", **env: str) -> Backend:
    settings = _settings(folder, PAL_DATABASE_URL=database_url, PAL_BROKER_URL=broker_url,
                         PAL_BROKER_KEY_PREFIX=key_prefix, **env)
    engine = create_engine(settings.database_url)
    migrate(engine)
    engine.dispose()
    return Backend("postgres", settings)


@pytest.fixture
def postgres_backend(tmp_path: Path, pg_url: str, redis_prefix: str) -> Backend:
    return migrated_postgres_backend(tmp_path, pg_url, REDIS_URL, redis_prefix)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each test using this runs twice: embedded SQLite + filesystem broker, Postgres + Redis."""
    result: Backend = request.getfixturevalue(f"{request.param}_backend")
    return result


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.support.report import FIGURES

    if FIGURES:
        terminalreporter.section("reliability figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
