"""A completion's successors' messages are built while the completion is on its way to Postgres,
and sent only once it has committed (docs/architecture.md, "The life of one step"): the overlap, the
order, and what a call interrupted, a build that fails or a fenced-out completion leave behind.
Real Postgres, real Redis."""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pal.client import Client
from pal.engine.steps import execute_step
from pal.storage.one_call import AutocommitCalls
from pal.storage.sql.queries import Query
from pal.workers.node_messages import Built, NodePublisher, OwnMessage
from tests.conftest import Backend
from tests.support.graphs import linear
from tests.support.tools import calls

# What these test is the fast publisher itself (pal.workers.celery_private): on a kombu that turns it
# off (5.5) PAL publishes through send_task, which other tests cover; `make test-lowest` deselects these.
pytestmark = pytest.mark.fast_publisher

# Calls of the tests' own, not PAL's: built from literal text, never put in queries.sql.
SLEEP = Query("test_sleep", "SELECT * FROM pg_sleep($1::double precision)")
LOCK = Query("test_lock", "SELECT * FROM pg_advisory_xact_lock($1::bigint)")
SET_CONFIG = Query("test_set_config", "SELECT * FROM set_config($1::text, $2::text, $3::boolean)")


@pytest.fixture
def client(postgres_backend: Backend) -> Iterator[Client]:
    c = Client(postgres_backend.settings)
    yield c
    c.close()


def _autocommit(client: Client) -> AutocommitCalls:
    calls_ = client.runtime.journal.calls
    assert calls_ is not None
    return calls_


def _queued_steps(redis_client: redis.Redis, backend: Backend) -> list[tuple[str, str, str]]:
    """(run, step, task id) of each message waiting on the backend's queue, oldest first."""
    raw = redis_client.lrange(backend.settings.broker_key_prefix + backend.settings.queue, 0, -1)
    found = []
    for item in reversed(raw):
        message = json.loads(item)
        args = json.loads(base64.b64decode(message["body"]))[0]
        found.append((args[0], args[1], message["headers"]["id"]))
    return found


def test_meanwhile_runs_while_the_statement_is_running_in_postgres(client: Client, pg_admin: sa.Engine) -> None:
    """The call waits on an advisory lock the test holds, and only `meanwhile` releases it: the
    call returns only because `meanwhile` ran while its statement was in Postgres."""
    autocommit = _autocommit(client)
    pid = autocommit._connection().get_backend_pid()
    # A call that waited for its reply before running meanwhile would wait on the lock: it fails
    # after this, instead of hanging.
    autocommit.rows(SET_CONFIG, ("lock_timeout", "10s", False))
    seen: list[str] = []
    with pg_admin.connect() as holder:
        holder.execute(sa.text("SELECT pg_advisory_lock(4242)"))

        def meanwhile() -> None:
            for _ in range(500):  # bounded: about 5 s
                with pg_admin.connect() as conn:
                    waiting = conn.execute(sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                                           {"p": pid}).scalar()
                if waiting == "Lock":
                    seen.append("waiting on the lock")
                    break
                time.sleep(0.01)
            holder.execute(sa.text("SELECT pg_advisory_unlock(4242)"))

        rows = autocommit.rows(LOCK, (4242,), meanwhile=meanwhile)
    assert seen == ["waiting on the lock"]  # the statement was in Postgres while meanwhile ran
    assert len(rows) == 1


def test_a_meanwhile_that_raises_still_waits_for_the_reply_and_keeps_the_connection(client: Client) -> None:
    autocommit = _autocommit(client)
    connection = autocommit._connection()

    def fails() -> None:
        raise RuntimeError("meanwhile failed")

    with pytest.raises(RuntimeError, match="meanwhile failed"):
        autocommit.rows(SLEEP, (0.05,), meanwhile=fails)
    assert autocommit._connection() is connection  # its state is known: the reply was read
    assert autocommit.rows(SLEEP, (0.0,)) in ([("",)], [(None,)])


def test_a_reply_interrupted_in_its_thread_drops_the_connection_and_the_next_call_opens_one(
        client: Client, pg_admin: sa.Engine) -> None:
    """An exception raised in the thread while it waits for a reply (a signal's handler here)
    leaves the connection mid-statement: it is closed, never reused, and the next call opens a
    new one."""
    autocommit = _autocommit(client)
    connection = autocommit._connection()
    pid = connection.get_backend_pid()

    class Interrupted(Exception):
        pass

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            autocommit.rows(SLEEP, (5.0,))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert connection.closed
    assert autocommit.rows(SLEEP, (0.0,)) in ([("",)], [(None,)])
    assert autocommit._connection().get_backend_pid() != pid


def _drive(client: Client, redis_client: redis.Redis, backend: Backend, run_id: str) -> None:
    """Run the run's queued messages in this process, one at a time, until none is left."""
    key = backend.settings.broker_key_prefix + backend.settings.queue
    for _ in range(50):
        item = redis_client.rpop(key)
        if item is None:
            return
        args = json.loads(base64.b64decode(json.loads(item)["body"]))[0]
        assert args[0] == run_id
        execute_step(client.runtime, args[0], args[1], args[2])
    raise AssertionError("the run did not stop publishing")


