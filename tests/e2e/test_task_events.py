"""A real `pal worker` sends every task event Flower needs, batched (pal.workers.consumer): each
publish of the main process holds the events of `EVENT_FLUSH_DELAY` seconds (or
`EVENT_BUFFER_LIMIT` events), not one event per turn of the event loop, nor one per 24 events as
Celery's dispatcher would."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from pal.client import Client
from pal.workers.consumer import EVENT_BUFFER_LIMIT, EVENT_FLUSH_DELAY
from tests.conftest import Backend
from tests.support.graphs import linear
from tests.support.processes import Processes

NODES = 30


def _published(pubsub: redis.client.PubSub) -> list[Any]:
    """Each event message published so far: an event (dict) or a batch of them (list)."""
    found = []
    while (item := pubsub.get_message(timeout=0.5)) is not None:
        if item["type"] == "pmessage":
            found.append(json.loads(base64.b64decode(json.loads(item["data"])["body"])))
    return found


def test_worker_sends_every_task_event_in_batches(processes: Processes, postgres_backend: Backend,
                                                  redis_client: redis.Redis, tmp_path: Path) -> None:
    pubsub = redis_client.pubsub()
    pubsub.psubscribe(postgres_backend.settings.broker_key_prefix + "/*celeryev*")
    client = Client(postgres_backend.settings)
    try:
        assert pubsub.get_message(timeout=2.0) is not None  # subscribed before the worker starts
        processes.worker("w", concurrency=2)
        run_id = client.start_run(linear(tmp_path / "c.log", NODES), {})
        assert client.wait(run_id, timeout=120).status == "succeeded"
        messages: list[Any] = []
        by_task: dict[str, set[str]] = defaultdict(set)
        deadline = time.monotonic() + 30  # the last batch leaves within EVENT_FLUSH_DELAY
        while time.monotonic() < deadline and (len(by_task) < NODES + 2 or any(
                len(kinds) < 4 for kinds in by_task.values())):
            for message in _published(pubsub):
                messages.append(message)
                for event in message if isinstance(message, list) else [message]:
                    if event["type"].startswith("task-"):
                        by_task[event["uuid"]].add(event["type"])
    finally:
        pubsub.close()
        client.close()
    # Every message of the run (trigger, 30 tools, output) was sent, received, started and succeeded.
    assert len(by_task) == NODES + 2
    assert all(kinds == {"task-sent", "task-received", "task-started", "task-succeeded"}
               for kinds in by_task.values()), by_task
    batches = [m for m in messages if isinstance(m, list) and m and m[0]["type"].startswith("task-")]
    assert sum(len(b) for b in batches) == 3 * (NODES + 2)  # the worker's events: all in batches
    # A batch that is not full was flushed no sooner than EVENT_FLUSH_DELAY after its first event,
    # so the next batch's first event is at least that much later (clock of the one worker).
    assert all(len(batch) <= EVENT_BUFFER_LIMIT for batch in batches)
    for earlier, later in itertools.pairwise(batches):
        if len(earlier) < EVENT_BUFFER_LIMIT:
            assert later[0]["timestamp"] - earlier[0]["timestamp"] >= EVENT_FLUSH_DELAY * 0.9
