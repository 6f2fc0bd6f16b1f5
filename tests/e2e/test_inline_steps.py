"""A solo `pal worker` runs `pal.execute_node` inline (pal.workers.inline): Flower still sees every
step as a task, the doorbell is taken at most once (no copy in kombu's `unacked` hash, which a
prefork worker still writes), the successor whose message the worker takes back is claimed by the
completion before it, a worker killed mid-step or right after such a completion is recovered by
the sweep, and hostile messages are refused without stopping the worker. docs/architecture.md,
"Delivery"."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.utils.uuid import uuid

from pal.cli.demo import wait_until
from pal.client import Client
from pal.workers import celery_private
from pal.workers.task_names import EXECUTE_NODE
from tests.conftest import Backend
from tests.support.graphs import failing, linear
from tests.support.journal_reads import started_in_completions
from tests.support.processes import Processes
from tests.support.tools import calls

NAP = {"nodes": [{"id": "start", "type": "trigger"},
                 {"id": "slow", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 4}}},
                 {"id": "out", "type": "output", "data": {"value": "{{ nodes.slow.output }}"}}],
       "edges": [{"source": "start", "target": "slow"}, {"source": "slow", "target": "out"}]}


@contextmanager
def task_events(client: Client) -> Iterator[list[dict[str, Any]]]:
    """Every Celery event on the client's broker while the block runs, as Flower receives them."""
    events: list[dict[str, Any]] = []
    ready = threading.Event()
    with client.app.connection_for_read() as connection:
        receiver = client.app.events.Receiver(connection, handlers={"*": events.append})

        def consume() -> None:
            for _ in receiver.itercapture(limit=None, timeout=None, wakeup=False):
                ready.set()  # subscribed: what is sent from now on is received

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        assert ready.wait(10)
        try:
            yield events
        finally:
            receiver.should_stop = True
            thread.join(10)