def test_a_successors_message_is_built_during_its_completion_and_sent_after_the_commit(
        client: Client, postgres_backend: Backend, redis_client: redis.Redis, pg_admin: sa.Engine,
        counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publisher = client.app.node_publisher
    assert isinstance(publisher, NodePublisher)
    autocommit = _autocommit(client)
    run_id = client.start_run(linear(counter, 3), {})
    calling = {"now": ""}
    in_completion: list[bool] = []  # per message built: inside a completion's call
    built_ids: list[str] = []
    completed_at_send: list[int] = []  # per built message sent: the run's completions committed by then
    rows, build, send = autocommit.rows, publisher.build, publisher._send

    def traced_rows(call: Query, params: Any, meanwhile: Any = None) -> Any:
        calling["now"] = call.name
        try:
            return rows(call, params, meanwhile)
        finally:
            calling["now"] = ""

    def traced_build(args: list[Any], own: bool = False) -> Built | OwnMessage | None:
        in_completion.append(calling["now"] == "complete_step")
        made = build(args, own)
        assert isinstance(made, Built)  # no thread of this test runs its own messages
        built_ids.append(json.loads(made.commands[0][2])["headers"]["id"])
        return made

    def traced_send(messages: list[Any], take: Any = None, own: bool = False, ahead: Any = None) -> None:
        if any(isinstance(message, Built) for message in messages):
            with client.runtime.journal.engine.connect() as conn:
                completed_at_send.append(conn.execute(sa.text(
                    "SELECT count(*) FROM journal_events WHERE run_id = :r AND kind = 'step_completed'"),
                    {"r": run_id}).scalar_one())
        send(messages, take, own, ahead)

    monkeypatch.setattr(autocommit, "rows", traced_rows)
    monkeypatch.setattr(publisher, "build", traced_build)
    monkeypatch.setattr(publisher, "_send", traced_send)
    key = postgres_backend.settings.broker_key_prefix + postgres_backend.settings.queue
    run_ids: list[str] = []  # the task ids of the messages run, in order
    while (item := redis_client.rpop(key)) is not None and len(run_ids) < 20:
        message = json.loads(item)
        run_ids.append(message["headers"]["id"])
        args = json.loads(base64.b64decode(message["body"]))[0]
        execute_step(client.runtime, args[0], args[1], args[2])
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]
    # Every message after the first (start_run's) was built inside its predecessor's completion
    # call; those built are the ones sent and run; each went out after that completion committed.
    assert len(built_ids) == len(run_ids) - 1 >= 3
    assert all(in_completion)
    assert built_ids == run_ids[1:]
    assert completed_at_send == list(range(1, len(built_ids) + 1))


def test_a_fenced_out_completion_sends_nothing_it_built(
        client: Client, postgres_backend: Backend, redis_client: redis.Redis, pg_admin: sa.Engine,
        counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another generation takes the lease just before the completion reaches Postgres: the
    successor's message is built, the completion is fenced out, and nothing is published."""
    publisher = client.app.node_publisher
    assert isinstance(publisher, NodePublisher)
    autocommit = _autocommit(client)
    run_id = client.start_run(linear(counter, 2), {})
    key = postgres_backend.settings.broker_key_prefix + postgres_backend.settings.queue
    start = json.loads(base64.b64decode(json.loads(redis_client.rpop(key))["body"]))[0]
    assert execute_step(client.runtime, *start[:3]).outcome == "completed"  # the trigger; s0 queued
    [(_, s0, _)] = _queued_steps(redis_client, postgres_backend)
    redis_client.delete(key)
    rows = autocommit.rows
    built: list[Built] = []
    build = publisher.build

    def counted_build(args: list[Any], own: bool = False) -> Built | OwnMessage | None:
        made = build(args, own)
        assert isinstance(made, Built)  # no thread of this test runs its own messages
        built.append(made)
        return made

    def taken_over(call: Query, params: Any, meanwhile: Any = None) -> Any:
        if call.name == "complete_step":
            with client.runtime.journal.engine.begin() as conn:
                conn.execute(sa.text("UPDATE run_locks SET generation = generation + 1 WHERE run_id = :r"),
                             {"r": run_id})
        return rows(call, params, meanwhile)

    monkeypatch.setattr(autocommit, "rows", taken_over)
    monkeypatch.setattr(publisher, "build", counted_build)
    assert execute_step(client.runtime, run_id, s0, 1).outcome == "fenced"
    assert [b.args[1] for b in built] == ["s1"]  # built while the completion was on its way
    assert _queued_steps(redis_client, postgres_backend) == []  # and never sent
    with client.runtime.journal.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM journal_events WHERE run_id = :r AND kind = "
                                    "'step_completed' AND step_id = :s"), {"r": run_id, "s": s0}).scalar() == 0


def test_a_message_that_cannot_be_built_ahead_is_built_at_its_publish(
        client: Client, postgres_backend: Backend, redis_client: redis.Redis, counter: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that cannot be reached while the completion is on its way: nothing is built
    ahead, and the publish after the commit builds and sends the message itself."""
    publisher = client.app.node_publisher
    assert isinstance(publisher, NodePublisher)
    run_id = client.start_run(linear(counter, 2), {})

    def unreachable() -> Any:
        raise redis.ConnectionError("the broker is not reachable now")

    wire_of_process = publisher._wire_of_process
    building = {"now": False}
    build = publisher.build

    def build_unreachable(args: list[Any], own: bool = False) -> Built | OwnMessage | None:
        building["now"] = True
        try:
            return build(args, own)
        finally:
            building["now"] = False

    monkeypatch.setattr(publisher, "build", build_unreachable)
    monkeypatch.setattr(publisher, "_wire_of_process",
                        lambda: unreachable() if building["now"] else wire_of_process())
    _drive(client, redis_client, postgres_backend, run_id)
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1"]
