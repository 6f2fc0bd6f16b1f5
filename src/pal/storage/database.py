"""Engines: one per process and URL, configured for safe concurrent use of the journal."""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.core.extras import missing_extra
from pal.errors import ConfigError
from pal.storage.private_files import private_database_file
from pal.storage.sql.queries import query

_engines: dict[str, Engine] = {}
DEFAULT_POOL_SIZE = 20  # PAL_DB_POOL_SIZE: the most Postgres connections one process opens
_one_call_limits: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
PING_AFTER_IDLE_SECONDS = 1.0  # a pooled Postgres connection idle this long is pinged before use
_IDLE_SINCE = "pal_idle_since"
_PING = query("ping").driver_sql


def normalize_url(url: str) -> sa.URL:
    """Plain `postgresql://` (or `postgres://`) means the psycopg2 driver PAL ships with."""
    parsed = sa.make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def create_engine(url: str, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    """A new engine for `url`. SQLite gets WAL, a busy timeout and write-locking transactions.
    On Postgres the process opens at most `pool_size` connections: half for transactions (the
    engine's pool), half for the step protocol's one-call statements (pal.storage.one_call)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            # The journal holds every tenant's graphs and inputs: 0600 in a 0700 folder that PAL
            # makes, before SQLite opens it (pal.storage.private_files).
            private_database_file(Path(parsed.database))
        # hide_parameters: a database error's text never carries a statement's values (a run's graph
        # or input may hold credentials: docs/security.md).
        engine = sa.create_engine(parsed, connect_args={"timeout": 60}, hide_parameters=True)
        _configure_sqlite(engine)
        return engine
    if pool_size < 2:
        raise ValueError(f"a Postgres pool needs at least 2 connections, not {pool_size}")
    try:
        import psycopg2  # noqa: F401  (the driver: an optional part, the app's choice)
    except ModuleNotFoundError as exc:
        raise ConfigError(missing_extra(exc, "a Postgres journal") or str(exc)) from exc
    transactions = pool_size // 2
    steady = min(5, transactions)  # kept open; the rest opened when busy and closed when idle again
    engine = sa.create_engine(parsed, pool_size=steady, max_overflow=transactions - steady,
                              hide_parameters=True)
    _one_call_limits[engine] = pool_size - transactions
    _ping_idle_connections(engine)
    return engine


def pool_limit(engine: Engine) -> int:
    """How many one-call connections the engine's process may open (see create_engine)."""
    return _one_call_limits.get(engine, DEFAULT_POOL_SIZE - DEFAULT_POOL_SIZE // 2)


def _ping_idle_connections(engine: Engine) -> None:
    """Ping a pooled connection before use only when it sat idle: a busy worker reuses its
    connection within milliseconds, and a ping on every checkout was two of a step's round trips.
    A connection that died while busy (a Postgres restart) fails its next transaction instead;
    SQLAlchemy then renews the whole pool, and the step protocol retries that transaction once
    (pal.engine.steps), so nothing is lost either way."""

    @sa.event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(_PING, ())
            cursor.close()
            # psycopg2 opened a transaction for the ping: end it, so the connection is handed out
            # as the pool keeps it, idle. pal.storage.one_call cannot switch a connection to autocommit
            # inside a transaction; that failed the first one-call claim of a process whose pooled
            # connection had sat idle for a second (a run resumed after an approval, say).
            dbapi_connection.rollback()
        except engine.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DisconnectionError("the pooled connection is gone") from exc  # the pool reconnects


def shared_engine(url: str, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    """The process-wide engine for `url` (workers dispose its pool after fork); the first call's
    `pool_size` holds for the process."""
    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = create_engine(url, pool_size)
    return engine


def dispose_after_fork() -> None:
    """Drop connections inherited from the parent process without closing the parent's."""
    for engine in _engines.values():
        engine.dispose(close=False)


def _configure_sqlite(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start (pysqlite would defer).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # Take the write lock up front: two processes that read then write cannot deadlock.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
