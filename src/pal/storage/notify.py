"""Postgres LISTEN/NOTIFY: one listening connection (per API process for its SSE streams, per
`pal.AsyncClient` for its waits) wakes the waiters of a run as soon as its journal grows (a
trigger NOTIFYs `pal_journal` with the run id of every event).
Polling stays as the fallback: a missed notification costs one poll period, never an event."""

from __future__ import annotations

import asyncio
import logging
import select
import threading
from collections import defaultdict

from pal.storage.database import normalize_url

log = logging.getLogger(__name__)
CHANNEL = "pal_journal"


class JournalNotifier:
    def __init__(self, database_url: str) -> None:
        url = normalize_url(database_url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._listen, name="pal-journal-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def subscribe(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiters[run_id].add(event)
        return event

    def unsubscribe(self, run_id: str, event: asyncio.Event) -> None:
        with self._lock:
            self._waiters[run_id].discard(event)
            if not self._waiters[run_id]:
                del self._waiters[run_id]

    def _wake(self, run_id: str) -> None:
        with self._lock:
            waiters = list(self._waiters.get(run_id, ()))
        if self._loop is not None:
            for event in waiters:
                self._loop.call_soon_threadsafe(event.set)

    def _listen(self) -> None:
        import psycopg2  # Postgres only: the driver is an optional part (pal[postgres])
        import psycopg2.extensions

        pause = 0.5
        while not self._stop.is_set():
            try:
                conn = psycopg2.connect(self._dsn)
                conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
                with conn.cursor() as cursor:
                    cursor.execute(f"LISTEN {CHANNEL}")
                pause = 0.5
                while not self._stop.is_set():
                    if select.select([conn], [], [], 1.0)[0]:
                        conn.poll()
                        while conn.notifies:
                            self._wake(conn.notifies.pop(0).payload)
                conn.close()
            except psycopg2.Error:
                log.warning("journal LISTEN connection lost; streams poll until it is back", exc_info=True)
                self._stop.wait(pause)
                pause = min(pause * 2, 10.0)
