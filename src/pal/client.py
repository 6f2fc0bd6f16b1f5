"""`pal.Client` and `pal.AsyncClient`: start runs and inspect them from Python, or from asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, Self, TypeVar

from pal.config import Settings, load_settings
from pal.core.records import Event, Handoff, RunRecord
from pal.core.run_filters import RunFilter
from pal.engine.lineage import SAME_INPUT, fork_run, retry_run
from pal.engine.runs import cancel, start_run
from pal.engine.signals import send_signal
from pal.engine.waiting import PendingApproval, decide, pending_approvals
from pal.errors import PalError, StorageError
from pal.storage.notify import JournalNotifier
from pal.workers.pal_app import create_app

P = ParamSpec("P")
T = TypeVar("T")
WAKE_AT_LEAST_EVERY_S = 1.0  # an AsyncClient's wait looks again at least this often (a lost NOTIFY)


class RunTimeout(PalError):
    """The run did not finish in time."""


def _user() -> str:
    """Who decides or cancels when no one is named: $USER or $LOGNAME, else this process's account
    (a container's shell often sets neither), else its uid; never "unknown"."""
    named = os.environ.get("USER") or os.environ.get("LOGNAME")
    if named:
        return named
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no account (an arbitrary container uid)
        return f"uid {os.getuid()}"


class Client:
    """Talks to the journal directly and publishes through the Celery broker.

    >>> client = Client()                       # settings from PAL_* variables
    >>> run_id = client.start_run(graph, {"ticket": "..."})
    >>> client.wait(run_id).status
    'succeeded'
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.app = create_app(self.settings)
        self.runtime = self.app.runtime

    def start_run(self, graph: Any, input: Any = None, *, run_id: str | None = None,
                  tenant_id: str | None = None, limits: dict[str, Any] | None = None,
                  traceparent: str | None = None, dedupe_key: str | None = None,
                  dedupe_window: str | float | None = None, debounce_key: str | None = None,
                  debounce: str | float | None = None, priority: int | None = None) -> str:
        """Validate and enqueue; the same `run_id` twice returns the existing run. `limits` is the
        run's own budget over the graph's (docs/anomalies.md); `traceparent`, the W3C trace
        context its first trace links to (docs/observability.md). `dedupe_key` (within
        `dedupe_window`, a day by default) gives the key's run again; `debounce_key` with
        `debounce` runs only the last start of a burst (docs/api.md, "Dedupe and debounce");
        `priority` (1 first .. 5 last) orders held runs (docs/fairness.md)."""
        record, _ = start_run(self.runtime, graph, input, run_id=run_id, tenant_id=tenant_id, limits=limits,
                              traceparent=traceparent, dedupe_key=dedupe_key, dedupe_window=dedupe_window,
                              debounce_key=debounce_key, debounce=debounce, priority=priority)
        return record.id

    def retry_run(self, run_id: str, *, new_run_id: str | None = None, graph: Any = None) -> str:
        """A new run retrying a failed or cancelled run (its completed steps reused); its id
        (docs/retry-and-fork.md). `graph`: a fixed graph to run instead, in which every node a
        completed step ran is unchanged. The same `new_run_id` twice returns the same run."""
        return retry_run(self.runtime, run_id, run_id=new_run_id, graph=graph).run.id

    def fork_run(self, run_id: str, from_step: str, input: Any = SAME_INPUT, *,
                 new_run_id: str | None = None) -> str:
        """A new run from a finished run's `from_step` on (the steps before it reused), with the
        source's input unless `input` is given; its id (docs/retry-and-fork.md)."""
        return fork_run(self.runtime, run_id, from_step, input, run_id=new_run_id).run.id

    def derived_runs(self, run_id: str) -> list[dict[str, Any]]:
        """The runs retried or forked from `run_id`: {run_id, kind, status}, oldest first."""
        self.runtime.control.get_run(run_id)  # RunNotFound for an unknown id
        return self.runtime.control.derived_runs(run_id)

    def anomalies(self, run_id: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Anomalies journaled, newest first: of one run, or of every run of this client's tenant."""
        tenant = None if run_id is not None else self.settings.tenant
        return self.runtime.control.anomalies(run_id=run_id, tenant_id=tenant, limit=limit)

    def get_run(self, run_id: str) -> RunRecord:
        return self.runtime.control.get_run(run_id)

    def events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        self.runtime.control.get_run(run_id)  # RunNotFound for an unknown id
        return self.runtime.control.events(run_id, after_seq)

    def list_runs(self, *, status: str | None = None, limit: int = 50, offset: int = 0,
                  filters: RunFilter | None = None) -> list[RunRecord]:
        """Runs newest first; `filters` (pal.core.run_filters) narrow them as GET /v1/runs does."""
        chosen = (filters or RunFilter()).as_kwargs() | ({"status": status} if status else {})
        return self.runtime.control.list_runs(limit=limit, offset=offset, **chosen)

    def wait(self, run_id: str, timeout: float = 60.0, poll: float = 0.05) -> RunRecord:
        """Poll until the run is terminal; RunTimeout after `timeout` seconds.

        A database that is briefly unreachable (a restart) is waited out, not reported.
        """
        waiting = _Waiting(run_id, timeout)
        while (run := waiting.look(self)) is None:
            time.sleep(poll)
        return run

    def decide(self, run_id: str, step_id: str, decision: str, *, comment: str | None = None,
               by: str | None = None, expected_hash: str | None = None) -> Handoff:
        """Approve (`approved`) or reject (`rejected`) a waiting approval; Refused otherwise."""
        return decide(self.runtime, run_id, step_id, decision, by=by or _user(), comment=comment,
                      expected_hash=expected_hash)

    def approve(self, run_id: str, step_id: str, **kwargs: Any) -> Handoff:
        return self.decide(run_id, step_id, "approved", **kwargs)

    def reject(self, run_id: str, step_id: str, **kwargs: Any) -> Handoff:
        return self.decide(run_id, step_id, "rejected", **kwargs)

    def pending_approvals(self, run_id: str) -> list[PendingApproval]:
        """Undecided approvals of the run and of its child runs, parents first."""
        self.runtime.control.get_run(run_id)  # RunNotFound for an unknown id
        return pending_approvals(self.runtime, run_id)

    def signal(self, run_id: str, name: str, payload: Any = None, *, by: str | None = None,
               tenant_id: str | None = None) -> str:
        """Send signal `name` to a run of `tenant_id` (default PAL_TENANT) for its `wait_event`
        steps; the signal's id (pal.engine.signals)."""
        return send_signal(self.runtime, run_id, name, payload, tenant_id=tenant_id or self.settings.tenant,
                           by=by or _user())

    def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> list[str]:
        """Cancel the run and its unfinished descendants; returns the ids cancelled."""
        return cancel(self.runtime, run_id, by=by or _user(), reason=reason)

    def close(self) -> None:
        """Release the broker connection and the journal's pooled connections (the engine
        stays usable; it reconnects on demand)."""
        if self.app.node_publisher is not None:
            self.app.node_publisher.close()
        self.app.close()
        self.runtime.release_connections()


class _Waiting:
    """One wait for a run to end, shared by both clients' `wait`."""

    def __init__(self, run_id: str, timeout: float) -> None:
        self.run_id, self.timeout = run_id, timeout
        self.deadline, self.status = time.monotonic() + timeout, "unknown"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def look(self, client: Client) -> RunRecord | None:
        """The run once terminal; None before (or while the database is briefly unreachable);
        RunTimeout, or the storage error, once the time is up."""
        try:
            run = client.get_run(self.run_id)
        except StorageError:
            if self.left() < 0:
                raise
        else:
            if run.terminal:
                return run
            self.status = run.status
        if self.left() < 0:
            raise RunTimeout(f"run {self.run_id} still {self.status} after {self.timeout:g}s")
        return None


class AsyncClient:
    """`Client` for asyncio apps: every call runs the synchronous client on one of a few threads
    (the journal's driver is synchronous), so the event loop never blocks on Postgres; `wait` and
    `follow` wake on the journal's NOTIFY on Postgres (one listening connection per client, opened
    on first use) instead of polling, and look again at least every second.

    >>> async with pal.AsyncClient() as client:
    ...     run_id = await client.start_run(graph, {"ticket": "..."})
    ...     run = await client.wait(run_id)
    """

    def __init__(self, settings: Settings | None = None, *, threads: int = 8) -> None:
        self.sync = Client(settings)
        self.settings = self.sync.settings
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="pal-async-client")
        self._notifier: JournalNotifier | None = None

    async def _call(self, method: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(method, *args, **kwargs))

    async def start_run(self, graph: Any, input: Any = None, **options: Any) -> str:
        """As `Client.start_run` (run_id, tenant_id, limits, traceparent, dedupe and debounce keys)."""
        return await self._call(self.sync.start_run, graph, input, **options)

    async def retry_run(self, run_id: str, *, new_run_id: str | None = None, graph: Any = None) -> str:
        return await self._call(self.sync.retry_run, run_id, new_run_id=new_run_id, graph=graph)

    async def fork_run(self, run_id: str, from_step: str, input: Any = SAME_INPUT, *,
                       new_run_id: str | None = None) -> str:
        return await self._call(self.sync.fork_run, run_id, from_step, input, new_run_id=new_run_id)

    async def get_run(self, run_id: str) -> RunRecord:
        return await self._call(self.sync.get_run, run_id)

    async def events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        return await self._call(self.sync.events, run_id, after_seq)

    async def list_runs(self, **options: Any) -> list[RunRecord]:
        return await self._call(self.sync.list_runs, **options)

    async def decide(self, run_id: str, step_id: str, decision: str, **options: Any) -> Handoff:
        return await self._call(self.sync.decide, run_id, step_id, decision, **options)

    async def pending_approvals(self, run_id: str) -> list[PendingApproval]:
        return await self._call(self.sync.pending_approvals, run_id)

    async def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> list[str]:
        return await self._call(self.sync.cancel, run_id, reason=reason, by=by)

    async def wait(self, run_id: str, timeout: float = 60.0) -> RunRecord:
        """The run once terminal; RunTimeout after `timeout` seconds (a database briefly
        unreachable is waited out, as `Client.wait` does)."""
        waiting = _Waiting(run_id, timeout)
        async with self._woken(run_id) as woken:
            while True:
                woken.clear()  # before the read: a NOTIFY after it wakes the next wait
                run = await self._call(waiting.look, self.sync)
                if run is not None:
                    return run
                await _woken_or_after(woken, min(waiting.left(), WAKE_AT_LEAST_EVERY_S))

    async def follow(self, run_id: str, after_seq: int = 0) -> AsyncIterator[Event]:
        """The run's events after `after_seq`, as they are journaled, until the run is terminal."""
        async with self._woken(run_id) as woken:
            while True:
                woken.clear()
                terminal = (await self.get_run(run_id)).terminal  # read first: no event after it is missed
                for event in await self.events(run_id, after_seq):
                    after_seq = event.seq
                    yield event
                if terminal:
                    return
                await _woken_or_after(woken, WAKE_AT_LEAST_EVERY_S)

    def _woken(self, run_id: str) -> _Subscription:
        if self._notifier is None and self.settings.database_url.startswith("postgresql"):
            self._notifier = JournalNotifier(self.settings.database_url)
            self._notifier.start(asyncio.get_running_loop())
        return _Subscription(self._notifier, run_id)

    async def aclose(self) -> None:
        if self._notifier is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._notifier.stop)
        self._threads.shutdown(wait=True)
        self.sync.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


class _Subscription:
    """A run's wake-up event while a wait or a follow looks at it (never set on SQLite)."""

    def __init__(self, notifier: JournalNotifier | None, run_id: str) -> None:
        self._notifier, self._run_id = notifier, run_id
        self._event = asyncio.Event()

    async def __aenter__(self) -> asyncio.Event:
        if self._notifier is not None:
            self._event = self._notifier.subscribe(self._run_id)
        return self._event

    async def __aexit__(self, *_: object) -> None:
        if self._notifier is not None:
            self._notifier.unsubscribe(self._run_id, self._event)


async def _woken_or_after(woken: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(woken.wait(), seconds)
