"""A `pal.execute_node` message is a doorbell from anyone who reaches the broker: a forged one
(unsigned, wrongly signed, re-aimed at another step or generation, or naming a step that is not on
the run's ready frontier) runs nothing, writes nothing and never fails the run. docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery.signals import task_postrun
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pal.client import Client
from pal.core.doorbell import sign
from pal.engine.steps import execute_step
from pal.storage.schema import run_locks
from pal.workers.task_names import CLAIM_AHEAD, EXECUTE_NODE, RUNS_NEXT
from tests.conftest import Backend
from tests.integration.test_doctor import event
from tests.support.graphs import approval, linear
from tests.support.tools import calls
from tests.support.workers import in_process_worker

Message = tuple[str, str, int]


def capture(client: Client) -> list[Message]:
    sent: list[Message] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    return sent


def parked_on_approval(client: Client, counter: Path) -> tuple[str, int]:
    """A run parked on its approval `gate`, whose `pay` step must not run before a decision;
    returns the run and the generation its lock row holds (a guessable integer)."""
    sent = capture(client)
    run_id = client.start_run(approval(counter), {"amount": 5, "customer": "c"})
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "waiting"
    with client.runtime.journal.engine.connect() as conn:
        generation = conn.execute(sa.select(run_locks.c.generation)
                                  .where(run_locks.c.run_id == run_id)).scalar_one()
    return run_id, generation


def journal_of(client: Client, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in client.runtime.journal.runs.events(run_id)]


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def through_a_worker(client: Client, queue: str, messages: list[tuple[list[Any], dict[str, Any]]]) -> list[Any]:
    """Send each message (arguments, headers) through the broker to a real in-process worker; what
    each task returned, in order."""
    outcomes: dict[str, Any] = {}

    def finished(sender: Any = None, task_id: str = "", retval: Any = None, **_: Any) -> None:
        outcomes[task_id] = retval

    task_postrun.connect(finished, weak=False)
    try:
        with in_process_worker(client):
            ids = [client.app.send_task(EXECUTE_NODE, args=args, queue=queue, headers=headers).id
                   for args, headers in messages]
            wait_for(lambda: set(ids) <= outcomes.keys())
    finally:
        task_postrun.disconnect(finished)
    return [outcomes[i] for i in ids]


def test_forged_messages_through_celery_never_pass_an_approval(postgres_backend: Backend, counter: Path) -> None:
    """The review's attack: execute_node(run, "pay", g) for guessable g, sent through the broker to a
    real worker, unsigned or with made-up signatures, ran the connector behind the approval."""
    client = Client(postgres_backend.settings)
    try:
        run_id, generation = parked_on_approval(client, counter)
        before = journal_of(client, run_id)
        forged: list[list[Any]] = []
        for g in range(0, generation + 4):
            forged += [[run_id, "pay", g], [run_id, "pay", g, None], [run_id, "pay", g, "0" * 32],
                       [run_id, "pay", g, sign(b"not the key", run_id, "pay", g)],
                       [run_id, "out", g, "x"], [run_id, "gate", g], [run_id, "no-such-step", g]]
        # A genuine signature, re-aimed: signed for `gate`, sent for `pay`; and a string generation.
        genuine = client.runtime.doorbell_signature(run_id, "gate", generation)
        forged += [[run_id, "pay", generation, genuine], [run_id, "pay", str(generation), genuine]]
        outcomes = through_a_worker(client, postgres_backend.settings.queue, [(args, {}) for args in forged])
        assert set(outcomes) == {"forged"}  # refused before the journal was touched
        assert calls(counter) == []  # the step behind the approval never ran
        assert journal_of(client, run_id) == before  # nothing was written
        assert client.get_run(run_id).status == "waiting"
        assert [a.step_id for a in client.pending_approvals(run_id)] == ["gate"]
        assert client.runtime.journal.doctor.violations() == []
        sent = capture(client)
        client.approve(run_id, "gate")  # the genuine path still works
        while sent:
            execute_step(client.runtime, *sent.pop(0))
        assert calls(counter) == ["pay"]
        assert client.get_run(run_id).status == "succeeded"
    finally:
        client.close()


def test_a_claim_ahead_header_on_a_message_claims_nothing(postgres_backend: Backend, counter: Path) -> None:
    """A completion's claim of the successor its worker runs next travels only in memory (a
    ClaimAhead, pal.workers.inline); a message that names one in a header, even a genuinely
    signed doorbell, is claimed from the journal: off the frontier it is refused, writing nothing."""
    client = Client(postgres_backend.settings)
    try:
        run_id, sent = start_linear(client, counter)
        (_, _, generation), = sent
        before = journal_of(client, run_id)
        signature = client.runtime.doorbell_signature(run_id, "s1", generation)
        fake = {"run_id": run_id, "step_id": "s1", "generation": generation, "until": 1e12,
                "claim": {"outcome": "run", "attempt": 1}}
        message = ([run_id, "s1", generation, signature], {CLAIM_AHEAD: fake})
        assert through_a_worker(client, postgres_backend.settings.queue, [message]) == ["not_ready"]
        assert journal_of(client, run_id) == before and calls(counter) == []
    finally:
        client.close()


def test_a_runs_next_header_on_a_message_takes_nothing(postgres_backend: Backend, counter: Path) -> None:
    """A step's chance to take back the message its worker runs next is an object a solo worker
    hands it (pal.workers.publishing.TakeBack); a header that names one is ignored: the step runs
    and hands off as any other, its successor's message published for any worker."""
    client = Client(postgres_backend.settings)
    try:
        run_id, sent = start_linear(client, counter)
        (_, step_id, generation), = sent
        signature = client.runtime.doorbell_signature(run_id, step_id, generation)
        forged = {"take": {"taken": [], "until": 1e12}, "may_claim": True}
        message = ([run_id, step_id, generation, signature], {RUNS_NEXT: forged})
        assert through_a_worker(client, postgres_backend.settings.queue, [message]) == ["completed"]
        assert calls(counter) == ["s0"]
        assert sent[1:] == [(run_id, "s1", generation)]  # published, not claimed for anyone
        assert ("step_started", "s1") not in journal_of(client, run_id)
    finally:
        client.close()


