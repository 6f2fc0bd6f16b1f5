"""The heartbeat: one thread per process renews the lease of every step running in it, and stops a
step from outside its own code when it must stop.

A step holds its run's lease while its node runs (`LeaseKeeper.holding`); every third of the lease's
TTL the keeper renews it, fenced by generation like every journal write. One shared thread instead
of one per step: starting and joining a thread per step cost more than the step's own SQL. The
thread exits when nothing has been held for a while, and the next holder starts it again.

A step is interrupted (docs/security.md, "Time limits") when it runs past its time limit
(TimeLimitReached) or when its lease is gone, taken over by a recovery or dropped by a cancellation
(LeaseGone). Both are BaseExceptions, so a node's `except Exception` cannot swallow them. In a
thread that is the process's main thread (a prefork pool child, where Celery runs each task) the
time limit is a SIGALRM timer, which also breaks a blocking sleep or socket wait; in another
thread the keeper raises the exception in it asynchronously at its next check, which takes effect
at the thread's next Python bytecode. Neither stops C code that holds the interpreter lock.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pal.errors import PalError

log = logging.getLogger(__name__)

Renew = Callable[[str, int], bool]
"""renew(run_id, generation): extend the lease; False when that generation no longer holds it."""


class TimeLimitReached(BaseException):
    """Control flow: the step ran past its time limit; raised inside the step's own thread."""


class LeaseGone(BaseException):
    """Control flow: the step's lease was taken over or dropped (a cancellation); raised inside the
    step's own thread so that it stops writing nothing more."""


STOP_GRACE_SECONDS = 1.0  # past a step's limit before it is stopped: its own transport timeouts go first


@dataclass
class _Held:
    run_id: str
    generation: int
    renewed: float  # time.monotonic() of the claim or the last renewal
    thread: int  # threading.get_ident() of the step's thread
    deadline: float | None  # time.monotonic() at which the step is stopped
    interrupted: bool = False  # an asynchronous exception was sent to the thread
    on_gone: Callable[[], None] | None = None  # a step on the event loop: how to stop it (watch)


class LeaseKeeper:
    def __init__(self, renew: Renew, lease_ttl: float) -> None:
        self._renew, self._every = renew, lease_ttl / 3
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._thread: threading.Thread | None = None
        self._next = 0

    @contextmanager
    def holding(self, run_id: str, generation: int, limit_s: float | None = None) -> Iterator[None]:
        """Keep the lease renewed while the block runs (the claim has just renewed it); stop the
        block with TimeLimitReached once it has run `limit_s` seconds (plus STOP_GRACE_SECONDS),
        or with LeaseGone once the lease is lost."""
        if self._pid != os.getpid():  # a forked pool process: nothing of the parent's applies
            self._reset()
        now, ident = time.monotonic(), threading.get_ident()
        on_main = threading.current_thread() is threading.main_thread()
        deadline = None if limit_s is None else now + limit_s + STOP_GRACE_SECONDS
        with self._lock:
            token = self._next = self._next + 1
            held = self._held[token] = _Held(run_id, generation, now, ident,
                                             None if on_main else deadline)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="pal-lease-keeper", daemon=True)
                self._thread.start()
        alarm = _Alarm(deadline - now) if on_main and deadline is not None else None
        try:
            if alarm is not None:
                alarm.arm()
            yield
        finally:
            with self._lock:  # the keeper interrupts under this lock: never after the alarm is gone
                if alarm is not None:
                    alarm.disarm()
                self._held.pop(token, None)
                if held.interrupted:  # sent but perhaps not raised yet: it must not outlive the block
                    _raise_in(ident, None)

    def watch(self, run_id: str, generation: int, on_gone: Callable[[], None]) -> int:
        """Keep a lease renewed for a step that runs on no thread of its own (an awaited effect,
        pal.engine.async_steps), until `unwatch`; `on_gone` is called once if the lease is lost.
        Its time limit is the event loop's to keep."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            token = self._next = self._next + 1
            self._held[token] = _Held(run_id, generation, time.monotonic(), 0, None, on_gone=on_gone)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="pal-lease-keeper", daemon=True)
                self._thread.start()
        return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._held.pop(token, None)

    def _beat(self) -> None:
        idle_since: float | None = None
        while True:
            time.sleep(self._every / 2)
            now = time.monotonic()
            with self._lock:
                if not self._held:
                    if idle_since is not None and now - idle_since >= self._every:
                        self._thread = None  # under the lock: the next holder starts a new one
                        return
                    idle_since = idle_since or now
                    continue
                idle_since = None
                due = [(t, held) for t, held in self._held.items() if now - held.renewed >= self._every]
                for held in self._held.values():
                    if held.deadline is not None and now >= held.deadline and not held.interrupted:
                        held.interrupted = True
                        _raise_in(held.thread, TimeLimitReached)
            for token, held in due:
                self._renew_one(token, held)

    def _renew_one(self, token: int, held: _Held) -> None:
        try:
            kept = self._renew(held.run_id, held.generation)
        except PalError:
            log.warning("lease renewal of run %s failed; will retry", held.run_id, exc_info=True)
            return
        if kept:
            held.renewed = time.monotonic()
            return
        log.warning("run %s: lease generation %d is gone (taken over or cancelled); stopping its step",
                    held.run_id, held.generation)
        with self._lock:
            if self._held.pop(token, None) is None or held.interrupted:
                return
            held.interrupted = True
            if held.on_gone is None:
                _interrupt(held.thread, LeaseGone)
        if held.on_gone is not None:
            held.on_gone()


class _Alarm:
    """A SIGALRM timer in the main thread that raises TimeLimitReached, or LeaseGone when the keeper
    has asked for that (a signal handler is the only way to break a blocking wait there)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = max(seconds, 0.001)
        self._previous: Any = None

    def arm(self) -> None:
        self._previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)
        _main_reason[0] = TimeLimitReached


_main_reason: list[type[BaseException]] = [TimeLimitReached]  # what the main thread's alarm raises


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _main_reason[0]()


def _interrupt(thread: int, exc: type[BaseException]) -> None:
    """Stop the step running in `thread` with `exc`: by a signal in the main thread (its handler
    is installed while a step with a time limit runs there), else asynchronously."""
    if thread == threading.main_thread().ident and signal.getsignal(signal.SIGALRM) is _on_alarm:
        _main_reason[0] = exc
        signal.pthread_kill(thread, signal.SIGALRM)
    else:
        _raise_in(thread, exc)


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in `thread` at its next bytecode (None: withdraw one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(exc) if exc is not None else None)
