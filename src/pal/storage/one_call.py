"""A bounded pool of autocommit DBAPI connections for the step protocol's single-statement calls.

On Postgres a claim, and a completion that only hands off, are each one call of a server-side
function that is atomic by itself (migrations 0005 and 0006), prepared once per connection. Such a
call needs no BEGIN or COMMIT round trip, and none of the pool's checkout, reset and checkin around
it either: on a busy worker those cost more than the call. The connections are opened with the
engine's URL and options, outside its pool, in psycopg2's asynchronous mode (always autocommit): a
call is sent, then waited for, so a caller can work while Postgres runs the call (`rows(...,
meanwhile=...)`; docs/decisions/messages-built-ahead.md). A connection is checked out for one call
and back right after, so a thread whose step waits (on a model, a tool's HTTP call) holds none:
however many threads a worker runs, a process opens at most the engine's pool limit
(PAL_DB_POOL_SIZE) of them, and a call waits for a free one. Disposing the engine closes them; a
forked child never uses its parent's (it opens its own).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.errors import journal_error
from pal.storage.database import pool_limit
from pal.storage.sql.queries import Query

# Behind a pooler in transaction mode (PgBouncer) consecutive statements of one connection may run
# in different server sessions: an EXECUTE finds no statement (26000, invalid_sql_statement_name),
# or a PREPARE finds another client's (42P05, duplicate_prepared_statement). Nothing ran either way.
_STATEMENT_ELSEWHERE = frozenset({"26000", "42P05"})
CHECKOUT_WAIT_S = 30.0  # how long a call waits for a free connection, as SQLAlchemy's pool does


@dataclass(eq=False)  # each is itself: two connecting places are never one
class _Held:
    """One pooled connection, the process that opened it, and the calls it has PREPAREd (None once
    it has shown that it cannot keep statements)."""

    pid: int
    connection: Any
    prepared: set[str] | None


class AutocommitCalls:
    """The autocommit connections of one engine in this process (`calls_for` shares them)."""

    def __init__(self, engine: Engine, limit: int) -> None:
        self._engine = weakref.ref(engine)  # not a strong one: calls_for's map must let it go
        self._dbapi: Any = engine.dialect.loaded_dbapi
        self.limit = limit
        self._free = threading.Condition()
        self._idle: list[_Held] = []  # most recently used last: a busy worker reuses one connection
        self._open: list[_Held] = []  # every connection this process opened and has not closed
        sa.event.listen(engine, "engine_disposed", self._on_disposed)

    def rows(self, call: Query, params: Sequence[Any],
             meanwhile: Callable[[], object] | None = None) -> list[tuple[Any, ...]]:
        """Run one call as its own transaction; its rows. StorageError on failure, with
        `disconnected` set when the connection is gone (the next call opens a new one).

        `meanwhile` runs once the call is on its way to Postgres, before its reply is awaited:
        work that does not depend on the reply overlaps the server's (pal.engine.steps builds
        the successors' messages there). It runs even if the call then fails."""
        held = self._checkout()
        connection = held.connection
        try:
            with connection.cursor() as cursor:
                self._execute(held, cursor, call, params, meanwhile)
                rows: list[tuple[Any, ...]] = cursor.fetchall()
            self._checkin(held)
            return rows
        except self._dbapi.Error as exc:
            gone = (self._dbapi.OperationalError, self._dbapi.InterfaceError)
            lost = connection.closed or isinstance(exc, gone)
            if lost:
                self._forget(held)
            else:
                self._checkin(held)
            raise journal_error(str(exc), disconnected=bool(lost)) from exc
        except BaseException:
            # Raised in this thread while a reply was awaited (a signal's handler, an exception
            # another thread raised here): the statement's fate is unknown, the connection unusable.
            if connection.isexecuting():
                self._forget(held)
            else:
                self._checkin(held)
            raise

    def _execute(self, held: _Held, cursor: Any, call: Query, params: Sequence[Any],
                 meanwhile: Callable[[], object] | None) -> None:
        """Execute the call by its prepared name, preparing it first on this connection's first
        use; unprepared once the connection has shown that it cannot keep statements."""
        connection, prepared = held.connection, held.prepared
        if prepared is None:  # this connection keeps no prepared statements
            _sent_and_done(connection, cursor, call.driver_sql, params, meanwhile)
            return
        try:
            if call.name not in prepared:
                _sent_and_done(connection, cursor, call.prepare, None, None)
                prepared.add(call.name)
            _sent_and_done(connection, cursor, call.execute, params, meanwhile)
        except self._dbapi.Error as exc:
            if getattr(exc, "pgcode", None) not in _STATEMENT_ELSEWHERE or connection.closed:
                raise
            held.prepared = None  # from now on this connection calls the functions unprepared
            _sent_and_done(connection, cursor, call.driver_sql, params, None)

    def _connection(self) -> Any:
        """The connection the next call gets while no other thread calls (the last used, or a new
        one): what tests look at."""
        held = self._checkout()
        self._checkin(held)
        return held.connection

    def _checkout(self) -> _Held:
        """A free connection of this process's, else a new one while fewer than `limit` are open,
        else the first to come back (StorageError after CHECKOUT_WAIT_S)."""
        pid = os.getpid()
        deadline = time.monotonic() + CHECKOUT_WAIT_S
        with self._free:
            if self._open and self._open[0].pid != pid:  # a forked child: its parent's are not its own
                self._idle, self._open = [], []
            while True:
                while self._idle:
                    held = self._idle.pop()
                    if not held.connection.closed:
                        return held
                    self._open.remove(held)
                if len(self._open) < self.limit:
                    held = _Held(pid, None, set())
                    self._open.append(held)  # its place, kept while it connects
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise journal_error(f"no Postgres connection of this process's {self.limit} "
                                        f"(PAL_DB_POOL_SIZE) came free in {CHECKOUT_WAIT_S:g}s")
                self._free.wait(remaining)
        try:
            held.connection = self._connect()
        except BaseException:
            self._forget(held)
            raise
        return held

    def _connect(self) -> Any:
        engine = self._engine()
        if engine is None:
            raise journal_error("the engine was garbage-collected")
        try:
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            connection: Any = self._dbapi.connect(*cargs, **cparams, async_=True)
            _wait(connection)
        except self._dbapi.Error as exc:
            raise journal_error(str(exc)) from exc
        return connection

    def _checkin(self, held: _Held) -> None:
        with self._free:
            if held in self._open:  # not since disposed or forgotten
                self._idle.append(held)
            self._free.notify()

    def _forget(self, held: _Held) -> None:
        with self._free:
            if held in self._open:
                self._open.remove(held)
            self._free.notify()
        if held.connection is not None:
            with contextlib.suppress(self._dbapi.Error):  # already gone
                held.connection.close()

    def _on_disposed(self, _engine: Engine) -> None:
        """Close this process's connections; forget (never close) ones inherited over a fork."""
        with self._free:
            opened, self._open, self._idle = self._open, [], []
            self._free.notify_all()
        for held in opened:
            if held.pid == os.getpid() and held.connection is not None:
                held.connection.close()


