"""Steps whose effect is awaited: one event loop per worker process runs them, so a step that waits
on a model or an HTTP call holds no worker slot, no thread and no Postgres connection.

The worker's thread claims the step (the journal's claim) and hands its effect, a coroutine, to
`AsyncSteps.submit`; the Celery task then ends and the worker takes its next message. The lease
keeper renews the run's lease while the coroutine runs. When it ends, a few finisher threads journal
the outcome (the completion, a retry, the failure) and hand off to the successors, exactly as a step
run in the worker's own thread does. A crash in between loses nothing: the lease lapses and the
orphan sweep re-drives the step, whose attempt was never completed.

A process runs at most `limit` steps at once (PAL_ASYNC_STEPS), awaited or not: a worker's thread
takes a slot before it claims a step (`slot`) and waits while none is free (the broker keeps the
rest); an awaited effect takes the slot over until its outcome is journaled. A finisher may run the
step its completion made ready and claimed (pal.engine.steps, a chain of model calls): that step
takes over the finished one's slot, so a finisher never waits for one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from pal.engine.heartbeat import STOP_GRACE_SECONDS, LeaseGone, LeaseKeeper, TimeLimitReached

log = logging.getLogger(__name__)

class Slot:
    """One of the process's `limit` places, held by the caller of one step: an awaited effect takes
    it over (`submit`), a finisher hands its own to the step it runs next."""

    __slots__ = ("held",)

    def __init__(self, held: bool = True) -> None:
        self.held = held


Finish = Callable[[Any, Slot], None]
"""finish(outcome, slot): journal the effect's result, or the BaseException it ended with; `slot`
is the effect's, which a step the finisher runs next may take over."""

FINISHER_THREADS = 4  # journal calls are short; more threads would only contend for the GIL


class AsyncSteps:
    def __init__(self, limit: int, leases: LeaseKeeper) -> None:
        self.limit, self._leases = limit, leases
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.limit)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finishers: ThreadPoolExecutor | None = None
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, effect: Coroutine[Any, Any, Any], *, run_id: str, generation: int, limit_s: float,
               finish: Finish, slot: Slot | None = None) -> None:
        """Run `effect` on the loop under the run's lease and the step's time limit, then `finish`
        its outcome on a finisher thread. The effect takes over the caller's `slot`; without one
        held, this waits for a free one."""
        if self._pid != os.getpid():  # a forked pool process: the parent's loop is not here
            self._start()
        if slot is not None and slot.held:
            slot.held = False  # the effect's now
        else:
            self._acquire()
        # The lease is watched from here, as soon after the claim as a step in a thread is, until
        # the outcome is journaled (`_finish`): a busy loop or finisher must not let it lapse.
        stop = _Stop()
        token = self._leases.watch(run_id, generation, stop)
        try:
            loop = self._running_loop()
            asyncio.run_coroutine_threadsafe(self._run(effect, stop, token, limit_s, finish), loop)
        except BaseException:
            self._leases.unwatch(token)
            effect.close()
            self._release()
            raise

    @contextmanager
    def slot(self, held: Slot | None = None) -> Iterator[Slot]:
        """A slot for the caller while it claims and runs a step: an awaited effect takes it over
        (`submit`), else it is freed at the end. So a thread never holds a claimed step while it
        waits for room on the loop, and a process runs at most `limit` steps at once. Given one
        still `held` (a finisher's), that one is used and nothing more is taken."""
        if self._pid != os.getpid():
            self._start()
        if held is not None and held.held:
            yield held
            return
        self._acquire()
        slot = Slot()
        try:
            yield slot
        finally:
            if slot.held:
                slot.held = False
                self._release()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the effects in flight to finish and journal (a worker's
        warm shutdown); False when some are still running (their leases lapse, the sweep re-drives)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pal-async-steps", daemon=True).start()
                self._finishers = ThreadPoolExecutor(FINISHER_THREADS, thread_name_prefix="pal-finish")
                self._loop = loop
            return self._loop

    async def _run(self, effect: Coroutine[Any, Any, Any], stop: _Stop, token: int, limit_s: float,
                   finish: Finish) -> None:
        task = asyncio.ensure_future(effect)
        stop.start(task, asyncio.get_running_loop())
        outcome: Any
        try:
            outcome = await asyncio.wait_for(task, limit_s + STOP_GRACE_SECONDS)
        except TimeoutError as exc:
            stopped = TimeLimitReached()
            stopped.__cause__ = exc
            outcome = stopped
        except asyncio.CancelledError:
            if not stop.gone.is_set():
                self._leases.unwatch(token)
                self._release()
                raise  # the loop itself is stopping
            outcome = LeaseGone()
        except Exception as exc:  # the node's failure: data for the journal
            outcome = exc
        assert self._finishers is not None
        self._finishers.submit(self._finish, finish, outcome, token)

    def _finish(self, finish: Finish, outcome: Any, token: int) -> None:
        slot = Slot()  # the effect's: a step this finisher runs next may take it over
        try:
            finish(outcome, slot)
        except Exception:  # the lease lapses and the sweep re-drives the step
            log.exception("an awaited step's outcome was not journaled; the sweep re-drives it")
        finally:
            self._leases.unwatch(token)
            if slot.held:
                slot.held = False
                self._release()

    def _acquire(self) -> None:
        self._slots.acquire()
        with self._lock:
            self._in_flight += 1

    def _release(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()
        self._slots.release()


class _Stop:
    """How the lease keeper stops an awaited effect whose lease is gone (a cancel, a takeover):
    it cancels the effect's task, once the loop has made it."""

    def __init__(self) -> None:
        self.gone = threading.Event()
        self.task: asyncio.Future[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, task: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.task, self._loop = task, loop
        if self.gone.is_set():  # lost before the loop got to it
            task.cancel()

    def __call__(self) -> None:  # from the lease keeper's thread
        self.gone.set()
        if self.task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.task.cancel)
