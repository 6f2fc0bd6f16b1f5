"""Providers without the network: the scripted provider, prices, message shapes, the key."""

from __future__ import annotations

import hashlib
from decimal import Decimal

import pytest

from pal.errors import ConfigError
from pal.nodes import idempotency_key
from pal.providers import ModelRequest, get_provider
from pal.providers.anthropic_api import _messages as anthropic_messages
from pal.providers.openai_api import _messages as openai_messages
from pal.providers.pricing import cost, load_prices
from pal.providers.scripted import ScriptedProvider


def test_idempotency_key_is_sha256_of_run_step_attempt() -> None:
    assert idempotency_key("run_1", "ask", 2) == hashlib.sha256(b"run_1|ask|2").hexdigest()
    assert idempotency_key("run_1", "ask", 2) != idempotency_key("run_1", "ask", 3)


def test_scripted_provider_is_a_pure_function_of_the_request() -> None:
    request = ModelRequest(model="scripted-1", messages=({"role": "user", "content": "one two three"},),
                           script=({"tool_calls": [{"name": "echo", "arguments": {"a": 1}}]}, {"text": "bye"}))
    first = ScriptedProvider().complete(request, "k")
    assert first == ScriptedProvider().complete(request, "other key")
    assert first.tool_calls == ({"id": "call_0_0", "name": "echo", "arguments": {"a": 1}},)
    later = ModelRequest(model="scripted-1", script=request.script, messages=(
        *request.messages, {"role": "assistant", "content": "", "tool_calls": list(first.tool_calls)}))
    assert ScriptedProvider().complete(later, "k").text == "bye"


def test_prices_are_per_million_tokens_and_overridable(tmp_path: object) -> None:
    prices = load_prices('{"my-model": {"input": 2, "output": 4}}')
    assert cost(prices, "my-model", 1_000_000, 500_000) == Decimal(4)
    assert cost(prices, "gpt-4o-mini", 1000, 1000) == Decimal("0.00075")
    assert cost(prices, "unknown-model", 10, 10) is None
    # Providers answer with dated snapshots; the price is the model's.
    assert cost(prices, "gpt-4o-mini-2024-07-18", 1000, 1000) == Decimal("0.00075")
    assert cost(prices, "claude-haiku-4-5-20251001", 1_000_000, 0) == Decimal(1)
    assert cost(prices, "my-alias", 1_000_000, 0, answered_model="my-model") == Decimal(2)


@pytest.mark.parametrize(("raw", "fragment"), [
    ("{not json", "not JSON"), ('{"m": {"input": 1}}', "needs numeric 'input' and 'output'"),
    ("/nonexistent/prices.json", "cannot read it"),
])
def test_bad_price_tables_are_refused(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_prices(raw)


def test_unknown_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown provider 'acme'"):
        get_provider("acme", base_urls={}, timeout=1)


CONVERSATION = (
    {"role": "user", "content": "find order 7"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "name": "lookup", "arguments": {"order": 7}},
        {"id": "c2", "name": "lookup", "arguments": {"order": 8}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": '{"ok": 1}'},
    {"role": "tool", "tool_call_id": "c2", "name": "lookup", "content": '{"ok": 2}'},
)


def test_openai_messages_carry_system_and_function_calls() -> None:
    out = openai_messages(ModelRequest(model="m", messages=CONVERSATION, system="be brief"))
    assert out[0] == {"role": "system", "content": "be brief"}
    assert out[2]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"order": 7}'}
    assert out[3] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok": 1}'}


def test_anthropic_messages_merge_tool_results_into_one_user_turn() -> None:
    out = anthropic_messages(ModelRequest(model="m", messages=CONVERSATION))
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert [b["type"] for b in out[1]["content"]] == ["tool_use", "tool_use"]
    assert [b["tool_use_id"] for b in out[2]["content"]] == ["c1", "c2"]
