"""Side effects under real SIGKILL: a `pal worker` dies at a fault point, a fresh worker and the
beat-driven sweep finish the run, and the local stand-in servers show what was sent.

- model calls: the provider sees the same Idempotency-Key again for the interrupted attempt and
  never a new key for it; once completed, a replay sends nothing;
- a plain-LLM run killed at turn 5 replays turns 1 to 4 from the journal;
- webhooks and email: never delivered twice; the in-doubt window is visible in the journal; an
  idempotent receiver gets exactly one effective delivery.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.engine.recovery import redrive
from pal.nodes import idempotency_key
from tests.conftest import Backend
from tests.support.graphs import email, single, webhook
from tests.support.processes import Processes
from tests.support.servers import FakeModelServer, SmtpReceiver, WebhookReceiver

TERMINAL = ("run_succeeded", "run_failed", "run_cancelled")


@pytest.fixture
def model_server(processes: Processes) -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        processes.common |= {"PAL_OPENAI_BASE_URL": server.openai_base_url,
                             "PAL_ANTHROPIC_BASE_URL": server.anthropic_base_url,
                             "OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"}
        yield server


def crash_then_finish(processes: Processes, client: Client, tmp_path: Path, point: str,
                      document: dict[str, Any], run_input: Any) -> str:
    """Start a doomed worker armed at `point`, run `document`, wait for the kill, then let a fresh
    worker and beat finish the run. Returns the run id."""
    doomed = processes.worker("doomed", PAL_FAULT_POINT=point, PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    run_id = client.start_run(document, run_input)
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL, "the worker did not die at the fault point"
    processes.worker("fresh")
    processes.beat()
    client.wait(run_id, timeout=120)
    events = client.events(run_id)
    assert set(Counter(e.step_id for e in events if e.kind == "step_completed").values()) <= {1}
    assert len([e for e in events if e.kind in TERMINAL]) == 1
    assert any(e.kind == "run_recovered" for e in events)
    assert client.runtime.journal.doctor.violations() == []  # `pal doctor` finds the journal clean
    return run_id


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_model_call_resumed_after_the_answer_reuses_its_key(
        processes: Processes, postgres_backend: Backend, model_server: FakeModelServer, tmp_path: Path,
        provider: str) -> None:
    model = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}[provider]
    graph = single({"id": "ask", "type": "ai-step",
                    "data": {"provider": provider, "model": model, "prompt": "Hello {{ input.name }}"}})
    client = Client(postgres_backend.settings)
    # after_effect: the provider answered, step_completed was not written.
    run_id = crash_then_finish(processes, client, tmp_path, "after_effect:ask", graph, {"name": "Ada"})
    run = client.get_run(run_id)
    assert run.status == "succeeded", run.error
    key = idempotency_key(run_id, "ask", 1)
    assert model_server.idempotency_keys() == [key, key]  # the same key twice, never a new one
    # Completed: a replay (a forced re-drive of the finished run) sends no request at all.
    assert redrive(client.runtime, run_id, require_expired=False) is None
    assert len(model_server.requests) == 2
    # The run paid for the call once, although the provider answered twice.
    answer = model_server.turn_for(model_server.requests[0].body)
    assert run.output_tokens == answer.output_tokens
    client.close()


def test_plain_llm_run_killed_at_turn_5_replays_turns_1_to_4_from_the_journal(
        processes: Processes, postgres_backend: Backend, model_server: FakeModelServer, tmp_path: Path) -> None:
    model_server.script = [{"tool_calls": [{"name": "echo", "arguments": {"turn": n}}]} for n in range(1, 6)]
    model_server.script.append({"text": "all done"})
    spec = {"kind": "llm", "provider": "openai", "model": "gpt-4o-mini", "prompt": "Go",
            "tools": ["echo"], "maxTurns": 8}
    client = Client(postgres_backend.settings)
    run_id = crash_then_finish(processes, client, tmp_path, "after_effect:turn-5", spec, {})
    run = client.get_run(run_id)
    assert run.status == "succeeded", run.error
    assert run.output == {"text": "all done", "turns": 6}
    keys = model_server.idempotency_keys()
    expected = [idempotency_key(run_id, f"turn-{n}", 1) for n in range(1, 7)]
    assert Counter(keys) == Counter(expected) + Counter([expected[4]])  # only turn 5 was sent twice
    assert keys == [*expected[:5], expected[4], expected[5]]
    events = client.events(run_id)
    assert [e.step_id for e in events if e.kind == "step_completed"] == [
        s for n in range(1, 6) for s in (f"turn-{n}", f"turn-{n}.tool-0")] + ["turn-6"]
    totals = [e.payload["usage"] for e in events if e.kind == "step_completed" and "usage" in e.payload]
    assert len(totals) == 6 and run.output_tokens == sum(u["output_tokens"] for u in totals)
    client.close()


# What a crash at each point leaves for a receiver that does not honour idempotency keys:
# (deliveries seen, run status). A kill between claim and confirmation can never be told apart
# from a kill after sending, so PAL fails the step as in doubt rather than risk a second delivery.
DELIVERY_MATRIX = {
    "after_claim_commit:notify": (1, "succeeded"),
    "before_effect:notify": (1, "succeeded"),
    "after_receipt_claim:notify": (0, "failed"),
    "after_delivery:notify": (1, "failed"),
    "after_effect:notify": (1, "succeeded"),
    "after_complete_commit:notify": (1, "succeeded"),
}


def assert_in_doubt_visible(client: Client, run_id: str, in_doubt: bool) -> None:
    doubts = [e for e in client.events(run_id) if e.kind == "step_in_doubt"]
    assert len(doubts) == (1 if in_doubt else 0)
    run = client.get_run(run_id)
    if in_doubt:
        assert run.error["code"] == "delivery_in_doubt"
        assert doubts[0].payload["idempotency_key"] == idempotency_key(run_id, "notify", 1)


@pytest.mark.parametrize("point", DELIVERY_MATRIX)
def test_webhook_is_never_delivered_twice(processes: Processes, postgres_backend: Backend,
                                          tmp_path: Path, point: str) -> None:
    deliveries, status = DELIVERY_MATRIX[point]
    client = Client(postgres_backend.settings)
    with WebhookReceiver() as receiver:
        run_id = crash_then_finish(processes, client, tmp_path, point, webhook(receiver.url), {"ticket": "T"})
        assert len(receiver.requests) == deliveries
    assert client.get_run(run_id).status == status
    assert_in_doubt_visible(client, run_id, status == "failed")
    client.close()


@pytest.mark.parametrize("point", ["after_receipt_claim:notify", "after_delivery:notify"])
def test_an_idempotent_webhook_receiver_gets_one_effective_delivery(
        processes: Processes, postgres_backend: Backend, tmp_path: Path, point: str) -> None:
    client = Client(postgres_backend.settings)
    with WebhookReceiver() as receiver:
        run_id = crash_then_finish(processes, client, tmp_path, point, webhook(receiver.url, idempotent=True),
                                   {"ticket": "T"})
        key = idempotency_key(run_id, "notify", 1)
        assert set(receiver.idempotency_keys()) == {key}
        assert len(receiver.effective_deliveries()) == 1
    assert client.get_run(run_id).status == "succeeded"
    assert client.runtime.journal.receipts.receipts(run_id)[0]["status"] == "delivered"
    client.close()


@pytest.mark.parametrize("point", DELIVERY_MATRIX)
def test_email_is_never_delivered_twice(processes: Processes, postgres_backend: Backend,
                                        tmp_path: Path, point: str) -> None:
    deliveries, status = DELIVERY_MATRIX[point]
    client = Client(postgres_backend.settings)
    with SmtpReceiver() as smtp:
        processes.common["PAL_SMTP_URL"] = f"smtp://{smtp.host}:{smtp.port}"
        run_id = crash_then_finish(processes, client, tmp_path, point, email(),
                                   {"ticket": "T", "to": "ada@example.test"})
        assert len(smtp.messages) == deliveries
    assert client.get_run(run_id).status == status
    assert_in_doubt_visible(client, run_id, status == "failed")
    client.close()


def test_an_idempotent_mail_receiver_gets_one_effective_delivery(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    client = Client(postgres_backend.settings)
    with SmtpReceiver() as smtp:
        processes.common["PAL_SMTP_URL"] = f"smtp://{smtp.host}:{smtp.port}"
        run_id = crash_then_finish(processes, client, tmp_path, "after_delivery:notify", email(idempotent=True),
                                   {"ticket": "T", "to": "ada@example.test"})
        ids = smtp.message_ids()
    assert client.get_run(run_id).status == "succeeded"
    key = idempotency_key(run_id, "notify", 1)
    assert len(ids) == 2 and {" ".join((i or "").split()) for i in ids} == {f"<{key}@pal>"}
    client.close()