def _sent_and_done(connection: Any, cursor: Any, statement: str, params: Sequence[Any] | None,
                   meanwhile: Callable[[], object] | None) -> None:
    """Send one statement on an asynchronous connection, run `meanwhile`, then wait for the reply
    (an error in it is raised here, as the blocking driver would raise it from `execute`)."""
    cursor.execute(statement, params)
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        _wait(connection)


def _wait(connection: Any) -> None:
    """Block until the connection's pending operation is done, as psycopg2's own blocking calls
    would (psycopg2.extras.wait_select, without its handling of Ctrl-C, which a worker leaves to
    its signal handlers)."""
    from psycopg2.extensions import POLL_OK, POLL_READ, POLL_WRITE  # Postgres only: pal[postgres]

    while True:
        state = connection.poll()
        if state == POLL_OK:
            return
        if state == POLL_READ:
            select.select([connection], [], [])
        elif state == POLL_WRITE:
            select.select([], [connection], [])
        else:
            raise connection.OperationalError(f"bad state from poll: {state}")


_by_engine: weakref.WeakKeyDictionary[Engine, AutocommitCalls] = weakref.WeakKeyDictionary()
_by_engine_lock = threading.Lock()


def calls_for(engine: Engine) -> AutocommitCalls:
    """The engine's AutocommitCalls: one per engine, however many journals use it, as many
    connections at most as the engine's own pool (PAL_DB_POOL_SIZE)."""
    with _by_engine_lock:
        calls = _by_engine.get(engine)
        if calls is None:
            calls = _by_engine[engine] = AutocommitCalls(engine, pool_limit(engine))
        return calls
