"""The local stand-in servers speak the real wire formats: the real SDKs and clients accept them.

Other tests rely on these stand-ins for model calls, webhooks and mail, so the stand-ins must
parse and answer exactly as the real services do for the fields PAL uses.
"""

from __future__ import annotations

import json
import smtplib
from email.message import EmailMessage
from typing import Any

import anthropic
import openai
import pytest

from tests.support import web
from tests.support.servers import FakeModelServer, SmtpReceiver, WebhookReceiver

TIMEOUT = 5.0
WEATHER_TOOL_OPENAI: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_TOOL_ANTHROPIC: Any = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"text": "It is sunny in Paris today"},
]


def openai_client(server: FakeModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=TIMEOUT)


def anthropic_client(server: FakeModelServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="sk-ant-test", max_retries=0, timeout=TIMEOUT,
    )


def assert_key_only_in_authorization(server: FakeModelServer, key: str) -> None:
    for request in server.requests:
        assert key not in json.dumps(request.body)
        carrying = {name for name, value in request.headers.items() if key in value}
        assert carrying == {"authorization"}
        assert request.headers["authorization"] == f"Bearer {key}"


# --- OpenAI Chat Completions -------------------------------------------------------------------


def test_openai_text_reply_usage_and_recorded_request() -> None:
    with FakeModelServer([{"text": "Hello from the fake model"}]) as server:
        with openai_client(server) as client:
            reply = client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "say hello please"}],
                extra_headers={"Idempotency-Key": "k1"},
            )
        assert reply.object == "chat.completion"
        assert reply.model == "gpt-test"
        choice = reply.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == "Hello from the fake model"
        assert choice.message.tool_calls is None
        assert choice.finish_reason == "stop"
        assert reply.usage is not None
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (3, 5, 8)

        (request,) = server.requests
        assert request.path == "/v1/chat/completions"
        assert server.idempotency_keys() == ["k1"]
        assert request.body["model"] == "gpt-test"
        assert request.body["messages"] == [{"role": "user", "content": "say hello please"}]
        assert_key_only_in_authorization(server, "sk-test")


def test_openai_sends_no_idempotency_key_of_its_own() -> None:
    with FakeModelServer() as server, openai_client(server) as client:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert server.idempotency_keys() == [None]


def test_openai_tool_call_reply_then_script_follows_assistant_count() -> None:
    with FakeModelServer(SCRIPT) as server, openai_client(server) as client:
        first = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[WEATHER_TOOL_OPENAI],
        )
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls is not None
        (call,) = message.tool_calls
        assert call.type == "function"
        assert call.id == "call_0_0"
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert first.usage is not None and first.usage.completion_tokens == 5
        assert server.requests[0].body["tools"] == [WEATHER_TOOL_OPENAI]

        second = client.chat.completions.create(
            model="gpt-test",
            messages=[
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function",
                     "function": {"name": call.function.name, "arguments": call.function.arguments}},
                ]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ],
            tools=[WEATHER_TOOL_OPENAI],
        )
        assert second.choices[0].message.content == "It is sunny in Paris today"
        assert second.choices[0].finish_reason == "stop"
        # 3 words of the question + 1 of the tool arguments {"city": "Paris"} is 2 + 1 of the result
        assert second.usage is not None and second.usage.prompt_tokens == 3 + 2 + 1


def test_past_the_script_end_echoes_the_last_user_message_truncated() -> None:
    long_prompt = "word " * 30
    with FakeModelServer([{"text": "only turn"}]) as server, openai_client(server) as client:
        reply = client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "only turn"},
            {"role": "user", "content": long_prompt},
        ])
        assert reply.choices[0].message.content == f"ok: {long_prompt[:60]}"
    with FakeModelServer() as server, openai_client(server) as client:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
        assert reply.choices[0].message.content == "ok: ping"


def test_identical_requests_get_identical_replies() -> None:
    messages: Any = [{"role": "user", "content": "same question"}]
    with FakeModelServer(SCRIPT) as server:
        with openai_client(server) as client:
            a = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL_OPENAI])
            b = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL_OPENAI])
        assert a.model_dump() == b.model_dump()
        with anthropic_client(server) as aclient:
            c = aclient.messages.create(model="c", max_tokens=100, messages=messages)
            d = aclient.messages.create(model="c", max_tokens=100, messages=messages)
        assert c.model_dump() == d.model_dump()
        assert len(server.requests) == 4


def test_fail_first_raises_the_sdk_server_error_then_succeeds() -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    with FakeModelServer(fail_first=1) as server, openai_client(server) as client:
        with pytest.raises(openai.InternalServerError) as excinfo:
            client.chat.completions.create(model="m", messages=messages)
        assert excinfo.value.status_code == 500
        assert client.chat.completions.create(model="m", messages=messages).choices[0].message.content == "ok: hi"
        assert len(server.requests) == 2
    with FakeModelServer(fail_first=1) as server, anthropic_client(server) as aclient:
        with pytest.raises(anthropic.InternalServerError) as aexcinfo:
            aclient.messages.create(model="c", max_tokens=100, messages=messages)
        assert aexcinfo.value.status_code == 500
        reply = aclient.messages.create(model="c", max_tokens=100, messages=messages)
        assert reply.content[0].type == "text" and reply.content[0].text == "ok: hi"


