"""Celery's worker consumer, sending the task events of many messages in one publish.

A worker's main process sends three task events per message it runs (received, started,
succeeded) for Flower. Celery buffers them and flushes the buffer on the event loop's next turn,
so under PAL's one-message-per-node load nearly every event leaves alone: a publish's CPU and a
Redis round trip during which the loop receives and dispatches nothing.
This consumer flushes at most every `EVENT_FLUSH_DELAY` seconds instead (and at once whenever 24
events are waiting, Celery's buffer limit): Flower sees each event up to that much later, and the
main process's work per message drops (docs/benchmarks.md has the figures). It flushes what is left before the
consumer stops, so a worker's last events are not lost on a warm shutdown.

A flush of a full buffer can leave the timer of an earlier event pending; when it fires, the
events now waiting may be younger than the delay, so it waits out the rest for the oldest of them
instead of sending a small batch early.
"""

from __future__ import annotations

import time
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

EVENT_FLUSH_DELAY = 0.1  # seconds; short next to what a person watching Flower can notice


class Consumer(CeleryConsumer):  # type: ignore[misc]
    _event_flush_due: bool = False  # a flush is scheduled on the event loop's timer

    def on_send_event_buffered(self) -> None:
        if not self.hub:
            return
        if not self._event_flush_due:
            self._event_flush_due = True
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
        buffers = self.event_dispatcher._group_buffer.values() if self.event_dispatcher else ()
        oldest = min((events[0]["timestamp"] for events in buffers if events), default=None)
        return float("inf") if oldest is None else time.time() - oldest

    def stop(self) -> Any:
        self._flush_events()
        return super().stop()

    def shutdown(self) -> Any:
        self._flush_events()
        return super().shutdown()
