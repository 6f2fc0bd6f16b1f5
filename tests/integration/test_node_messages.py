"""PAL's publisher of `pal.execute_node` messages (pal.workers.node_messages) against the real Redis:
the message and its task-sent event are what `send_task` would have sent, and a lost connection
does not lose a message."""

from __future__ import annotations

import base64
import json
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from pal.client import Client
from pal.workers.inline import InlineSteps
from pal.workers.node_messages import OWN_TAKES_WHILE_OTHERS_WAIT, Lane, NodePublisher, OwnMessage, Take
from pal.workers.pal_app import create_app
from pal.workers.task_names import EXECUTE_NODE, SENT_AT_HEADER
from tests.conftest import Backend

# What these test is the fast publisher itself (pal.workers.celery_private): on a kombu that turns it
# off (5.5) PAL publishes through send_task, which other tests cover; `make test-lowest` deselects these.
pytestmark = pytest.mark.fast_publisher

# Fields that differ between any two messages: fresh ids, the sender's name, the event's and
# the doorbell's times.
FRESH = {"id", "root_id", "correlation_id", "delivery_tag", "reply_to", "origin", "uuid", "timestamp",
         "clock", "utcoffset", "local_received", SENT_AT_HEADER}


def _queued(client: redis.Redis, backend: Backend) -> list[dict[str, Any]]:
    """The messages waiting in the backend's queue, oldest first, with their bodies decoded."""
    raw = client.lrange(backend.settings.broker_key_prefix + backend.settings.queue, 0, -1)
    messages = [json.loads(item) for item in reversed(raw)]
    for message in messages:
        assert message["properties"]["body_encoding"] == "base64"
        message["body"] = json.loads(base64.b64decode(message["body"]))
    return messages


def _without_fresh(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_fresh(v) for k, v in value.items() if k not in FRESH}
    return value


def _sent_events(pubsub: redis.client.PubSub) -> list[dict[str, Any]]:
    events = []
    while (item := pubsub.get_message(timeout=2.0)) is not None:
        if item["type"] != "pmessage":
            continue
        payload = json.loads(item["data"])
        events.append(json.loads(base64.b64decode(payload["body"])))
    return events


def test_a_node_message_is_the_message_send_task_sends(postgres_backend: Backend,
                                                      redis_client: redis.Redis) -> None:
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)  # a redis:// broker gets the fast path
    events = redis_client.pubsub()
    events.psubscribe(postgres_backend.settings.broker_key_prefix + "/*celeryev*")
    try:
        assert events.get_message(timeout=2.0) is not None  # the subscription is in place
        app.runtime.publish("run-1", "step-a", 3)  # the fast path
        signed = ["run-1", "step-a", 3, app.runtime.doorbell_signature("run-1", "step-a", 3)]
        app.send_task(EXECUTE_NODE, args=signed, queue=postgres_backend.settings.queue,
                      headers={SENT_AT_HEADER: time.time()})  # as PAL's own send_task path does
        fast, stock = _queued(redis_client, postgres_backend)
        sent = _sent_events(events)
    finally:
        events.close()
    assert publisher.sent == 1
    assert fast["body"] == [signed, {}, {"callbacks": None, "errbacks": None,
                                                          "chain": None, "chord": None}]
    assert _without_fresh(fast) == _without_fresh(stock)
    assert isinstance(fast["headers"][SENT_AT_HEADER], float)  # a step span's queue wait starts here
    assert fast["headers"]["id"] == fast["properties"]["correlation_id"] != stock["headers"]["id"]
    # Each message has its task-sent event, and Flower reads the same fields from both.
    assert [e["uuid"] for e in sent] == [fast["headers"]["id"], stock["headers"]["id"]]
    assert [e["type"] for e in sent] == ["task-sent", "task-sent"]
    assert _without_fresh(sent[0]) == _without_fresh(sent[1])
    assert sent[0]["queue"] == postgres_backend.settings.queue
    assert sent[0]["name"] == EXECUTE_NODE


