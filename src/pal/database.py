"""Engines: one per process and URL, configured for safe concurrent use of the journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

_engines: dict[str, Engine] = {}


def normalize_url(url: str) -> sa.URL:
    """Plain `postgresql://` (or `postgres://`) means the psycopg2 driver PAL ships with."""
    parsed = sa.make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def create_engine(url: str) -> Engine:
    """A new engine for `url`. SQLite gets WAL, a busy timeout and write-locking transactions."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"timeout": 60})
        _configure_sqlite(engine)
        return engine
    # pre_ping: a worker that outlives a Postgres restart reconnects instead of failing a step.
    return sa.create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=5)


def shared_engine(url: str) -> Engine:
    """The process-wide engine for `url` (workers dispose its pool after fork)."""
    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = create_engine(url)
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
