"""The worker consumer's event timer: one flush per EVENT_FLUSH_DELAY, never a young batch early.

The consumer runs here without a broker: a recording timer stands in for the event loop and a
buffer stands in for Celery's event dispatcher. tests/e2e/test_task_events.py runs the same
consumer in a real worker."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from pal.workers.consumer import EVENT_BUFFER_LIMIT, EVENT_FLUSH_DELAY, Consumer


class Timer:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.calls.append((delay, callback))


class Buffer:
    def __init__(self) -> None:
        self._group_buffer: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.flushed: list[list[dict[str, Any]]] = []

    def add(self, age: float) -> None:
        self._group_buffer["task"].append({"timestamp": time.time() - age})

    def flush(self) -> None:
        self.flushed.append(self._group_buffer.pop("task", []))


@pytest.fixture
def consumer() -> Consumer:
    made = Consumer.__new__(Consumer)  # the timer logic needs no broker connection
    made.hub = Timer()
    made.event_dispatcher = Buffer()
    return made


def test_many_buffered_events_schedule_one_flush(consumer: Consumer) -> None:
    for _ in range(5):
        consumer.event_dispatcher.add(age=0.0)
        consumer.on_send_event_buffered()
    assert [delay for delay, _ in consumer.hub.calls] == [EVENT_FLUSH_DELAY]


def test_the_timer_flushes_events_that_waited_the_delay(consumer: Consumer) -> None:
    consumer.event_dispatcher.add(age=EVENT_FLUSH_DELAY)
    consumer.on_send_event_buffered()
    consumer.hub.calls[0][1]()
    assert [len(batch) for batch in consumer.event_dispatcher.flushed] == [1]
    consumer.event_dispatcher.add(age=0.0)
    consumer.on_send_event_buffered()  # the next event starts a new timer
    assert len(consumer.hub.calls) == 2


def test_a_stale_timer_waits_out_the_rest_for_younger_events(consumer: Consumer) -> None:
    consumer.event_dispatcher.add(age=0.0)
    consumer.on_send_event_buffered()
    consumer.event_dispatcher.flush()  # the buffer filled up and Celery flushed it
    consumer.event_dispatcher.add(age=EVENT_FLUSH_DELAY / 4)
    consumer.hub.calls[0][1]()  # the first event's timer fires
    assert len(consumer.event_dispatcher.flushed) == 1  # the young event was not sent
    delay, callback = consumer.hub.calls[1]
    assert 0 < delay <= EVENT_FLUSH_DELAY * 3 / 4
    consumer.event_dispatcher._group_buffer["task"][0]["timestamp"] -= delay
    callback()
    assert [len(batch) for batch in consumer.event_dispatcher.flushed] == [1, 1]



def test_celery_s_dispatcher_holds_a_busy_worker_s_events_for_the_timer(consumer: Consumer) -> None:
    """Celery's own dispatcher, as its Events step makes it (a limit of 24): with this consumer it
    holds EVENT_BUFFER_LIMIT events before it flushes on its own, so a busy worker publishes once
    per EVENT_FLUSH_DELAY instead of once per 8 steps."""
    app = Celery(set_as_current=False)
    dispatcher = app.events.Dispatcher(None, hostname="w@h", enabled=True, buffer_group=["task"],
                                       on_send_buffered=consumer.on_send_event_buffered)
    flushed: list[int] = []
    dispatcher.flush = lambda *args, **kwargs: flushed.append(len(dispatcher._group_buffer["task"]))
    consumer.event_dispatcher = dispatcher
    for _ in range(EVENT_BUFFER_LIMIT - 1):
        dispatcher.send("task-succeeded", uuid="t")
    assert flushed == [] and [delay for delay, _ in consumer.hub.calls] == [EVENT_FLUSH_DELAY]
    dispatcher.send("task-succeeded", uuid="t")
    assert flushed == [EVENT_BUFFER_LIMIT]  # a burst still cannot hold more