def test_a_node_message_survives_a_dropped_broker_connection(postgres_backend: Backend,
                                                           redis_client: redis.Redis) -> None:
    app = create_app(postgres_backend.settings)
    app.runtime.publish("run-1", "s1", 1)
    assert app.node_publisher is not None
    connection = app.node_publisher._wire_of_process().redis  # the publisher's own connection
    ports = {connection._sock.getsockname()[1]} if connection._sock else set()
    assert ports, "the publish left its connection open"
    killed = 0
    for client in redis_client.client_list():  # as a Redis restart would, behind the pool's back
        if int(client["addr"].rsplit(":", 1)[1]) in ports:
            killed += redis_client.client_kill_filter(_id=int(client["id"]))
    assert killed == len(ports)
    app.runtime.publish("run-1", "s2", 1)
    app.runtime.publish("run-1", "s3", 1)
    steps = [m["body"][0][1] for m in _queued(redis_client, postgres_backend)]
    assert steps[0] == "s1"
    assert set(steps[1:]) == {"s2", "s3"}  # each at least once: a retried publish may repeat one
    assert app.node_publisher is not None and app.node_publisher.sent >= 2  # s1 and s3 at least


def test_a_batch_holds_its_messages_until_it_ends_and_sends_them_with_their_events(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    app = create_app(postgres_backend.settings)
    events = redis_client.pubsub()
    events.psubscribe(postgres_backend.settings.broker_key_prefix + "/*celeryev*")
    try:
        assert events.get_message(timeout=2.0) is not None  # the subscription is in place
        with app.runtime.publish_batch() as publish:
            for step in ("a", "b", "c", "d"):
                publish("run-1", step, 2)
            app.runtime.publish("run-1", "outside", 2)  # the runtime's own publish is not held
            assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["outside"]
            redis_client.delete(postgres_backend.settings.broker_key_prefix + postgres_backend.settings.queue)
        queued = _queued(redis_client, postgres_backend)
        sent = _sent_events(events)
    finally:
        events.close()
    assert [m["body"][0][:3] for m in queued] == [["run-1", step, 2] for step in "abcd"]
    assert [e["uuid"] for e in sent][-4:] == [m["headers"]["id"] for m in queued]
    assert app.node_publisher is not None and app.node_publisher.sent == 5


def test_a_batch_that_raises_sends_nothing(postgres_backend: Backend, redis_client: redis.Redis) -> None:
    app = create_app(postgres_backend.settings)
    with pytest.raises(LookupError), app.runtime.publish_batch() as publish:
        publish("run-1", "a", 2)
        raise LookupError("the pass died before its end")
    assert _queued(redis_client, postgres_backend) == []
    app.runtime.publish("run-1", "b", 2)  # out of the batch: this one goes at once
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["b"]


def test_a_take_pops_the_oldest_message_with_the_publish_and_nothing_past_its_deadline(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    """What a solo worker's step does as it hands off (pal.workers.inline): the pipeline that
    publishes the successor also takes the queue's oldest message, unless the worker has already
    chained steps for long enough."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    publisher.publish(["run_x", "older", 1, "sig"])
    lane = Lane()
    take = Take(lane)
    publisher.publish(["run_x", "newer", 1, "sig"], take=take)
    assert len(take.taken) == 1 and _step_of(take.taken[0]) == "older"
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["newer"]
    take = Take(lane)  # the oldest again: the one the first take left
    publisher.publish(["run_x", "own", 1, "sig"], take=take)
    publisher.publish(["run_x", "second", 1, "sig"], take=take)  # one take per step
    assert [_step_of(raw) for raw in take.taken] == ["newer"]
    take = Take(lane, until=time.monotonic() - 1)
    publisher.publish(["run_x", "late", 1, "sig"], take=take)
    assert take.taken == []
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["own", "second", "late"]
    redis_client.delete(postgres_backend.settings.broker_key_prefix + postgres_backend.settings.queue)
    take = Take(lane)  # an empty queue: the step takes its own successor
    publisher.publish(["run_x", "alone", 1, "sig"], take=take)
    assert [_step_of(raw) for raw in take.taken] == ["alone"]
    assert _queued(redis_client, postgres_backend) == []


def _step_of(taken: str | bytes | OwnMessage) -> str:
    """The step of a message taken: one popped from the queue, or the thread's own (in memory)."""
    if isinstance(taken, OwnMessage):
        return str(taken.args[1])
    step: str = json.loads(base64.b64decode(json.loads(taken)["body"]))[0][1]
    return step


def test_a_step_takes_its_own_message_back_and_only_a_few_in_a_row_while_others_wait(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    """`publish_taken` pushes the message and pops that very one (its step is claimed for this
    thread), never an older one; with other messages waiting, after OWN_TAKES_WHILE_OTHERS_WAIT of
    those in a row the thread may not take its own again, and takes the oldest instead."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    lane = Lane()
    take = Take(lane)
    assert publisher.can_take(take)
    assert publisher.publish_taken(["run_x", "alone", 1, "sig"], take)
    assert not publisher.can_take(take)  # one take per step
    assert [_step_of(raw) for raw in take.taken] == ["alone"] and _queued(redis_client, postgres_backend) == []
    publisher.publish(["run_y", "waiting", 1, "sig"])
    for i in range(OWN_TAKES_WHILE_OTHERS_WAIT):
        take = Take(lane)
        assert publisher.can_take(take)
        assert publisher.publish_taken(["run_x", f"own{i}", 1, "sig"], take)
        assert [_step_of(raw) for raw in take.taken] == [f"own{i}"]
    take = Take(lane)
    assert not publisher.can_take(take)  # run_y has waited long enough
    publisher.publish(["run_x", "next", 1, "sig"], take=take)
    assert [_step_of(raw) for raw in take.taken] == ["waiting"]
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["next"]
    assert publisher.can_take(Take(lane))  # a fresh visit
    assert publisher.can_take(Take(Lane()))  # another lane's streak is its own
    assert not publisher.can_take(Take(lane, until=time.monotonic() - 1))  # the chain has run long enough


def _kill_connection(redis_client: redis.Redis, publisher: NodePublisher) -> None:
    """Close the publisher's own connection from the server's side, as a Redis restart would."""
    connection = publisher._wire_of_process().redis
    port = connection._sock.getsockname()[1] if connection._sock else None
    killed = sum(redis_client.client_kill_filter(_id=int(client["id"]))
                 for client in redis_client.client_list() if int(client["addr"].rsplit(":", 1)[1]) == port)
    assert killed == 1


def test_a_step_s_own_message_is_never_queued_and_carries_the_fields_of_its_task_sent_event(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    """`publish_taken` with a step's Take: the message is its worker's without passing
    through the queue, so no other worker can take it; it is never even serialized (an
    OwnMessage), and nothing of it is published here: it carries the fields of the task-sent event
    send_task's would have, which the worker that runs it sends (pal.workers.inline), or
    `publish_sent_event` when that worker buffers no events. On a dead connection only the count
    of waiting messages is lost: the message is still this thread's (its step was claimed for
    it), and the next publish connects afresh and is queued."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    events = redis_client.pubsub()
    events.psubscribe(postgres_backend.settings.broker_key_prefix + "/*celeryev*")
    signed = ["run_x", "first", 1, app.runtime.doorbell_signature("run_x", "first", 1)]
    try:
        assert events.get_message(timeout=2.0) is not None  # the subscription is in place
        take = Take(Lane())
        assert publisher.publish_taken(signed, take)
        app.send_task(EXECUTE_NODE, args=signed, queue=postgres_backend.settings.queue)
        [stock_sent] = _sent_events(events)  # send_task's only: the own message published no event
        [own] = take.taken
        assert isinstance(own, OwnMessage) and own.args == signed and own.sent_event is not None
        publisher.publish_sent_event(own.sent_event)
        [own_sent] = _sent_events(events)
    finally:
        events.close()
    assert [m["headers"]["id"] for m in _queued(redis_client, postgres_backend)] == [stock_sent["uuid"]]
    assert own.sent_event["uuid"] == own_sent["uuid"] == own.task_id == own.root_id
    assert own_sent["type"] == "task-sent"
    assert _without_fresh(own_sent) == _without_fresh(stock_sent)  # Flower reads the same fields
    redis_client.delete(postgres_backend.settings.broker_key_prefix + postgres_backend.settings.queue)
    _kill_connection(redis_client, publisher)
    take = Take(Lane())
    assert publisher.publish_taken(["run_x", "second", 1, "sig"], take)
    assert [_step_of(raw) for raw in take.taken] == ["second"]
    publisher.publish(["run_x", "third", 1, "sig"])
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["third"]
    assert publisher.sent == 3  # the first, second and third: send_task's message is not this publisher's


def test_an_own_message_s_task_sent_event_goes_with_the_worker_s_events_or_alone_if_it_sends_none(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    """A solo worker that runs its own message sends the message's task-sent event: into its task
    events' buffer when its dispatcher sends task events (pal.workers.consumer publishes them
    together), by itself when it keeps its dispatcher for heartbeats only (a worker without task
    events, or after `disable_events`): task-sent is the sender's setting."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    task = app.tasks[EXECUTE_NODE]
    take = Take(Lane())
    assert publisher.publish_taken(["run_x", "own", 1, "sig"], take)
    [own] = take.taken
    assert isinstance(own, OwnMessage) and own.sent_event is not None
    events = redis_client.pubsub()
    events.psubscribe(postgres_backend.settings.broker_key_prefix + "/*celeryev*")
    try:
        assert events.get_message(timeout=2.0) is not None  # the subscription is in place
        with app.connection_for_write() as connection:
            with_task_events = app.events.Dispatcher(connection, buffer_group=["task"])
            InlineSteps(task, app, SimpleNamespace(event_dispatcher=with_task_events, hostname="w"),
                        lambda *_: None)._sent(own.sent_event)
            [buffered] = with_task_events._group_buffer["task"]
            heartbeats_only = app.events.Dispatcher(connection, groups=["worker"])
            InlineSteps(task, app, SimpleNamespace(event_dispatcher=heartbeats_only, hostname="w"),
                        lambda *_: None)._sent(own.sent_event)
            [published] = _sent_events(events)
    finally:
        events.close()
    for event in (buffered, published):
        assert event["type"] == "task-sent" and event["uuid"] == own.task_id
        assert event["timestamp"] == own.sent_at and event["args"] == own.argsrepr
    assert _without_fresh(buffered) | {"hostname": None, "pid": None} == \
        _without_fresh(published) | {"hostname": None, "pid": None}  # only the sender differs


def test_a_message_built_as_the_thread_s_own_but_not_taken_is_queued_as_a_full_message(
        postgres_backend: Backend, redis_client: redis.Redis) -> None:
    """Built ahead as this thread's own (`build(own=True)`: no Celery message, only its fields) but
    published as any other, because the completion could not claim the step for this thread: it
    goes onto the queue as the whole message send_task would send, for any worker to take."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    signed = ["run_x", "s1", 1, app.runtime.doorbell_signature("run_x", "s1", 1)]
    built = publisher.build(signed, own=True)
    assert isinstance(built, OwnMessage)
    publisher.publish(built)
    app.send_task(EXECUTE_NODE, args=signed, queue=postgres_backend.settings.queue,
                  headers={SENT_AT_HEADER: time.time()})
    fast, stock = _queued(redis_client, postgres_backend)
    assert fast["body"][0] == signed and _without_fresh(fast) == _without_fresh(stock)
    assert publisher.sent == 1


def test_a_message_that_cannot_reach_the_broker_is_not_taken_and_goes_through_send_task(
        postgres_backend: Backend, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """No wire to the broker at all (it cannot be opened): `publish_taken` sends the message
    through `send_task`, which retries until it is queued (any worker may take it), and says it
    was not taken back (the runtime then drops its claim ahead, pal.engine.runtime)."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)

    def unreachable() -> None:
        raise redis.ConnectionError("the broker is down")
    monkeypatch.setattr(publisher, "_wire_of_process", unreachable)
    take = Take(Lane())
    assert not publisher.publish_taken(["run_x", "second", 1, "sig"], take)
    assert take.taken == [] and [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == ["second"]
    assert publisher.sent == 0


def test_a_forked_child_publishes_on_its_own_connection(postgres_backend: Backend,
                                                       redis_client: redis.Redis) -> None:
    """A prefork pool process inherits its parent's publisher: it must open its own wire, never
    write on its parent's socket, and the parent's wire must still work after the child exits."""
    app = create_app(postgres_backend.settings)
    publisher = app.node_publisher
    assert isinstance(publisher, NodePublisher)
    publisher.publish(["run_f", "parent-before", 1, "sig"])
    parent_wire = publisher._wire_of_process()
    parent_port = parent_wire.redis._sock.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 1
        try:
            publisher.publish(["run_f", "child", 1, "sig"])
            child_wire = publisher._wire_of_process()
            ok = child_wire is not parent_wire and child_wire.redis._sock.getsockname()[1] != parent_port
            code = 0 if ok and publisher.sent == 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    publisher.publish(["run_f", "parent-after", 1, "sig"])  # the parent's socket was left alone
    assert publisher._wire_of_process() is parent_wire
    assert [m["body"][0][1] for m in _queued(redis_client, postgres_backend)] == [
        "parent-before", "child", "parent-after"]


def test_closing_the_client_closes_the_publishers_connection(postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings)
    client.runtime.publish("run_c", "s1", 1)
    publisher = client.app.node_publisher
    assert publisher is not None
    wire = publisher._wire_of_process()
    assert wire.redis._sock is not None
    client.close()
    assert wire.closed and wire.redis._sock is None
    assert publisher._wire is None  # a later publish opens a new one