def test_delay_lets_a_client_give_up_mid_call_and_the_request_is_still_recorded() -> None:
    with FakeModelServer(delay=2.0) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=0.2)
        with client, pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "slow"}])
        assert len(server.requests) == 1


def test_unknown_path_is_a_json_404() -> None:
    with FakeModelServer() as server:
        response = web.post(f"{server.url}/v1/nope", json={}, timeout=TIMEOUT)
        assert response.status_code == 404
        assert "error" in response.json()


# --- Anthropic Messages ----------------------------------------------------------------------


def test_anthropic_text_reply_and_recorded_request() -> None:
    with FakeModelServer([{"text": "Hello from Claude stand-in"}]) as server, anthropic_client(server) as client:
        reply = client.messages.create(
            model="claude-test", max_tokens=100, system="be brief",
            messages=[{"role": "user", "content": "say hello"}],
            extra_headers={"Idempotency-Key": "a1"},
        )
        assert reply.type == "message" and reply.role == "assistant"
        assert reply.model == "claude-test"
        (block,) = reply.content
        assert block.type == "text" and block.text == "Hello from Claude stand-in"
        assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (4, 4)

        (request,) = server.requests
        assert request.path == "/v1/messages"
        assert server.idempotency_keys() == ["a1"]
        assert request.body["model"] == "claude-test"
        assert request.body["max_tokens"] == 100
        assert request.body["messages"] == [{"role": "user", "content": "say hello"}]
        assert "anthropic-version" in request.headers
        assert_key_only_in_authorization(server, "sk-ant-test")


def test_anthropic_tool_use_reply_then_tool_result_turn() -> None:
    with FakeModelServer(SCRIPT) as server, anthropic_client(server) as client:
        first = client.messages.create(
            model="claude-test", max_tokens=100, tools=[WEATHER_TOOL_ANTHROPIC],
            messages=[{"role": "user", "content": "weather in Paris?"}],
        )
        assert first.stop_reason == "tool_use"
        (block,) = first.content
        assert block.type == "tool_use"
        assert (block.id, block.name, block.input) == ("toolu_0_0", "get_weather", {"city": "Paris"})
        assert first.usage.output_tokens == 5

        second = client.messages.create(
            model="claude-test", max_tokens=100, tools=[WEATHER_TOOL_ANTHROPIC],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": block.id, "content": "sunny and warm"},
                ]},
            ],
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].type == "text" and second.content[0].text == "It is sunny in Paris today"
        # 3 words + 2 for the JSON input {"city": "Paris"} + 3 words of the tool result
        assert second.usage.input_tokens == 3 + 2 + 3
        assert server.requests[1].body["messages"][2]["content"][0]["type"] == "tool_result"


# --- Webhooks --------------------------------------------------------------------------------


def test_webhook_dedupes_effective_deliveries_by_idempotency_key() -> None:
    with WebhookReceiver() as hook:
        headers = {"Idempotency-Key": "delivery-1"}
        first = web.post(f"{hook.url}/hooks/run", json={"event": "done"}, headers=headers, timeout=TIMEOUT)
        second = web.post(f"{hook.url}/hooks/run", json={"event": "done"}, headers=headers, timeout=TIMEOUT)
        web.put(f"{hook.url}/other", json={"n": 1}, timeout=TIMEOUT)
        web.put(f"{hook.url}/other", json={"n": 1}, timeout=TIMEOUT)
        assert first.status_code == 200 and first.json() == {"received": True, "n": 1}
        assert second.json() == {"received": True, "n": 2}
        assert len(hook.requests) == 4
        assert [r.path for r in hook.effective_deliveries()] == ["/hooks/run", "/other", "/other"]
        assert hook.requests[0].body == {"event": "done"}
        assert hook.requests[0].headers["idempotency-key"] == "delivery-1"
        assert hook.idempotency_keys() == ["delivery-1", "delivery-1", None, None]


def test_webhook_answers_with_the_configured_status() -> None:
    with WebhookReceiver(status=503) as hook:
        response = web.post(hook.url, content=b"not json", timeout=TIMEOUT)
        assert response.status_code == 503
        assert hook.requests[0].body == "not json"
        hook.status = 200
        assert web.post(hook.url, json={}, timeout=TIMEOUT).status_code == 200


# --- SMTP ------------------------------------------------------------------------------------


def test_smtp_receiver_records_messages() -> None:
    message = EmailMessage()
    message["From"] = "pal@example.com"
    message["To"] = "ops@example.com"
    message["Subject"] = "Run finished"
    message["Message-ID"] = "<run-42@pal.test>"
    message.set_content("The run finished.\nAll good.")
    with SmtpReceiver() as smtp:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=TIMEOUT) as client:
            client.send_message(message)
        (mail,) = smtp.messages
    assert mail.mail_from == "pal@example.com"
    assert mail.rcpt_tos == ["ops@example.com"]
    assert mail.headers["message-id"] == "<run-42@pal.test>"
    assert mail.headers["subject"] == "Run finished"
    assert mail.body == "The run finished.\nAll good.\n"
