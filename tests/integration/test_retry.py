"""Per-step retry through a real Celery worker, on SQLite and on Postgres + Redis."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from pal.client import Client
from pal.core.clock import utcnow
from pal.engine.recovery import sweep
from pal.engine.steps import execute_step
from tests.support.graphs import flaky
from tests.support.tools import calls


def kinds(client: Client, run_id: str, step_id: str = "f") -> list[tuple[str, int | None]]:
    return [(e.kind, e.attempt) for e in client.events(run_id) if e.step_id == step_id]


def test_flaky_tool_succeeds_on_attempt_3_after_two_step_retrying(
        client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(flaky(counter, 2, {"maxAttempts": 3, "backoffMs": 50}), {})
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output == {"label": "f", "calls": 3}
    assert kinds(client, run_id) == [
        ("step_started", 1), ("step_retrying", 1), ("step_started", 2), ("step_retrying", 2),
        ("step_started", 3), ("step_completed", 3)]
    retrying = [e.payload for e in client.events(run_id) if e.kind == "step_retrying"]
    assert [(p["attempt"], p["of"]) for p in retrying] == [(1, 3), (2, 3)]
    assert retrying[0]["error"]["message"] == "f: call 1 failed" and retrying[0]["error"]["class"] == "tool"
    assert calls(counter) == ["f", "f", "f"]


def test_the_next_attempt_waits_out_the_backoff(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(flaky(counter, 1, {"maxAttempts": 2, "backoffMs": 400}), {})
    assert client.wait(run_id, timeout=60).status == "succeeded"
    events = client.events(run_id)
    wake_at = datetime.fromisoformat(next(e.payload["wake_at"] for e in events if e.kind == "step_retrying"))
    second = next(e for e in events if e.kind == "step_started" and e.attempt == 2)
    assert second.created_at >= wake_at


def test_a_non_retryable_class_fails_at_once(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(flaky(counter, 5, {"maxAttempts": 4, "retryableClasses": ["llm", "timeout"]}), {})
    run = client.wait(run_id, timeout=60)
    assert run.status == "failed"
    assert kinds(client, run_id) == [("step_started", 1), ("step_failed", 1)]
    assert run.error["class"] == "tool" and "not retryable" in run.error["retry"]
    assert calls(counter) == ["f"]


def test_timeouts_are_their_own_retry_class(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(flaky(counter, 1, {"maxAttempts": 2, "retryableClasses": ["timeout"]},
                                    error="timeout"), {})
    assert client.wait(run_id, timeout=60).status == "succeeded"
    assert [p for k, p in kinds(client, run_id) if k == "step_retrying"] == [1]


def test_attempts_run_out(client: Client, worker: None, counter: Path) -> None:
    run_id = client.start_run(flaky(counter, 9, {"maxAttempts": 2}), {})
    run = client.wait(run_id, timeout=60)
    assert run.status == "failed" and "attempt 2 of 2: no attempts left" in run.error["retry"]
    assert calls(counter) == ["f", "f"]


def test_an_early_message_during_a_short_backoff_is_put_back_not_run(client: Client, counter: Path) -> None:
    """A re-drive (or a duplicate) reaching a step that waits out its backoff must not start the
    next attempt early: the claim sees the wake-up time and the message is re-published later."""
    sent: list[tuple[str, str, int, float]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g, countdown))
    run_id = client.start_run(flaky(counter, 1, {"maxAttempts": 2, "backoffMs": 8000}), {})
    execute_step(client.runtime, *sent.pop(0)[:3])  # trigger
    assert execute_step(client.runtime, *sent.pop(0)[:3]).outcome == "retrying"
    run, step, generation, countdown = sent.pop(0)
    assert step == "f" and 7 < countdown <= 8
    assert execute_step(client.runtime, run, step, generation).outcome == "backoff"
    assert sent[-1][1] == "f" and 0 < sent[-1][3] <= 8
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None and (lease.expires_at - utcnow()).total_seconds() > 8  # past the wake-up
    assert calls(counter) == ["f"]
    assert [k for k, _ in kinds(client, run_id)].count("step_started") == 1


def test_a_long_backoff_waits_in_the_journal_and_the_sweep_wakes_it(client: Client, counter: Path) -> None:
    """No Celery countdown for a long backoff: the lease lapses at the wake-up time and the sweep
    re-drives the step then, at the next attempt."""
    sent: list[tuple[str, str, int, float]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g, countdown))
    run_id = client.start_run(flaky(counter, 1, {"maxAttempts": 2, "backoffMs": 120_000}), {})
    execute_step(client.runtime, *sent.pop(0)[:3])
    assert execute_step(client.runtime, *sent.pop(0)[:3]).outcome == "retrying"
    assert sent == []  # nothing waits in the broker
    wake_at = datetime.fromisoformat(next(e.payload["wake_at"] for e in client.events(run_id)
                                          if e.kind == "step_retrying"))
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None and abs((lease.expires_at - wake_at).total_seconds()) < 0.01
    assert sweep(client.runtime, now=wake_at - timedelta(seconds=1)).recovered == {}
    report = sweep(client.runtime, now=wake_at + timedelta(seconds=1))
    assert report.recovered[run_id].resumed_steps == ("f",)
    [(_, step, generation, _)] = sent
    assert (step, generation) == ("f", 2)
    # The wake-up time is in the journal: delivered before it (the real clock), the step still waits.
    assert execute_step(client.runtime, run_id, step, generation).outcome == "backoff"
    assert calls(counter) == ["f"]
