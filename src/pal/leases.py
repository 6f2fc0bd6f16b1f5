"""The heartbeat: one thread per process renews the lease of every step running in it.

A step holds its run's lease while its node runs (`LeaseKeeper.holding`); every third of the lease's
TTL the keeper renews it, fenced by generation like every journal write. One shared thread instead
of one per step: starting and joining a thread per step cost more than the step's own SQL. The
thread exits when nothing has been held for a while, and the next holder starts it again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pal.errors import PalError

log = logging.getLogger(__name__)

Renew = Callable[[str, int], bool]
"""renew(run_id, generation): extend the lease; False when that generation no longer holds it."""


@dataclass
class _Held:
    run_id: str
    generation: int
    renewed: float  # time.monotonic() of the claim or the last renewal


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
    def holding(self, run_id: str, generation: int) -> Iterator[None]:
        """Keep the lease renewed while the block runs (the claim has just renewed it)."""
        if self._pid != os.getpid():  # a forked pool process: nothing of the parent's applies
            self._reset()
        with self._lock:
            token = self._next = self._next + 1
            self._held[token] = _Held(run_id, generation, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="pal-lease-keeper", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
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
        log.warning("run %s: lease generation %d was taken over", held.run_id, held.generation)
        with self._lock:
            self._held.pop(token, None)