def start_linear(client: Client, counter: Path) -> tuple[str, list[Message]]:
    """start -> s0 -> s1 -> s2, with only the trigger run: s0's message is the one outstanding."""
    sent = capture(client)
    run_id = client.start_run(linear(counter, 3), {})
    execute_step(client.runtime, *sent.pop(0))
    return run_id, sent


@pytest.fixture
def started_linear(client: Client, counter: Path) -> tuple[str, list[Message]]:
    return start_linear(client, counter)


def test_a_step_off_the_frontier_is_refused_without_failing_the_run(
        client: Client, counter: Path, started_linear: tuple[str, list[Message]]) -> None:
    run_id, sent = started_linear
    assert [s for _, s, _ in sent] == ["s0"]
    generation = sent[0][2]
    before = journal_of(client, run_id)
    for step in ("s1", "s2", "out", "start", "nope", "s0[items]", "each[0].work", "", "s1\x00"):
        assert execute_step(client.runtime, run_id, step, generation).outcome in ("not_ready", "completed")
    assert journal_of(client, run_id) == before
    assert client.get_run(run_id).status == "running"
    while sent:  # the genuine message still runs the run to its end
        execute_step(client.runtime, *sent.pop(0))
    assert client.get_run(run_id).status == "succeeded"
    assert calls(counter) == ["s0", "s1", "s2"]
    assert client.runtime.journal.doctor.violations() == []


_STEP_NAMES = st.one_of(
    st.sampled_from(["s1", "s2", "out", "start", "s0"]),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=40),
    st.from_regex(r"\A[a-z]{1,6}\[(items|\d{1,3})\](\.[a-z]{1,6})?\Z"),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=_STEP_NAMES, shift=st.integers(-2, 3))
def test_generated_doorbells_off_the_frontier_write_nothing(
        postgres_backend: Backend, counter: Path, step: str, shift: int) -> None:
    client = Client(postgres_backend.settings)
    try:
        run_id, sent = start_linear(client, counter)
        (_, ready, generation), = sent
        before = journal_of(client, run_id)
        outcome = execute_step(client.runtime, run_id, step, generation + shift).outcome
        if step == ready and shift == 0:
            assert outcome == "completed"
        else:
            assert outcome in ("not_ready", "stale", "completed")
            assert [e for e in journal_of(client, run_id) if e not in before] == []
        assert client.get_run(run_id).status == "running"
    finally:
        client.close()


def test_doctor_reports_a_step_completed_behind_an_undecided_approval(
        postgres_backend: Backend, counter: Path) -> None:
    client = Client(postgres_backend.settings)
    try:
        run_id, _ = parked_on_approval(client, counter)
        assert client.runtime.journal.doctor.violations() == []
        with client.runtime.journal.engine.begin() as conn:  # what a forged message used to leave
            conn.execute(event(run_id, "step_started", "pay", 1, {"attempt": 1}))
            conn.execute(event(run_id, "step_completed", "pay", 1, {"output": {"value": "paid"}}))
        found = [v for v in client.runtime.journal.doctor.violations() if v.kind == "completed_out_of_order"]
        assert [(v.run_id, v.step_id) for v in found] == [(run_id, "pay")]
        assert "approval gate was undecided" in found[0].detail
    finally:
        client.close()


def test_doctor_reports_a_step_completed_out_of_the_graphs_order(
        client: Client, counter: Path, started_linear: tuple[str, list[Message]]) -> None:
    run_id, _ = started_linear
    with client.runtime.journal.engine.begin() as conn:
        conn.execute(event(run_id, "step_started", "s2", 1, {"attempt": 1}))
        conn.execute(event(run_id, "step_completed", "s2", 1, {"output": 1}))
    found = [v for v in client.runtime.journal.doctor.violations() if v.kind == "completed_out_of_order"]
    assert [(v.run_id, v.step_id) for v in found] == [(run_id, "s2")]
