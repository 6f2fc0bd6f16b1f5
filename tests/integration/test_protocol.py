"""The step protocol called directly, message by message: duplicates, stale generations, replays.

Publishing goes to a list instead of the broker so the test decides exactly which message is
delivered when; the worker tests in test_engine.py cover the same code through Celery.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import Fence
from pal.engine.recovery import redrive
from pal.engine.steps import execute_step
from tests.conftest import Backend
from tests.support.graphs import fan_out_in, linear
from tests.support.tools import calls

Message = tuple[str, str, int]


@pytest.fixture
def outbox(client: Client) -> list[Message]:
    """Every message the runtime publishes, in order, instead of sending it to the broker."""
    sent: list[Message] = []
    client.runtime.publish = lambda run_id, step_id, generation, countdown=0.0: sent.append(
        (run_id, step_id, generation))
    return sent


def deliver(client: Client, message: Message) -> str:
    return execute_step(client.runtime, *message).outcome


def drain(client: Client, outbox: list[Message]) -> None:
    while outbox:
        deliver(client, outbox.pop(0))


def test_same_message_twice_runs_the_step_once(client: Client, outbox: list[Message],
                                               counter: Path) -> None:
    run_id = client.start_run(linear(counter, 2), {})
    deliver(client, outbox.pop(0))  # the trigger
    message = outbox.pop(0)
    assert deliver(client, message) == "completed"
    assert deliver(client, message) == "completed"  # already has step_completed: no-op
    drain(client, outbox)
    events = client.events(run_id)
    assert calls(counter) == ["s0", "s1"]
    assert [e.step_id for e in events if e.kind == "step_started"] == ["start", "s0", "s1", "out"]
    assert client.get_run(run_id).status == "succeeded"


def test_stale_generation_message_is_dropped(client: Client, outbox: list[Message],
                                             counter: Path) -> None:
    run_id = client.start_run(linear(counter, 1), {})
    trigger = outbox.pop(0)
    # Another process takes the lease over (as the sweep does): generation 2 supersedes 1.
    recovery = redrive(client.runtime, run_id, require_expired=False)
    assert recovery is not None and recovery.generation == 2
    before = client.events(run_id)
    assert deliver(client, trigger) == "stale"
    assert client.events(run_id) == before
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    assert {e.generation for e in client.events(run_id) if e.kind == "step_started"} == {2}


def test_duplicate_claim_of_an_attempt_in_flight_is_refused(
    client: Client, outbox: list[Message], counter: Path
) -> None:
    run_id = client.start_run(linear(counter, 1), {})
    journal = client.runtime.journal
    _, step_id, generation = outbox.pop(0)
    first = journal.steps.claim_step(Fence(run_id, generation, "w1", utcnow(), 30), step_id)
    second = journal.steps.claim_step(Fence(run_id, generation, "w2", utcnow(), 30), step_id)
    assert first.outcome.value == "run"
    assert second.outcome.value == "duplicate"
    started = [e for e in client.events(run_id) if e.kind == "step_started"]
    assert len(started) == 1


def test_redrive_of_a_finished_run_is_a_noop(client: Client, outbox: list[Message],
                                             counter: Path) -> None:
    run_id = client.start_run(linear(counter, 3), {})
    drain(client, outbox)
    before = client.events(run_id)
    assert redrive(client.runtime, run_id, require_expired=False) is None
    assert outbox == []
    assert client.events(run_id) == before
    assert calls(counter) == ["s0", "s1", "s2"]


def test_redrive_of_a_half_finished_run_runs_only_the_rest(
    client: Client, outbox: list[Message], counter: Path
) -> None:
    run_id = client.start_run(linear(counter, 4), {})
    deliver(client, outbox.pop(0))  # start
    deliver(client, outbox.pop(0))  # s0
    deliver(client, outbox.pop(0))  # s1
    outbox.clear()  # the message for s2 is lost (a crash before publish, a flushed Redis)
    assert redrive(client.runtime, run_id) is None  # lease still live: nothing to steal
    # An operator's explicit re-drive: the interpreter resumes at the first incomplete step.
    recovery = redrive(client.runtime, run_id, require_expired=False)
    assert recovery is not None and recovery.resumed_steps == ("s2",)
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2", "s3"]
    recovered = [e for e in client.events(run_id) if e.kind == "run_recovered"]
    assert [e.payload for e in recovered] == [{"generation": 2, "resumed_steps": ["s2"]}]


def test_join_is_dispatched_once_whatever_the_completion_order(
    client: Client, outbox: list[Message], counter: Path
) -> None:
    run_id = client.start_run(fan_out_in(counter, 3), {})
    deliver(client, outbox.pop(0))
    branches = [outbox.pop(0) for _ in range(3)]
    for message in reversed(branches):
        deliver(client, message)
    assert [step for _, step, _ in outbox] == ["join"]
    drain(client, outbox)
    assert client.get_run(run_id).output == 3


def test_redrive_with_a_real_worker_finishes_the_run(backend: Backend, counter: Path) -> None:
    from celery.contrib.testing.worker import start_worker

    client = Client(backend.settings)
    sent: list[Message] = []
    real_publish = client.runtime.publish
    client.runtime.publish = lambda *m, countdown=0.0: sent.append(m)
    run_id = client.start_run(linear(counter, 3), {})
    for _ in range(2):  # start and s0 run here; their successor messages are never sent
        execute_step(client.runtime, *sent.pop(0))
    client.runtime.publish = real_publish
    with start_worker(client.app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING"):
        recovery = redrive(client.runtime, run_id, require_expired=False)
        assert recovery is not None and recovery.resumed_steps == ("s1",)
        assert client.wait(run_id, timeout=60).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]
    client.close()


def test_resume_takes_an_idle_live_lease_but_never_a_busy_one(client: Client, outbox: list[Message],
                                                              counter: Path) -> None:
    from pal.engine.recovery import ResumeRefused, resume

    run_id = client.start_run(linear(counter, 1), {})
    deliver(client, outbox.pop(0))  # the trigger; s0's message is now in the outbox, lease live
    s0 = outbox.pop(0)
    claim = client.runtime.journal.steps.claim_step(Fence(run_id, s0[2], "busy-worker", utcnow(), 30), "s0")
    assert claim.outcome.value == "run"  # s0 is now running under the live lease
    with pytest.raises(ResumeRefused, match="s0 running under busy-worker"):
        resume(client.runtime, run_id)
    assert not [e for e in client.events(run_id) if e.kind == "run_recovered"]
    # The busy worker dies without a trace; once its lease lapses, resume takes over.
    later = utcnow() + timedelta(seconds=31)
    recovery = resume(client.runtime, run_id, now=later)
    assert recovery.generation == 2 and recovery.resumed_steps == ("s0",)
    assert deliver(client, s0) == "stale"
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"


def test_resume_of_an_idle_run_fences_out_its_old_messages(client: Client, outbox: list[Message],
                                                           counter: Path) -> None:
    from pal.engine.recovery import resume

    run_id = client.start_run(linear(counter, 2), {})
    old = outbox.pop(0)  # as if the broker lost it... or still holds it
    recovery = resume(client.runtime, run_id)
    assert recovery.generation == 2 and recovery.resumed_steps == ("start",)
    assert deliver(client, old) == "stale"
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1"]
