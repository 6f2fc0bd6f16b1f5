"""Webhook (connector) and email deliveries claim side_effect_receipts before sending: real HTTP
to a local receiver and real SMTP to a local server, through a real Celery worker, on SQLite and on
Postgres + Redis. Crashes at each fault point are in tests/e2e/test_delivery_crashes.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pal.client import Client
from pal.core.clock import utcnow
from pal.core.records import Fence
from pal.engine.steps import execute_step
from pal.nodes import idempotency_key
from tests.support.graphs import email, webhook
from tests.support.servers import SmtpReceiver, WebhookReceiver


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as server:
        yield server


Outbox = list[tuple[str, str, int]]


def capture(client: Client) -> Outbox:
    sent: Outbox = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    return sent


def drain(client: Client, sent: Outbox) -> None:
    while sent:
        execute_step(client.runtime, *sent.pop(0))


def plant_receipt(client: Client, run_id: str, status: str | None = None) -> str:
    """What a worker that died mid-delivery leaves behind: a claim (maybe settled) for attempt 1."""
    key = idempotency_key(run_id, "notify", 1)
    client.runtime.journal.receipts.claim_receipt(Fence(run_id, 1, "dead-worker", utcnow(), 30), key=key, step_id="notify", attempt=1, effect_kind="webhook", target="earlier")
    if status is not None:
        client.runtime.journal.receipts.settle_receipt(key=key, status=status, response={"status": 200}, now=utcnow())
    return key


def test_webhook_is_delivered_once_with_the_idempotency_key(
        client: Client, worker: None, receiver: WebhookReceiver) -> None:
    run_id = client.start_run(webhook(receiver.url + "/hook"), {"ticket": "T-1"})
    run = client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    [request] = receiver.requests
    assert request.path == "/hook" and request.body == {"ticket": "T-1"}
    assert request.headers["idempotency-key"] == idempotency_key(run_id, "notify", 1)
    assert request.headers["x-source"] == "pal"
    [receipt] = client.runtime.journal.receipts.receipts(run_id)
    assert receipt["status"] == "delivered" and receipt["effect_kind"] == "webhook"
    assert receipt["idempotency_key"] == request.headers["idempotency-key"]
    assert run.output == {"delivered": True, "replayed": False,
                          "response": {"status": 200, "body": {"received": True, "n": 1}}}


def test_a_duplicate_message_does_not_deliver_again(client: Client, receiver: WebhookReceiver) -> None:
    sent = capture(client)
    run_id = client.start_run(webhook(receiver.url), {"ticket": "T-2"})
    execute_step(client.runtime, *sent.pop(0))
    message = sent.pop(0)
    assert execute_step(client.runtime, *message).outcome == "completed"
    assert execute_step(client.runtime, *message).outcome == "completed"  # the step is done: no-op
    drain(client, sent)
    assert client.get_run(run_id).status == "succeeded"
    assert len(receiver.requests) == 1


def test_a_delivered_receipt_stops_a_re_driven_delivery(client: Client, receiver: WebhookReceiver) -> None:
    sent = capture(client)
    run_id = client.start_run(webhook(receiver.url), {"ticket": "T-3"})
    plant_receipt(client, run_id, status="delivered")
    drain(client, sent)
    run = client.get_run(run_id)
    assert run.status == "succeeded"
    assert run.output["replayed"] is True
    assert receiver.requests == []


def test_an_unconfirmed_claim_is_in_doubt_and_fails_the_step(client: Client, receiver: WebhookReceiver) -> None:
    sent = capture(client)
    run_id = client.start_run(webhook(receiver.url, retry={"maxAttempts": 3}), {"ticket": "T-4"})
    key = plant_receipt(client, run_id)
    drain(client, sent)
    run = client.get_run(run_id)
    assert run.status == "failed"
    assert run.error["code"] == "delivery_in_doubt" and run.error["step_id"] == "notify"
    [doubt] = [e for e in client.events(run_id) if e.kind == "step_in_doubt"]
    assert doubt.payload["idempotency_key"] == key and doubt.step_id == "notify"
    assert not any(e.kind == "step_retrying" for e in client.events(run_id))  # never retried
    assert receiver.requests == []


def test_an_idempotent_receiver_gets_the_unconfirmed_delivery_again_with_the_same_key(
        client: Client, receiver: WebhookReceiver) -> None:
    sent = capture(client)
    run_id = client.start_run(webhook(receiver.url, idempotent=True), {"ticket": "T-5"})
    key = plant_receipt(client, run_id)
    drain(client, sent)
    assert client.get_run(run_id).status == "succeeded"
    assert receiver.idempotency_keys() == [key]
    assert client.runtime.journal.receipts.receipts(run_id)[0]["status"] == "delivered"


def test_a_refused_webhook_is_a_connector_failure_retried_with_a_new_attempt(
        client: Client, worker: None) -> None:
    with WebhookReceiver(status=422) as refusing:
        run_id = client.start_run(
            webhook(refusing.url, retry={"maxAttempts": 2, "retryableClasses": ["connector"]}), {"ticket": "T-6"})
        run = client.wait(run_id, timeout=60)
        assert run.status == "failed"
        assert run.error["code"] == "delivery_failed" and "HTTP 422" in run.error["message"]
        assert refusing.idempotency_keys() == [idempotency_key(run_id, "notify", 1),
                                               idempotency_key(run_id, "notify", 2)]
    assert [r["status"] for r in client.runtime.journal.receipts.receipts(run_id)] == ["failed", "failed"]


def test_an_unreachable_webhook_fails_without_doubt(client: Client, worker: None) -> None:
    run_id = client.start_run(webhook("http://127.0.0.1:9/nothing-listens-here"), {"ticket": "T-7"})
    run = client.wait(run_id, timeout=60)
    assert run.status == "failed" and run.error["code"] == "delivery_failed"
    assert client.runtime.journal.receipts.receipts(run_id)[0]["status"] == "failed"


def test_email_is_delivered_once_with_a_message_id_from_the_key(
        mail_client: Client, smtp: SmtpReceiver) -> None:
    sent = capture(mail_client)
    run_id = mail_client.start_run(email(), {"ticket": "T-8", "to": "ada@example.test"})
    execute_step(mail_client.runtime, *sent.pop(0))
    message = sent.pop(0)
    execute_step(mail_client.runtime, *message)
    execute_step(mail_client.runtime, *message)  # a duplicate message: no second mail
    drain(mail_client, sent)
    run = mail_client.get_run(run_id)
    assert run.status == "succeeded", run.error
    [mail] = smtp.messages
    key = idempotency_key(run_id, "notify", 1)
    assert mail.rcpt_tos == ["ada@example.test"] and mail.headers["subject"] == "Ticket T-8"
    assert mail.headers["message-id"] == f"<{key}@pal>" and mail.headers["idempotency-key"] == key
    assert "Your ticket T-8 was answered." in mail.body
    assert mail_client.runtime.journal.receipts.receipts(run_id)[0]["effect_kind"] == "email"


def test_bad_email_address_fails_the_step_clearly(mail_client: Client, smtp: SmtpReceiver) -> None:
    sent = capture(mail_client)
    run_id = mail_client.start_run(email(), {"ticket": "T-9", "to": "not an address"})
    drain(mail_client, sent)
    run = mail_client.get_run(run_id)
    assert run.status == "failed" and "not e-mail addresses" in run.error["message"]
    assert smtp.messages == []


def test_a_5xx_leaves_the_outcome_unknown_and_is_never_retried(client: Client) -> None:
    """The receiver may have done the work before answering 503: in doubt, whatever the policy."""
    sent = capture(client)
    with WebhookReceiver(status=503) as flaky_receiver:
        run_id = client.start_run(webhook(flaky_receiver.url, retry={"maxAttempts": 3}), {"ticket": "T-10"})
        drain(client, sent)
        assert len(flaky_receiver.requests) == 1
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "delivery_in_doubt"
    assert "HTTP 503" in run.error["message"]
    assert [e.kind for e in client.events(run_id) if e.step_id == "notify"] == [
        "step_started", "step_in_doubt", "step_failed"]


def test_an_idempotent_receiver_gets_the_same_key_again_when_the_answer_is_lost(client: Client) -> None:
    sent = capture(client)
    with WebhookReceiver(status=503) as flaky_receiver:
        run_id = client.start_run(webhook(flaky_receiver.url, idempotent=True, retry={"maxAttempts": 3}),
                                  {"ticket": "T-11"})
        drain(client, sent)
        keys = flaky_receiver.idempotency_keys()
    assert len(keys) == 4 and set(keys) == {idempotency_key(run_id, "notify", 1)}  # never a new key
    assert client.get_run(run_id).error["code"] == "delivery_in_doubt"
