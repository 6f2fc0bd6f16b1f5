"""ai-step nodes and plain-LLM runs through the real OpenAI and Anthropic SDKs, against a local
server that stands in for both APIs and records every request; a real Celery worker runs the steps,
on SQLite and on Postgres + Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from pal.client import Client
from pal.engine.recovery import redrive
from pal.engine.steps import execute_step
from pal.nodes import idempotency_key
from tests.conftest import Backend
from tests.support.graphs import single
from tests.support.servers import FakeModelServer
from tests.support.workers import in_process_worker

SECRET = "sk-test-never-journal-this-4242"
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


@pytest.fixture
def model_server() -> Iterator[FakeModelServer]:
    with FakeModelServer(script=[{"tool_calls": [{"name": "echo", "arguments": {"q": "order 7"}}]},
                                 {"text": "order 7 ships tomorrow"}]) as server:
        yield server


@pytest.fixture
def llm_client(backend: Backend, model_server: FakeModelServer,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    settings = backend.settings.with_(openai_base_url=model_server.openai_base_url,
                                      anthropic_base_url=model_server.anthropic_base_url)
    client = Client(settings)
    yield client
    client.close()


@pytest.fixture
def llm_worker(llm_client: Client) -> Iterator[None]:
    with in_process_worker(llm_client, concurrency=2):
        yield


def ask(provider: str) -> dict[str, Any]:
    return single({"id": "ask", "type": "ai-step",
                   "data": {"provider": provider, "model": MODEL[provider], "system": "You are terse.",
                            "prompt": "Summarise: {{ input.text }}"}})


def everything_stored(client: Client, run_id: str) -> str:
    journal = client.runtime.journal
    return json.dumps([client.get_run(run_id).as_dict(), [e.as_dict() for e in client.events(run_id)],
                       journal.receipts.receipts(run_id)], default=str)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_ai_step_calls_the_provider_once_with_the_idempotency_key(
        llm_client: Client, llm_worker: None, model_server: FakeModelServer, provider: str,
        caplog: pytest.LogCaptureFixture) -> None:
    model_server.script = [{"text": "A short summary."}]
    run_id = llm_client.start_run(ask(provider), {"text": "a long ticket about a refund"})
    run = llm_client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    [request] = model_server.requests
    assert request.path == PATH[provider]
    assert request.headers["idempotency-key"] == idempotency_key(run_id, "ask", 1)
    assert request.body["model"] == MODEL[provider]
    assert "Summarise: a long ticket about a refund" in json.dumps(request.body)
    step = next(e for e in llm_client.events(run_id) if e.kind == "step_completed" and e.step_id == "ask")
    output = step.payload["output"]
    assert output["text"] == "A short summary." and output["provider"] == provider
    usage = output["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == 3
    assert Decimal(output["cost_usd"]) > 0 and output["priced"] is True
    # The run's totals are the step's, and the key is nowhere in what PAL stored or logged.
    assert (run.input_tokens, run.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
    assert run.cost_usd == Decimal(output["cost_usd"])
    assert SECRET not in everything_stored(llm_client, run_id)
    assert SECRET not in caplog.text
    assert request.headers["authorization"] == f"Bearer {SECRET}"


def test_a_completed_ai_step_is_read_back_from_the_journal(
        llm_client: Client, model_server: FakeModelServer) -> None:
    """checkCachedLLMStep: re-delivering the message and re-driving the finished run call nothing."""
    sent: list[tuple[str, str, int]] = []
    llm_client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    run_id = llm_client.start_run(ask("openai"), {"text": "x"})
    execute_step(llm_client.runtime, *sent.pop(0))
    ask_message = sent.pop(0)
    assert execute_step(llm_client.runtime, *ask_message).outcome == "completed"
    assert execute_step(llm_client.runtime, *ask_message).outcome == "completed"  # a duplicate
    while sent:
        execute_step(llm_client.runtime, *sent.pop(0))
    assert llm_client.get_run(run_id).status == "succeeded"
    assert redrive(llm_client.runtime, run_id, require_expired=False) is None
    assert len(model_server.requests) == 1
    run = llm_client.get_run(run_id)
    assert run.output_tokens == model_server.turn_for(model_server.requests[0].body).output_tokens


def test_provider_failure_is_retried_as_class_llm(
        llm_client: Client, llm_worker: None, model_server: FakeModelServer) -> None:
    model_server.fail_first = 1
    model_server.script = [{"text": "fine now"}]
    graph = ask("openai")
    graph["nodes"][1]["data"]["retry"] = {"maxAttempts": 2, "retryableClasses": ["llm"]}
    run_id = llm_client.start_run(graph, {"text": "x"})
    run = llm_client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    keys = model_server.idempotency_keys()
    assert keys == [idempotency_key(run_id, "ask", 1), idempotency_key(run_id, "ask", 2)]
    retrying = [e.payload for e in llm_client.events(run_id) if e.kind == "step_retrying"]
    assert len(retrying) == 1 and retrying[0]["error"]["class"] == "llm"
    # Only the successful call is paid for.
    assert run.output_tokens == 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_plain_llm_run_journals_each_turn_and_tool_call(
        llm_client: Client, llm_worker: None, model_server: FakeModelServer, provider: str) -> None:
    spec = {"kind": "llm", "provider": provider, "model": MODEL[provider], "system": "Use tools.",
            "prompt": "Where is {{ input.order }}?", "tools": ["echo"], "maxTurns": 4}
    run_id = llm_client.start_run(spec, {"order": "order 7"})
    run = llm_client.wait(run_id, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.kind == "llm"
    assert run.output == {"text": "order 7 ships tomorrow", "turns": 2}
    events = llm_client.events(run_id)
    done = [e for e in events if e.kind == "step_completed"]
    assert [e.step_id for e in done] == ["turn-1", "turn-1.tool-0", "turn-2"]
    assert done[1].payload["output"] == {"q": "order 7"}
    assert model_server.idempotency_keys() == [idempotency_key(run_id, "turn-1", 1),
                                                idempotency_key(run_id, "turn-2", 1)]
    second = json.dumps(model_server.requests[1].body)
    assert "order 7" in second and ("tool_result" in second or '"role": "tool"' in second)
    totals = [e.payload["usage"] for e in done if "usage" in e.payload]
    assert run.input_tokens == sum(u["input_tokens"] for u in totals)
    assert run.output_tokens == sum(u["output_tokens"] for u in totals)
    assert run.cost_usd == sum(Decimal(u["cost_usd"]) for u in totals)


def test_turn_limit_fails_the_run_with_its_code(llm_client: Client, llm_worker: None) -> None:
    spec = {"kind": "llm", "prompt": "loop", "tools": ["echo"], "maxTurns": 2,
            "script": [{"tool_calls": [{"name": "echo", "arguments": {}}]}] * 3}
    run = llm_client.wait(llm_client.start_run(spec, {}), timeout=60)
    assert run.status == "failed"
    assert run.error["code"] == "turn_limit_reached"


def test_unknown_tool_from_the_model_is_reported_back_to_it(llm_client: Client, llm_worker: None) -> None:
    spec = {"kind": "llm", "prompt": "go", "tools": ["echo"],
            "script": [{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}, {"text": "sorry"}]}
    run_id = llm_client.start_run(spec, {})
    assert llm_client.wait(run_id, timeout=60).status == "succeeded"
    tool = next(e for e in llm_client.events(run_id) if e.step_id == "turn-1.tool-0" and e.kind == "step_completed")
    assert "unknown tool 'rm_rf'" in tool.payload["output"]["error"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_temperature_and_max_tokens_reach_the_provider(
        llm_client: Client, llm_worker: None, model_server: FakeModelServer, provider: str) -> None:
    graph = ask(provider)
    graph["nodes"][1]["data"] |= {"temperature": 0.3, "maxTokens": 77}
    assert llm_client.wait(llm_client.start_run(graph, {"text": "x"}), timeout=60).status == "succeeded"
    body = model_server.requests[0].body
    assert body["temperature"] == 0.3
    assert body.get("max_completion_tokens", body.get("max_tokens")) == 77


def test_bad_tool_arguments_from_the_model_are_reported_back_to_it(llm_client: Client, llm_worker: None) -> None:
    spec = {"kind": "llm", "prompt": "go", "tools": ["flaky"],
            "script": [{"tool_calls": [{"name": "flaky", "arguments": {"nonsense": 1}}]}, {"text": "sorry"}]}
    run_id = llm_client.start_run(spec, {})
    assert llm_client.wait(run_id, timeout=60).status == "succeeded"
    tool = next(e for e in llm_client.events(run_id) if e.step_id == "turn-1.tool-0" and e.kind == "step_completed")
    assert "bad arguments for 'flaky'" in tool.payload["output"]["error"]
