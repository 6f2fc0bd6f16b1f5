"""One autocommit DBAPI connection per thread for the step protocol's single-statement calls.

On Postgres a claim, and a completion that only hands off, are each one call of a server-side
function that is atomic by itself (migrations 0005 and 0006), prepared once per connection.
Such a call needs no BEGIN or COMMIT round trip, and none of the pool's checkout, reset and
checkin around it either: on a busy worker those cost more than the call. The connections are
opened with the engine's URL and options, outside its pool, in psycopg2's asynchronous mode (always
autocommit): a call is sent, then waited for, so a caller can work while Postgres runs the call
(`rows(..., meanwhile=...)`; docs/architecture.md, "Messages built while the completion is on its
way"). Disposing the engine closes them; a forked child never uses its parent's (it opens its own).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from psycopg2.extensions import POLL_OK, POLL_READ, POLL_WRITE
from sqlalchemy.engine import Engine

from pal.errors import journal_error

# Behind a pooler in transaction mode (PgBouncer) consecutive statements of one connection may run
# in different server sessions: an EXECUTE finds no statement (26000, invalid_sql_statement_name),
# or a PREPARE finds another client's (42P05, duplicate_prepared_statement). Nothing ran either way.
_STATEMENT_ELSEWHERE = frozenset({"26000", "42P05"})


@dataclass(frozen=True)
class FunctionCall:
    """`SELECT * FROM function(...)`, PREPAREd once per connection and then EXECUTEd by name, so
    Postgres parses and plans the call once per connection instead of at every step."""

    function: str
    prepare: str  # PREPARE <function>_call (<types>) AS SELECT * FROM <function>($1, ...)
    execute: str  # EXECUTE <function>_call (%s, ...): psycopg2 fills in the parameters
    plain: str  # SELECT * FROM <function>(%s::<type>, ...): where statements cannot be kept

    @classmethod
    def of(cls, function: str, arg_types: Sequence[str]) -> FunctionCall:
        name = f"{function}_call"
        places = ", ".join(f"${i}" for i in range(1, len(arg_types) + 1))
        return cls(function,
                   f"PREPARE {name} ({', '.join(arg_types)}) AS SELECT * FROM {function}({places})",
                   f"EXECUTE {name} ({', '.join(['%s'] * len(arg_types))})",
                   f"SELECT * FROM {function}({', '.join(f'%s::{t}' for t in arg_types)})")


class AutocommitCalls:
    """The autocommit connections of one engine in this process (`calls_for` shares them)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)  # not a strong one: calls_for's map must let it go
        self._dbapi: Any = engine.dialect.loaded_dbapi
        self._local = threading.local()
        self._lock = threading.Lock()
        self._held: list[tuple[int, Any]] = []  # (pid, connection) of every thread's connection
        sa.event.listen(engine, "engine_disposed", self._on_disposed)

    def rows(self, call: FunctionCall, params: Sequence[Any],
             meanwhile: Callable[[], object] | None = None) -> list[tuple[Any, ...]]:
        """Run one call as its own transaction; its rows. StorageError on failure, with
        `disconnected` set when the connection is gone (the next call opens a new one).

        `meanwhile` runs once the call is on its way to Postgres, before its reply is awaited:
        work that does not depend on the reply overlaps the server's (pal.engine.steps builds
        the successors' messages there). It runs even if the call then fails."""
        connection = self._connection()
        try:
            with connection.cursor() as cursor:
                self._execute(connection, cursor, call, params, meanwhile)
                rows: list[tuple[Any, ...]] = cursor.fetchall()
                return rows
        except self._dbapi.Error as exc:
            gone = (self._dbapi.OperationalError, self._dbapi.InterfaceError)
            lost = connection.closed or isinstance(exc, gone)
            if lost:
                self._forget(connection)
            raise journal_error(str(exc), disconnected=bool(lost)) from exc
        except BaseException:
            # Raised in this thread while a reply was awaited (a signal's handler, an exception
            # another thread raised here): the statement's fate is unknown, the connection unusable.
            if connection.isexecuting():
                self._forget(connection)
            raise

    def _execute(self, connection: Any, cursor: Any, call: FunctionCall, params: Sequence[Any],
                 meanwhile: Callable[[], object] | None) -> None:
        """Execute the call by its prepared name, preparing it first on this connection's first
        use; unprepared once the connection has shown that it cannot keep statements."""
        prepared: set[str] | None = self._local.prepared
        if prepared is None:  # this connection keeps no prepared statements
            _sent_and_done(connection, cursor, call.plain, params, meanwhile)
            return
        try:
            if call.function not in prepared:
                _sent_and_done(connection, cursor, call.prepare, None, None)
                prepared.add(call.function)
            _sent_and_done(connection, cursor, call.execute, params, meanwhile)
        except self._dbapi.Error as exc:
            if getattr(exc, "pgcode", None) not in _STATEMENT_ELSEWHERE or connection.closed:
                raise
            self._local.prepared = None  # from now on this connection calls the functions unprepared
            _sent_and_done(connection, cursor, call.plain, params, None)

    def _connection(self) -> Any:
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == os.getpid() and not held[1].closed:
            return held[1]
        engine = self._engine()
        if engine is None:
            raise journal_error("the engine was garbage-collected")
        try:
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            connection: Any = self._dbapi.connect(*cargs, **cparams, async_=True)
            _wait(connection)
        except self._dbapi.Error as exc:
            raise journal_error(str(exc)) from exc
        self._local.held = (os.getpid(), connection)
        self._local.prepared = set()  # the functions whose call this connection has PREPAREd
        with self._lock:
            self._held.append(self._local.held)
        return connection

    def _forget(self, connection: Any) -> None:
        self._local.held = None
        with self._lock:
            self._held = [h for h in self._held if h[1] is not connection]
        with contextlib.suppress(self._dbapi.Error):  # already gone
            connection.close()

    def _on_disposed(self, _engine: Engine) -> None:
        """Close this process's connections; forget (never close) ones inherited over a fork."""
        with self._lock:
            held, self._held = self._held, []
        for pid, connection in held:
            if pid == os.getpid():
                connection.close()


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
    """The engine's AutocommitCalls: one per engine, however many journals use it."""
    with _by_engine_lock:
        calls = _by_engine.get(engine)
        if calls is None:
            calls = _by_engine[engine] = AutocommitCalls(engine)
        return calls
