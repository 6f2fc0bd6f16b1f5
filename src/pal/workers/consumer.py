"""Celery's worker consumer, sending the task events of many messages in one publish.

A worker's main process sends three task events per message it runs (received, started, succeeded)
for Flower. Celery buffers them and flushes the buffer on the event loop's next turn, so under PAL's
one-message-per-node load nearly every event leaves alone: a publish's CPU and a Redis round trip
during which the loop receives and dispatches nothing. This consumer flushes at most every
`EVENT_FLUSH_DELAY` seconds instead: Flower sees each event up to that much later, and the main
process's work per message drops (figures: docs/decisions/solo-worker-delivery.md). Celery's
dispatcher also flushes at once whenever its buffer holds 24 events, a publish every 8 steps; here
the buffer holds up to `EVENT_BUFFER_LIMIT`, a cap on memory that a worker reaches only in a burst,
so a busy worker publishes its events once per `EVENT_FLUSH_DELAY`. It flushes what is left before
the consumer stops, so a worker's last events are not lost on a warm shutdown.

A flush of a full buffer can leave the timer of an earlier event pending; when it fires, the events
now waiting may be younger than the delay, so it waits out the rest for the oldest of them instead
of sending a small batch early.
"""

from __future__ import annotations

import time
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from pal.workers import celery_private

EVENT_FLUSH_DELAY = 0.1  # seconds; short next to what a person watching Flower can notice
EVENT_BUFFER_LIMIT = 1024  # events held before a flush that cannot wait: about 340 steps' worth


class Consumer(CeleryConsumer):  # type: ignore[misc]
    _event_flush_due: bool = False  # a flush is scheduled on the event loop's timer

    def on_send_event_buffered(self) -> None:
        if not self.hub:
            return
        if not self._event_flush_due:
            self._event_flush_due = True
            # Celery's Events step makes the dispatcher (again after a reconnection) with a limit
            # of 24 and no hook after it; the first event of each flush period sets PAL's.
            self.event_dispatcher.buffer_limit = EVENT_BUFFER_LIMIT
            self.hub.call_later(EVENT_FLUSH_DELAY, self._flush_due_events)

    def _flush_due_events(self) -> None:
        wait = EVENT_FLUSH_DELAY - self._oldest_event_age()
        if wait > 0:
            self.hub.call_later(wait, self._flush_due_events)
            return
        self._event_flush_due = False
        self._flush_events()

    def _oldest_event_age(self) -> float:
        """Seconds since the oldest buffered event was made; infinite when none waits."""
        buffers = celery_private.buffered_events(self.event_dispatcher) if self.event_dispatcher else ()
        oldest = min((events[0]["timestamp"] for events in buffers if events), default=None)
        return float("inf") if oldest is None else time.time() - oldest

    def stop(self) -> Any:
        self._flush_events()
        return super().stop()

    def shutdown(self) -> Any:
        self._flush_events()
        return super().shutdown()