def tasks_of(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The task events of each `pal.execute_node` task id, in the order received."""
    ids = {e["uuid"] for e in events if e["type"] == "task-received" and e.get("name") == EXECUTE_NODE}
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["type"].startswith("task-") and e["type"] != "task-sent" and e.get("uuid") in ids:
            by_task[e["uuid"]].append(e)
    return by_task


def worker_is_listening(events: list[dict[str, Any]]) -> bool:
    return any(e["type"] in ("worker-online", "worker-heartbeat") for e in events)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a prefork worker's pool), from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def unacked(redis_client: redis.Redis, backend: Backend) -> int:
    return int(redis_client.hlen(f"{backend.settings.broker_key_prefix}unacked"))


def test_a_solo_worker_runs_steps_inline_and_flower_sees_each_one(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    client = Client(postgres_backend.settings)
    counter = tmp_path / "calls.log"
    with task_events(client) as events:
        processes.worker("solo")
        assert wait_until(lambda: worker_is_listening(events), timeout=60)
        run_id = client.start_run(linear(counter, 3), {})
        assert client.wait(run_id, timeout=60).status == "succeeded"
        steps = sum(1 for e in client.events(run_id) if e.kind == "step_completed")
        assert wait_until(lambda: sum(1 for kinds in tasks_of(events).values()
                                      if kinds[-1]["type"] == "task-succeeded") == steps, timeout=10)
    assert "runs pal.execute_node inline" in (tmp_path / "solo.log").read_text()
    tasks = tasks_of(events)
    assert len(tasks) == steps == 5  # start, s0, s1, s2, out: one message and one task per node
    for kinds in tasks.values():
        assert [e["type"] for e in kinds] == ["task-received", "task-started", "task-succeeded"]
        assert kinds[-1]["result"] == "'completed'"
    received = {task_id: kinds[0] for task_id, kinds in tasks.items()}
    roots = [task_id for task_id, e in received.items() if e["parent_id"] is None]
    assert len(roots) == 1  # the trigger's message, sent by start_run
    for task_id, e in received.items():  # each successor's message names the task that sent it
        assert e["root_id"] == roots[0]
        assert task_id == roots[0] or e["parent_id"] in received
    # Each message's task-sent event reaches Flower once, with the fields of its task-received:
    # start_run's from the client, each successor's (a message this worker ran itself, never
    # queued) from the worker, batched with its other task events.
    sent = [e for e in events if e["type"] == "task-sent" and e.get("uuid") in received]
    assert sorted(e["uuid"] for e in sent) == sorted(received)
    for e in sent:
        fields = ("name", "args", "kwargs", "retries", "root_id", "parent_id")
        assert {k: e[k] for k in fields} == {k: received[e["uuid"]][k] for k in fields}
        assert e["queue"] == e["routing_key"] == postgres_backend.settings.queue
        if celery_private.fast_paths().on("publisher"):  # send_task sends its event after the message
            assert e["timestamp"] <= received[e["uuid"]]["timestamp"]
    assert calls(counter) == ["s0", "s1", "s2"]
    # Migration 0020: a successor's step_started is written by its predecessor's completion (at
    # least once; every time, unless the chain broke), and the message taken back runs it. Only the
    # fast publisher takes a message back (pal.workers.celery_private).
    assert bool(started_in_completions(client, run_id)) == celery_private.fast_paths().on("publisher")
    assert [e.step_id for e in client.events(run_id) if e.kind == "step_started"] == [
        "start", "s0", "s1", "s2", "out"]
    client.close()


def test_a_failed_step_is_a_failed_task(processes: Processes, postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings)
    with task_events(client) as events:
        processes.worker("solo")
        assert wait_until(lambda: worker_is_listening(events), timeout=60)
        run_id = client.start_run(failing(), {})
        assert client.wait(run_id, timeout=60).status == "failed"
        assert wait_until(lambda: any(k[-1]["type"] == "task-failed" for k in tasks_of(events).values()),
                          timeout=10)
    ends = sorted(kinds[-1]["type"] for kinds in tasks_of(events).values())
    assert ends == ["task-failed", "task-succeeded"]  # start succeeded; bad failed; out never ran
    failed = next(k[-1] for k in tasks_of(events).values() if k[-1]["type"] == "task-failed")
    assert "StepFailed" in failed["exception"] and "kaput" in failed["exception"]
    client.close()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_the_doorbell_of_a_running_step_is_kept_only_by_a_prefork_worker(
        processes: Processes, postgres_backend: Backend, redis_client: redis.Redis, pool: str) -> None:
    """kombu keeps a copy of each message it delivered in `unacked` until the ack; a solo worker
    running the step inline keeps none. Killed mid-step, neither worker's message comes back
    (the visibility timeout is an hour): the lease and the sweep recover the run."""
    client = Client(postgres_backend.settings)
    worker = processes.worker("doomed", concurrency=1 if pool == "prefork" else 0)
    run_id = client.start_run(NAP, {})
    assert wait_until(lambda: any(e.kind == "step_started" and e.step_id == "slow"
                                  for e in client.events(run_id)), timeout=60)
    time.sleep(0.5)  # the step is napping
    assert unacked(redis_client, postgres_backend) == (1 if pool == "prefork" else 0)
    for pid in (*children_of(worker.pid), worker.pid):  # the machine is gone: pool children too
        os.kill(pid, signal.SIGKILL)
    worker.wait(10)
    queue = f"{postgres_backend.settings.broker_key_prefix}{postgres_backend.settings.queue}"
    assert redis_client.llen(queue) == 0  # nothing was given back to the queue
    processes.worker("fresh")
    processes.beat()
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded"
    kinds = [e.kind for e in client.events(run_id)]
    assert "run_recovered" in kinds and kinds.count("step_completed") == 3
    client.close()


def test_hostile_messages_are_refused_and_the_worker_runs_on(
        processes: Processes, postgres_backend: Backend, redis_client: redis.Redis, tmp_path: Path) -> None:
    client = Client(postgres_backend.settings)
    settings = postgres_backend.settings
    worker = processes.worker("solo")
    bodies: list[tuple[Any, str]] = [
        ("not a list", "json"), ([["r", "s"]], "json"), ([["r", "s", 1], "kwargs", {}], "json"),
        ([[1, 2, 3, 4, 5, 6], {}, {}], "json"), ([["r", "s", 1, "x"], {"bogus": 1}, {}], "json"),
        ([["r", "s", 1, "x"], {}, {}], "pickle"),  # a content type the app does not accept
    ]
    with client.app.producer_or_acquire() as producer:
        for body, serializer in bodies:
            producer.publish(body, routing_key=settings.queue, serializer=serializer,
                             headers={"task": EXECUTE_NODE, "id": uuid(), "argsrepr": "()"})
    # A doorbell that must wait (a countdown) takes Celery's own path, and kombu keeps its copy.
    client.app.send_task(EXECUTE_NODE, args=["run_forged", "s", 1, None], countdown=3, queue=settings.queue)
    queue = f"{settings.broker_key_prefix}{settings.queue}"
    assert wait_until(lambda: redis_client.llen(queue) == 0 and unacked(redis_client, postgres_backend) == 1,
                      timeout=30)
    log = tmp_path / "solo.log"
    assert wait_until(lambda: "pal.execute_node refused: not a message PAL sent" in log.read_text()
                      and unacked(redis_client, postgres_backend) == 0, timeout=30)
    text = log.read_text()
    assert "pal.execute_node refused: body is not [args, kwargs, embed]" in text
    assert worker.poll() is None  # still running
    assert client.list_runs() == []  # nothing was written
    counter = tmp_path / "calls.log"
    run_id = client.start_run(linear(counter, 2), {})
    assert client.wait(run_id, timeout=60).status == "succeeded"
    assert calls(counter) == ["s0", "s1"]
    client.close()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_garbage_on_the_queue_is_dropped_and_the_worker_runs_on(
        processes: Processes, postgres_backend: Backend, redis_client: redis.Redis, tmp_path: Path,
        pool: str) -> None:
    """Bytes that are no kombu message at all, pushed onto the queue while steps hand off (a solo
    worker's step may take them from the queue, or any worker's BRPOP). Stock kombu stopped the
    worker with "Unrecoverable error" (pal.workers.redis_transport)."""
    client = Client(postgres_backend.settings)
    settings = postgres_backend.settings
    queue = f"{settings.broker_key_prefix}{settings.queue}"
    worker = processes.worker("w", concurrency=2 if pool == "prefork" else 0)
    counter = tmp_path / "calls.log"
    run_id = client.start_run(linear(counter, 30), {})
    for junk in (b"\xff\xfe not json", b"[1, 2", b"{}", b'{"body": 7}'):
        redis_client.lpush(queue, junk)
    assert client.wait(run_id, timeout=60).status == "succeeded"
    assert calls(counter) == [f"s{i}" for i in range(30)]
    assert wait_until(lambda: redis_client.llen(queue) == 0, timeout=10)
    second = client.start_run(linear(counter, 2), {})
    assert client.wait(second, timeout=60).status == "succeeded"
    assert worker.poll() is None
    assert (tmp_path / "w.log").read_text().count("was not a kombu message, dropped") + \
        (tmp_path / "w.log").read_text().count("a message taken from queue") == 4
    client.close()


@pytest.mark.fast_publisher  # only the fast publisher claims a successor in its predecessor's completion
def test_a_solo_worker_killed_after_claiming_its_successor_is_recovered(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    """SIGKILL right after the completion that started s1 committed, before s1's message was
    published: the lease lapses, the sweep re-drives s1 with the same attempt, it runs once."""
    client = Client(postgres_backend.settings)
    counter = tmp_path / "calls.log"
    run_id = "claimed-then-killed"
    doomed = processes.worker("doomed", PAL_FAULT_POINT=f"after_complete_commit:s0@{run_id}",
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    # A warm worker: a cold one's first steps can outlast a chain's 0.5 s, and then claim nothing ahead.
    warm = client.start_run(linear(tmp_path / "warm.log", 1), {})
    assert client.wait(warm, timeout=60).status == "succeeded"
    client.start_run(linear(counter, 2), {}, run_id=run_id)
    assert doomed.wait(60) == -signal.SIGKILL
    assert "s1" in started_in_completions(client, run_id)  # s1 was claimed by s0's completion
    processes.worker("fresh")
    processes.beat()
    assert client.wait(run_id, timeout=120).status == "succeeded"
    events = client.events(run_id)
    assert [(e.attempt, e.generation) for e in events if e.kind == "step_started" and e.step_id == "s1"] \
        == [(1, 1), (1, 2)]
    assert "run_recovered" in [e.kind for e in events]
    assert calls(counter) == ["s0", "s1"]
    client.close()
