"""One autocommit DBAPI connection per thread for the step protocol's single-statement calls.

On Postgres a claim, and a completion that only hands off, are each one call of a server-side
function that is atomic by itself (migrations 0005 and 0006), prepared once per connection.
Such a call needs no BEGIN or COMMIT round trip, and none of the pool's checkout, reset and
checkin around it either: on a busy worker those cost more than the call. The connections are
the engine's own (same URL and options), taken from its pool and detached from it. Disposing the
engine closes them; a forked child never uses its parent's (it opens its own).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
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

    def rows(self, call: FunctionCall, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run one call as its own transaction; its rows. StorageError on failure, with
        `disconnected` set when the connection is gone (the next call opens a new one)."""
        connection = self._connection()
        try:
            with connection.cursor() as cursor:
                self._execute(connection, cursor, call, params)
                rows: list[tuple[Any, ...]] = cursor.fetchall()
                return rows
        except self._dbapi.Error as exc:
            gone = (self._dbapi.OperationalError, self._dbapi.InterfaceError)
            lost = connection.closed or isinstance(exc, gone)
            if lost:
                self._forget(connection)
            raise journal_error(str(exc), disconnected=bool(lost)) from exc

    def _execute(self, connection: Any, cursor: Any, call: FunctionCall, params: Sequence[Any]) -> None:
        """Execute the call by its prepared name, preparing it first on this connection's first
        use; unprepared once the connection has shown that it cannot keep statements."""
        prepared: set[str] | None = self._local.prepared
        if prepared is None:  # this connection keeps no prepared statements
            cursor.execute(call.plain, params)
            return
        try:
            if call.function not in prepared:
                cursor.execute(call.prepare)
                prepared.add(call.function)
            cursor.execute(call.execute, params)
        except self._dbapi.Error as exc:
            if getattr(exc, "pgcode", None) not in _STATEMENT_ELSEWHERE or connection.closed:
                raise
            self._local.prepared = None  # from now on this connection calls the functions unprepared
            cursor.execute(call.plain, params)

    def _connection(self) -> Any:
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == os.getpid() and not held[1].closed:
            return held[1]
        engine = self._engine()
        if engine is None:
            raise journal_error("the engine was garbage-collected")
        try:
            fairy = engine.raw_connection()
        except sa.exc.DBAPIError as exc:
            raise journal_error(str(exc.orig)) from exc
        fairy.detach()  # ours now: the pool neither resets nor hands it to anyone else
        connection: Any = fairy.dbapi_connection
        connection.autocommit = True
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


_by_engine: weakref.WeakKeyDictionary[Engine, AutocommitCalls] = weakref.WeakKeyDictionary()
_by_engine_lock = threading.Lock()


def calls_for(engine: Engine) -> AutocommitCalls:
    """The engine's AutocommitCalls: one per engine, however many journals use it."""
    with _by_engine_lock:
        calls = _by_engine.get(engine)
        if calls is None:
            calls = _by_engine[engine] = AutocommitCalls(engine)
        return calls
